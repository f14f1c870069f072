"""A one-shot grouped GEMM (new weights every call) in three launches and a handful of host operations.

``OneShot.run(table, ...)`` takes the address table of :mod:`.gather` (one int64 row per group: the caller's
activation and weight tensors, read in place), then launches the gather (weights packed, activation rows packed,
offsets and global scales: one Triton launch), then the activation prologue and the device-scheduled GEMM (one
TVM-FFI call, :func:`.runner.compile_call`).

On the H100's host every torch operation costs 5–10 µs, so a call makes as few as it can. A plan holds what does not
depend on the call's data — the compiled kernels for (config, G, N, K_pad, out dtype) — and, per CUDA stream, the
buffers the kernels write before the GEMM reads them (:class:`_Buffers`: the packed weights, the activation scratch,
views of it per row count, the fp16 rows of the prologue, and a small ring of pinned tables, which small plans'
gathers read in place and large plans copy to the device first: :data:`TABLE_ON_HOST_PROGRAMS`). Calls on one stream
run in order, so each call may overwrite what the previous one's GEMM read; a call on another stream gets its own
buffers. A call allocates only its output. One-shot calls cannot be captured in a CUDA graph (the captured launch
would read a ring slot that later calls overwrite): prepare the weights and capture ``w(a)`` instead.
"""
from __future__ import annotations

import torch

from .config import NWG, ROW_BYTES, VarlenConfig
from .gather import F, Plan, launch_plan, views
from .runner import OUT_DTYPES, POST_SCALE, Scratch, compile_call, require_hopper

_PLANS: dict = {}
SLOTS = 4  # pinned tables in flight per stream (a slot is reused once the gather four calls back has run)
# Plans of at most this many gather programs read their table from pinned host memory in place (no host-to-device
# copy before the launch); larger ones copy it first. An A/B in one process on the H100 (2026-11-26, development
# script, 4 alternating rounds of 30 calls): in place, the host time per call fell 9-23 us on all eight shapes, but
# the GPU time of the large dual shapes rose ~21 us (S1-dual, S2-dual: 7-15k programs, each reading the table
# over PCIe). The small shapes (S3, S4 and their duals: 500-2000 programs) are host-bound: they read it in place.
TABLE_ON_HOST_PROGRAMS = 2048


class _Buffers:
    """One stream's buffers for one plan: packed weights (fixed size), the gather's ``small`` output (activation
    codes and scales, offsets, global scales; doubled when a call has more rows), views of it per row count, the
    prologue's fp16 rows, and ``SLOTS`` pinned host tables with their device copies."""

    def __init__(self, plan: Plan, device, k_pad: int):
        self.stream = torch.cuda.current_stream(device)
        self.x16 = Scratch(k_pad, device)  # the prologue's fp16 rows (per stream, like everything the GEMM reads)
        self.packed = torch.empty(plan.packed_shape, dtype=torch.uint8, device=device)
        self.weights = self.packed.view(-1, ROW_BYTES)
        self.small = torch.empty(0, dtype=torch.uint8, device=device)
        self.views: dict = {}
        width = F * (plan.groups + 1)
        pinned = torch.empty((SLOTS, width), dtype=torch.int64, pin_memory=True)
        dev = torch.empty((SLOTS, width), dtype=torch.int64, device=device)
        self.host = pinned.numpy()
        self.slots = [(pinned[i], dev[i]) for i in range(SLOTS)]
        self.events: list = [None] * SLOTS
        self.next = 0

    def table(self, rows: list[int], on_host: bool) -> int:
        """The address of the call's table (header and group rows), written into the next pinned slot once the
        gather that last read it has run: the slot itself (``on_host``: the kernel reads pinned memory in place) or
        its device copy (copied asynchronously). :meth:`done` marks the slot in use until the launch has run."""
        i = self.next
        self.next = (i + 1) % SLOTS
        ev = self.events[i]
        if ev is None:
            ev = self.events[i] = torch.cuda.Event()
        else:
            ev.synchronize()  # the gather SLOTS calls back (long done in a serving loop)
        self.host[i, : len(rows)] = rows
        src, dst = self.slots[i]
        if on_host:
            return src.data_ptr()
        dst.copy_(src, non_blocking=True)
        return dst.data_ptr()

    def done(self) -> None:
        """After the gather's launch: the last slot is free again once this stream has run it."""
        self.events[(self.next - 1) % SLOTS].record(self.stream)

    def scratch(self, plan: Plan):
        """(small, its views (:func:`.gather.views`)) for the plan's row count."""
        v = self.views.get(plan.rows)
        if v is None:
            if self.small.numel() < plan.small_bytes:
                self.small = torch.empty(max(plan.small_bytes, 2 * self.small.numel()), dtype=torch.uint8,
                                         device=self.small.device)
                self.views.clear()
            if len(self.views) > 256:
                self.views.clear()
            v = self.views[plan.rows] = (self.small, views(self.small, plan))
        return v


