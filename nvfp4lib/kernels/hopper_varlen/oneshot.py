"""A one-shot grouped GEMM (new weights every call) in three launches and a handful of host operations.

``OneShot.run(table, ...)`` takes the address table of :mod:`.gather` (one int64 row per group: the caller's
activation and weight tensors, read in place), then launches the gather (weights packed, activation rows packed,
offsets and global scales: one Triton kernel), then the activation prologue and the device-scheduled GEMM (one
TVM-FFI call, :func:`.runner.compile_call`).

On the H100's host every torch operation costs 5–10 µs, and for the large shapes the GPU waits for the steps before
the gather, so a call makes as few as it can. A plan holds what does not depend on the call's data — the compiled
kernels for (config, G, N, K_pad, out dtype) — and, per CUDA stream, the buffers the kernels write before the GEMM
reads them (:class:`_Buffers`: the packed weights, the activation scratch, views of it per row count, and a ring of
pinned tables (:data:`SLOTS`), which small plans' gathers read in place and large plans copy to the device first:
:data:`TABLE_ON_HOST_PROGRAMS`); the fp16 rows of the prologue are per stream too (:class:`.runner.Scratch`). A
:class:`_Lane` per (row count, stream) binds them, so that a call is: one ``struct.pack_into`` of the table, at most
one driver copy, the gather as a prepared driver launch (:func:`.gather.bind_plan`, after its first launch through
Triton), the output's allocation (none where the caller gives ``out``) and the TVM-FFI call (one call in
:data:`EVENT_EVERY` also waits for and records a driver event). Calls on one stream run in order, so each call may
overwrite what the previous one's GEMM read; a call on another stream gets its own buffers. A call allocates at most
its output. One-shot calls cannot be captured in a CUDA graph (the captured launch would read a ring
slot that later calls overwrite): prepare the weights and capture ``w(a)`` instead.
"""
from __future__ import annotations

import struct

import torch

from ..common import driver
from ..common.triton_launch import plain
from .config import NWG, ROW_BYTES, VarlenConfig, check_grid
from .gather import F, Plan, bind_plan, launch_plan, views
from .runner import E4M3, OUT_DTYPES, POST_SCALE, Scratch, compile_call, device_index, no_splits, require_hopper

_PLANS: dict = {}
# Pinned tables per stream, reused in blocks of EVENT_EVERY: the call that starts a block records a driver event after
# its gather's launch, and first waits for the event of the block after it, recorded SLOTS - EVENT_EVERY calls
# earlier (stream order: every gather up to that call has run, the last use of this block's slots included). Two
# driver calls per EVENT_EVERY calls instead of two per call (SLOTS = 4, EVENT_EVERY = 1 before 2026-11-27).
SLOTS = 64
EVENT_EVERY = 16
# Plans of at most this many gather programs read their table from pinned host memory in place (no host-to-device
# copy before the launch); larger ones copy it first. An A/B in one process on the H100 (2026-11-26, development
# script, 4 alternating rounds of 30 calls): in place, the host time per call fell 9-23 us on all eight shapes, but
# the GPU time of the large dual shapes rose ~21 us (S1-dual, S2-dual: 7-15k programs, each reading the table
# over PCIe). The small shapes (S3, S4 and their duals: 500-2000 programs) are host-bound: they read it in place.
TABLE_ON_HOST_PROGRAMS = 2048


def _driver(ctx: int, what: str, call, *args) -> None:
    """``call(*args)``, a driver call of :mod:`..common.driver`: on a thread without the context
    (:data:`.driver.INVALID_CONTEXT`), make the context current and call it once more; raise on any other failure."""
    r = call(*args)
    if r == driver.INVALID_CONTEXT:
        driver.ensure_context(ctx)
        r = call(*args)
    if r:
        raise RuntimeError(f"one-shot call: {what} failed with CUresult {r}")


