"""A one-shot grouped GEMM (new weights every call) in three launches and a handful of host operations.

``OneShot.run(table, ...)`` takes the address table of :mod:`.gather` (one int64 row per group: the caller's
activation and weight tensors, read in place), then launches the gather (weights packed, activation rows packed,
offsets and global scales: one Triton kernel), then the activation prologue and the device-scheduled GEMM (one
TVM-FFI call, :func:`.runner.compile_call`).

On the H100's host every torch operation costs 5–10 µs, and for the large shapes the GPU waits for the steps before
the gather, so a call makes as few as it can. A plan holds what does not depend on the call's data — the compiled
kernels for (config, G, N, K_pad, out dtype) — and, per CUDA stream, the buffers the kernels write before the GEMM
reads them (:class:`_Buffers`: the packed weights, the activation scratch, views of it per row count, and a small ring
of pinned tables, which small plans' gathers read in place and large plans copy to the device first:
:data:`TABLE_ON_HOST_PROGRAMS`); the fp16 rows of the prologue are per stream too (:class:`.runner.Scratch`). A
:class:`_Lane` per (row count, stream) binds them, so that a call is: one ``struct.pack_into`` of the table, at most
one driver copy, the gather as a prepared driver launch (:func:`.gather.bind_plan`, after its first launch through
Triton), a driver event record, the output's allocation and the TVM-FFI call. Calls on one stream run in order, so
each call may overwrite what the previous one's GEMM read; a call on another stream gets its own buffers. A call
allocates only its output. One-shot calls cannot be captured in a CUDA graph (the captured launch would read a ring
slot that later calls overwrite): prepare the weights and capture ``w(a)`` instead.
"""
from __future__ import annotations

import struct

import torch

from ..common import driver
from ..common.triton_launch import plain
from .config import NWG, ROW_BYTES, VarlenConfig
from .gather import F, Plan, bind_plan, fill_activations, launch_plan, views
from .runner import OUT_DTYPES, POST_SCALE, Scratch, compile_call, require_hopper

_PLANS: dict = {}
SLOTS = 4  # pinned tables in flight per stream (a slot is reused once the gather four calls back has run)
# Plans of at most this many gather programs read their table from pinned host memory in place (no host-to-device
# copy before the launch); larger ones copy it first. An A/B in one process on the H100 (2026-11-26, development
# script, 4 alternating rounds of 30 calls): in place, the host time per call fell 9-23 us on all eight shapes, but
# the GPU time of the large dual shapes rose ~21 us (S1-dual, S2-dual: 7-15k programs, each reading the table
# over PCIe). The small shapes (S3, S4 and their duals: 500-2000 programs) are host-bound: they read it in place.
TABLE_ON_HOST_PROGRAMS = 2048


def _check(r: int, what: str, ctx: int, retry) -> None:
    """A driver call's result: on a thread without the context (:data:`.driver.INVALID_CONTEXT`), make the context
    current and call ``retry()`` once; raise on any other failure."""
    if r == driver.INVALID_CONTEXT:
        driver.ensure_context(ctx)
        r = retry()
    if r:
        raise RuntimeError(f"one-shot call: {what} failed with CUresult {r}")


