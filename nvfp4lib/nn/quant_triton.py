"""The layer's activation quantizer (:func:`nvfp4lib.nn.quant.quantize_rows`) as two Triton launches and a one-word
memset instead of ~45 torch kernels. At decode sizes each torch kernel costs ~2 µs of GPU time even inside a CUDA
graph, so the torch form is most of a small W4A4 layer's time.

Every step keeps the torch form's fp32 arithmetic: IEEE divisions (``div_rn``; Triton's ``/`` is approximate), the
E4M3 rounding of the block scale done in integers (round to nearest even, the scale clamped to [0, 448] first), the
same E2M1 boundaries and sign of zero. Bit-identical to the torch form in Triton's interpreter
(``tests/test_quant_triton.py``) and on the H100 (``tests/gpu/test_moe_gpu.py``); the layer's default on a CUDA
device (``NVFP4MoE(..., quantizer="auto")``).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..formats import BLOCK_SIZE
from ..kernels.common import pdl
from ..kernels.common.pdl_triton import chain
from ..kernels.common.triton_launch import launch
from .quant import check_k

__all__ = ["quantize_rows_triton", "quantize_to_operand"]

BLOCKS_PER_PROGRAM = 32  # 16-element blocks of a row per program
ROWS_PER_PROGRAM = 4
# Small inputs in smaller tiles (the knob, off): where the tiles above give fewer than SMALL_PROGRAMS programs, the amax
# and quantize launches halve the blocks per program (down to 4), then the rows (down to 1), until they have that
# many, with a warp per 32 of a tile's element pairs (1-4 warps); each element's arithmetic is the same, so the bits
# are too. Why (issue 41): in the Qwen3-like W4A4 layer at T = 1 (H200, moe-bench --profile, graph replay) the two
# quantizations (amax launch, quantize launch) end 6.1 and 5.7 us after the kernel before them, the quantize launches
# 4.5 and 4.1 us after their amax launch, read as their own work: 8 programs (8 rows x 128 blocks, and 8 x 48 for
# the intermediate) each walk 1024 element pairs through two IEEE divisions and the E2M1 comparisons, on 8 of 132 SMs.
# Prediction (2026-11-29, before the run): each quantize launch's own work ~4.5 -> ~1.5 us, the Qwen3-like W4A4 layer
# at T = 1 ~29.6 -> ~25-26 us, the other decode cases 1-4 us faster.
# Outcome (H200, moe-bench --quant-small-tiles 0 1 0 1, W4A4, uniform, graph replay; notebook 11's rounds): slower
# where it was meant to help, Qwen3-like T = 1 29.7 -> 34.3 us, T = 8 75.6 -> 78.5; the other seven cases within 1%.
# The same bits (the Triton quantizer's tests, 88 passed on the GPU in both forms; memcheck 0 errors). So the time
# after the kernel before is not the programs' own work on few SMs, as read from the profile: what it is stays to be
# measured (the launch's wait for its predecessor, by PDL, is the candidate). Off.
SMALL_TILES = False
SMALL_PROGRAMS = 128
# The knob: a computed global scale on an input of at most ONE_PROGRAM_ELEMENTS (the padded tile: rows and blocks
# rounded up to powers of two) in one program and one launch (_quant_one_kernel) instead of a memset, the amax launch
# and the quantize launch. Prediction (2026-11-27, before any GPU run): ~5-6 us off a Qwen3-like W4A4 layer at T = 1
# (its two quantizations cost 0.9 + 2.2 + 2.7 and 1.0 + 2.0 + 4.1 us in the H100 profile; one program ~2-4 us each).
# Measured (the A/B at 57ed0a0, H100, notebook 11): slower where it was meant to help. One program took 8.4 us for
# the Qwen3-like input (8 copies x 2048: 16384 elements) and 7.1 us for its intermediate (8 x 768, padded to 8192),
# against 5.5 and 7.3 us for memset + amax + quantize: the layer 41.6 -> 50.3 us (uniform routing), DeepSeek-like
# T = 1 (its intermediate 8 x 2048) 117.7 -> 123.7 us; only Mixtral-like T = 1 gained (input 2 x 4096: 7.9 -> 5.4
# us, the layer 122.1 -> 119.6). One SM walks ~2 elements per ns through the tile; the grid spreads it over many.
# The knob stays off.
ONE_PROGRAM = False
ONE_PROGRAM_ELEMENTS = 16384  # a Qwen3-like T = 1 step's 8 token copies of 2048: 8 x 128 blocks


@triton.jit
def _tile(x, x_stride, rows, nblk, R: tl.constexpr, CB: tl.constexpr, index, HAS_INDEX: tl.constexpr):
    """The even and odd elements (fp32) of this program's [R rows, CB blocks, 8 pairs] tile, its mask and indices
    (output row r reads x's row ``index[r]`` with ``HAS_INDEX`` (a negative index: zeros), else row r; x's rows
    ``x_stride`` elements apart; blocks past ``nblk``, the operand's padding, read as zeros)."""
    r = tl.program_id(0) * R + tl.arange(0, R)[:, None, None]
    b = tl.program_id(1) * CB + tl.arange(0, CB)[None, :, None]
    j = tl.arange(0, 8)[None, None, :]
    ok = (r < rows) & (b < nblk) & (j < 8)
    src = r.to(tl.int64)
    if HAS_INDEX:
        src = tl.load(index + r, mask=r < rows, other=0).to(tl.int64)
        ok = ok & (src >= 0)
    off = src * x_stride + b * 16 + 2 * j
    ev = tl.load(x + off, mask=ok, other=0.0).to(tl.float32)
    od = tl.load(x + off + 1, mask=ok, other=0.0).to(tl.float32)
    return ev, od, ok, r, b, j


@triton.jit
def _tile_amax(ev, od):
    """amax(|x|) over a tile's even and odd elements (masked ones read as zeros)."""
    return tl.max(tl.max(tl.max(tl.maximum(tl.abs(ev), tl.abs(od)), axis=2), axis=1), axis=0)


@triton.jit
def _amax_kernel(x, x_stride, amax_bits, rows, nblk, valid, R: tl.constexpr, CB: tl.constexpr,
                 HAS_VALID: tl.constexpr, GDC: tl.constexpr):
    chain(GDC)
    if HAS_VALID:  # only the first valid[0] rows
        rows = tl.minimum(rows, tl.load(valid))
    ev, od, ok, r, b, j = _tile(x, x_stride, rows, nblk, R, CB, x, False)
    m = _tile_amax(ev, od)
    # |x| >= 0: its float bits order as int32, so an integer max is the float max
    tl.atomic_max(amax_bits, m.to(tl.int32, bitcast=True))


@triton.jit
def _e2m1(y):
    """E2M1 code of y (already divided by its block's scale): the boundaries of nvfp4lib.formats."""
    a = tl.abs(y)
    mag = ((a > 0.25).to(tl.int32) + (a >= 0.75).to(tl.int32) + (a > 1.25).to(tl.int32)
           + (a >= 1.75).to(tl.int32) + (a > 2.5).to(tl.int32) + (a >= 3.5).to(tl.int32)
           + (a > 5.0).to(tl.int32))
    return mag | (((y.to(tl.int32, bitcast=True) >> 31) & 1) << 3)


@triton.jit
def _global_scale(amax):
    """global_scale_of: amax / (6 * 448); 1 where amax is 0; at least the smallest subnormal."""
    g = tl.where(amax == 0.0, 1.0, tl.math.div_rn(amax, 2688.0))
    # the smallest fp32 subnormal, from its bits: Triton types a float literal below fp32's normal range as fp64
    return tl.maximum(g, tl.full([], 1, tl.int32).to(tl.float32, bitcast=True))


@triton.jit
def _e4m3_value(byte):
    """The E4M3 byte's value in fp32 (exact; 0x7F and 0xFF: NaN), as the kernels' cvt.e4m3x2 decodes it."""
    e = (byte >> 3) & 15
    m = byte & 7
    mag = tl.where(e == 0, m.to(tl.float32) * 0.001953125, (((e + 120) << 23) | (m << 20)).to(tl.float32,
                                                                                               bitcast=True))
    mag = tl.where((e == 15) & (m == 7), float("nan"), mag)
    return _with_sign(mag, (byte >> 7) & 1)


@triton.jit
def _with_sign(v, sign):
    """v (>= 0) with the sign bit set where ``sign`` is 1 (in bits: Triton's negation is 0 - v, which gives +0)."""
    return (v.to(tl.int32, bitcast=True) | (sign << 31)).to(tl.float32, bitcast=True)


@triton.jit
def _e2m1_value(code):
    """The E2M1 code's value in fp32 (sign at bit 3; code 8 is -0)."""
    mag = code & 7
    v = tl.where(mag < 4, mag.to(tl.float32) * 0.5, tl.where(mag < 6, (mag - 2).to(tl.float32),
                                                             (mag * 2 - 8).to(tl.float32)))
    return _with_sign(v, (code >> 3) & 1)


@triton.jit
def _quant_tile(x, x_stride, g, codes, scales, index, rows, nblk, R: tl.constexpr, CB: tl.constexpr,
                HAS_INDEX: tl.constexpr, OPERAND: tl.constexpr = False, op_stride=0, op_blocks=0):
    """Quantize this program's tile of output rows with the global scale ``g``: codes and E4M3 block scales; with
    ``OPERAND``, instead the serving GEMM's fp16 operand at ``codes`` (rows ``op_stride`` apart, ``op_blocks``
    blocks of 16 per row, those past ``nblk`` zeros): each element ``e2m1 · block scale · 2^-7``, the values the
    GEMM's activation prologue decodes from those codes and scale bytes, bit for bit."""
    ev, od, ok, r, b, j = _tile(x, x_stride, rows, nblk, R, CB, index, HAS_INDEX)
    bmax = tl.max(tl.maximum(tl.abs(ev), tl.abs(od)), axis=2)  # [R, CB]
    s = tl.minimum(tl.math.div_rn(tl.math.div_rn(bmax, 6.0), g), 448.0)
    # E4M3 of s, round to nearest even: below 2^-6 in steps of 2^-9; above, the fp32 mantissa rounded to 3 bits in
    # integers (a carry rolls into the exponent); 960 = (127 - 7) << 3 rebiases the exponent
    v = s * 512.0
    f = tl.floor(v)
    fi = f.to(tl.int32)
    sub = fi + ((v - f) > 0.5).to(tl.int32) + (((v - f) == 0.5) & ((fi & 1) == 1)).to(tl.int32)
    bits = s.to(tl.int32, bitcast=True)
    code = tl.where(s < 0.015625, sub, ((bits + 0x7FFFF + ((bits >> 20) & 1)) >> 20) - 960)
    s32 = tl.where(code < 8, code.to(tl.float32) * 0.001953125, ((code + 960) << 20).to(tl.float32, bitcast=True))
    denom = (s32 * g)[:, :, None]
    pos = denom > 0.0
    safe = tl.where(pos, denom, 1.0)
    lo = _e2m1(tl.where(pos, tl.math.div_rn(ev, safe), 0.0))
    hi = _e2m1(tl.where(pos, tl.math.div_rn(od, safe), 0.0))
    r2 = tl.program_id(0) * R + tl.arange(0, R)[:, None]
    b2 = tl.program_id(1) * CB + tl.arange(0, CB)[None, :]
    if OPERAND:
        # the scale as its stored byte decodes (what the prologue reads), times 2^-7
        sb = (_e4m3_value(code & 255) * 0.0078125)[:, :, None]
        # each block's 16 values interleaved back (even, odd) into one contiguous 32-byte run per block
        vals = tl.reshape(tl.join(_e2m1_value(lo) * sb, _e2m1_value(hi) * sb), [R, CB, 16])
        e = tl.arange(0, 16)[None, None, :]
        at = codes + r.to(tl.int64) * op_stride + b * 16 + e
        tl.store(at, vals.to(tl.float16), mask=(r < rows) & (b < op_blocks) & (e < 16))
    else:
        tl.store(codes + r.to(tl.int64) * (nblk * 8) + b * 8 + j, (lo | (hi << 4)).to(tl.uint8), mask=ok)
        tl.store(scales + r2.to(tl.int64) * nblk + b2, code.to(tl.uint8), mask=(r2 < rows) & (b2 < nblk))


@triton.jit
def _quant_kernel(x, x_stride, g_in, amax_bits, codes, scales, g_out, index, rows, nblk, valid, op_stride, op_blocks,
                  HAVE_G: tl.constexpr, R: tl.constexpr, CB: tl.constexpr, HAS_INDEX: tl.constexpr,
                  HAS_VALID: tl.constexpr, OPERAND: tl.constexpr, GDC: tl.constexpr):
    chain(GDC)
    if HAS_VALID:
        rows = tl.minimum(rows, tl.load(valid))
    if HAVE_G:
        g = tl.load(g_in).to(tl.float32)
    else:
        g = _global_scale(tl.load(amax_bits).to(tl.float32, bitcast=True))
    if (tl.program_id(0) == 0) & (tl.program_id(1) == 0):
        tl.store(g_out, g)
    _quant_tile(x, x_stride, g, codes, scales, index, rows, nblk, R, CB, HAS_INDEX, OPERAND, op_stride, op_blocks)


@triton.jit
def _quant_one_kernel(x, x_stride, codes, scales, g_out, index, x_rows, rows, nblk, R: tl.constexpr,
                      CB: tl.constexpr, HAS_INDEX: tl.constexpr, GDC: tl.constexpr):
    """A small input in one program (one tile holds all of x and all output rows): x's amax, the global scale, the
    quantized rows; no memset, no atomic, one launch."""
    chain(GDC)
    ev, od, ok, r, b, j = _tile(x, x_stride, x_rows, nblk, R, CB, x, False)
    amax = _tile_amax(ev, od)
    g = _global_scale(amax)
    tl.store(g_out, g)
    _quant_tile(x, x_stride, g, codes, scales, index, rows, nblk, R, CB, HAS_INDEX)


def _grid(rows: int, nblk: int, tile: dict) -> tuple[int, int]:
    return max(1, -(-rows // tile["R"])), -(-nblk // tile["CB"])


def _tiling(rows: int, nblk: int) -> tuple[dict, int]:
    """(the amax and quantize launches' tile {R, CB}, their warps) for ``rows`` rows of ``nblk`` blocks: the default
    tile, or with :data:`SMALL_TILES` a smaller one where the default gives fewer than :data:`SMALL_PROGRAMS`
    programs."""
    r, cb = ROWS_PER_PROGRAM, BLOCKS_PER_PROGRAM
    if SMALL_TILES:
        def programs(r, cb):
            return max(1, -(-rows // r)) * -(-nblk // cb)

        while cb > 4 and programs(r, cb) < SMALL_PROGRAMS:
            cb //= 2
        while r > 1 and programs(r, cb) < SMALL_PROGRAMS:
            r //= 2
    return {"R": r, "CB": cb}, max(1, min(4, r * cb * 8 // 32))


def quantize_rows_triton(x: torch.Tensor, global_scale: torch.Tensor | None = None, index: torch.Tensor | None = None,
                         amax_reduce=None, valid: torch.Tensor | None = None, amax_word: torch.Tensor | None = None):
    """:func:`nvfp4lib.nn.quant.quantize_rows` in two Triton launches (one with ``global_scale``): the same outputs,
    bit for bit. ``x`` a contiguous float tensor ``[..., K]`` (or 2-D with any row stride) on a device Triton runs
    on (a CUDA GPU, or the CPU under ``TRITON_INTERPRET=1``); no host synchronisation. ``index`` (int ``[R]``, 2-D
    ``x`` only): the outputs are the rows ``x[index]`` quantized (the gather fused in; the global scale is still
    x's), ``[R, K/2]`` and ``[R, K/16]``; a negative index gives an unspecified row. ``amax_reduce`` (without
    ``global_scale``): called on x's ``amax(|x|)`` (float32 ``[1]``, on the device) between the two launches, to
    replace it in place, e.g. with a process group's max (expert parallelism); the global scale is then computed
    from what it leaves there. ``valid`` (int32 ``[1]`` on the device, 2-D ``x``
    without ``index``): only x's first ``valid[0]`` rows count and are quantized (the rest of the outputs are left
    unspecified), e.g. the rows an expert GEMM wrote of a buffer sized for the most. ``amax_word`` (without
    ``global_scale``): an int32 ``[1]`` the caller has zeroed on the device for this call, used instead of a new
    zeroed word (its fill kernel: the MoE layer has its routing launch clear it)."""
    return _quantize(x, global_scale, index, amax_reduce, valid, amax_word)


def quantize_to_operand(x: torch.Tensor, k_pad: int, global_scale: torch.Tensor | None = None,
                        index: torch.Tensor | None = None, amax_word: torch.Tensor | None = None,
                        amax_ready: bool = False):
    """``(x16, g)``: x's rows (2-D; or ``x[index]``) quantized to NVFP4 as :func:`quantize_rows_triton` does, with the
    same global scale ``g``, but written as the serving GEMM's fp16 operand ``x16 [R, k_pad]`` instead of codes and
    scales: each element ``e2m1 · block scale · 2^-7`` (columns past K zeros), the values the GEMM's activation
    prologue would decode from those codes, bit for bit
    (:meth:`nvfp4lib.serving.PreparedWeights.call_operand` takes it and runs the GEMM alone, no prologue).
    ``amax_ready``: ``amax_word`` already holds amax(|x|)'s float bits (the routing launch wrote them: :data:`.routing.
    AMAX_IN_ROUTE`), so there is no amax launch."""
    if amax_ready and (amax_word is None or global_scale is not None):
        raise ValueError("quantize_to_operand: amax_ready needs amax_word and no global_scale")
    if x.dim() != 2:
        raise ValueError(f"quantize_to_operand: x must be 2-D [T, K], got {tuple(x.shape)}")
    if k_pad < x.shape[1] or k_pad % BLOCK_SIZE:
        raise ValueError(f"quantize_to_operand: k_pad={k_pad} must be a multiple of {BLOCK_SIZE} and at least "
                         f"K={x.shape[1]}")
    return _quantize(x, global_scale, index, None, None, amax_word, k_pad, amax_ready)


def _quantize(x, global_scale, index, amax_reduce, valid, amax_word, k_pad: int | None = None, amax_ready=False):
    """The launches of both entries: codes and scales, or with ``k_pad`` the fp16 operand ``[R, k_pad]``."""
    if valid is not None and (index is not None or x.dim() != 2):
        raise ValueError("quantize_rows (triton): valid needs a 2-D x and no index")
    k = check_k(x)
    if not (x.is_contiguous() or (x.dim() == 2 and x.stride(1) == 1)):
        raise ValueError("quantize_rows (triton): x must be contiguous, or 2-D with contiguous rows; pass "
                         "x.contiguous()")
    stride = x.stride(0) if x.dim() == 2 else k
    if index is not None and (x.dim() != 2 or index.dim() != 1):
        raise ValueError(f"quantize_rows (triton): index needs a 2-D x and a 1-D index, got {tuple(x.shape)} and "
                         f"{tuple(index.shape)}")
    rows, nblk = x.numel() // k, k // BLOCK_SIZE
    lead = tuple(x.shape[:-1]) if index is None else (index.numel(),)
    out_rows = rows if index is None else index.numel()
    operand = k_pad is not None
    if operand:
        codes = torch.empty((out_rows, k_pad), dtype=torch.float16, device=x.device)
        scales = codes  # (not written)
    else:
        codes = torch.empty((*lead, k // 2), dtype=torch.uint8, device=x.device)
        scales = torch.empty((*lead, nblk), dtype=torch.uint8, device=x.device)
    g = torch.empty(1, dtype=torch.float32, device=x.device)
    have_g = global_scale is not None
    # the amax word is zeroed (a memset launch) only where a global scale is computed
    if have_g:
        amax_bits = g.view(torch.int32)
    elif amax_word is not None:
        amax_bits = amax_word.view(torch.int32).reshape(1)
    else:
        amax_bits = torch.zeros(1, dtype=torch.int32, device=x.device)
    if not have_g and ONE_PROGRAM and amax_reduce is None and valid is None and not operand:
        tile = {"R": triton.next_power_of_2(max(rows, out_rows, 1)), "CB": triton.next_power_of_2(nblk)}
        if tile["R"] * tile["CB"] * BLOCK_SIZE <= ONE_PROGRAM_ELEMENTS:
            launch(_quant_one_kernel, (1, 1), (x, stride, codes, scales, g, x if index is None else index, rows,
                                               out_rows, nblk),
                   {**tile, "HAS_INDEX": index is not None, **pdl.flag(x.device)}, num_warps=8)
            return codes, scales.view(torch.float8_e4m3fn), g
    if not have_g and not amax_ready:
        tile, warps = _tiling(rows, nblk)
        launch(_amax_kernel, _grid(rows, nblk, tile), (x, stride, amax_bits, rows, nblk,
                                                       x if valid is None else valid),
               {**tile, "HAS_VALID": valid is not None, **pdl.flag(x.device)}, num_warps=warps)
        if amax_reduce is not None:  # (|x| >= 0: its float32 bits order as int32 bits, which the kernel maxes)
            amax_reduce(amax_bits.view(torch.float32))
    g_in = global_scale.to(torch.float32).reshape(1) if have_g else g
    op_blocks = k_pad // BLOCK_SIZE if operand else nblk
    tile, warps = _tiling(out_rows, op_blocks)
    # (at least one program, also for no rows: program 0 writes the global scale)
    launch(_quant_kernel, _grid(out_rows, op_blocks, tile),
           (x, stride, g_in, amax_bits, codes, scales, g, x if index is None else index, out_rows, nblk,
            x if valid is None else valid, k_pad or 0, op_blocks),
           {"HAVE_G": have_g, **tile, "HAS_INDEX": index is not None, "HAS_VALID": valid is not None,
            "OPERAND": operand, **pdl.flag(x.device)}, num_warps=warps)
    if operand:
        return codes, g
    return codes, scales.view(torch.float8_e4m3fn), g
