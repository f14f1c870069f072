"""The all-to-all transport of :mod:`.ep` on torch symmetric memory (``torch.distributed._symmetric_memory``):
:class:`SymmMemTransport` (``"symm-mem"``), GPU only.

Every rank allocates the same buffers once (``symm_mem.empty`` + ``rendezvous`` on the group) and writes into its
peers' copies (``get_buffer`` of the peer) directly; ``barrier`` orders the steps. A step:

1. dispatch: the source sorts its T·k copies by global expert (:func:`.routing.route`), writes its per-expert counts
   into row ``rank`` of every peer's ``counts [W, E]``, barrier; now every rank holds every source's counts, so each
   source computes on the device where each of its copies lands in its owner's receive buffer (owner's rows grouped by
   local expert, then source rank, then the source's order) and writes the rows straight there, barrier. The owner's
   offsets come from the same counts.
2. combine: the owner writes each result row back into its source's return buffer, at the row the source packed that
   copy in (computed from the counts again), barrier; the source un-permutes with :func:`.routing.weighted_rows`
   (a lost copy NaN), the single-process layer's own combine (bit-identical for any k).

Rows are written with :func:`put_rows`. On a GPU (:data:`PUT_ROWS_TRITON`, on) one Triton launch
(:func:`.routing_triton.put_rows_triton`) reads each row's destination and writes it only there, into the peer's
buffer by address: each row's bytes move once. The torch form (the CPU, or the knob off) is one ``index_copy_`` per
peer into the peer's buffer, a row not for that peer going to the buffer's last row (a dump row): capturable, every
shape fixed, but every peer's launch carries all the step's rows; on 2x H100 at T = 4096 per rank it took 9.6x the
Triton form's time in the combine (``moe-bench --ep 2 --put-rows torch triton``; the note at the knob).

With :data:`PLAN_TRITON` (on) a CUDA step does the same in :mod:`.ep_symm_triton`'s four launches: the counts
written into every peer, one program for every index the step needs (kept in a private snapshot of the counts), the
dispatch's rows and the combine's rows, each row placed by its own program; the un-permute then marks lost copies in
its own launch. Same rows, same order, same numbers as the torch form.

Buffers are reused every step without a reset: each is written by peers only after a barrier that its reader passes
after reading it (stream order), so one step never overwrites what another still reads.

:class:`SymmetricHeap` is what the transport needs of symmetric memory (allocate, a peer's buffer, barrier), so the
protocol can also run on other heaps (the CPU test runs W ranks as threads of one process on plain tensors).
"""
from __future__ import annotations

import torch

from .ep_transport import Dispatched, EPShape, Transport, _group_of, joined
from .routing import _triton_form, route, weighted_rows

__all__ = ["SymmMemTransport", "SymmetricHeap", "TorchSymmetricHeap", "put_rows"]


class SymmetricHeap:
    """Buffers of the same name and shape on every rank of a group, each writable by every rank."""

    rank = 0
    world = 1

    def alloc(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, device) -> None:
        """Allocate ``name`` on every rank (collective: every rank calls it, in the same order)."""
        raise NotImplementedError

    def peer(self, rank: int, name: str) -> torch.Tensor:
        """Rank ``rank``'s buffer ``name``, as a tensor this rank can write (``rank == self.rank``: its own)."""
        raise NotImplementedError

    def barrier(self) -> None:
        """Every rank's writes before the barrier are visible to every rank after it (on the device's stream)."""
        raise NotImplementedError