class _Buffers:
    """One stream's buffers for one plan shape: packed weights (fixed size), the gather's ``small`` output (activation
    codes and scales, offsets, global scales; doubled when a call has more rows), views of it per row count, and
    ``SLOTS`` pinned host tables with their device copies and driver events (:mod:`..common.driver`)."""

    def __init__(self, plan: Plan, device, stream: int):
        self.stream = stream
        self.packed = torch.empty(plan.packed_shape, dtype=torch.uint8, device=device)
        self.weights = self.packed.view(-1, ROW_BYTES)
        self.small = torch.empty(0, dtype=torch.uint8, device=device)
        self.views: dict = {}
        width = F * (plan.groups + 1)
        self._pinned = torch.empty((SLOTS, width), dtype=torch.int64, pin_memory=True)
        self._dev = torch.empty((SLOTS, width), dtype=torch.int64, device=device)
        self._host = memoryview(self._pinned.numpy()).cast("B")  # written with one struct.pack_into per call
        self._row = struct.Struct(f"<{width}q")
        self.nbytes = 8 * width
        self.ctx = driver.current_context()
        self.events = driver.Events(SLOTS)
        self.next = 0

    def table(self, header: list[int], rows: list[int], on_host: bool) -> int:
        """The address of the call's table (``header``, then the group ``rows``), written into the next pinned slot
        (:meth:`take`): the slot itself (``on_host``: the kernel reads pinned memory in place) or its device copy
        (copied asynchronously). :meth:`done` marks the slot in use until the launch has run."""
        i = self.take()
        self.write(i, header, rows)
        return self.pinned_at(i) if on_host else self.copy(i)

    def take(self) -> int:
        """The next slot, once the gather that last read it has run (long done in a serving loop)."""
        i = self.next
        self.next = (i + 1) % SLOTS
        r = self.events.wait(i)
        if r:
            _check(r, "waiting for a table slot", self.ctx, lambda: self.events.wait(i))
        return i

    def write(self, i: int, header: list[int], rows: list[int]) -> None:
        self._row.pack_into(self._host, i * self.nbytes, *header, *rows)

    def pinned_at(self, i: int) -> int:
        return self._pinned.data_ptr() + i * self.nbytes

    def copy(self, i: int) -> int:
        """Copy slot i to the device (asynchronously, on this stream); returns the copy's address."""
        src, dst = self.pinned_at(i), self._dev.data_ptr() + i * self.nbytes
        r = driver.copy_to_device(dst, src, self.nbytes, self.stream)
        if r:
            _check(r, "the table's copy", self.ctx, lambda: driver.copy_to_device(dst, src, self.nbytes, self.stream))
        return dst

    def done(self) -> None:
        """After the call's last gather launch: its slot is free again once this stream has run it."""
        i, stream = (self.next - 1) % SLOTS, self.stream
        r = self.events.record(i, stream)
        if r:
            _check(r, "an event record", self.ctx, lambda: self.events.record(i, stream))

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
    the fp16 rows, and the gather's launches (whole, or in two parts: :data:`.gather.PARTS`) as prepared driver
    launches after their first (Triton) launch."""

    def __init__(self, shot: "OneShot", plan: Plan, buf: _Buffers, swz: tuple[bool, bool]):
        self.shot, self.plan, self.buf, self.swz = shot, plan, buf, swz
        self.small, self.views = buf.scratch(plan)
        self.x16 = shot.x16(plan.rows)
        self.on_host = plan.grid <= TABLE_ON_HOST_PROGRAMS
        self.launches: dict = {}  # part -> the prepared gather launch (its parameter 2: the table's address) or None

    def __call__(self, table: list[int]) -> torch.Tensor:
        """The call from a whole table: one gather launch."""
        at = self.buf.table(self.plan.header, table, self.on_host)
        self._gather(0, at)
        self.buf.done()
        return self._gemm()

    def parts(self, table: list[int], a, kh: int, dev: int):
        """The call from the weights' columns of the table (:func:`.gather.weight_rows`) and the activations ``a``:
        (C, row counts), or None where ``a`` cannot be read in place. A plan whose table is copied to the device
        launches the weights' programs before reading ``a`` (:data:`.gather.PARTS`): the GPU starts that much
        earlier. The rows' programs then read the whole table from pinned memory in place (a few hundred programs)."""
        if self.on_host:
            sizes = fill_activations(table, a, kh, dev)
            return None if sizes is None else (self(table), sizes)
        buf, header = self.buf, self.plan.header
        i = buf.take()
        buf.write(i, header, table)
        self._gather(1, buf.copy(i))
        sizes = fill_activations(table, a, kh, dev)
        if sizes is None:  # (the weights' programs only wrote this stream's packed weights)
            buf.done()
            return None
        buf.write(i, header, table)  # the same bytes, plus the activations' columns
        self._gather(2, buf.pinned_at(i))
        buf.done()
        return self._gemm(), sizes

    def _gather(self, part: int, at: int) -> None:
        buf = self.buf
        launch = self.launches.get(part)
        if launch is not None and plain():
            launch.set(2, at)
            r = launch(buf.stream)
            if r:
                raise RuntimeError(f"one-shot call: the gather's launch failed with CUresult {r}")
            return
        swz_a, swz_b = self.swz
        launch_plan(self.plan, at, buf.packed, self.small, buf.stream, swz_a=swz_a, swz_b=swz_b, post=POST_SCALE,
                    part=part)
        if part not in self.launches:
            self.launches[part] = bind_plan(self.plan, at, buf.packed, self.small, swz_a=swz_a, swz_b=swz_b,
                                            post=POST_SCALE, part=part)

    def _gemm(self) -> torch.Tensor:
        shot, rows = self.shot, self.plan.rows
        out = torch.empty((rows, shot.n), dtype=shot.out_dtype, device=shot.device)
        if rows:
            a_codes, a_scales, offsets, gs_a, gs_b = self.views
            shot._call(a_codes, a_scales, self.x16, self.buf.weights, out, offsets, gs_a, gs_b)
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
        self._call = compile_call(cfg, groups, n, self.k_pad, OUT_DTYPES[out_dtype])
        dev = torch.device(device)
        self._index = dev.index if dev.index is not None else torch.cuda.current_device()
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

    def run(self, table: list[int], rows: int, *, swz_a: bool = False, swz_b: bool = False) -> torch.Tensor:
        """``table``: G·F ints (:data:`.gather.FIELDS` per group); ``rows``: T. Returns C ``[T, N]``."""
        return self._lane_now(rows, swz_a, swz_b)(table)

    def run_parts(self, table: list[int], a, kh: int, dev: int, rows: int):
        """``table``: the weights' columns (:func:`.gather.weight_rows`), ``a`` the activations (T rows in all, K/2 =
        ``kh`` bytes, on device index ``dev``): (C ``[T, N]``, row counts), or None where ``a`` cannot be read in
        place (:meth:`_Lane.parts`)."""
        return self._lane_now(rows, False, False).parts(table, a, kh, dev)

    def _lane_now(self, rows: int, swz_a: bool, swz_b: bool) -> "_Lane":
        if torch._C._cuda_isCurrentStreamCapturing():
            raise RuntimeError("a one-shot call (new weights every call) cannot be captured in a CUDA graph: prepare "
                               "the weights once (nvfp4lib.prepare_weights) and capture w(a) instead")
        stream = torch._C._cuda_getCurrentRawStream(self._index)  # (the handle: no Stream object per call)
        lane = self._lanes.get((rows, stream, swz_a, swz_b))
        return lane if lane is not None else self._lane(rows, stream, swz_a, swz_b)

    def _lane(self, rows: int, stream: int, swz_a: bool, swz_b: bool) -> _Lane:
        plan = self._plans.get(rows)
        if plan is None:
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
