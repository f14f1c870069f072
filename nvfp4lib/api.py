"""The one-shot grouped GEMMs: new weights every call (for weights used many times, :func:`nvfp4lib.prepare_weights`).

Two backends: "cute-hopper" (the serving kernel, :mod:`nvfp4lib.kernels.hopper_varlen`, on an sm_90 GPU) and
"reference" (the exact semantics on any device). Operands are validated at the boundary and every error names the
group and the rule it broke. The study's other kernels and the peers are benchmarked through :mod:`nvfp4lib.bench`,
not called from here."""
from __future__ import annotations

import torch

from .formats import NVFP4Tensor
from .reference import reference_grouped_gemm
from .serving import oneshot as _serving_oneshot  # (here, not per call: ~1 µs)

__all__ = ["grouped_gemm", "grouped_dual_gemm_silu", "validate_operands", "BACKENDS"]

BACKENDS = ("cute-hopper", "reference")

OUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _as_list(x, what: str) -> list:
    if isinstance(x, NVFP4Tensor):
        raise TypeError(f"{what} must be a list of NVFP4Tensor (one per group), got a single NVFP4Tensor")
    if not isinstance(x, (list, tuple)):
        raise TypeError(f"{what} must be a list of NVFP4Tensor (one per group), got {type(x).__name__}")
    for i, t in enumerate(x):
        if not isinstance(t, NVFP4Tensor):
            raise TypeError(f"{what}[{i}] must be an NVFP4Tensor, got {type(t).__name__}")
        if t.data.dim() != 2:
            raise ValueError(f"{what}[{i}] must be 2-D [rows, K], got shape {tuple(t.shape)}")
    return list(x)


def validate_operands(a, b, b2=None, out_dtype=torch.float16):
    """Check the grouped operands; return them as lists. Raises TypeError/ValueError naming the problem.

    (One pass per group over shapes and devices: one-shot calls pay this every call. An NVFP4Tensor's parts share one
    device, checked when it is built, so its codes' device stands for it.)"""
    a = _as_list(a, "a")
    b = _as_list(b, "b")
    b2 = None if b2 is None else _as_list(b2, "b2")
    if len(a) == 0:
        raise ValueError("a grouped GEMM needs at least one group (a is empty)")
    for name, w in (("b", b), ("b2", b2)):
        if w is not None and len(w) != len(a):
            raise ValueError(f"{name} has {len(w)} groups but a has {len(a)}")
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"out_dtype must be one of {OUT_DTYPES}, got {out_dtype}")
    device = a[0].data.device
    for g, x in enumerate(a):
        xd, wd = x.data, b[g].data
        ka = xd.shape[1]
        wn, wk = wd.shape
        if wk != ka or wn == 0:
            _shape_error(g, "b", ka, wn, wk)
        if xd.device != device or wd.device != device:
            _device_error(g, device, (("a", xd), ("b", wd)))
        if b2 is not None:
            ud = b2[g].data
            un, uk = ud.shape
            if uk != ka or un == 0:
                _shape_error(g, "b2", ka, un, uk)
            if un != wn:
                raise ValueError(f"group {g}: b[{g}] has N={wn} but b2[{g}] has N={un}")
            if ud.device != device:
                _device_error(g, device, (("b2", ud),))
    return a, b, b2


def _shape_error(g: int, name: str, ka: int, wn: int, wk: int):
    if wk != ka:
        raise ValueError(f"group {g}: K mismatch, a[{g}] has K={2 * ka} but {name}[{g}] has K={2 * wk}")
    raise ValueError(f"group {g}: {name}[{g}] has N=0; N must be positive")


def _device_error(g: int, device, parts):
    for name, t in parts:
        if t.device != device:
            raise ValueError(f"{name}[{g}] is on device {t.device} but a[0] is on device {device}: "
                             "all operands must be on one device")


def _oneshot(a, b, b2, backend: str, out_dtype, config: str) -> list[torch.Tensor]:
    """The groups' products with new weights. cute-hopper: the one-shot serving call where the groups share N and K
    (the callers' tensors read in place; a cached or heuristic config, never timed inside the call), else one
    prepared-weights call per distinct (N, K) of the groups (the same kernel)."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; the one-shot functions take {', '.join(BACKENDS)} (the study's "
                         "kernels and peers are benchmarked with `python -m nvfp4lib bench`)")
    if backend == "cute-hopper" and config == "auto":
        c = _serving_oneshot(a, b, b2, out_dtype=out_dtype, split=True)  # one pass over the operands
        if c is not None:
            return c
    a, b, b2 = validate_operands(a, b, b2, out_dtype)  # (names what kept the operands off the one-shot path)
    if backend == "reference":
        if config != "auto":
            raise ValueError(f"backend 'reference' has no configs (got config={config!r})")
        return reference_grouped_gemm(a, b, b2, out_dtype=out_dtype)
    from .serving import prepare_weights

    shapes: dict[tuple, list[int]] = {}
    for g, w in enumerate(b):
        shapes.setdefault(tuple(w.shape), []).append(g)
    out: list = [None] * len(a)
    for groups in shapes.values():
        w = prepare_weights([b[g] for g in groups], None if b2 is None else [b2[g] for g in groups],
                            backend=backend, out_dtype=out_dtype, config=config, check_scales=False)
        for g, c in zip(groups, w([a[g] for g in groups])):
            out[g] = c
    return out


def grouped_gemm(a, b, *, backend: str = "reference", out_dtype=torch.float16,
                 config: str = "auto") -> list[torch.Tensor]:
    """C_g = A_g · B_gᵀ for every group; ``a[g]`` is [M_g, K], ``b[g]`` is [N_g, K] (NVFP4Tensor); returns [M_g, N_g]
    tensors of ``out_dtype``. ``config`` names a serving-kernel config (``"auto"``: the cached or heuristic choice).
    For repeated calls with the same weights, prepare them once: :func:`nvfp4lib.prepare_weights`."""
    return _oneshot(a, b, None, backend, out_dtype, config)


def grouped_dual_gemm_silu(a, b1, b2, *, backend: str = "reference", out_dtype=torch.float16,
                           config: str = "auto") -> list[torch.Tensor]:
    """C_g = silu(A_g·B1_gᵀ) * (A_g·B2_gᵀ), both products in fp32, one rounding to ``out_dtype``."""
    if b2 is None:
        raise TypeError("grouped_dual_gemm_silu needs b2 (the up projection); use grouped_gemm for one product")
    return _oneshot(a, b1, b2, backend, out_dtype, config)
