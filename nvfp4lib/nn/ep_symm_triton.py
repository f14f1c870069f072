"""The symm-mem transport's index arithmetic and row writes in four Triton launches a step (:mod:`.ep_symm`,
:data:`.ep_symm.PLAN_TRITON`).

The torch form of a step computes where every copy goes with about 25 small tensor operations in the dispatch and 15
in the combine (sums and prefix sums of the counts, a search per copy, gathers), each a kernel of a few microseconds
inside a CUDA graph. Here:

- :func:`put_counts`: one program writes this source's per-expert counts (the differences of its routing offsets)
  into row ``rank`` of every peer's ``counts [W, E]``, by address;
- :func:`plan`: one program reads the counts every source wrote (after the barrier) and keeps a private snapshot (the
  combine reads it; a peer may overwrite the shared counts with its next step's once it passes the combine's
  barrier), then computes this source's destination row base per global expert (its owner's rows: the owner's local
  experts before it, then the sources before this one), this owner's offsets per local expert (clamped to its
  receive capacity), the group's dropped copies, and the combine's table: per (source, local expert) its first row in
  this owner's receive buffer, its copy count, and the row of its first copy in the source's packed order;
- :func:`put_dispatch`: per packed copy (and column block of 32-bit words) its expert (a count over the routing's
  ends), its destination row, and the row written into the owner's receive buffer if it fits (the fit kept per copy);
- :func:`put_combine`: per received row, the one (source, local expert) segment holding it, and the row written back
  into that source's return buffer at its packed row.

The values are the torch form's (:class:`.ep_symm.SymmMemTransport` with the knob off), element for element
(tests/test_ep_symm_triton.py compares them in Triton's interpreter). Nothing is checked here: the transport's own
shapes are in range by construction.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..kernels.common.triton_launch import launch
from .routing_triton import _PUT_BN as _BN  # 32-bit words per row-writing program, as put_rows_triton's
from .routing_triton import copy_row, word_rows

__all__ = ["put_counts", "plan", "put_dispatch", "put_combine", "Plan"]


def _p2(n: int) -> int:
    return max(2, triton.next_power_of_2(max(1, n)))


@triton.jit
def _symm_counts_kernel(offsets, peer_ptrs, me, experts, WORLD: tl.constexpr, E_P2: tl.constexpr):
    e = tl.arange(0, E_P2)
    m = e < experts
    c = tl.load(offsets + e + 1, mask=m, other=0) - tl.load(offsets + e, mask=m, other=0)
    for p in tl.static_range(WORLD):  # a constexpr: Triton 3.6's interpreter fails on runtime loop bounds
        dst = tl.load(peer_ptrs + p).to(tl.pointer_type(tl.int32), bitcast=True)
        tl.store(dst + me * experts + e, c.to(tl.int32), mask=m)


@triton.jit
def _symm_plan_kernel(counts, snap, first, offsets, dropped, seg_start, seg_len, seg_row, me, n_local, cap,
                      WORLD: tl.constexpr, W_P2: tl.constexpr, L_P2: tl.constexpr, E_P2: tl.constexpr):
    world = WORLD
    experts = world * n_local
    o = tl.arange(0, W_P2)[:, None]  # an owner (or, below, a source)
    ll = tl.arange(0, L_P2)[None, :]  # a local expert
    m2 = (o < world) & (ll < n_local)
    total = tl.zeros([W_P2, L_P2], dtype=tl.int32)  # [owner, local expert]: copies over every source
    before = tl.zeros([W_P2, L_P2], dtype=tl.int32)  # the same over the sources before this one
    e1 = tl.arange(0, E_P2)
    for s in tl.static_range(WORLD):
        row = tl.load(counts + s * experts + e1, mask=e1 < experts, other=0)
        tl.store(snap + s * experts + e1, row, mask=e1 < experts)
        c = tl.load(counts + s * experts + o * n_local + ll, mask=m2, other=0)
        total += c
        before += tl.where(s < me, c, 0)
    # this source's first row per global expert in its owner's buffer: the owner's experts before, the sources before
    tl.store(first + o * n_local + ll, tl.cumsum(total, axis=1) - total + before, mask=m2)
    mine = tl.sum(tl.where(o == me, total, 0), axis=0)  # [local expert]: copies this owner receives
    l1 = tl.arange(0, L_P2)
    tl.store(offsets + 1 + l1, tl.minimum(tl.cumsum(mine, axis=0), cap), mask=l1 < n_local)
    tl.store(offsets + l1, 0, mask=l1 == 0)
    over = tl.maximum(tl.sum(total, axis=1) - cap, 0)
    tl.store(dropped + tl.arange(0, 2), tl.sum(over, axis=0), mask=tl.arange(0, 2) == 0)
    # the combine's table, per (source s, local expert l) at s * n_local + l
    s2 = o
    mm = tl.load(counts + s2 * experts + me * n_local + ll, mask=m2, other=0)  # [source, local expert]
    ebase = tl.cumsum(mine, axis=0) - mine  # this owner's first row of each local expert
    start = ebase[None, :] + tl.cumsum(mm, axis=0) - mm  # then the sources before s
    e2 = tl.arange(0, E_P2)[None, :]
    head = tl.sum(tl.load(counts + s2 * experts + e2, mask=(s2 < world) & (e2 < me * n_local), other=0), axis=1)
    srow = head[:, None] + tl.cumsum(mm, axis=1) - mm  # the source's packed row of its first copy of the expert
    tl.store(seg_start + s2 * n_local + ll, start, mask=m2)
    tl.store(seg_len + s2 * n_local + ll, mm, mask=m2)
    tl.store(seg_row + s2 * n_local + ll, srow, mask=m2)


@triton.jit
def _symm_dispatch_kernel(src, token, route_offsets, first, peer_ptrs, fits, n_local, experts, cap, cols,
                     E_P2: tl.constexpr, BN: tl.constexpr):
    pos = tl.program_id(0)
    e1 = tl.arange(0, E_P2)
    ends = tl.load(route_offsets + 1 + e1, mask=e1 < experts, other=2147483647)
    expert = tl.sum((ends <= pos).to(tl.int32), axis=0)
    row = (tl.load(first + expert) + pos - tl.load(route_offsets + expert)).to(tl.int64)
    ok = row < cap
    if tl.program_id(1) == 0:
        tl.store(fits + pos, ok.to(tl.int8))
    if ok:
        copy_row(src, tl.load(token + pos).to(tl.int64), tl.load(peer_ptrs + expert // n_local), row, cols, BN)


@triton.jit
def _symm_combine_kernel(y, seg_start, seg_len, seg_row, peer_ptrs, n_seg, n_local, cols, S_P2: tl.constexpr,
                    BN: tl.constexpr):
    q = tl.program_id(0)
    i = tl.arange(0, S_P2)
    mi = i < n_seg
    start = tl.load(seg_start + i, mask=mi, other=0)
    ln = tl.load(seg_len + i, mask=mi, other=0)
    hit = mi & (start <= q) & (q < start + ln)  # at most one segment holds row q (none past the received rows)
    if tl.sum(hit.to(tl.int32), axis=0) > 0:
        k = tl.sum(tl.where(hit, i, 0), axis=0)
        row = (tl.load(seg_row + k) + q - tl.load(seg_start + k)).to(tl.int64)
        copy_row(y, q.to(tl.int64), tl.load(peer_ptrs + k // n_local), row, cols, BN)


class Plan:
    """What :func:`plan` computes for one step (private tensors of this rank): ``snap`` int32 [W, E] the counts,
    ``first`` int32 [E] this source's row base per global expert, ``offsets`` int32 [E/W + 1] and ``dropped`` int32
    [1] (the dispatch's), and the combine's table ``seg_start``, ``seg_len``, ``seg_row`` int32 [W·E/W]."""

    def __init__(self, world: int, experts: int, device):
        n_local = experts // world
        z = dict(dtype=torch.int32, device=device)
        self.world, self.experts, self.n_local = world, experts, n_local
        self.snap = torch.empty((world, experts), **z)
        self.first = torch.empty(experts, **z)
        self.offsets = torch.empty(n_local + 1, **z)
        self.dropped = torch.empty(1, **z)
        self.seg_start, self.seg_len, self.seg_row = (torch.empty(world * n_local, **z) for _ in range(3))


def put_counts(route_offsets: torch.Tensor, counts_ptrs: torch.Tensor, rank: int, world: int) -> None:
    """Row ``rank`` of every peer's int32 ``counts [W, E]`` (addresses ``counts_ptrs``) := the differences of
    ``route_offsets`` (int32 [E+1]), in one launch."""
    experts = route_offsets.numel() - 1
    launch(_symm_counts_kernel, (1,), (route_offsets, counts_ptrs, rank, experts),
           {"WORLD": world, "E_P2": _p2(experts)})


def plan(counts: torch.Tensor, rank: int, cap: int) -> Plan:
    """:class:`Plan` of this rank from the group's int32 ``counts [W, E]`` (its own buffer, after the barrier), in one
    launch; ``cap``: every owner's receive capacity in rows."""
    world, experts = counts.shape
    p = Plan(world, experts, counts.device)
    launch(_symm_plan_kernel, (1,), (counts, p.snap, p.first, p.offsets, p.dropped, p.seg_start, p.seg_len, p.seg_row,
                                rank, p.n_local, cap),
           {"WORLD": world, "W_P2": _p2(world), "L_P2": _p2(p.n_local), "E_P2": _p2(experts)}, num_warps=4)
    return p


def put_dispatch(payload: torch.Tensor, token: torch.Tensor, route_offsets: torch.Tensor, p: Plan,
                 recv_ptrs: torch.Tensor, cap: int) -> torch.Tensor:
    """Each packed copy's row of ``payload`` (its token ``token[pos]``) into its owner's receive buffer (addresses
    ``recv_ptrs``, rows of the payload's size) at the row :func:`plan` gives it, where that row is below ``cap``;
    returns the fit per packed copy (int8 [T·k]). One launch."""
    n = token.numel()
    words = word_rows(payload, "put_dispatch")
    fits = torch.empty(n, dtype=torch.int8, device=payload.device)
    if n:
        launch(_symm_dispatch_kernel, (n, triton.cdiv(words.shape[1], _BN)),
               (words, token, route_offsets, p.first, recv_ptrs, fits, p.n_local, p.experts, cap, words.shape[1]),
               {"E_P2": _p2(p.experts), "BN": _BN})
    return fits


def put_combine(y: torch.Tensor, p: Plan, ret_ptrs: torch.Tensor) -> None:
    """Each received row of ``y`` (this owner's expert outputs, receive order) back into its source's return buffer
    (addresses ``ret_ptrs``) at the source's packed row of that copy, from :func:`plan`'s table. One launch."""
    words = word_rows(y, "put_combine")
    if words.shape[0]:
        launch(_symm_combine_kernel, (words.shape[0], triton.cdiv(words.shape[1], _BN)),
               (words, p.seg_start, p.seg_len, p.seg_row, ret_ptrs, p.world * p.n_local, p.n_local, words.shape[1]),
               {"S_P2": _p2(p.world * p.n_local), "BN": _BN})
