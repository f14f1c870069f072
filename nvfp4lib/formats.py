"""The NVFP4 number format: encoding, the :class:`NVFP4Tensor` container, and scale layouts.

This module owns everything about *how NVFP4 numbers are stored*; it knows nothing
about GEMMs. An NVFP4 tensor of logical shape ``[..., K]`` is three things:

* ``data``   -- E2M1 codes (1 sign, 2 exponent, 1 mantissa bit; values
  0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives), two per byte: element ``2i``
  in the LOW nibble of byte ``i``, element ``2i+1`` in the high nibble. These are
  exactly the bytes of ``torch.float4_e2m1fn_x2``.
* ``scales`` -- one FP8 E4M3 scale per 16 consecutive elements along K,
  row-major ``[..., K//16]``.
* ``global_scale`` -- one FP32 number per tensor.

The value of element ``j`` is ``e2m1(code_j) * scale_{j//16} * global_scale``.
Storage is 4 + 8/16 = 4.5 bits per element (plus 32 bits per tensor).

Decisions a user should know about
----------------------------------
* Rounding of elements is round-to-nearest, ties-to-even on the E2M1 grid,
  saturating at +-6. The sign bit is copied from the input (``torch.signbit``), so
  ``-0.0`` and small negatives that round to zero encode as ``0x8`` (negative zero),
  as torch's (torchao's) bit-level float -> float4_e2m1fn_x2 converter does (the
  tests compare bytes). The exception: a block whose E4M3 scale is zero (or whose
  scale * global scale underflows FP32) encodes all sixteen codes as ``0x0``.
* ``quantize`` computes in FP32. float16/bfloat16 inputs upcast exactly; float64
  inputs are first rounded to FP32 (and must fit in its range).
* Block scales are cast with torch's ``float8_e4m3fn`` conversion (round to
  nearest even) after clamping to 448, so CPU and CUDA saturate identically.
  Blocks whose ideal scale falls in E4M3's subnormal range (< 2**-6) lose relative
  precision, and at or below 2**-10 flush to zero. Re-quantizing a dequantized
  tensor reproduces it bit for bit when every block scale is normal; a block with a
  subnormal scale may pick a different scale the second time.
* Accuracy assumes ``global_scale * block_scale`` is a normal FP32 number: with the
  default global scale that means amax(|x|) above ~1e-32. Tinier tensors still
  quantize (no error raised) but coarsely, down to all zeros.
* ``dequantize`` is exact up to one rounding: ``e2m1 * e4m3`` needs at most
  2 + 4 = 6 significant bits and stays within [2**-10, 2688], so the product is
  exact in FP32 (and in bf16/fp16); multiplying by the FP32 global scale is then
  a single correctly rounded FP32 operation. With ``dtype=torch.float64`` the
  result is exact. For bf16/fp16 outputs the FP32 result is cast, i.e. rounded
  twice, unless the global scale is a power of two (then it is exact).

Scale layout for tensor cores
-----------------------------
cuBLAS and CUTLASS (tcgen05 block-scaled MMA) read scales in a swizzled "blocked"
layout built from 128 x 4 atoms; :func:`swizzle_scales`,
:func:`unswizzle_scales` and :func:`scales_cute_view` convert to and from it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = [
    "BLOCK_SIZE",
    "E2M1_MAX",
    "E4M3_MAX",
    "E2M1_VALUES",
    "NVFP4Tensor",
    "e2m1_encode",
    "e2m1_decode",
    "pack_e2m1",
    "unpack_e2m1",
    "quantize",
    "dequantize",
    "swizzle_scales",
    "unswizzle_scales",
    "scales_cute_view",
]

BLOCK_SIZE = 16  # elements per E4M3 scale (NVFP4's block; MXFP4 would use 32)
E2M1_MAX = 6.0
E4M3_MAX = 448.0

# Decoded value of each 4-bit code. Codes 0..7 are the magnitudes, bit 3 is the sign.
E2M1_VALUES: tuple[float, ...] = (
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
    -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
)

# Midpoints between consecutive magnitudes (codes k and k+1) and the direction a tie
# goes. Ties go to the even code (mantissa bit 0): 0, 1.0, 2.0 and 4.0 are even.
# A tie that must round *up* (to code k+1) is counted with ">=", one that rounds
# *down* with ">". All these midpoints are exact in fp16, bf16 and fp32.
_MIDPOINTS_ROUND_DOWN = (0.25, 1.25, 2.5, 5.0)  # ties -> 0, 1.0, 2.0, 4.0
_MIDPOINTS_ROUND_UP = (0.75, 1.75, 3.5)  # ties -> 1.0, 2.0, 4.0

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_SWIZZLE_ROWS = 128  # rows per atom (4 groups of 32 rows)
_SWIZZLE_COLS = 4  # scale columns per atom (4 x 16 = 64 K elements)


# --------------------------------------------------------------------------- E2M1


def e2m1_encode(x: torch.Tensor) -> torch.Tensor:
    """Round each element of ``x`` to the nearest E2M1 value (ties to even, saturate at
    +-6) and return its 4-bit code as ``uint8`` (one code per element, same shape).

    The sign bit (bit 3) comes from ``torch.signbit``: ``-0.0`` encodes as ``0x8``.
    Infinities saturate to +-6. NaN raises ``ValueError``.
    """
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f"e2m1_encode needs a floating-point tensor, got {_describe(x)}")
    n_nan = int(torch.isnan(x).sum())
    if n_nan:
        raise ValueError(f"e2m1_encode: input holds {n_nan} NaN value(s); NaN has no E2M1 code")
    a = x.abs()
    # Magnitude code = number of midpoints passed; values above 5 land on code 7 (= 6),
    # which is the saturation.
    mag = torch.zeros(x.shape, dtype=torch.uint8, device=x.device)
    for m in _MIDPOINTS_ROUND_DOWN:
        mag += (a > m).to(torch.uint8)
    for m in _MIDPOINTS_ROUND_UP:
        mag += (a >= m).to(torch.uint8)
    return mag | (torch.signbit(x).to(torch.uint8) << 3)


def _check_codes(codes: torch.Tensor, what: str) -> None:
    if not isinstance(codes, torch.Tensor) or codes.dtype != torch.uint8:
        raise TypeError(f"{what} needs uint8 codes, got {_describe(codes)}")
    n_bad = int((codes > 15).sum())
    if n_bad:
        raise ValueError(f"{what}: {n_bad} code(s) exceed 15; E2M1 codes are 4-bit (0..15)")


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """Decode uint8 E2M1 codes (0..15, one per element) to float32, exactly."""
    _check_codes(codes, "e2m1_decode")
    return _decode_unchecked(codes)


def _decode_unchecked(codes: torch.Tensor) -> torch.Tensor:
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=codes.device)
    return table[codes.long()]


def pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """Pack codes ``[..., K]`` (uint8, 0..15, K even) into bytes ``[..., K//2]``:
    element ``2i`` in the low nibble, ``2i+1`` in the high nibble."""
    _check_codes(codes, "pack_e2m1")
    if codes.ndim == 0 or codes.shape[-1] % 2:
        raise ValueError(f"pack_e2m1: last dim must be even, got shape {tuple(codes.shape)}")
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_e2m1`: bytes ``[..., K//2]`` -> codes ``[..., K]``."""
    if not isinstance(packed, torch.Tensor) or packed.dtype != torch.uint8:
        raise TypeError(f"unpack_e2m1 needs a uint8 tensor, got {_describe(packed)}")
    if packed.ndim == 0:
        raise ValueError("unpack_e2m1 needs at least one dimension")
    codes = torch.stack((packed & 0xF, packed >> 4), dim=-1)
    return codes.reshape(*packed.shape[:-1], 2 * packed.shape[-1])


# --------------------------------------------------------------------------- tensor


@dataclass(frozen=True, eq=False)
class NVFP4Tensor:
    """An NVFP4 tensor of logical shape ``[..., K]`` (see the module docstring).

    ``NVFP4Tensor(data, scales, global_scale)`` validates its inputs: ``data`` uint8
    ``[..., K//2]``, ``scales`` float8_e4m3fn ``[..., K//16]`` with the same leading
    dims, ``global_scale`` a finite positive float32 0-d tensor (a Python float is
    accepted and converted), all on one device. Build one from real numbers with
    :func:`quantize`.
    """

    data: torch.Tensor
    scales: torch.Tensor
    global_scale: torch.Tensor

    def __post_init__(self) -> None:
        data, scales, g = self.data, self.scales, self.global_scale
        if not isinstance(data, torch.Tensor) or data.dtype != torch.uint8:
            raise TypeError(f"NVFP4Tensor.data must be a torch.uint8 tensor, got {_describe(data)}")
        if not isinstance(scales, torch.Tensor) or scales.dtype != torch.float8_e4m3fn:
            raise TypeError(
                f"NVFP4Tensor.scales must be a torch.float8_e4m3fn tensor, got {_describe(scales)}"
            )
        if isinstance(g, (float, int)) and not isinstance(g, bool):
            g = torch.tensor(float(g), dtype=torch.float32, device=data.device)
            object.__setattr__(self, "global_scale", g)
        if not isinstance(g, torch.Tensor) or g.dtype != torch.float32:
            raise TypeError(
                f"NVFP4Tensor.global_scale must be a float32 0-d tensor, got {_describe(g)}"
            )
        if data.ndim == 0 or scales.ndim == 0:
            raise ValueError(
                "NVFP4Tensor.data and .scales need at least one dim, got shapes "
                f"{tuple(data.shape)} and {tuple(scales.shape)}"
            )
        if g.ndim != 0:
            raise ValueError(f"NVFP4Tensor.global_scale must be 0-d, got shape {tuple(g.shape)}")
        half_k = data.shape[-1]
        # K = 2 * half_k must be a positive multiple of 16, i.e. half_k a multiple of 8.
        if half_k == 0 or half_k % (BLOCK_SIZE // 2):
            raise ValueError(
                f"NVFP4Tensor.data last dim is {half_k} bytes, so K = {2 * half_k}; "
                f"K must be a positive multiple of {BLOCK_SIZE}"
            )
        if scales.shape != data.shape[:-1] + (half_k * 2 // BLOCK_SIZE,):
            raise ValueError(
                f"NVFP4Tensor.scales shape {tuple(scales.shape)} does not match data shape "
                f"{tuple(data.shape)}: expected {tuple(data.shape[:-1]) + (2 * half_k // BLOCK_SIZE,)} "
                f"(one scale per {BLOCK_SIZE} elements)"
            )
        if not (data.device == scales.device == g.device):
            raise ValueError(
                "NVFP4Tensor parts must share one device, got data on "
                f"{data.device}, scales on {scales.device}, global_scale on {g.device}"
            )
        # Checked where it costs nothing: reading a device scalar would synchronise every call (and cannot run
        # inside a CUDA graph capture); prepared weights check theirs once, at prepare. Under torch.compile the
        # value is symbolic (reading it would break the graph), so the check is left to eager calls.
        if g.device.type == "cpu" and not torch.compiler.is_compiling():
            gv = float(g)
            if not (gv > 0.0 and gv != float("inf")):  # also rejects NaN
                raise ValueError(f"NVFP4Tensor.global_scale must be finite and > 0, got {gv}")

    def addresses(self) -> tuple:
        """``(data shape, device index, both parts contiguous, data address, scales address, global scale address)``,
        read on the first call and kept on the tensor. A one-shot call reads these of its weights (7 attribute reads of
        ~0.2 µs each on the H100's host per tensor, every call, before it kept them); a model builds its weights once.
        Like the shapes checked when the tensor is built, they stay valid while the parts keep their storage and
        strides: their values may change in place (``copy_``), their metadata may not (``set_``, ``resize_``, ``t_``,
        ``.data =`` on a part)."""
        a = self.__dict__.get("_addresses")
        if a is None:
            d, s = self.data, self.scales
            a = (d.shape, d.get_device(), d.is_contiguous() and s.is_contiguous(), d.data_ptr(), s.data_ptr(),
                 self.global_scale.data_ptr())
            object.__setattr__(self, "_addresses", a)
        return a

    def __getstate__(self) -> dict:
        # copies and pickles hold other tensors (deepcopy, pickle) or may outlive these: they read their own addresses
        state = dict(self.__dict__)
        state.pop("_addresses", None)
        return state

    @property
    def K(self) -> int:
        return 2 * self.data.shape[-1]

    @property
    def shape(self) -> torch.Size:
        """Logical shape ``[..., K]``."""
        return torch.Size(self.data.shape[:-1] + (self.K,))

    @property
    def device(self) -> torch.device:
        return self.data.device

    @property
    def nbytes(self) -> int:
        """Storage in bytes: packed codes + E4M3 scales + 4 for the global scale."""
        return self.data.numel() + self.scales.numel() + 4

    def to(self, device: torch.device | str) -> NVFP4Tensor:
        return NVFP4Tensor(
            self.data.to(device), self.scales.to(device), self.global_scale.to(device)
        )

    def __repr__(self) -> str:
        return (
            f"NVFP4Tensor(shape={tuple(self.shape)}, device={self.device}, "
            f"global_scale={float(self.global_scale):.6g})"
        )


# --------------------------------------------------------------------------- quantize


def _global_scale_tensor(global_scale, device: torch.device) -> torch.Tensor:
    """A user-given global scale as a validated float32 0-d tensor on ``device``."""
    if isinstance(global_scale, torch.Tensor):
        if global_scale.numel() != 1 or global_scale.ndim != 0:
            raise ValueError(
                f"quantize: global_scale must be a 0-d tensor or a float, got shape "
                f"{tuple(global_scale.shape)}"
            )
        if not global_scale.is_floating_point():
            raise TypeError(f"quantize: global_scale must be floating point, got {global_scale.dtype}")
        g = global_scale.detach().to(device=device, dtype=torch.float32)
    elif isinstance(global_scale, (float, int)) and not isinstance(global_scale, bool):
        g = torch.tensor(float(global_scale), dtype=torch.float32, device=device)
    else:
        raise TypeError(f"quantize: global_scale must be a float or 0-d tensor, got {_describe(global_scale)}")
    gv = float(g)
    # Checked after the float32 rounding: 1e-50 or 1e40 are positive and finite as
    # Python floats but not as the float32 that would be stored.
    if not (gv > 0.0 and gv != float("inf")):
        raise ValueError(
            f"quantize: global_scale must be finite and > 0 in float32, got {global_scale!r} "
            f"(float32 value {gv})"
        )
    return g


def quantize(x: torch.Tensor, *, global_scale=None) -> NVFP4Tensor:
    """Quantize a float tensor ``[..., K]`` (K a multiple of 16) to NVFP4.

    ``global_scale=None`` picks ``amax(|x|) / (6 * 448)`` (1.0 if x is all zero), so the
    largest block scale lands on E4M3's maximum 448. Per block of 16 elements:
    ``scale = e4m3(min(block_amax / 6 / global_scale, 448))`` and
    ``code = e2m1(x / (scale * global_scale))``; a zero scale gives all-zero codes.
    All arithmetic is FP32 (see the module docstring).
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"quantize needs a torch.Tensor, got {_describe(x)}")
    if x.dtype not in _FLOAT_DTYPES:
        raise TypeError(
            f"quantize needs a float16/bfloat16/float32/float64 tensor, got dtype {x.dtype}"
        )
    if x.ndim == 0:
        raise ValueError("quantize needs a tensor with at least one dim [..., K], got a 0-d tensor")
    K = x.shape[-1]
    if K == 0 or K % BLOCK_SIZE:
        raise ValueError(f"quantize: K = {K} (last dim) must be a positive multiple of {BLOCK_SIZE}")

    x32 = x.detach().to(torch.float32)
    n_bad = int((~torch.isfinite(x32)).sum())
    if n_bad:
        n_src = int((~torch.isfinite(x)).sum())
        why = "non-finite" if n_src else "outside the float32 range"
        raise ValueError(f"quantize: input holds {n_bad} {why} value(s); NVFP4 needs finite input")

    if global_scale is None:
        amax = x32.abs().amax() if x32.numel() else x32.new_zeros(())
        g = amax / (E2M1_MAX * E4M3_MAX)
        # amax == 0 -> 1.0. A nonzero amax so tiny that the division underflows to 0
        # gets the smallest positive float32 instead (its blocks then flush to zero).
        g = torch.where(amax == 0, torch.ones_like(g), g)
        g = torch.clamp(g, min=torch.finfo(torch.float32).smallest_normal * 2.0**-23)
    else:
        g = _global_scale_tensor(global_scale, x.device)

    blocks = x32.reshape(*x.shape[:-1], K // BLOCK_SIZE, BLOCK_SIZE)
    block_amax = blocks.abs().amax(dim=-1)
    # Clamp before the cast so saturation does not depend on the backend's fp8
    # conversion (CPU saturates, some CUDA paths produce NaN above 480).
    ideal = torch.clamp(block_amax / E2M1_MAX / g, max=E4M3_MAX)
    scales = ideal.to(torch.float8_e4m3fn)

    denom = (scales.to(torch.float32) * g).unsqueeze(-1)
    ok = denom > 0
    y = torch.where(ok, blocks / torch.where(ok, denom, torch.ones_like(denom)), torch.zeros_like(blocks))
    codes = e2m1_encode(y).reshape(x.shape)
    return NVFP4Tensor(pack_e2m1(codes), scales, g.reshape(()).clone())


def dequantize(t: NVFP4Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Real values of ``t`` as ``dtype``: ``e2m1(code) * scale * global_scale``.

    Computed in FP32 (FP64 when ``dtype=torch.float64``): the e2m1 x e4m3 product is
    exact, times the global scale is one rounding (none in FP64), then cast to
    ``dtype``. NaN scales raise ``ValueError`` instead of propagating.
    """
    if not isinstance(t, NVFP4Tensor):
        raise TypeError(f"dequantize needs an NVFP4Tensor, got {_describe(t)}")
    if dtype not in _FLOAT_DTYPES:
        raise TypeError(f"dequantize: dtype must be one of {_FLOAT_DTYPES}, got {dtype}")
    # E4M3FN has no infinities; its only non-finite bytes are 0x7F and 0xFF (NaN).
    n_nan = int(((t.scales.view(torch.uint8) & 0x7F) == 0x7F).sum())
    if n_nan:
        raise ValueError(
            f"dequantize: NVFP4Tensor.scales holds {n_nan} NaN E4M3 value(s) (bytes 0x7F/0xFF) "
            f"out of {t.scales.numel()}"
        )
    work = torch.float64 if dtype == torch.float64 else torch.float32
    q = _decode_unchecked(unpack_e2m1(t.data)).to(work)
    q = q.reshape(*t.shape[:-1], t.K // BLOCK_SIZE, BLOCK_SIZE)
    qs = q * t.scales.to(work).unsqueeze(-1)  # exact: <= 6 significant bits
    out = qs * t.global_scale.to(work)  # the one rounding (fp32) / exact (fp64)
    return out.reshape(t.shape).to(dtype)


# --------------------------------------------------------------------------- scale layout


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def swizzle_scales(scales: torch.Tensor) -> torch.Tensor:
    """Scales ``[rows, cols]`` (or ``[L, rows, cols]``) -> the flat cuBLAS/CUTLASS
    "blocked" layout (1-D, same dtype).

    Rows are zero-padded to a multiple of 128 and cols to a multiple of 4. The padded
    matrix is cut into 128 x 4 atoms stored one after another, row-atom-major (all
    column atoms of rows 0..127 first). Inside an atom, row ``r`` is split as
    ``r = 32 * (r // 32) + r % 32`` and element ``(r, c)`` sits at offset
    ``(r % 32) * 16 + (r // 32) * 4 + c`` -- so one 16-byte line holds the 4 x 4
    scales that rows r, r+32, r+64, r+96 need for 64 K elements. A leading batch
    dim is flattened per batch and the batches concatenated.
    """
    if not isinstance(scales, torch.Tensor) or scales.ndim not in (2, 3):
        raise ValueError(
            f"swizzle_scales needs a [rows, cols] or [L, rows, cols] tensor, got {_describe(scales)}"
        )
    s = scales if scales.ndim == 3 else scales.unsqueeze(0)
    L, rows, cols = s.shape
    rm, rk = _ceil_div(rows, _SWIZZLE_ROWS), _ceil_div(cols, _SWIZZLE_COLS)
    padded = s.new_zeros(L, rm * _SWIZZLE_ROWS, rk * _SWIZZLE_COLS)
    padded[:, :rows, :cols] = s
    # padded row = 128*i_m + 32*i_4 + i_32, col = 4*i_k + j  ->  order (L, i_m, i_k, i_32, i_4, j)
    tiles = padded.view(L, rm, 4, 32, rk, _SWIZZLE_COLS)
    return tiles.permute(0, 1, 4, 3, 2, 5).reshape(-1)


def unswizzle_scales(blocked: torch.Tensor, rows: int, cols: int, L: int | None = None) -> torch.Tensor:
    """Exact inverse of :func:`swizzle_scales`: flat blocked scales -> ``[rows, cols]``
    (or ``[L, rows, cols]`` when ``L`` is given), padding dropped."""
    Lb = 1 if L is None else L
    rm, rk = _ceil_div(rows, _SWIZZLE_ROWS), _ceil_div(cols, _SWIZZLE_COLS)
    need = Lb * rm * rk * _SWIZZLE_ROWS * _SWIZZLE_COLS
    if blocked.ndim != 1 or blocked.numel() != need:
        raise ValueError(
            f"unswizzle_scales: expected a 1-D tensor of {need} elements for rows={rows}, "
            f"cols={cols}, L={Lb}, got shape {tuple(blocked.shape)}"
        )
    tiles = blocked.view(Lb, rm, rk, 32, 4, _SWIZZLE_COLS).permute(0, 1, 4, 3, 2, 5)
    out = tiles.reshape(Lb, rm * _SWIZZLE_ROWS, rk * _SWIZZLE_COLS)[:, :rows, :cols]
    return out[0] if L is None else out


def scales_cute_view(blocked: torch.Tensor, rows: int, cols: int, L: int = 1) -> torch.Tensor:
    """The blocked scales seen as CUTLASS's 6-d ``(32, 4, rest_m, 4, rest_k, L)`` tensor.

    A view (no copy) of the same storage: index ``(i32, i4, im, j, jk, l)`` is scale
    ``[l, 128*im + 32*i4 + i32, 4*jk + j]`` of the unswizzled matrix. In elements
    the strides are ``(16, 4, 512*rest_k, 1, 512, 512*rest_m*rest_k)`` -- the
    tcgen05 scale atom ``((32, 4), (16, 4)) : ((16, 4), (0, 1))`` of CUTLASS's
    ``BlockScaledBasicChunk`` (without the stride-0 per-element mode) tiled K-atom
    fastest, then M, then L.
    """
    rm, rk = _ceil_div(rows, _SWIZZLE_ROWS), _ceil_div(cols, _SWIZZLE_COLS)
    need = L * rm * rk * _SWIZZLE_ROWS * _SWIZZLE_COLS
    if blocked.ndim != 1 or blocked.numel() != need:
        raise ValueError(
            f"scales_cute_view: expected a 1-D tensor of {need} elements for rows={rows}, "
            f"cols={cols}, L={L}, got shape {tuple(blocked.shape)}"
        )
    return blocked.view(L, rm, rk, 32, 4, _SWIZZLE_COLS).permute(3, 4, 1, 5, 2, 0)


def _describe(v) -> str:
    if isinstance(v, torch.Tensor):
        return f"tensor(dtype={v.dtype}, shape={tuple(v.shape)}, device={v.device})"
    return f"{type(v).__name__} {v!r}"