class TorchSymmetricHeap(SymmetricHeap):
    """torch symmetric memory on a CUDA device: one ``symm_mem.empty`` + ``rendezvous`` per buffer."""

    def __init__(self, group=None):
        import torch.distributed as dist

        self.group = _group_of(group)
        self.rank, self.world = dist.get_rank(self.group), dist.get_world_size(self.group)
        self.handles: dict = {}
        self.local: dict = {}

    def alloc(self, name, shape, dtype, device):
        import torch.distributed._symmetric_memory as symm_mem

        device = torch.device(device)
        if device.type != "cuda":
            raise ValueError(f"the symm-mem transport needs CUDA tensors (torch symmetric memory), got {device}; use "
                             "transport='all-gather' elsewhere")
        t = symm_mem.empty(*shape, dtype=dtype, device=device)
        self.handles[name] = (symm_mem.rendezvous(t, self.group), tuple(shape), dtype)
        self.local[name] = t
        self.peers = {}

    def peer(self, rank, name):
        if rank == self.rank:
            return self.local[name]
        key = (rank, name)
        if key not in self.peers:  # get_buffer once per (peer, buffer): the same tensor is captured every step
            handle, shape, dtype = self.handles[name]
            self.peers[key] = handle.get_buffer(rank, shape, dtype)
        return self.peers[key]

    def barrier(self):
        next(iter(self.handles.values()))[0].barrier(channel=0)


# The knob: put_rows as one Triton launch that writes each row only to its destination (True), or the torch form
# (False: an index_copy_ per peer of every row). Prediction (2026-11-27, before any GPU run of it): at T = 4096 per
# rank on 2 GPUs the symm-mem combine ~3x faster (DeepSeek-like 6.3 ms -> ~2 ms: 940 MB of rows written once instead
# of once per peer, half of them to a dump row over NVLink), the dispatch ~2x; decode steps within a few us.
# Measured (the A/B at 7c4a089, 2x H100, moe-bench --ep 2 --transport symm-mem --put-rows torch|triton, Qwen3-like
# W4A16; notebook 13): T = 4096 per rank combine 3323 -> 347 us (9.6x), dispatch 1661 -> 401 us, the step 5702 ->
# 1469 us; T = 64 combine 148 -> 83 us, dispatch 173 -> 134 us; both exact (bit-identical to the single-GPU layer).
# Faster than predicted: the torch form cost more than its bytes (not profiled to say why). On since then.
PUT_ROWS_TRITON = True
PUT_ROWS = ("torch", "triton")  # the knob's names in bench rows and on the command line
# The knob: a step's index arithmetic and row writes in four Triton launches (True: .ep_symm_triton, where rows are
# whole 32-bit words on a CUDA device), or the torch form (False: ~25 small kernels in the dispatch and ~15 in the
# combine around the barriers, the row writes by put_rows). Prediction (2026-11-28, before any GPU run of it): the
# 2x H200 run at d11fa4d spent 86-123 us in the symm-mem dispatch and 71-92 us in the combine at T = 1 and 64 per
# rank (the all-gather transport 20-47 and 10-37 us): mostly the ~40 launches at ~2-3 us each in a graph, not the
# three barriers or the bytes. With the knob on, dispatch + combine at T = 1 from ~157-191 us to ~30-45 us (4 + 2
# launches and three barriers), T = 64 about the same plus the bytes; T = 4096 within 10% (the row bytes dominate).
# Outcome (2x H200, the same session, runs at d11fa4d and eef77ba; notebook 13's table of changes): dispatch + combine
# at T = 1 per rank 157-191 -> 28-60 us (W4A16 and the bf16 peer 28-30 us, held; W4A4 58-60 us: its dispatch keeps the
# group amax (all_max: a copy per peer and a barrier) and the quantization, ~30 us); T = 64 170-215 -> 37-76 us; T =
# 4096 the dispatch and the combine 7-23% faster, the step 3-10%; every row exact (bit-identical to the single-GPU
# layer); memcheck: 0 errors (Qwen3-like, T = 1 and 64, both modes, eager).
PLAN_TRITON = True
PLANS = ("torch", "triton")  # the knob's names in bench rows and on the command line