class OneShot:
    """The compiled kernels and the per-stream buffers for one (config, G, N, K, out dtype) on one device."""

    def __init__(self, cfg: VarlenConfig, groups: int, n: int, k: int, out_dtype, device):
        require_hopper(device)
        self.cfg, self.groups, self.n, self.k, self.out_dtype, self.device = cfg, groups, n, k, out_dtype, device
        self.dual = cfg.dual
        self.n_pad = -(-n // cfg.tile_m) * cfg.tile_m
        self.k_pad = -(-k // cfg.tile_k) * cfg.tile_k
        self.blocks = cfg.tile_m * (2 if self.dual else 1) // (64 * NWG)
        self._call = compile_call(cfg, groups, n, self.k_pad, OUT_DTYPES[out_dtype])
        dev = torch.device(device)
        self._index = dev.index if dev.index is not None else torch.cuda.current_device()
        self._plans: dict = {}  # rows -> gather plan (a serving loop repeats its row counts)
        self._buffers: dict = {}  # CUDA stream handle -> _Buffers

    @classmethod
    def get(cls, cfg: VarlenConfig, groups: int, n: int, k: int, out_dtype, device) -> "OneShot":
        key = (cfg.name, groups, n, k, out_dtype, device)
        plan = _PLANS.get(key)
        if plan is None:
            plan = _PLANS[key] = cls(cfg, groups, n, k, out_dtype, device)
        return plan

    def run(self, table: list[int], rows: int, *, swz_a: bool = False, swz_b: bool = False) -> torch.Tensor:
        """``table``: G·F ints (:data:`.gather.FIELDS` per group); ``rows``: T. Returns C ``[T, N]``."""
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("a one-shot call (new weights every call) cannot be captured in a CUDA graph: prepare "
                               "the weights once (nvfp4lib.prepare_weights) and capture w(a) instead")
        plan = self._plans.get(rows)
        if plan is None:
            if len(self._plans) > 256:
                self._plans.clear()
            plan = self._plans[rows] = Plan(self.groups, self.n, self.k, self.n_pad, self.k_pad, NWG, self.blocks,
                                            self.dual, rows)
        stream = torch._C._cuda_getCurrentRawStream(self._index)  # (the handle: no Stream object per call)
        buf = self._buffers.get(stream)
        if buf is None:
            buf = self._buffers[stream] = _Buffers(plan, self.device, self.k_pad)
        small, (a_codes, a_scales, offsets, gs_a, gs_b) = buf.scratch(plan)
        launch_plan(plan, buf.table(plan.header + table, plan.grid <= TABLE_ON_HOST_PROGRAMS), buf.packed, small,
                    stream, swz_a=swz_a, swz_b=swz_b, post=POST_SCALE)
        buf.done()
        out = torch.empty((rows, self.n), dtype=self.out_dtype, device=self.device)
        if rows:
            self._call(a_codes, a_scales, buf.x16(rows), buf.weights, out, offsets, gs_a, gs_b)
        return out


__all__ = ["OneShot", "F"]
