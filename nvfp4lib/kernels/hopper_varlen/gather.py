"""Everything a one-shot call needs before the GEMM, in one Triton launch, read in place from the caller's tensors.

A one-shot call (new weights every call: ``nvfp4lib.grouped_gemm``, the study's harness) used to pay ~30 torch ops
of host time (stacking the weights, concatenating the activations, stacking global scales, building offsets) before
its two kernels. Here the host writes one small table — a header row of sizes, then one row of addresses per group
(:data:`FIELDS`, the callers' tensors read in place) — which the kernel reads by address (from pinned host memory in
place, or from a device copy), and one launch of the gather does, by program id:

- **weights** (programs ``0 .. units``): ``KCU`` 64-row × 64-K units of the packed weights each (the layout of
  :func:`nvfp4lib.kernels.hopper_rs.layout.prepack_weights`), from group g's own codes and scales, one output word
  per element from two 8-byte code-pair loads (no tile, no layout change in registers). GPU time of the weights
  alone on the H100 (development runs, not recorded: median of 40, L2 flushed, a GPU sleep hiding the launch, the
  method of ``python -m nvfp4lib gather-bench``, :mod:`nvfp4lib.bench.gather_bench`):
  S1 154 µs against 200 µs for the earlier 64 × 256-byte tile permuted in registers (whose Nsight Compute profile
  showed L1 at 91% of its throughput and 144 registers, 19% occupancy), S2 82 vs 111, S1-dual 300 vs 390;
  vectorising each row's four words (32-byte loads, 16-byte stores) was slower (163–320 µs on S1). At 2fe0d84 the
  kernel fell from 145 registers (set by the activation-rows branch) to 64, and S1's weights from 153.7 to 122.2 µs
  (S1-dual 299.8 to 238.2; recorded A/B in ``data/gather.jsonl``); one load per lane writing four words (77b4697)
  was 14–27% slower. The one-load form (``ONCE = 1``, the default since 2026-11-27): each code pair is loaded by one
  lane and Triton moves the unit to the storing lanes through shared memory, and a program loads the scales of all
  its units at once, a warp along one row's columns. Nsight Compute had the earlier form L1-bound, four lanes loading
  each pair; cutting the load sectors ~4× was predicted to take S1's weights from ~115 to ~100 µs. Measured
  (development run, one H100, same process): S1 114.3 → 111.0 µs, S1-dual 223.4 → 216.9, S2 63.5 → 61.4, S3-dual
  34.2 → 31.5, the other four shapes within 0.3 µs; 8 warps or 4 or 16 units per program were slower. The whole
  program's loads at once (``WHOLE = 1``, the default since 674dc09's measurement): each row's ``KCU`` × 32 code
  bytes in one request instead of 32 bytes per unit in a loop, then one store permuted through shared memory. Predicted
  ~90–95 µs on S1 if the DRAM pattern limited it; measured (recorded, ``gather-bench --whole 0 --whole 1``):
  S1 110.5 → 95.7 µs, S1-dual 215.4 → 188.4, S2 60.9 → 51.5, S4 12.5 → 10.4 — 2.8 TB/s on the large shapes, 1.04–1.06×
  the copy floor;
- **activation rows**: the groups' rows copied into one packed ``[T, K/2]`` codes and ``[T, K/16]`` scales pair
  (the prologue's input), row r of the packed form belonging to the group whose offsets bracket it;
- **the small things** (last program): the offsets ``[G+1]`` (prefix sums of the groups' rows), A's global scales
  ``[G]`` and ``gs_b [G, 2]`` (the weights' global scales × ``POST``, the dual's second column from b2).

Scales are read row-major (``[rows, K/16]``, the NVFP4Tensor form) or, with ``SWZ_*``, in the 128×4 blocked layout
of :func:`nvfp4lib.formats.swizzle_scales` (the harness's reordered scales, read without unswizzling). The kernel
takes two pointers, the table's address and compile-time flags only (sizes are in the header): after the first call
it is launched through its compiled launcher directly (:mod:`..common.triton_launch`), skipping Triton's per-call
argument binding.
"""
from __future__ import annotations

import torch

from ...formats import NVFP4Tensor
from ..common.triton_launch import bound
from ..common.triton_launch import launch as triton_launch
from ..hopper_rs.layout import UNIT_BYTES

FIELDS = ("a_codes", "a_scales", "a_rows", "b_codes", "b_scales", "b2_codes", "b2_scales", "a_gs", "b_gs", "b2_gs")
HEADER = ("n", "k", "n_pad", "kc_n", "per", "blocks", "groups", "units", "a_progs", "scales_at", "offsets_at",
          "gs_b_at", "gs_a_at")