class _Ring:
    """The bookkeeping of a ring of ``slots`` tables reused in blocks of ``every`` (:data:`SLOTS`): which slot a call
    writes, which block's event it waits for first, and which it records after its launch (no driver calls here)."""

    def __init__(self, slots: int, every: int):
        if every < 1 or slots % every or slots < 2 * every:
            raise ValueError(f"one-shot tables: {slots} slots must be a multiple of {every} per event, at least two "
                             "blocks")
        self.slots, self.every, self.blocks, self.next = slots, every, slots // every, 0

    def take(self) -> tuple[int, int | None]:
        """(the slot, the block whose event to wait for first, or None)."""
        i = self.next
        self.next = (i + 1) % self.slots
        return i, ((i // self.every + 1) % self.blocks if i % self.every == 0 else None)

    def records(self) -> int | None:
        """The block whose event the call that took the last slot records after its launch, or None."""
        i = (self.next - 1) % self.slots
        return i // self.every if i % self.every == 0 else None


class _Buffers:
    """One stream's buffers for one plan shape: packed weights (fixed size), the gather's ``small`` output (activation
    codes and scales, offsets, global scales; doubled when a call has more rows), views of it per row count, and
    ``SLOTS`` pinned host tables with their device copies, and a driver event per block of ``EVENT_EVERY`` slots
    (:mod:`..common.driver`)."""

    def __init__(self, plan: Plan, device, stream: int):
        self.stream = stream
        self.packed = torch.empty(plan.packed_shape, dtype=torch.uint8, device=device)
        self.weights = self.packed.view(-1, ROW_BYTES)
        self.small = torch.empty(0, dtype=torch.uint8, device=device)
        self.views: dict = {}
        width = F * (plan.groups + 1)
        self.ring = _Ring(SLOTS, EVENT_EVERY)
        self._pinned = torch.empty((SLOTS, width), dtype=torch.int64, pin_memory=True)
        self._dev = torch.empty((SLOTS, width), dtype=torch.int64, device=device)
        self._host = memoryview(self._pinned.numpy()).cast("B")  # written with one struct.pack_into per call
        self._row = struct.Struct(f"<{width}q")
        self.nbytes = 8 * width
        self.ctx = driver.current_context()
        self.events = driver.Events(self.ring.blocks)

    def table(self, header: list[int], rows: list[int], on_host: bool) -> int:
        """The address of the call's table (``header``, then the group ``rows``), written into the next pinned slot
        once the gather that last read it has run: the slot itself (``on_host``: the kernel reads pinned memory in
        place) or its device copy (copied asynchronously). A call that starts a block of slots first waits for the
        event of the next block (recorded ``slots - every`` calls earlier, after that call's gather); :meth:`done`
        records this block's event after the launch."""
        i, wait = self.ring.take()
        if wait is not None:
            _driver(self.ctx, "waiting for a block of table slots", self.events.wait, wait)
        at = i * self.nbytes
        self._row.pack_into(self._host, at, *header, *rows)
        src = self._pinned.data_ptr() + at
        if on_host:
            return src
        dst = self._dev.data_ptr() + at
        _driver(self.ctx, "the table's copy", driver.copy_to_device, dst, src, self.nbytes, self.stream)
        return dst

    def done(self) -> None:
        """After the gather's launch: the call that started a block records the block's event."""
        block = self.ring.records()
        if block is not None:
            _driver(self.ctx, "an event record", self.events.record, block, self.stream)

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


class _Lane:
    """Everything one (row count, stream, scale layout) needs per call: the plan, the stream's buffers and their views,
    the fp16 rows, and the gather as a prepared driver launch after its first (Triton) launch."""

    def __init__(self, shot: "OneShot", plan: Plan, buf: _Buffers, swz: tuple[bool, bool]):
        self.shot, self.plan, self.buf, self.swz = shot, plan, buf, swz
        self.small, views = buf.scratch(plan)
        a_codes, a_scales, *rest = views
        self.views = (a_codes, a_scales.view(E4M3), *rest)  # (the compiled call takes E4M3 scales)
        self.x16, self.count = shot.x16(plan.rows)
        self.on_host = plan.grid <= TABLE_ON_HOST_PROGRAMS
        self.launch = None  # the prepared gather launch (its parameter 2: the table's address)

    def __call__(self, table: list[int], out: torch.Tensor | None = None) -> torch.Tensor:
        plan, buf, shot = self.plan, self.buf, self.shot
        at = buf.table(plan.header, table, self.on_host)
        launch = self.launch
        if launch is not None and plain():
            launch.set(2, at)
            r = launch(buf.stream)
            if r:
                raise RuntimeError(f"one-shot call: the gather's launch failed with CUresult {r}")
        else:
            swz_a, swz_b = self.swz
            launch_plan(plan, at, buf.packed, self.small, buf.stream, swz_a=swz_a, swz_b=swz_b, post=POST_SCALE)
            if launch is None:
                self.launch = bind_plan(plan, at, buf.packed, self.small, swz_a=swz_a, swz_b=swz_b, post=POST_SCALE)
        buf.done()
        if out is None:  # (sizes as arguments, not a tuple: .runner's note at OUT_DTYPES)
            out = torch.empty(plan.rows, shot.n, dtype=shot.out_dtype, device=shot.device)
        if plan.rows:
            a_codes, a_scales, offsets, gs_a, gs_b = self.views
            shot._call(a_codes, a_scales, self.x16, buf.weights, out, offsets, gs_a, gs_b, self.count,
                       *shot.no_split)
        return out


class OneShot:
    """The compiled kernels and the per-stream buffers for one (config, G, N, K, out dtype) on one device."""

    def __init__(self, cfg: VarlenConfig, groups: int, n: int, k: int, out_dtype, device):
        require_hopper(device)
        if not driver.available():
            raise RuntimeError("one-shot calls need libcuda (the NVIDIA driver's library), which could not be loaded")
        self.cfg, self.groups, self.n, self.k, self.out_dtype, self.device = cfg, groups, n, k, out_dtype, device
        self.dual = cfg.dual
        self.n_pad = -(-n // cfg.tile_m) * cfg.tile_m
        self.k_pad = -(-k // cfg.tile_k) * cfg.tile_k
        self.blocks = cfg.tile_m * (2 if self.dual else 1) // (64 * NWG)
        self._call = compile_call(cfg, groups, n, self.k_pad, OUT_DTYPES[out_dtype])  # (never .kernel.EAGER_FUSED)
        self.no_split = no_splits(cfg, n, device)  # (one-shot calls do not split K)
        self._index = device_index(device)
        self.x16 = Scratch(self.k_pad, device)  # the prologue's fp16 rows, per stream like everything the GEMM reads
        self._plans: dict = {}  # rows -> gather plan (a serving loop repeats its row counts)
        self._buffers: dict = {}  # CUDA stream handle -> _Buffers
        self._lanes: dict = {}  # (rows, stream handle, scale layouts) -> _Lane

    @classmethod
    def get(cls, cfg: VarlenConfig, groups: int, n: int, k: int, out_dtype, device) -> "OneShot":
        key = (cfg.name, groups, n, k, out_dtype, device)
        plan = _PLANS.get(key)
        if plan is None:
            plan = _PLANS[key] = cls(cfg, groups, n, k, out_dtype, device)
        return plan

    def run(self, table: list[int], rows: int, *, swz_a: bool = False, swz_b: bool = False,
            out: torch.Tensor | None = None) -> torch.Tensor:
        """``table``: G·F ints (:data:`.gather.FIELDS` per group); ``rows``: T. Returns C ``[T, N]``: ``out`` where
        given (unchecked here: a contiguous, 16-byte-aligned ``[T, N]`` tensor of the out dtype on the device, which
        the caller checked), else a new tensor."""
        if torch._C._cuda_getDevice() != self._index:  # the driver calls act on the current device's context
            with torch.cuda.device(self._index):
                return self.run(table, rows, swz_a=swz_a, swz_b=swz_b, out=out)
        if torch._C._cuda_isCurrentStreamCapturing():
            raise RuntimeError("a one-shot call (new weights every call) cannot be captured in a CUDA graph: prepare "
                               "the weights once (nvfp4lib.prepare_weights) and capture w(a) instead")
        stream = torch._C._cuda_getCurrentRawStream(self._index)  # (the handle: no Stream object per call)
        lane = self._lanes.get((rows, stream, swz_a, swz_b))
        if lane is None:
            lane = self._lane(rows, stream, swz_a, swz_b)
        return lane(table, out)

    def _lane(self, rows: int, stream: int, swz_a: bool, swz_b: bool) -> _Lane:
        plan = self._plans.get(rows)
        if plan is None:
            check_grid(self.cfg, rows, self.groups, self.n)
            if len(self._plans) > 256:
                self._plans.clear()
            plan = self._plans[rows] = Plan(self.groups, self.n, self.k, self.n_pad, self.k_pad, NWG, self.blocks,
                                            self.dual, rows)
        buf = self._buffers.get(stream)
        if buf is None:
            buf = self._buffers[stream] = _Buffers(plan, self.device, stream)
        if len(self._lanes) > 1024:
            self._lanes.clear()
        lane = self._lanes[(rows, stream, swz_a, swz_b)] = _Lane(self, plan, buf, (swz_a, swz_b))
        return lane


__all__ = ["OneShot", "F"]