def put_rows(src: torch.Tensor, src_index: torch.Tensor, dst_rank: torch.Tensor, dst_row: torch.Tensor,
             peers: list[torch.Tensor], peer_ptrs: torch.Tensor | None = None) -> None:
    """``peers[dst_rank[i]][dst_row[i]] = src[src_index[i]]`` for every i with ``dst_row[i] >= 0`` (the others are
    skipped); each peer buffer's last row is its dump row (see the module doc). With :data:`PUT_ROWS_TRITON`,
    ``peer_ptrs`` (the buffers' addresses, int64 on the device) and a CUDA ``src`` whose rows are whole 32-bit words:
    one Triton launch."""
    if PUT_ROWS_TRITON and peer_ptrs is not None and _triton_form(src) and src.shape[-1] * src.element_size() % 4 == 0:
        from .routing_triton import put_rows_triton

        return put_rows_triton(src, src_index, dst_rank, dst_row, peer_ptrs)
    rows = src.index_select(0, src_index)
    for p, buf in enumerate(peers):
        idx = torch.where((dst_rank == p) & (dst_row >= 0), dst_row, buf.shape[0] - 1)
        buf.index_copy_(0, idx, rows)


def _exclusive_cumsum(x: torch.Tensor, dim: int) -> torch.Tensor:
    return x.cumsum(dim) - x


