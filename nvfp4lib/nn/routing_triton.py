"""The layer's routing and un-permute in one Triton launch each, for decode-sized steps on a CUDA device.

The torch forms (:mod:`.routing`) are about 7 kernels for the routing (a stable argsort, a search, a scatter) and 5
for the un-permute (a gather, casts, a product, a sum). Inside a CUDA graph each still costs ~2 µs of GPU time: at
T = 1 that is ~30 µs of a layer whose GEMMs take ~30-120 µs. Here:

- :func:`route_triton`: one program ranks every token copy against every other (copy i goes to packed row
  #{j : e_j < e_i, or e_j = e_i and j < i}: the stable sort's position) and counts the copies below each expert (the
  offsets). Its outputs are the torch form's, element for element. O(N²) comparisons for N = T·k copies in one
  program, so it takes N <= :data:`ROUTE_MAX_COPIES` (T <= 16 at k = 8); larger steps keep the torch form. On the
  H100 (e48509f, limit 1024) it was ~15-20 µs slower than the torch form at N = 512 and ~600 µs slower at N = 1024;
  at N <= 64 it saved most of the ~30 µs that the layer's routing and un-permute cost;
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

from ..kernels.common.triton_launch import launch

__all__ = ["ROUTE_MAX_COPIES", "route_triton", "unpermute_triton", "gather_rows_triton", "put_rows_triton"]

ROUTE_MAX_COPIES = 128
_MAX_EXPERTS = 1023  # offsets [E+1] in one block of at most 1024
_BJ = 32  # copies compared per step
_BN = 256  # output columns per un-permute program
_GATHER_BN = 1024  # elements per gather program


@triton.jit
def _route_kernel(ids, token, row, offsets, n, experts, K: tl.constexpr, N_P2: tl.constexpr, E_P2: tl.constexpr,
                  BJ: tl.constexpr):
    i = tl.arange(0, N_P2)
    mi = i < n
    ei = tl.load(ids + i, mask=mi, other=0)
    e = tl.arange(0, E_P2)
    rank = tl.zeros([N_P2], dtype=tl.int32)
    below = tl.zeros([E_P2], dtype=tl.int32)
    for j0 in tl.static_range(0, N_P2, BJ):
        j = j0 + tl.arange(0, BJ)
        mj = j < n
        ej = tl.load(ids + j, mask=mj, other=0)
        first = (ej[None, :] < ei[:, None]) | ((ej[None, :] == ei[:, None]) & (j[None, :] < i[:, None]))
        rank += tl.sum((first & mj[None, :]).to(tl.int32), axis=1)
        below += tl.sum(((ej[None, :] < e[:, None]) & mj[None, :]).to(tl.int32), axis=1)
    tl.store(row + i, rank.to(tl.int64), mask=mi)
    tl.store(token + rank, (i // K).to(tl.int64), mask=mi)
    tl.store(offsets + e, below, mask=e <= experts)


@triton.jit
def _unpermute_kernel(y, row, w, out, cols, K: tl.constexpr, BN: tl.constexpr):
    t = tl.program_id(0)
    c = tl.program_id(1) * BN + tl.arange(0, BN)
    m = c < cols
    acc = tl.zeros([BN], dtype=tl.float32)
    for j in tl.static_range(K):
        r = tl.load(row + t * K + j)
        wt = tl.load(w + t * K + j).to(tl.float32)
        acc += tl.load(y + r * cols + c, mask=m & (r >= 0), other=0.0).to(tl.float32) * wt  # row < 0: 0 · wt
    tl.store(out + t.to(tl.int64) * cols + c, acc.to(out.dtype.element_ty), mask=m)


@triton.jit
def _gather_rows_kernel(x, index, out, cols, BN: tl.constexpr):
    r = tl.program_id(0)
    c = tl.program_id(1) * BN + tl.arange(0, BN)
    m = c < cols
    src = tl.load(index + r).to(tl.int64)
    tl.store(out + r.to(tl.int64) * cols + c, tl.load(x + src * cols + c, mask=m), mask=m)


def gather_rows_triton(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``x[index]`` for a 2-D ``x`` and a 1-D integer ``index`` in one launch (torch's index_select took a generic
    ~3.7 µs kernel for 8 bf16 rows of 2048 on the H200, moe-bench --profile). Indices are not checked."""
    x = x.contiguous()
    rows, cols = index.numel(), x.shape[1]
    out = torch.empty((rows, cols), dtype=x.dtype, device=x.device)
    if rows and cols:
        launch(_gather_rows_kernel, (rows, triton.cdiv(cols, _GATHER_BN)), (x, index, out, cols),
               {"BN": _GATHER_BN})
    return out


