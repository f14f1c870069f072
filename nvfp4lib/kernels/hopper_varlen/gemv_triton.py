"""Decode-sized MoE steps as weight-streaming GEMVs (Triton), read from the serving kernel's packed weights.

Not taken by default: on the H100 these GEMVs ran 1.09-6.59x slower than the grouped GEMM path on the MoE bench's
decode cases (the recorded A/B, notebook 11's rounds; :data:`nvfp4lib.nn.moe_gemv.GEMV_MAX_TOKENS`). Kept, tested
and memchecked as a knob for the next A/B.

At a few tokens per step the grouped GEMM (:mod:`.kernel`) is bound neither by bandwidth nor by its tensor cores: an
H200 kernel profile of the Qwen3-like layer at T = 1 (2026-11-27, ``moe-bench --profile``) put its gate/up GEMM at
15.0 µs and its down GEMM at 8.2 µs for 12.6 and 6.3 MB of weights (~0.8 TB/s), one CTA per 64-128 weight rows
streaming its whole K at ~12 GB/s, with fewer CTAs than the GPU has room for. Here each program multiplies one token
copy's activations with a slice of its expert's rows over a slice of K, on CUDA cores in fp32, so a step launches as
many programs as it needs to keep the memory system busy (the ``split`` of K multiplies them).

It reads the weights where the serving kernel keeps them (:class:`~.runner.PackedWeights`: no second copy). A
prepacked unit is 64 rows × 64 K of one matrix, 2048 code bytes then 256 scale bytes
(:mod:`nvfp4lib.kernels.hopper_rs.layout`). Viewed as ``[32, 64]`` bytes, the byte at ``[8w + g, 16c + 4j + 2e + h']``
holds two codes of row ``16w + 8(1 - h') + g``: ``x`` (bits 1-3, sign 7) at K column ``16j + 2c + e`` and ``y`` (bits
4-6, sign 0) at column ``16j + 8 + 2c + e``; the row's block scale for columns ``16j .. 16j + 15`` is scale byte
``8(8w + g) + 2j + (1 - h')``. Each code becomes an fp16 worth ``e2m1 · 2^-14`` by moving its bits (exact), then fp32;
a product with a bf16 activation, or with an NVFP4 activation's ``e2m1 · scale``, is exact in fp32. The sums run in
fp32 (per row: over the 4 values ``c``, then times the block scale, then over ``j`` and ``e``, then over the units
of K), so a result differs from the GEMM's only in the order of its fp32 sums; the weights' ``gs_b`` (the global
scale times 2^14) and the activations' global scale multiply the total. Weights packed for bf16 activations in their
own word layout (``PackedWeights.own_words``: :func:`~nvfp4lib.kernels.hopper_rs.layout.a16_words`) are read as words
and their codes put back in the bytes above, in registers.

Three launches per layer step, none of them routing: the copy ``r = t·k + j`` of token ``t`` goes to expert
``topk_ids[t, j]``, read in the kernel.

- gate/up (:func:`gemv`, dual weights): fp32 partial sums ``[split, R, 2, I]`` of the gate and up rows;
- down: its activations are the intermediate ``bf16(silu(Σ gate) · Σ up)`` of the copy, formed from those partials
  as it loads them (W4A16), or the NVFP4 intermediate (W4A4: :func:`finalize` writes it in bf16 for the caller's
  quantizer); fp32 partials ``[split, R, H]``;
- :func:`combine`: ``out[t] = Σ_j topk_weights[t, j] · Σ_s y[s, t·k + j]`` in fp32, summed in a fixed order.

Nothing reads a value back to the host, so a step is captured in a CUDA graph as it is.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ..common.triton_launch import launch
from ..hopper_rs.layout import A16_OWN_SHIFTS

__all__ = ["GemvWeights", "gemv_weights", "gemv", "finalize", "combine", "ACT_BF16", "ACT_NVFP4", "ACT_PARTIALS"]

UNIT = 2304  # bytes of one 64 × 64 unit: 2048 codes, 256 scales
ACT_BF16, ACT_NVFP4, ACT_PARTIALS = 0, 1, 2  # what a GEMV's activations are (the ACT constexpr)
_BN = 256  # output columns per combine / finalize program


class GemvWeights(NamedTuple):
    """What a GEMV needs of packed weights: ``packed`` (uint8, ``[ctas, K_pad/64, units, 2304]`` in any view),
    ``gs_b`` (fp32 ``[G, 2]``: each matrix's global scale × 2^14, gate and up for dual weights), ``n`` rows and ``k``
    columns per matrix, ``k_pad``, ``tile_m`` (rows of one matrix per CTA block), ``dual``, ``groups``."""

    packed: torch.Tensor
    gs_b: torch.Tensor
    n: int
    k: int
    k_pad: int
    tile_m: int
    dual: bool
    groups: int
    own_words: bool = False  # the code words in W4A16's own layout (PackedWeights.own_words)

    @property
    def units(self) -> int:
        """64-row units per CTA block (both matrices' for dual weights)."""
        return self.tile_m // 64 * (2 if self.dual else 1)

    @property
    def blocks(self) -> int:
        """CTA blocks per group."""
        return -(-self.n // self.tile_m)


def gemv_weights(pw) -> GemvWeights:
    """The :class:`GemvWeights` of a :class:`~.runner.PackedWeights`."""
    return GemvWeights(pw.packed, pw.gs_b, pw.n, pw.k, pw.k_pad, pw.tile_m, pw.dual, pw.groups, bool(pw.own_words))


# each fragment register's (sign, magnitude) shifts in W4A16's own word layout (layout.A16_OWN_SHIFTS)
(_S0, _M0), (_S1, _M1), (_S2, _M2), (_S3, _M3) = [tuple(tl.constexpr(v) for v in sh) for sh in A16_OWN_SHIFTS]


@triton.jit
def _own_code(word, sign: tl.constexpr, mag: tl.constexpr, h: tl.constexpr):
    """The 4-bit code (sign at bit 3) of one register half of own-layout words: sign at bit 15 + h - sign, magnitude at
    6 + h - mag and up (layout.a16_words)."""
    return (((word >> (15 + h - sign)) & 1) << 3) | ((word >> (6 + h - mag)) & 7)


@triton.jit
def _byte(x, y):
    """As layout._byte: x at bits 1-3 (+ sign at 7), y at bits 4-6 (+ sign at 0)."""
    return ((x & 7) << 1) | ((x >> 3) << 7) | (y >> 3) | ((y & 7) << 4)


@triton.jit
def _fp16_word(word):
    """Own-layout code words -> the same codes as the fp16 path's bytes place them (byte b: x and y of row g + 8 for
    even b, of row g for odd, K column parity b // 2; x: registers 0/1, y: 2/3)."""
    b0 = _byte(_own_code(word, _S1, _M1, 0), _own_code(word, _S3, _M3, 0))
    b1 = _byte(_own_code(word, _S0, _M0, 0), _own_code(word, _S2, _M2, 0))
    b2 = _byte(_own_code(word, _S1, _M1, 16), _own_code(word, _S3, _M3, 16))
    b3 = _byte(_own_code(word, _S0, _M0, 16), _own_code(word, _S2, _M2, 16))
    return b0 | (b1 << 8) | (b2 << 16) | (b3 << 24)


@triton.jit
def _code_f32(bits):
    """fp16 bit patterns (int32, low 16 bits) -> fp32."""
    return bits.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _silu_up(part, row, cols, m, R, HALF, SPLIT: tl.constexpr):
    """``silu(Σ_s gate) · Σ_s up`` (fp32) of copy ``row`` at intermediate columns ``cols`` of gate/up partials
    ``[SPLIT, R, 2, HALF]`` (zero where ``m`` is false)."""
    g = tl.zeros(cols.shape, dtype=tl.float32)
    u = tl.zeros(cols.shape, dtype=tl.float32)
    for s in tl.static_range(SPLIT):
        base = (s * R + row).to(tl.int64) * (2 * HALF)
        g += tl.load(part + base + cols, mask=m, other=0.0)
        u += tl.load(part + base + HALF + cols, mask=m, other=0.0)
    return g / (1.0 + tl.exp(-g)) * u


@triton.jit
def _act(act, act_sc, part, row, kk, K, ACT: tl.constexpr, SPLIT_IN: tl.constexpr, R, HALF: tl.constexpr):
    """The activations of one copy at K columns ``kk`` (fp32; zero past K)."""
    m = kk < K
    if ACT == 0:  # bf16 rows
        v = tl.load(act + row * K + kk, mask=m, other=0.0).to(tl.float32)
    elif ACT == 1:  # NVFP4 rows: e2m1 · block scale (the global scale multiplies the total)
        byte = tl.load(act + row * (K // 2) + kk // 2, mask=m, other=0).to(tl.int32)
        nib = (byte >> ((kk & 1) * 4)) & 0xF
        mag = _code_f32(((nib & 7) << 9) | ((nib & 8) << 12)) * 16384.0
        sc = tl.load(act_sc + row * (K // 16) + kk // 16, mask=m, other=0).to(tl.float8e4nv, bitcast=True)
        v = mag * sc.to(tl.float32)
    else:  # the gate/up partials of the copy: bf16(silu(gate) · up)
        v = _silu_up(part, row, kk, m, R, HALF, SPLIT_IN).to(tl.bfloat16).to(tl.float32)
    return v


@triton.jit
def _gemv_kernel(w, gs_b, ids, act, act_sc, act_gs, part, out, R, K, N, KC, BLOCKS, ROW_DIV,
                 CHUNKS: tl.constexpr, U: tl.constexpr, DUAL: tl.constexpr, ACT: tl.constexpr,
                 SPLIT_IN: tl.constexpr, HALF_IN: tl.constexpr, HAS_GS: tl.constexpr, OWN: tl.constexpr):
    r = tl.program_id(0)  # the token copy (fastest: copies of one expert's block run side by side and share L2)
    cb = tl.program_id(1)  # the CTA block of its expert
    s = tl.program_id(2)  # the slice of K
    e = tl.load(ids + r).to(tl.int64)
    arow = r // ROW_DIV
    ru = tl.arange(0, U * 32)  # (unit, w, g)
    i = tl.arange(0, 64)  # (c, j, e, h')
    # K column of each byte's x code within a 64-column unit (y: + 8), and the scale byte of (row, j)
    kx = 16 * ((i >> 2) & 3) + 2 * (i >> 4) + ((i >> 1) & 1)
    i16 = tl.arange(0, 16)  # (j, e, h')
    sc_off = (ru % 32)[:, None] * 8 + 2 * (i16 >> 2)[None, :] + (1 - (i16 & 1))[None, :] + 2048
    unit_off = (ru // 32).to(tl.int64) * 2304
    cta = e * BLOCKS + cb
    acc = tl.zeros([U * 32, 2], dtype=tl.float32)
    k0 = s * CHUNKS
    for step in range(CHUNKS):  # (split divides KC; a constexpr: Triton 3.6's interpreter fails on runtime bounds)
        kc = k0 + step
        base = ((cta * KC + kc) * U) * 2304
        if OWN:  # 16 words per row: word 4c + j
            row0 = (w + base + unit_off[:, None] + (ru % 32)[:, None] * 64).to(tl.pointer_type(tl.int32))
            words = _fp16_word(tl.load(row0 + tl.arange(0, 16)[None, :]))
            b = tl.reshape((words[:, :, None] >> (8 * tl.arange(0, 4))[None, None, :]) & 0xFF, [U * 32, 64])
        else:
            b = tl.load(w + base + unit_off[:, None] + (ru % 32)[:, None] * 64 + i[None, :]).to(tl.int32)
        xv = _code_f32(((b & 0x8E) << 8))
        yv = _code_f32(((b & 0x70) << 5) | ((b & 1) << 15))
        ax = _act(act, act_sc, part, arow, kc * 64 + kx, K, ACT, SPLIT_IN, R, HALF_IN)
        ay = _act(act, act_sc, part, arow, kc * 64 + kx + 8, K, ACT, SPLIT_IN, R, HALF_IN)
        p = xv * ax[None, :] + yv * ay[None, :]
        p = tl.sum(tl.reshape(p, [U * 32, 4, 16]), axis=1)  # over c: [(u, w, g), (j, e, h')]
        sc = tl.load(w + base + unit_off[:, None] + sc_off).to(tl.float8e4nv, bitcast=True).to(tl.float32)
        acc += tl.sum(tl.reshape(p * sc, [U * 32, 8, 2]), axis=1)  # over (j, e): [(u, w, g), h']
    # rows: unit u, row 16w + 8(1 - h') + g of it
    hp = tl.arange(0, 2)
    unit = ru // 32
    rin = 16 * ((ru % 32) // 8) + (ru % 8)
    if DUAL:
        half = unit // (U // 2)  # 0: gate, 1: up
        n = cb * (U // 2) * 64 + (unit % (U // 2)) * 64 + rin
        scale = tl.load(gs_b + e * 2 + half)
    else:
        half = unit * 0
        n = cb * U * 64 + unit * 64 + rin
        scale = tl.load(gs_b + e * 2 + half)
    if HAS_GS:
        scale = scale * tl.load(act_gs)
    rows = n[:, None] + 8 * (1 - hp)[None, :]
    val = acc * scale[:, None]
    width = N * (2 if DUAL else 1)
    dst = out + (s * R + r).to(tl.int64) * width + half[:, None] * N + rows
    tl.store(dst, val, mask=rows < N)


def gemv(weights: GemvWeights, topk_ids: torch.Tensor, act: torch.Tensor, *, act_scales=None, act_gs=None,
         partials=None, split: int = 1, num_warps: int = 4) -> torch.Tensor:
    """fp32 partial sums ``[split, R, N]`` (dual weights: ``[split, R, 2, N]``, gate then up) of every token copy
    ``r = t·k + j`` (R = T·k) against expert ``topk_ids[t, j]``'s rows, K cut into ``split`` slices (a divisor of
    ``k_pad / 64``).

    The activations: ``act`` bf16 ``[T, K]`` rows of the tokens (copy r reads row ``r // k``) when the weights are
    dual (gate/up), else of the copies ``[R, K]``; or, with ``act_scales`` (E4M3 ``[rows, K/16]``) and ``act_gs``
    (fp32 [1]), ``act`` holds NVFP4 codes ``[rows, K/2]``; or, with ``partials`` (the gate/up call's output), the
    intermediate is formed from them (``act`` ignored)."""
    t, k = topk_ids.shape
    r = t * k
    width = weights.n * (2 if weights.dual else 1)
    out = torch.empty((split, r, width), dtype=torch.float32, device=topk_ids.device)
    if r == 0:
        return out.view(split, r, 2, weights.n) if weights.dual else out
    kc = weights.k_pad // 64
    if split < 1 or kc % split:
        raise ValueError(f"split={split} must divide the {kc} units of 64 columns of K_pad={weights.k_pad}")
    chunks = kc // split
    a, sc, gs, part, split_in, half = act, act, act, out, 1, 0  # (unused arguments: any tensor)
    if partials is not None:
        mode, a, sc, gs, part, split_in, half = ACT_PARTIALS, partials, partials, partials, partials, \
            partials.shape[0], partials.shape[-1]
    elif act_scales is not None:
        mode, sc, gs = ACT_NVFP4, act_scales.view(torch.uint8), act_gs
    else:
        mode = ACT_BF16
    launch(_gemv_kernel, (r, weights.blocks, split),
           (weights.packed, weights.gs_b, topk_ids.reshape(-1), a, sc, gs, part, out, r, weights.k, weights.n, kc,
            weights.blocks, k if weights.dual else 1),
           {"CHUNKS": chunks, "U": weights.units, "DUAL": weights.dual, "ACT": mode, "SPLIT_IN": split_in,
            "HALF_IN": half, "HAS_GS": mode == ACT_NVFP4, "OWN": weights.own_words}, num_warps=num_warps)
    return out.view(split, r, 2, weights.n) if weights.dual else out


@triton.jit
def _finalize_kernel(part, h, R, HALF, SPLIT: tl.constexpr, BN: tl.constexpr):
    r = tl.program_id(0)
    c = tl.program_id(1) * BN + tl.arange(0, BN)
    m = c < HALF
    tl.store(h + r.to(tl.int64) * HALF + c, _silu_up(part, r, c, m, R, HALF, SPLIT).to(h.dtype.element_ty), mask=m)


def finalize(partials: torch.Tensor, out_dtype=torch.bfloat16) -> torch.Tensor:
    """The intermediate ``silu(Σ_s gate) · Σ_s up`` ``[R, I]`` of gate/up partials ``[split, R, 2, I]``."""
    split, r, _, half = partials.shape
    h = torch.empty((r, half), dtype=out_dtype, device=partials.device)
    if r:
        launch(_finalize_kernel, (r, triton.cdiv(half, _BN)), (partials, h, r, half), {"SPLIT": split, "BN": _BN})
    return h


@triton.jit
def _combine_kernel(y, w, out, T, R, COLS, K: tl.constexpr, SPLIT: tl.constexpr, BN: tl.constexpr):
    t = tl.program_id(0)
    c = tl.program_id(1) * BN + tl.arange(0, BN)
    m = c < COLS
    acc = tl.zeros([BN], dtype=tl.float32)
    for j in tl.static_range(K):
        v = tl.zeros([BN], dtype=tl.float32)
        for s in tl.static_range(SPLIT):
            v += tl.load(y + (s * R + t * K + j).to(tl.int64) * COLS + c, mask=m, other=0.0)
        acc += v * tl.load(w + t * K + j).to(tl.float32)
    tl.store(out + t.to(tl.int64) * COLS + c, acc.to(out.dtype.element_ty), mask=m)


def combine(y: torch.Tensor, topk_weights: torch.Tensor, out_dtype) -> torch.Tensor:
    """``out[t] = Σ_j topk_weights[t, j] · Σ_s y[s, t·k + j]`` (fp32, fixed order) ``[T, H]`` of ``out_dtype``."""
    split, r, cols = y.shape
    t, k = topk_weights.shape
    out = torch.empty((t, cols), dtype=out_dtype, device=y.device)
    if t and cols:
        launch(_combine_kernel, (t, triton.cdiv(cols, _BN)), (y, topk_weights.contiguous(), out, t, r, cols),
               {"K": k, "SPLIT": split, "BN": _BN})
    return out
