"""Activations to NVFP4 on the device: the layer's per-call quantizer.

:func:`quantize_rows` computes what :func:`nvfp4lib.formats.quantize` computes (the same FP32 arithmetic, the same
E2M1 rounding, bit for bit for one global scale) with torch ops only and no host read-back, so it runs inside a CUDA
graph and traces whole under ``torch.compile`` (where its elementwise chain fuses into one kernel). What it gives up
for that: no validation of the values (non-finite input gives unspecified codes instead of an error).
"""
from __future__ import annotations

import torch

from ..formats import BLOCK_SIZE, E2M1_MAX, E4M3_MAX

__all__ = ["AMAX_ROUTE_ELEMENTS", "amax_of", "amax_tile", "check_k", "global_scale_of", "quantize_rows", "static_scale"]

# E2M1 rounding boundaries, as in nvfp4lib.formats: a value rounds up past the first set only when strictly above
# (its ties go down to an even code), past the second set when at or above (its ties go up to an even code).
_TIES_DOWN = (0.25, 1.25, 2.5, 5.0)
_TIES_UP = (0.75, 1.75, 3.5)


def _div(a: torch.Tensor, b: float) -> torch.Tensor:
    """``a / b`` rounded once (IEEE), on any device. torch's CUDA kernels divide by a Python number as a
    multiplication by its reciprocal (two roundings: 4.53125 / 2688 came out 1 ulp high on the H100, where the CPU and
    the Triton form divide exactly); a device tensor divisor takes the true division."""
    return a / torch.full((), b, dtype=torch.float32, device=a.device)


def amax_of(x: torch.Tensor) -> torch.Tensor:
    """``amax(|x|)`` as float32 ``[1]`` on x's device (0 for an empty x)."""
    x32 = x.detach().to(torch.float32)
    return (x32.abs().amax() if x32.numel() else x32.new_zeros(())).reshape(1)


def global_scale_of(x: torch.Tensor) -> torch.Tensor:
    """``amax(|x|) / (6 · 448)`` as float32 ``[1]`` on x's device (1.0 for an all-zero or empty x), so the largest
    block scale lands on E4M3's maximum; the same rule as ``formats.quantize``'s default."""
    amax = amax_of(x)
    g = _div(amax, E2M1_MAX * E4M3_MAX)
    g = torch.where(amax == 0, torch.ones_like(g), g)
    # a nonzero amax that underflows the division gets the smallest positive float32 (formats does the same)
    g = torch.clamp(g, min=torch.finfo(torch.float32).smallest_normal * 2.0**-23)
    return g.reshape(1)


def check_k(x: torch.Tensor) -> int:
    """K, the last dim of ``x``, which both forms of :func:`quantize_rows` need to be a positive multiple of 16."""
    k = x.shape[-1]
    if k == 0 or k % BLOCK_SIZE:
        raise ValueError(f"quantize_rows: K = {k} (last dim) must be a positive multiple of {BLOCK_SIZE}")
    return k


def quantize_rows(x: torch.Tensor, global_scale: torch.Tensor | None = None):
    """Quantize ``x [..., K]`` (K a multiple of 16) to NVFP4 parts without synchronising.

    ``global_scale``: a float32 tensor of one element on x's device, or None for :func:`global_scale_of` (x).
    Returns ``(codes uint8 [..., K/2], scales float8_e4m3fn [..., K/16], global_scale float32 [1])``: the fields of
    an :class:`~nvfp4lib.formats.NVFP4Tensor`, its global scale kept a device tensor."""
    k = check_k(x)
    g = global_scale_of(x) if global_scale is None else global_scale.to(torch.float32).reshape(1)
    blocks = x.detach().to(torch.float32).reshape(*x.shape[:-1], k // BLOCK_SIZE, BLOCK_SIZE)
    # Clamp before the cast, as formats does: saturation then does not depend on the fp8 conversion of the backend.
    scales = torch.clamp(_div(blocks.abs().amax(dim=-1), E2M1_MAX) / g, max=E4M3_MAX).to(torch.float8_e4m3fn)
    denom = (scales.to(torch.float32) * g).unsqueeze(-1)
    ok = denom > 0
    # a zero scale (or an underflowing product) encodes its block as +0 codes
    y = torch.where(ok, blocks / torch.where(ok, denom, torch.ones_like(denom)), torch.zeros_like(blocks))
    a = y.abs()
    mag = sum((a > m).to(torch.uint8) for m in _TIES_DOWN) + sum((a >= m).to(torch.uint8) for m in _TIES_UP)
    codes = (mag | (torch.signbit(y).to(torch.uint8) << 3)).reshape(x.shape)
    return codes[..., 0::2] | (codes[..., 1::2] << 4), scales, g


def static_scale(scale, device, what: str) -> torch.Tensor:
    """A static activation global scale (a checkpoint's) as float32 ``[1]`` on ``device``, checked finite and positive
    once, here: the forward reads nothing back."""
    t = torch.as_tensor(scale, dtype=torch.float32).detach().reshape(-1)
    if t.numel() != 1:
        raise ValueError(f"{what} must hold one number, got shape {tuple(torch.as_tensor(scale).shape)}")
    v = float(t.cpu())
    if not (v > 0.0 and v != float("inf")):
        raise ValueError(f"{what} must be finite and > 0, got {v}")
    return t.to(device)


AMAX_ROUTE_ELEMENTS = 16384  # the amax tile in the routing program: rows and 16-column blocks rounded up to powers of 2


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def amax_tile(x: torch.Tensor) -> tuple[int, int] | None:
    """The routing program's amax tile for ``x`` (:data:`.routing.AMAX_IN_ROUTE`: rows and 16-column blocks, both
    powers of two), or None where x is not a 2-D tensor of whole 16-column blocks with unit column stride, or its tile
    holds more than AMAX_ROUTE_ELEMENTS."""
    if x.dim() != 2 or x.shape[1] % 16 or x.shape[1] == 0 or x.stride(1) != 1:
        return None
    tile = (_pow2(x.shape[0]), _pow2(x.shape[1] // 16))
    return tile if tile[0] * tile[1] * 16 <= AMAX_ROUTE_ELEMENTS else None