class SymmMemTransport(Transport):
    """The all-to-all on symmetric memory (see the module doc). ``heap``: a :class:`SymmetricHeap` (default: torch
    symmetric memory on ``group``)."""

    name = "symm-mem"

    def __init__(self, group=None, *, heap: SymmetricHeap | None = None):
        self.heap = heap if heap is not None else TorchSymmetricHeap(group)
        self.rank, self.world = self.heap.rank, self.heap.world

    def setup(self, shape: EPShape) -> None:
        self.shape = s = shape
        if s.recv_capacity + 1 > 2**31 - 1:
            raise ValueError(f"recv_capacity = {s.recv_capacity} is too large")
        hp = self.heap
        hp.alloc("counts", (s.world, s.experts), torch.int32, s.device)
        hp.alloc("recv", (s.recv_capacity + 1, s.row_bytes), torch.uint8, s.device)
        hp.alloc("ret", (s.capacity * s.top_k + 1, s.hidden), torch.bfloat16, s.device)
        hp.alloc("amax", (2, s.world), torch.float32, s.device)
        for name in ("counts", "recv", "ret", "amax"):  # rows never written yet hold valid (zero) values
            hp.peer(self.rank, name).zero_()
        # the peers' row buffers by address, for put_rows' one-launch form (made here: not under a graph capture)
        self.ptrs = {name: torch.tensor([hp.peer(p, name).data_ptr() for p in range(s.world)], dtype=torch.int64,
                                        device=s.device) for name in ("counts", "recv", "ret")}
        hp.barrier()

    def _peers(self, name: str) -> list[torch.Tensor]:
        return [self.heap.peer(p, name) for p in range(self.world)]

    def all_max(self, x, use):
        x = x.to(torch.float32).reshape(1)
        for buf in self._peers("amax"):
            buf[use, self.rank:self.rank + 1].copy_(x)
        self.heap.barrier()
        return self.heap.peer(self.rank, "amax")[use].amax().reshape(1)

    def dispatch(self, payload, topk_ids, topk_weights, quantize=None):
        if quantize is not None:
            raise ValueError("the symm-mem transport does not take quantize: its ranks receive only their experts' "
                             "copies, not every token (gathers_all is False)")
        s, me = self.shape, self.rank
        n_local = s.local_experts
        n = topk_ids.numel()
        payload = joined(payload)
        r = route(topk_ids, s.experts)
        if self._fused(payload):
            return self._dispatch_fused(payload, r, topk_weights)
        for buf in self._peers("counts"):
            buf[me].copy_(r.offsets[1:] - r.offsets[:-1])
        self.heap.barrier()
        counts = self.heap.peer(me, "counts").to(torch.int64)  # [source, expert], a copy: read again in combine
        by_dest = counts.view(s.world, s.world, n_local)  # [source, owner, local expert]
        total = by_dest.sum(0)  # [owner, local expert]: copies each owner receives
        # the owner's row of this source's first copy of each expert: its experts before, then the sources before
        first = (_exclusive_cumsum(total, 1) + by_dest[:me].sum(0)).reshape(-1)
        pos = torch.arange(n, device=payload.device)
        expert = torch.searchsorted(r.offsets[1:].to(torch.int64), pos, right=True)
        dst_row = first.index_select(0, expert) + pos - r.offsets.to(torch.int64).index_select(0, expert)
        fits = dst_row < s.recv_capacity
        put_rows(payload, r.token, torch.div(expert, n_local, rounding_mode="floor"),
                 torch.where(fits, dst_row, -1), self._peers("recv"), self.ptrs["recv"])
        self.heap.barrier()
        mine = total[me]
        offsets = torch.cat([mine.new_zeros(1), mine.cumsum(0)])
        offsets = torch.clamp(offsets, max=s.recv_capacity).to(torch.int32)
        dropped = torch.clamp(total.sum(1) - s.recv_capacity, min=0).sum().to(torch.int32).reshape(1)
        rows = self.heap.peer(me, "recv")[:s.recv_capacity]
        return Dispatched(rows, offsets, dropped, (r, counts, fits, topk_weights))

    def _fused(self, rows: torch.Tensor) -> bool:
        """Whether this step takes :data:`PLAN_TRITON`'s form: the knob on, Triton's form for ``rows``' device, rows of
        whole 32-bit words."""
        return PLAN_TRITON and _triton_form(rows) and rows.shape[-1] * rows.element_size() % 4 == 0

    def _dispatch_fused(self, payload, r, topk_weights):
        from . import ep_symm_triton as st

        s, me = self.shape, self.rank
        st.put_counts(r.offsets, self.ptrs["counts"], me, s.world)
        self.heap.barrier()
        p = st.plan(self.heap.peer(me, "counts"), me, s.recv_capacity)
        fits = st.put_dispatch(payload, r.token, r.offsets, p, self.ptrs["recv"], s.recv_capacity)
        self.heap.barrier()
        rows = self.heap.peer(me, "recv")[:s.recv_capacity]
        return Dispatched(rows, p.offsets, p.dropped, (r, p, fits, topk_weights))

    def combine(self, y, d, out_dtype):
        s, me = self.shape, self.rank
        n_local = s.local_experts
        r, counts, fits, topk_weights = d.state
        if not isinstance(counts, torch.Tensor):  # the fused dispatch's Plan
            return self._combine_fused(y, r, counts, fits, topk_weights, out_dtype)
        mine = counts[:, me * n_local:(me + 1) * n_local]  # [source, local expert]
        ends = mine.sum(0).cumsum(0)
        q = torch.arange(y.shape[0], device=y.device)
        e = torch.clamp(torch.searchsorted(ends, q, right=True), max=n_local - 1)
        i = q - (ends - mine.sum(0)).index_select(0, e)  # the row's index within its expert
        upto = mine.cumsum(0).T  # [local expert, source]: copies of sources <= s
        src = torch.clamp((upto.index_select(0, e) <= i.unsqueeze(1)).sum(1), max=s.world - 1)
        j = i - (upto - mine.T)[e, src]  # its index among that source's copies of the expert
        # the source packed its copies by global expert: its row of this copy
        row = _exclusive_cumsum(counts, 1)[src, me * n_local + e] + j
        put_rows(y, q, src, torch.where(q < ends[-1], row, -1), self._peers("ret"), self.ptrs["ret"])
        self.heap.barrier()
        n = topk_weights.numel()
        back = self.heap.peer(me, "ret")[:n]
        # a copy the owner could not take (past its receive capacity) comes back NaN: its weight NaN, its row unread
        lost = ~fits.index_select(0, r.row)
        row = torch.where(lost, -1, r.row)
        w = torch.where(lost.view(topk_weights.shape), torch.full((), float("nan"), device=y.device),
                        topk_weights.to(torch.float32))
        return weighted_rows(back, row, w, out_dtype)

    def _combine_fused(self, y, r, p, fits, topk_weights, out_dtype):
        from . import ep_symm_triton as st
        from .routing_triton import unpermute_triton

        st.put_combine(y, p, self.ptrs["ret"])
        self.heap.barrier()
        back = self.heap.peer(self.rank, "ret")[:topk_weights.numel()]
        # a copy the owner could not take comes back NaN (its weight NaN, its row unread), as in the torch form
        return unpermute_triton(back, r.row, topk_weights, out_dtype, fits=fits)