def route_triton(topk_ids: torch.Tensor, experts: int):
    """(token int64 [T·k], offsets int32 [E+1], row int64 [T·k]) of :func:`.routing.route`, in one launch.
    ``topk_ids`` an integer [T, k] tensor with T·k <= :data:`ROUTE_MAX_COPIES`, ``experts`` <= 1023."""
    t, k = topk_ids.shape
    n = t * k
    if n > ROUTE_MAX_COPIES or experts > _MAX_EXPERTS:
        raise ValueError(f"route_triton: {n} copies over {experts} experts; at most {ROUTE_MAX_COPIES} copies and "
                         f"{_MAX_EXPERTS} experts (use routing.route, which picks the torch form for larger steps)")
    ids = topk_ids.contiguous()
    dev = ids.device
    token = torch.empty(n, dtype=torch.int64, device=dev)
    row = torch.empty(n, dtype=torch.int64, device=dev)
    offsets = torch.empty(experts + 1, dtype=torch.int32, device=dev)
    if n:
        launch(_route_kernel, (1,), (ids, token, row, offsets, n, experts),
               {"K": k, "N_P2": max(_BJ, triton.next_power_of_2(n)), "E_P2": triton.next_power_of_2(experts + 1),
                "BJ": _BJ}, num_warps=8)
    else:
        offsets.zero_()
    return token, offsets, row


def unpermute_triton(y: torch.Tensor, row: torch.Tensor, topk_weights: torch.Tensor, out_dtype) -> torch.Tensor:
    """``out[t] = Σ_j topk_weights[t, j] · y[row[t·k + j]]`` in fp32, ``[T, N]`` of ``out_dtype``, in one launch; a
    copy whose ``row`` is negative adds ``0 · topk_weights[t, j]`` (:func:`.routing.weighted_rows`)."""
    t, k = topk_weights.shape
    cols = y.shape[-1]
    out = torch.empty((t, cols), dtype=out_dtype, device=y.device)
    if t and cols:
        launch(_unpermute_kernel, (t, triton.cdiv(cols, _BN)), (y.contiguous(), row, topk_weights.contiguous(), out,
                                                                 cols), {"K": k, "BN": _BN})
    return out


_PUT_BN = 1024  # 32-bit words per put_rows program


@triton.jit
def _put_rows_kernel(src, src_index, dst_rank, dst_row, peer_ptrs, cols, BN: tl.constexpr):
    i = tl.program_id(0)
    row = tl.load(dst_row + i).to(tl.int64)
    if row >= 0:
        c = tl.program_id(1) * BN + tl.arange(0, BN)
        m = c < cols
        s = tl.load(src_index + i).to(tl.int64)
        dst = tl.load(peer_ptrs + tl.load(dst_rank + i)).to(tl.pointer_type(src.dtype.element_ty), bitcast=True)
        tl.store(dst + row * cols + c, tl.load(src + s * cols + c, mask=m), mask=m)


def put_rows_triton(src: torch.Tensor, src_index: torch.Tensor, dst_rank: torch.Tensor, dst_row: torch.Tensor,
                    peer_ptrs: torch.Tensor) -> None:
    """``peer[dst_rank[i]][dst_row[i]] = src[src_index[i]]`` for every i with ``dst_row[i] >= 0``, in one launch.
    ``peer_ptrs``: int64 [W], the address of each peer's buffer, every buffer row-major with ``src``'s row size in
    bytes (a multiple of 4: the rows move as 32-bit words) and valid for the rows written. Nothing is checked here:
    the transport's own indices are in range by construction."""
    src = src.contiguous()
    n = dst_row.numel()
    if src.shape[-1] * src.element_size() % 4:
        raise ValueError(f"put_rows_triton moves rows as 32-bit words: a row of {src.shape[-1]} x "
                         f"{src.element_size()} bytes is not a multiple of 4")
    words = src.view(torch.int32)
    cols = words.shape[-1]
    if n and cols:
        launch(_put_rows_kernel, (n, triton.cdiv(cols, _PUT_BN)), (words, src_index, dst_rank, dst_row, peer_ptrs,
                                                                   cols), {"BN": _PUT_BN})
