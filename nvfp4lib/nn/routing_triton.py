"""The layer's routing and un-permute in one Triton launch each, for decode-sized steps on a CUDA device.

The torch forms (:mod:`.routing`) are about 7 kernels for the routing (a stable argsort, a search, a scatter) and 5
for the un-permute (a gather, casts, a product, a sum). Inside a CUDA graph each still costs ~2 µs of GPU time: at
T = 1 that is ~30 µs of a layer whose GEMMs take ~30-120 µs. Here:

- :func:`route_triton`: one program sorts the copies' keys (expert, copy index) with ``tl.sort`` (a stable sort by
  expert: the index is part of the key), so a copy's packed row is its key's position, and counts the copies per
  expert with ``tl.histogram`` (the offsets: its exclusive prefix sum). Its outputs are the torch form's, element for
  element. It takes N = T·k <= :data:`ROUTE_MAX_COPIES` copies (a sort of N keys in one program); larger steps keep
  the torch form. It also routes an expert-parallel rank's own copies (:func:`.routing.route_local`: ids read in
  place with a row stride, other ranks' copies sorted last with row -1). History: its first form ranked every copy
  against every other (O(N²)); on the H100 (with a limit of 1024) that was ~15-20 µs slower than the torch form at
  N = 512 and ~600 µs slower at N = 1024, so its limit was 128; at N <= 64 it saved most of the ~30 µs that the
  layer's routing and un-permute cost. A counting form (one-hot blocks of 32 copies in a loop, the limit 1024)
  followed; in the first EP run (2x H100) the all-gather dispatch at T = 64 per rank (N = 1024) took 79-122 µs
  against 23 µs at T = 1, most of it that loop. With the sort form (predicted ~5-10 µs at N = 1024) that dispatch
  took 28.5 µs (Qwen3-like, was 78.9) and 39.0 µs (DeepSeek-like, was 107.5) at T = 64, 21-25 µs at T = 1 (2x H100,
  W4A16; notebook 13). On the single-GPU layer against the torch form at 128 < N <= 1024 (``moe-bench
  --route-max-copies 128 1024``, an H200, notebook 11): Qwen3-like T = 64 and 128 17-18% faster, DeepSeek-like
  within 5% but T = 128 W4A4 (5% faster);
- :func:`route_gather_triton` (:data:`.routing.ROUTE_GATHER`, W4A16's step): the routing and the gather of x's rows in
  packed order in one launch. One program per (copy, column block) finds its copy's packed row by counting the copies
  before it in (expert, copy) order, an O(T·k) count over the step's expert ids that every program repeats; program 0
  also writes the offsets, and, launched chained, lets the next kernel launch only after them (the serving GEMM reads
  the offsets before its wait: :mod:`nvfp4lib.kernels.common.pdl`). The same outputs as :func:`route_triton` then
  :func:`gather_rows_triton`;
- :func:`gather_rows_triton` and :func:`pack_rows_triton`: a row copy per program (column blocks of 32-bit words),
  the gather skipping negative indices; the pack writes the all-gather transport's send rows (payload, expert ids,
  weights, then padding rows) in one launch instead of two concatenations and two casts;
- :func:`put_rows_triton`: the expert-parallel symm-mem transport's row writes (:func:`.ep_symm.put_rows`): one
  program per (row, column block) reads its destination rank and row and writes the row there, into that peer's
  buffer by address; rows with no destination are skipped;
- :func:`unpermute_triton`: one program per (token, column block) sums its k weighted copies in fp32 in the order
  j = 0 .. k-1 and writes the caller's dtype. Deterministic; its rounding may differ from the torch form's sum in the
  last bit of fp32 (a different order of the same k products).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..kernels.common import pdl
from ..kernels.common.pdl_triton import chain
from ..kernels.common.triton_launch import launch
from . import quant
from .quant_triton import _tile, _tile_amax

__all__ = ["ROUTE_MAX_COPIES", "route_triton", "route_gather_triton", "unpermute_triton",
           "gather_rows_triton", "pack_rows_triton", "put_rows_triton", "word_rows", "copy_row"]

ROUTE_MAX_COPIES = 1024
_MAX_EXPERTS = 1023  # offsets [E+1] in one block of at most 1024
_BN = 256  # output columns per un-permute program
_GATHER_BN = 1024  # elements (32-bit words where rows are whole words) per gather program
_PACK_BW = 1024  # 32-bit words per pack program


@triton.jit
def _groups(ids, stride, n, experts, base, K: tl.constexpr, N_P2: tl.constexpr):
    """(copy index, mask of the real copies, each copy's group): its expert id minus ``base``, a copy outside
    ``[base, base + experts)`` in the sink group ``experts``."""
    i = tl.arange(0, N_P2)
    mi = i < n
    e = tl.load(ids + (i // K).to(tl.int64) * stride + i % K, mask=mi, other=0).to(tl.int32) - base
    return i, mi, tl.where((e >= 0) & (e < experts), e, experts)


@triton.jit
def _store_offsets(e, mi, offsets, experts, E_P2: tl.constexpr):
    """The offsets ``[experts + 1]``: the copies per group, exclusive prefix sum. Returns the group index vector."""
    count = tl.histogram(e, E_P2, mask=mi)
    g = tl.arange(0, E_P2)
    tl.store(offsets + g, tl.cumsum(count, axis=0) - count, mask=g <= experts)
    return g


@triton.jit
def _route_kernel(ids, stride, token, row, offsets, n, experts, base, clear, x, x_stride, x_rows, nblk, amax_out,
                  CLEAR: tl.constexpr, K: tl.constexpr, N_P2: tl.constexpr, E_P2: tl.constexpr, AMAX_R: tl.constexpr,
                  AMAX_CB: tl.constexpr, GDC: tl.constexpr):
    chain(GDC)
    if CLEAR > 0:  # zero the caller's words (the layer's amax words: no fill kernel)
        c = tl.arange(0, 16)
        tl.store(clear + c, tl.zeros([16], dtype=tl.int32), mask=c < CLEAR)
    if AMAX_R > 0:  # amax(|x|) as the quantizer's amax launch finds it, its float bits in the caller's word
        ev, od, ok, r, b, j = _tile(x, x_stride, x_rows, nblk, AMAX_R, AMAX_CB, x, False)
        tl.store(amax_out, _tile_amax(ev, od).to(tl.int32, bitcast=True))
    i, mi, e = _groups(ids, stride, n, experts, base, K, N_P2)
    _store_offsets(e, mi, offsets, experts, E_P2)
    # the stable sort: keys (group, copy) sorted in one program; a copy's packed row is its key's position
    key = tl.sort(tl.where(mi, e, E_P2) * N_P2 + i)
    src = key % N_P2
    own = key // N_P2 < experts
    tl.store(row + src, tl.where(own, i, -1).to(tl.int64), mask=mi)
    tl.store(token + i, tl.where(own, src // K, -1).to(tl.int64), mask=mi)


@triton.jit
def _route_gather_kernel(ids, stride, token, row, offsets, x, x_stride, out, cols, n, experts, K: tl.constexpr,
                         N_P2: tl.constexpr, E_P2: tl.constexpr, BN: tl.constexpr, GDC: tl.constexpr):
    # Chained (GDC), program 0 lets the next kernel launch only once the offsets are written: the GEMM after it reads
    # them before its own wait (kernels.common.pdl); the other programs let it launch at once, as chain() does.
    if GDC:
        tl.extra.cuda.gdc_wait()
    p = tl.program_id(0)
    i, mi, e = _groups(ids, stride, n, experts, 0, K, N_P2)
    if (p == 0) & (tl.program_id(1) == 0):
        g = _store_offsets(e, mi, offsets, experts, E_P2)
        if GDC:
            tl.debug_barrier()  # every thread's offsets stored, then made visible to the GPU before the launch
            tl.inline_asm_elementwise("fence.acq_rel.gpu;\nmov.b32 $0, $1;", "=r,r", [g], dtype=tl.int32,
                                      is_pure=False, pack=1)
            tl.extra.cuda.gdc_launch_dependents()
    elif GDC:
        tl.extra.cuda.gdc_launch_dependents()
    ep = tl.load(ids + (p // K).to(tl.int64) * stride + p % K).to(tl.int32)
    ep = tl.where((ep >= 0) & (ep < experts), ep, experts)
    # this copy's packed row: the copies before it in (expert, copy) order, as route_triton's stable sort places it
    rank = tl.sum((((e < ep) | ((e == ep) & (i < p))) & mi).to(tl.int32), axis=0)
    own = ep < experts
    if tl.program_id(1) == 0:
        tl.store(row + p, tl.where(own, rank, -1).to(tl.int64))
        tl.store(token + rank, tl.where(own, p // K, -1).to(tl.int64))
    if own:
        c = tl.program_id(1) * BN + tl.arange(0, BN)
        m = c < cols
        src = (p // K).to(tl.int64) * x_stride
        tl.store(out + rank.to(tl.int64) * cols + c, tl.load(x + src + c, mask=m), mask=m)


@triton.jit
def _unpermute_kernel(y, row, w, w_stride, fits, out, cols, K: tl.constexpr, BN: tl.constexpr,
                      HAS_FITS: tl.constexpr, GDC: tl.constexpr):
    chain(GDC)
    t = tl.program_id(0)
    c = tl.program_id(1) * BN + tl.arange(0, BN)
    m = c < cols
    acc = tl.zeros([BN], dtype=tl.float32)
    for j in tl.static_range(K):
        r = tl.load(row + t * K + j)
        wt = tl.load(w + t.to(tl.int64) * w_stride + j).to(tl.float32)
        if HAS_FITS:  # a copy that did not fit its owner is lost: row -1, weight NaN
            lost = tl.load(fits + tl.maximum(r, 0)) == 0
            r = tl.where(lost, -1, r)
            wt = tl.where(lost, float("nan"), wt)
        acc += tl.load(y + r * cols + c, mask=m & (r >= 0), other=0.0).to(tl.float32) * wt  # row < 0: 0 · wt
    tl.store(out + t.to(tl.int64) * cols + c, acc.to(out.dtype.element_ty), mask=m)


@triton.jit
def _gather_rows_kernel(x, x_stride, index, out, cols, BN: tl.constexpr, GDC: tl.constexpr):
    chain(GDC)
    r = tl.program_id(0)
    src = tl.load(index + r).to(tl.int64)
    if src >= 0:  # a negative index: the row is left as it is
        c = tl.program_id(1) * BN + tl.arange(0, BN)
        m = c < cols
        tl.store(out + r.to(tl.int64) * cols + c, tl.load(x + src * x_stride + c, mask=m), mask=m)


@triton.jit
def _pack_rows_kernel(a, b, ids, w, out, t, wa, wb, words, K: tl.constexpr, BW: tl.constexpr):
    r = tl.program_id(0)
    c = tl.program_id(1) * BW + tl.arange(0, BW)
    live = r < t
    r64 = r.to(tl.int64)
    in_b = (c >= wa) & (c < wa + wb)
    j = c - wa - wb
    in_ids = (j >= 0) & (j < K)
    in_w = (j >= K) & (j < 2 * K)
    v = tl.load(a + r64 * wa + c, mask=(c < wa) & live, other=0)
    v = tl.where(in_b, tl.load(b + r64 * wb + (c - wa), mask=in_b & live, other=0), v)
    v = tl.where(in_ids, tl.load(ids + r64 * K + j, mask=in_ids & live, other=-1).to(tl.int32), v)
    wt = tl.load(w + r64 * K + (j - K), mask=in_w & live, other=0.0).to(tl.float32)
    v = tl.where(in_w, wt.to(tl.int32, bitcast=True), v)
    tl.store(out + r64 * words + c, v, mask=c < words)


def _words(x: torch.Tensor) -> torch.Tensor | None:
    """``x`` (2-D, unit column stride) as 32-bit words, or None where its rows or row stride are not whole words."""
    size = x.element_size()
    if x.stride(-1) != 1 or (x.shape[-1] * size) % 4 or (x.stride(0) * size) % 4 or x.data_ptr() % 4:
        return None
    return x.view(torch.int32) if x.dtype != torch.int32 else x


def gather_rows_triton(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``x[index]`` for a 2-D ``x`` (any row stride) and a 1-D integer ``index`` in one launch (torch's index_select
    took a generic ~3.7 µs kernel for 8 bf16 rows of 2048 on the H200, moe-bench --profile); a row whose index is
    negative is left unwritten. Rows move as 32-bit words where they are whole words. Indices are not checked."""
    rows, cols = index.numel(), x.shape[1]
    out = torch.empty((rows, cols), dtype=x.dtype, device=x.device)
    if x.stride(-1) != 1:
        x = x.contiguous()
    src, dst = _words(x), _words(out)
    if src is None or dst is None:
        src, dst = x, out
    if rows and cols:
        launch(_gather_rows_kernel, (rows, triton.cdiv(dst.shape[1], _GATHER_BN)),
               (src, src.stride(0), index, dst, dst.shape[1]), {"BN": _GATHER_BN, **pdl.flag(x.device)})
    return out


def pack_rows_triton(parts: tuple[torch.Tensor, ...], topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                     capacity: int) -> torch.Tensor | None:
    """The expert-parallel send rows in one launch: uint8 ``[capacity, bytes]``, row t < T the payload ``parts``
    (one or two uint8 [T, ·] tensors, side by side), then ``topk_ids`` as int32 and ``topk_weights`` as fp32 bytes;
    rows T .. capacity-1 padding (zero payload and weights, expert ids -1). None where a part's rows are not whole
    32-bit words (the caller then packs with torch)."""
    t, k = topk_ids.shape
    if len(parts) not in (1, 2):
        raise ValueError(f"pack_rows_triton takes one or two payload parts, got {len(parts)}")
    words = [_words(p.contiguous()) for p in parts]
    if any(wd is None for wd in words):
        return None
    a, b = words[0], words[-1]
    wa, wb = a.shape[1], b.shape[1] if len(words) == 2 else 0
    total = wa + wb + 2 * k
    out = torch.empty((capacity, total), dtype=torch.int32, device=a.device)
    if capacity:
        launch(_pack_rows_kernel, (capacity, triton.cdiv(total, _PACK_BW)),
               (a, b, topk_ids.contiguous(), topk_weights.contiguous(), out, t, wa, wb, total),
               {"K": k, "BW": _PACK_BW})
    return out.view(torch.uint8)


def route_triton(topk_ids: torch.Tensor, experts: int, base: int = 0, clear: torch.Tensor | None = None,
                 amax_of=None):
    """(token int64 [T·k], offsets int32 [E+1], row int64 [T·k]) of :func:`.routing.route` (``base`` 0) or
    :func:`.routing.route_local` (the experts ``[base, base + E)``), in one launch. ``topk_ids``: an integer [T, k]
    tensor (any row stride, unit column stride) with T·k <= :data:`ROUTE_MAX_COPIES`, ``experts`` <= 1023.
    ``clear``: an int32 tensor of at most 16 contiguous words the launch also zeroes (one fill kernel less).
    ``amax_of``: ``(x, word)``, the launch also writes amax(|x|)'s float32 bits into the int32 word (x 2-D with unit
    column stride whose :func:`.routing.amax_tile` is not None; the word not among ``clear``'s): the dynamic quantizer's
    amax launch, :data:`.routing.AMAX_IN_ROUTE`."""
    if clear is not None and (clear.dtype != torch.int32 or clear.numel() > 16 or not clear.is_contiguous()):
        raise ValueError(f"route_triton: clear must be at most 16 contiguous int32 words, got {clear.dtype} "
                         f"{tuple(clear.shape)}")
    xa, word, tile = (None, None, (0, 0)) if amax_of is None else (*amax_of, quant.amax_tile(amax_of[0]))
    if tile is None:
        raise ValueError(f"route_triton: amax_of's x {tuple(xa.shape)} is not a 2-D tensor of whole 16-column blocks "
                         "that fits the routing program's amax tile (routing.AMAX_ROUTE_ELEMENTS)")
    ids, t, k, token, offsets, row = _routing_outputs(topk_ids, experts, "route_triton",
                                                      "routing.route, which picks the torch form for larger steps")
    n, dev = t * k, ids.device
    if n:
        launch(_route_kernel, (1,), (ids, ids.stride(0) if t > 1 else k, token, row, offsets, n, experts, base,
                                     offsets if clear is None else clear, offsets if xa is None else xa,
                                     0 if xa is None else xa.stride(0), 0 if xa is None else xa.shape[0],
                                     0 if xa is None else xa.shape[1] // 16, offsets if word is None else word),
               {"CLEAR": 0 if clear is None else clear.numel(), "K": k, "N_P2": max(16, triton.next_power_of_2(n)),
                "E_P2": triton.next_power_of_2(experts + 1), "AMAX_R": tile[0], "AMAX_CB": tile[1],
                **pdl.flag(dev)}, num_warps=8)
    else:
        offsets.zero_()
        if clear is not None:
            clear.zero_()
        if word is not None:
            word.copy_(quant.amax_of(xa).view(torch.int32))
    return token, offsets, row


def _routing_outputs(topk_ids: torch.Tensor, experts: int, who: str, instead: str):
    """(ids with unit column stride, T, k, token, offsets, row): a one-launch routing's checked input and its empty
    outputs (``who`` and ``instead``: the caller and what to call for a step past the limits, named in the error)."""
    t, k = topk_ids.shape
    n = t * k
    if n > ROUTE_MAX_COPIES or experts > _MAX_EXPERTS:
        raise ValueError(f"{who}: {n} copies over {experts} experts; at most {ROUTE_MAX_COPIES} copies and "
                         f"{_MAX_EXPERTS} experts (use {instead})")
    ids = topk_ids if topk_ids.stride(-1) == 1 else topk_ids.contiguous()
    dev = ids.device
    return (ids, t, k, torch.empty(n, dtype=torch.int64, device=dev),
            torch.empty(experts + 1, dtype=torch.int32, device=dev), torch.empty(n, dtype=torch.int64, device=dev))


def route_gather_triton(topk_ids: torch.Tensor, experts: int, x: torch.Tensor):
    """(token, offsets, row, rows): :func:`route_triton`'s outputs (``base`` 0) and ``x[token]`` (a row whose token is
    negative left unwritten: a copy routed outside ``[0, experts)``), in one launch. ``topk_ids``: as
    :func:`route_triton` takes it; ``x``: 2-D ``[T, H]``, any row stride (copied where its columns are not unit-
    stride); rows move as 32-bit words where they are whole words."""
    ids, t, k, token, offsets, row = _routing_outputs(topk_ids, experts, "route_gather_triton",
                                                      "routing.route_gather, which picks the two-step form")
    n, dev = t * k, ids.device
    if x.dim() != 2 or x.shape[0] != t:
        raise ValueError(f"route_gather_triton: x must be [T={t}, H], got {tuple(x.shape)}")
    if x.stride(-1) != 1:
        x = x.contiguous()
    out = torch.empty((n, x.shape[1]), dtype=x.dtype, device=dev)
    src, dst = _words(x), _words(out)
    if src is None or dst is None:
        src, dst = x, out
    if n:
        launch(_route_gather_kernel, (n, max(1, triton.cdiv(dst.shape[1], _GATHER_BN))),
               (ids, ids.stride(0) if t > 1 else k, token, row, offsets, src, src.stride(0), dst, dst.shape[1], n,
                experts),
               {"K": k, "N_P2": max(16, triton.next_power_of_2(n)), "E_P2": triton.next_power_of_2(experts + 1),
                "BN": _GATHER_BN, **pdl.flag(dev)})
    else:
        offsets.zero_()
    return token, offsets, row, out


def unpermute_triton(y: torch.Tensor, row: torch.Tensor, topk_weights: torch.Tensor, out_dtype,
                     fits: torch.Tensor | None = None) -> torch.Tensor:
    """``out[t] = Σ_j topk_weights[t, j] · y[row[t·k + j]]`` in fp32, ``[T, N]`` of ``out_dtype``, in one launch; a
    copy whose ``row`` is negative adds ``0 · topk_weights[t, j]`` (:func:`.routing.weighted_rows`). ``topk_weights``
    may have any row stride (the expert-parallel combine reads them in place from the gathered rows). ``fits``: int8
    per row of ``y``; a copy whose row has 0 there is lost and adds NaN (the symm-mem combine's lost copies)."""
    t, k = topk_weights.shape
    cols = y.shape[-1]
    out = torch.empty((t, cols), dtype=out_dtype, device=y.device)
    w = topk_weights if topk_weights.stride(-1) == 1 else topk_weights.contiguous()
    if t and cols:
        launch(_unpermute_kernel, (t, triton.cdiv(cols, _BN)),
               (y.contiguous(), row, w, w.stride(0) if t > 1 else k, row if fits is None else fits, out, cols),
               {"K": k, "BN": _BN, "HAS_FITS": fits is not None, **pdl.flag(y.device)})
    return out


_PUT_BN = 1024  # 32-bit words per put_rows program


@triton.jit
def _put_rows_kernel(src, src_index, dst_rank, dst_row, peer_ptrs, cols, BN: tl.constexpr):
    i = tl.program_id(0)
    row = tl.load(dst_row + i).to(tl.int64)
    if row >= 0:
        copy_row(src, tl.load(src_index + i).to(tl.int64), tl.load(peer_ptrs + tl.load(dst_rank + i)), row, cols, BN)


def word_rows(x: torch.Tensor, what: str) -> torch.Tensor:
    """``x``'s rows as 32-bit words (contiguous), for the kernels that move whole rows by address (``what`` names the
    caller in the error where its rows are not whole words)."""
    x = x.contiguous()
    words = _words(x)
    if words is None:
        raise ValueError(f"{what} moves rows as 32-bit words: a row of {x.shape[-1]} x {x.element_size()} bytes (or "
                         "its address) is not a multiple of 4")
    return words


@triton.jit
def copy_row(src, s, dst, row, cols, BN: tl.constexpr):
    """This program's column block (``program_id(1)``) of row ``s`` of ``src`` (32-bit words, ``cols`` a row) into
    row ``row`` of the buffer at address ``dst`` (an int64, rows as ``src``'s): the row writes of
    :func:`put_rows_triton` and of the symm-mem transport's Triton form (:mod:`.ep_symm_triton`)."""
    c = tl.program_id(1) * BN + tl.arange(0, BN)
    m = c < cols
    d = dst.to(tl.pointer_type(src.dtype.element_ty), bitcast=True)
    tl.store(d + row * cols + c, tl.load(src + s * cols + c, mask=m), mask=m)


def put_rows_triton(src: torch.Tensor, src_index: torch.Tensor, dst_rank: torch.Tensor, dst_row: torch.Tensor,
                    peer_ptrs: torch.Tensor) -> None:
    """``peer[dst_rank[i]][dst_row[i]] = src[src_index[i]]`` for every i with ``dst_row[i] >= 0``, in one launch.
    ``peer_ptrs``: int64 [W], the address of each peer's buffer, every buffer row-major with ``src``'s row size in
    bytes (a multiple of 4: the rows move as 32-bit words) and valid for the rows written. Nothing is checked here:
    the transport's own indices are in range by construction."""
    n = dst_row.numel()
    words = word_rows(src, "put_rows_triton")
    cols = words.shape[-1]
    if n and cols:
        launch(_put_rows_kernel, (n, triton.cdiv(cols, _PUT_BN)), (words, src_index, dst_rank, dst_row, peer_ptrs,
                                                                   cols), {"BN": _PUT_BN})