F = 16  # int64 columns per row of the table (header and group rows)
_PAD = (0,) * (F - len(FIELDS))
A_ROWS = 4  # activation rows per program (8 rows took the kernel to 114-145 registers: 3 programs per SM)
A_BYTES = 256  # code bytes per inner step of an activation row
KCU = 8  # 64-row x 64-K weight units per program (consecutive along K, one after the other)
PREFETCH = 1  # 1: the next unit's loads issued before this unit's stores (two units' loads in flight)
ONCE = 1  # 1: each code pair loaded by one lane, the unit passed to the store's lanes through shared memory
# 1: the activation rows' programs and the small things' before the weights', so that they run in the first wave and
# not as a tail after the weights' last (each rows program copies 4 rows in 256-byte steps: long, little traffic).
# H100, development A/B in one process (2026-11-27): S1 weights + rows 120.2 -> 114.8 us, S1-dual 226.7 -> 219.3,
# S2 and S4-dual within 0.4 us; one-shot calls back to back S1 257.4 -> 250.6, S1-dual 457.9 -> 448.6
ROWS_FIRST = 1
# 1 (with ONCE): a program loads its KCU units' codes at once, each row's KCU * 32 bytes in one request, and stores
# them after (no loop); 0: one unit after the other, 32 bytes per row per request. H100, gather-bench at 674dc09
# (2026-11-27), weights: S1 110.5 -> 95.7 us, S1-dual 215.4 -> 188.4, S2 60.9 -> 51.5, S4 12.5 -> 10.4 (2.4 -> 2.8
# TB/s on the large shapes; KCU 4 and 16 within 1 us of 8, 8 warps slower)
WHOLE = 1
WARPS = 4  # warps per program
_KERNEL = None


def knobs() -> dict:
    """The gather's form knobs as set now: what ``gather-bench`` sweeps and what its report keeps rows at
    (:func:`nvfp4lib.study.gather_report.gather_variants`)."""
    return {"prefetch": PREFETCH, "once": ONCE, "rows_first": ROWS_FIRST, "whole": WHOLE}


def group_table(a, b, b2=None) -> list[int] | None:
    """The table's group rows (:data:`FIELDS`, ``F`` ints per group) for NVFP4Tensor lists: activations ``a`` (None:
    weights alone, no activation rows) and weights ``b`` (and ``b2``, the dual's second matrix), or None unless every
    part can be read in place: lists of equal length of 2-D NVFP4Tensors on one device, the weights all of ``b[0]``'s
    shape with N > 0, the activations of their K, every part contiguous and the weight codes 8-byte aligned.

    Callers either checked the operands before (then None means "not readable in place") or take the checked path on
    None, which names what is wrong. (A one-shot call builds this every call, as its only pass over the operands. The
    weights' shape, device, contiguity and addresses come from :meth:`NVFP4Tensor.addresses`, read once per tensor;
    the activations' are read every call, since a serving loop's activations are new tensors each step. On the lent
    H100's host each tensor attribute read costs 0.13-0.2 µs, and reading every operand's every call kept the GPU idle
    before the gather on the eight-group shapes. An NVFP4Tensor's parts share one device and its global scale is
    float32, both checked when it is built.)"""
    lists = (list, tuple)
    if type(b) not in lists or not b or (a is not None and (type(a) not in lists or len(a) != len(b))) \
            or (b2 is not None and (type(b2) not in lists or len(b2) != len(b))) or type(b[0]) is not NVFP4Tensor:
        return None
    shape, dev = b[0].addresses()[:2]
    if len(shape) != 2 or not shape[0]:
        return None
    kh = shape[1]
    table = []
    add = table.extend  # (one tuple per group, no per-group lists or helper calls: ~13% of this on the CPU)
    for g, w in enumerate(b):
        if type(w) is not NVFP4Tensor:
            return None
        wsh, wdev, wok, wp, wsp, wg = w.addresses()
        if wsh is not shape and wsh != shape or wdev != dev or not wok:
            return None
        if b2 is None:
            up, usp, ug = wp, wsp, wg
        else:
            u = b2[g]
            if type(u) is not NVFP4Tensor:
                return None
            ush, udev, uok, up, usp, ug = u.addresses()
            if ush is not shape and ush != shape or udev != dev or not uok:
                return None
        if (wp | up) & 7:  # the gather reads codes as 8-byte pairs (codes_readable)
            return None
        if a is None:  # no rows; A's global-scale address only has to be readable
            add((0, 0, 0, wp, wsp, up, usp, wg, wg, ug, *_PAD))
        else:
            x = a[g]
            if type(x) is not NVFP4Tensor:
                return None
            xd, xs = x.data, x.scales  # (read every call: activations are new tensors every step)
            xsh = xd.shape
            if len(xsh) != 2 or xsh[1] != kh or xd.get_device() != dev or not (xd.is_contiguous()
                                                                             and xs.is_contiguous()):
                return None
            add((xd.data_ptr(), xs.data_ptr(), xsh[0], wp, wsp, up, usp, x.global_scale.data_ptr(), wg, ug, *_PAD))
    return table


def codes_readable(*addresses: int) -> bool:
    """Whether weight codes at these addresses can be read in place: the gather reads them as 8-byte pairs."""
    bits = 0
    for a in addresses:
        bits |= a
    return not bits & 7


def _kernel():
    global _KERNEL
    if _KERNEL is None:
        from .gather_triton import gather

        _KERNEL = gather
    return _KERNEL


def _next_pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


class Plan:
    """The sizes of one gather: the header row, the grid, and where each output lies in the one scratch buffer."""

    def __init__(self, groups: int, n: int, k: int, n_pad: int, k_pad: int, nwg: int, blocks: int, dual: bool,
                 rows: int, kcu: int = KCU, warps: int = WARPS, prefetch: int = PREFETCH, once: int | None = None,
                 rows_first: int | None = None, whole: int | None = None):
        # (the knobs' module defaults read at the call: a development A/B may set ONCE, ROWS_FIRST, WHOLE)
        once = ONCE if once is None else once
        rows_first = ROWS_FIRST if rows_first is None else rows_first
        whole = (WHOLE if once else 0) if whole is None else whole  # (whole needs once: off with the older form)
        if (n_pad + 128) * (k // 16 + 4) >= 1 << 31:  # the kernel's offsets inside one matrix are 32-bit
            raise ValueError(f"the gather takes weight matrices of fewer than 2^35 elements; one group's is {n} x {k}")
        if once and kcu & (kcu - 1):
            raise ValueError(f"the gather's one-load form (once=1) takes a power of two of units per program, not "
                             f"{kcu}")
        if whole and not once:
            raise ValueError("the gather's whole-program loads (whole=1) need its one-load form (once=1)")
        self.groups, self.n, self.k, self.dual, self.rows, self.kcu = groups, n, k, dual, rows, kcu
        self.prefetch, self.once, self.rows_first, self.whole = prefetch, once, rows_first, whole
        self.warps = warps
        rb_n, self.kc_n, self.per = groups * n_pad // 64, k_pad // 64, nwg * blocks
        self.ctas = rb_n // (blocks if dual else self.per)
        self.units = (2 if dual else 1) * rb_n * -(-self.kc_n // kcu)
        self.a_progs = -(-rows // A_ROWS)
        self.scales_at = rows * (k // 2)
        self.offsets_at = -(-(self.scales_at + rows * (k // 16)) // 16) * 16
        self.gs_b_at = self.offsets_at + 16 * (groups + 1)
        self.gs_a_at = self.gs_b_at + 8 * groups
        self.small_bytes = self.gs_a_at + 4 * groups + 16
        self.header = [n, k, n_pad, self.kc_n, self.per, blocks, groups, self.units, self.a_progs, self.scales_at,
                       self.offsets_at, self.gs_b_at, self.gs_a_at] + [0] * (F - len(HEADER))
        self.grid = self.units + self.a_progs + 1
        self.packed_shape = (self.ctas, self.kc_n, self.per, UNIT_BYTES)  # the packed weights (rows do not matter)
        self.consts: dict = {}  # (swz_a, swz_b, post) -> the launch's constexprs (launch_plan)


def run(table: torch.Tensor, plan: Plan, *, swz_a: bool = False, swz_b: bool = False, post: float = 1.0):
    """Launch the gather for ``table`` (on the device: the plan's header, then ``[groups, F]`` int64 rows as
    :data:`FIELDS`). Returns ``(packed [ctas, K_pad/64, per, 2304], small)``: the scratch buffer holding the
    activation codes and scales, offsets and global scales at the plan's ``*_at`` byte offsets."""
    dev = table.device
    packed = torch.empty(plan.packed_shape, dtype=torch.uint8, device=dev)
    small = torch.empty(plan.small_bytes, dtype=torch.uint8, device=dev)
    stream = torch.cuda.current_stream(dev).cuda_stream if dev.type == "cuda" else 0  # (0: Triton's interpreter)
    launch_plan(plan, table.data_ptr(), packed, small, stream, swz_a=swz_a, swz_b=swz_b, post=post)
    return packed, small


def launch_plan(plan: Plan, table_at: int, packed: torch.Tensor, small: torch.Tensor, stream: int, *,
                swz_a: bool = False, swz_b: bool = False, post: float = 1.0) -> None:
    """Launch the gather into buffers the caller holds (``packed`` and ``small`` of at least the plan's sizes) on
    ``stream`` (a CUDA stream handle: torch's current stream). ``table_at``: the address of the table (the plan's
    header, then the group rows): device memory, or pinned host memory, which the kernel reads in place (a
    one-shot call's table: no copy to launch first; the caller keeps it unchanged until the kernel has run)."""
    # compiled on its first launch per flags, then through its compiled launcher (:mod:`..common.triton_launch`)
    triton_launch(_kernel(), (plan.grid,), (packed, small, table_at), _consts(plan, swz_a, swz_b, post), plan.warps,
                  stream)


def bind_plan(plan: Plan, table_at: int, packed: torch.Tensor, small: torch.Tensor, *, swz_a: bool = False,
              swz_b: bool = False, post: float = 1.0):
    """The gather of an earlier :func:`launch_plan` with these arguments as a prepared driver launch
    (:func:`..common.triton_launch.bound`: parameter 2 is the table's address, which every table of a
    16-byte-aligned ring shares the specialisation of), or None where it cannot be prepared."""
    return bound(_kernel(), (plan.grid,), (packed, small, table_at), _consts(plan, swz_a, swz_b, post),
                 plan.warps)


def _consts(plan: Plan, swz_a: bool, swz_b: bool, post: float) -> dict:
    consts = plan.consts.get((swz_a, swz_b, post))
    if consts is None:
        values = (plan.dual, swz_a, swz_b, max(16, _next_pow2(plan.groups)), post, A_ROWS, A_BYTES, plan.kcu,
                  plan.prefetch, plan.once, plan.rows_first, plan.whole)
        consts = plan.consts[(swz_a, swz_b, post)] = dict(zip(CONSTS, values))
    return consts


# the kernel's constexprs, in order
CONSTS = ("DUAL", "SWZ_A", "SWZ_B", "G_P2", "POST", "ROWS", "BYTES", "KCU", "PREFETCH", "ONCE", "ROWS_FIRST",
          "WHOLE")


def launch(table: torch.Tensor, groups: int, n: int, k: int, n_pad: int, k_pad: int, nwg: int, blocks: int,
           dual: bool, rows: int, *, swz_a: bool = False, swz_b: bool = False, post: float = 1.0,
           weights_only: bool = False, kcu: int = KCU, prefetch: int = PREFETCH, once: int | None = None,
           rows_first: int | None = None, whole: int | None = None):
    """Build the plan, put its header before ``table``'s group rows and run; returns ``(packed, a_codes [T, K/2],
    a_scales [T, K/16], offsets [G+1], gs_a [G], gs_b [G, 2])`` (no activation rows with ``weights_only``).
    ``table``: the group rows ``[groups·F]`` int64 on the device (for callers that build them there)."""
    plan = Plan(groups, n, k, n_pad, k_pad, nwg, blocks, dual, 0 if weights_only else rows, kcu,
                prefetch=prefetch, once=once, rows_first=rows_first, whole=whole)
    full = torch.cat([torch.tensor(plan.header, dtype=torch.int64, device=table.device), table.reshape(-1)])
    packed, small = run(full, plan, swz_a=swz_a, swz_b=swz_b, post=post)
    return (packed, *views(small, plan))


def views(small: torch.Tensor, plan: Plan):
    """(a_codes, a_scales, offsets, gs_a, gs_b) of the scratch buffer."""
    r, k, g = plan.rows, plan.k, plan.groups
    return (small[: plan.scales_at].view(r, k // 2),
            small[plan.scales_at: plan.scales_at + r * (k // 16)].view(r, k // 16),
            small[plan.offsets_at: plan.offsets_at + 4 * (g + 1)].view(torch.int32),
            small[plan.gs_a_at: plan.gs_a_at + 4 * g].view(torch.float32),
            small[plan.gs_b_at: plan.gs_b_at + 8 * g].view(torch.float32).view(g, 2))
