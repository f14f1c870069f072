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
  method of ``python -m nvfp4lib gather-bench``, :mod:`nvfp4lib.gather_bench`):
  S1 154 µs against 200 µs for the earlier 64 × 256-byte tile permuted in registers (whose Nsight Compute profile
  showed L1 at 91% of its throughput and 144 registers, 19% occupancy), S2 82 vs 111, S1-dual 300 vs 390;
  vectorising each row's four words (32-byte loads, 16-byte stores) was slower (163–320 µs on S1). At 2fe0d84 the
  kernel fell from 145 registers (set by the activation-rows branch) to 64, and S1's weights from 153.7 to 122.2 µs
  (S1-dual 299.8 to 238.2; recorded A/B in ``data/gather.jsonl``); one load per lane writing four words (77b4697)
  was 14–27% slower;
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
A_ROWS = 4  # activation rows per program (8 rows took the kernel to 114-145 registers: 3 programs per SM)
A_BYTES = 256  # code bytes per inner step of an activation row
KCU = 8  # 64-row x 64-K weight units per program (consecutive along K, one after the other)
WARPS = 4  # warps per program
_KERNEL = None


def group_table(a, b, b2=None) -> list[int] | None:
    """The table's group rows (:data:`FIELDS`, ``F`` ints per group) for NVFP4Tensor lists: activations ``a`` (None:
    weights alone, no activation rows) and weights ``b`` (and ``b2``, the dual's second matrix), or None unless every
    part can be read in place: lists of equal length of 2-D NVFP4Tensors on one device, the weights all of ``b[0]``'s
    shape with N > 0, the activations of their K, every part contiguous and the weight codes 8-byte aligned.

    Callers either checked the operands before (then None means "not readable in place") or take the checked path on
    None, which names what is wrong. (A one-shot call builds this every call, as its only pass over the operands: on
    the lent H100's host each tensor attribute read costs 0.13-0.2 µs; an NVFP4Tensor's parts share one device and its
    global scale is float32, both checked when it is built.)"""
    lists = (list, tuple)
    if type(b) not in lists or not b or (a is not None and (type(a) not in lists or len(a) != len(b))) \
            or (b2 is not None and (type(b2) not in lists or len(b2) != len(b))) or type(b[0]) is not NVFP4Tensor:
        return None
    shape = b[0].data.shape
    if len(shape) != 2 or not shape[0]:
        return None
    kh, dev = shape[1], b[0].data.get_device()
    pad = [0] * (F - len(FIELDS))
    table = []
    for g, w in enumerate(b):
        if type(w) is not NVFP4Tensor:
            return None
        wd, ws = w.data, w.scales
        if wd.shape != shape or wd.get_device() != dev or not (wd.is_contiguous() and ws.is_contiguous()):
            return None
        wp, wg = wd.data_ptr(), w.global_scale.data_ptr()
        if b2 is None:
            wsp = ws.data_ptr()
            up, ug = wp, wg
            row = [wp, wsp, wp, wsp]
        else:
            u = b2[g]
            if type(u) is not NVFP4Tensor:
                return None
            ud, us = u.data, u.scales
            if ud.shape != shape or ud.get_device() != dev or not (ud.is_contiguous() and us.is_contiguous()):
                return None
            up = ud.data_ptr()
            row = [wp, ws.data_ptr(), up, us.data_ptr()]
            ug = u.global_scale.data_ptr()
        if not codes_readable(wp, up):
            return None
        if a is None:  # no rows; A's global-scale address only has to be readable
            table += [0, 0, 0, *row, wg, wg, ug, *pad]
        else:
            x = a[g]
            if type(x) is not NVFP4Tensor:
                return None
            xd, xs = x.data, x.scales
            xsh = xd.shape
            if len(xsh) != 2 or xsh[1] != kh or xd.get_device() != dev or not (xd.is_contiguous()
                                                                             and xs.is_contiguous()):
                return None
            table += [xd.data_ptr(), xs.data_ptr(), xsh[0], *row, x.global_scale.data_ptr(), wg, ug, *pad]
    return table


def codes_readable(*addresses: int) -> bool:
    """Whether weight codes at these addresses can be read in place: the gather reads them as 8-byte pairs."""
    bits = 0
    for a in addresses:
        bits |= a
    return not bits & 7


def _kernel():
    global _KERNEL
    if _KERNEL is not None:
        return _KERNEL
    import triton
    import triton.language as tl

    @triton.jit
    def gather(packed, small, table_at, DUAL: tl.constexpr, SWZ_A: tl.constexpr, SWZ_B: tl.constexpr,
               G_P2: tl.constexpr, POST: tl.constexpr, ROWS: tl.constexpr, BYTES: tl.constexpr, KCU: tl.constexpr):
        pid = tl.program_id(0)
        table = table_at.to(tl.pointer_type(tl.int64))  # device memory, or pinned host memory read in place
        n = tl.load(table + 0).to(tl.int32)
        k = tl.load(table + 1).to(tl.int32)
        n_pad = tl.load(table + 2).to(tl.int32)
        kc_n = tl.load(table + 3).to(tl.int32)
        per = tl.load(table + 4).to(tl.int32)
        blocks = tl.load(table + 5).to(tl.int32)
        groups = tl.load(table + 6).to(tl.int32)
        units = tl.load(table + 7).to(tl.int32)
        a_progs = tl.load(table + 8).to(tl.int32)
        rows_t = table + 16  # group g's row at rows_t + 16 g
        # (sizes as int32: per-element offsets inside one group's matrix stay 32-bit, Plan checks they fit; fewer
        # registers per element than int64 offsets)
        g_idx = tl.arange(0, G_P2)
        g_ok = g_idx < groups
        cols = k // 16
        if pid < units:  # ---- KCU consecutive 64-row x 64-K units of the packed weights (one 64-row block)
            kcp_n = (kc_n + KCU - 1) // KCU
            per_mat = units // (2 if DUAL else 1)
            mat = pid // per_mat
            unit = pid % per_mat
            rb = unit // kcp_n
            if DUAL:
                cta = rb // blocks
                slot = mat * blocks + rb % blocks
            else:
                cta = rb // per
                slot = rb % per
            base = rows_t + (rb * 64 // n_pad) * 16 + 3 + 2 * mat  # one group per block: n_pad is a multiple of 64
            cptr = tl.load(base).to(tl.pointer_type(tl.uint64))  # codes read as 8-byte pairs (group_table: aligned)
            sptr = tl.load(base + 1).to(tl.pointer_type(tl.uint8))
            # one output word per element, no tile and no layout change: word (w, g, c, j) of a unit holds bytes
            # (e, hp); byte (e, hp) packs nibble e of byte c of words 2j (x) and 2j + 1 (y) of source row
            # 16w + 8(1-hp) + g, i.e. byte c of both halves of the row's code pair j
            q = tl.arange(0, 512)
            j = q % 4
            c = ((q // 4) % 4 * 8).to(tl.uint64)
            rw = rb * 64 + 16 * (q // 128) + (q // 16) % 8
            r0 = (rw + 8) % n_pad  # hp = 0
            r1 = rw % n_pad  # hp = 1
            # scales: output byte (w, g, j, h) of a unit is scale column j of row 16w + 8h + g
            t = tl.arange(0, 256)
            sr = (rb * 64 + 16 * (t // 64) + 8 * (t % 2) + (t // 8) % 8) % n_pad
            sj = (t // 2) % 4
            for u in range(KCU):
                kc = (unit % kcp_n) * KCU + u
                if kc < kc_n:
                    dst = ((cta * kc_n + kc) * per + slot).to(tl.int64) * 2304  # the unit's byte offset
                    kp = kc * 4 + j  # code pair along K
                    ok = kp < k // 16
                    p0 = tl.load(cptr + (r0 * cols + kp), mask=ok & (r0 < n), other=0) >> c
                    p1 = tl.load(cptr + (r1 * cols + kp), mask=ok & (r1 < n), other=0) >> c
                    xs = ((p0 & 255) | ((p1 & 255) << 8)).to(tl.uint32)  # byte c of x, hp = 0 | 1
                    ys = (((p0 >> 32) & 255) | (((p1 >> 32) & 255) << 8)).to(tl.uint32)
                    x = (xs & 0x0F0F) | ((xs & 0xF0F0) << 12)  # nibbles to bytes (e, hp)
                    y = (ys & 0x0F0F) | ((ys & 0xF0F0) << 12)
                    word = ((x & 0x07070707) << 1) | ((x & 0x08080808) << 4) | ((y & 0x08080808) >> 3) \
                        | ((y & 0x07070707) << 4)
                    tl.store(packed.to(tl.pointer_type(tl.uint32)) + dst // 4 + q, word)
                    sk = kc * 4 + sj
                    if SWZ_B:  # 128x4 atoms, row-atom-major; inside one: (r % 32) * 16 + (r // 32 % 4) * 4 + c % 4
                        soff = ((sr // 128) * ((cols + 3) // 4) + sk // 4) * 512 + (sr % 32) * 16 \
                            + ((sr // 32) % 4) * 4 + sk % 4
                    else:
                        soff = sr * cols + sk
                    sv = tl.load(sptr + soff, mask=(sr < n) & (sk < cols), other=0)
                    tl.store(packed + dst + 2048 + t, sv)
        elif pid < units + a_progs:  # ---- ROWS packed activation rows
            a_codes = small
            a_scales = small + tl.load(table + 9)
            rows = tl.load(rows_t + g_idx * 16 + 2, mask=g_ok, other=0)
            ends = tl.cumsum(rows, 0)
            r = (pid - units) * ROWS + tl.arange(0, ROWS)
            live = r < tl.sum(rows, 0)
            g = tl.minimum(tl.sum((ends[None, :] <= r[:, None]).to(tl.int32), 1), groups - 1)
            start = tl.sum(tl.where(g_idx[None, :] < g[:, None], rows[None, :], 0), 1)
            local = (r - start).to(tl.int64)
            cp = tl.load(rows_t + g * 16 + 0, mask=live, other=0).to(tl.pointer_type(tl.uint8))
            sp = tl.load(rows_t + g * 16 + 1, mask=live, other=0).to(tl.pointer_type(tl.uint8))
            half = k // 2
            for b in range(0, half, BYTES):
                cb = b + tl.arange(0, BYTES)
                msk = live[:, None] & (cb[None, :] < half)
                v = tl.load(cp[:, None] + local[:, None] * half + cb[None, :], mask=msk, other=0)
                tl.store(a_codes + r.to(tl.int64)[:, None] * half + cb[None, :], v, mask=msk)
            for b in range(0, cols, 64):
                sc = b + tl.arange(0, 64)
                msk = live[:, None] & (sc[None, :] < cols)
                if SWZ_A:
                    soff = ((local[:, None] // 128) * ((cols + 3) // 4) + sc[None, :] // 4) * 512 \
                        + (local[:, None] % 32) * 16 + ((local[:, None] // 32) % 4) * 4 + sc[None, :] % 4
                else:
                    soff = local[:, None] * cols + sc[None, :]
                v = tl.load(sp[:, None] + soff, mask=msk, other=0)
                tl.store(a_scales + r.to(tl.int64)[:, None] * cols + sc[None, :], v, mask=msk)
        else:  # ---- offsets, A's global scales, gs_b
            offsets = (small + tl.load(table + 10)).to(tl.pointer_type(tl.int32))
            gs_b = (small + tl.load(table + 11)).to(tl.pointer_type(tl.float32))
            gs_a = (small + tl.load(table + 12)).to(tl.pointer_type(tl.float32))
            rows = tl.load(rows_t + g_idx * 16 + 2, mask=g_ok, other=0)
            tl.store(offsets + 1 + g_idx, tl.cumsum(rows, 0).to(tl.int32), mask=g_ok)
            tl.store(offsets + g_idx, tl.zeros([G_P2], tl.int32), mask=g_idx == 0)
            pa = tl.load(rows_t + g_idx * 16 + 7, mask=g_ok, other=0).to(tl.pointer_type(tl.float32))
            pb = tl.load(rows_t + g_idx * 16 + 8, mask=g_ok, other=0).to(tl.pointer_type(tl.float32))
            pb2 = tl.load(rows_t + g_idx * 16 + 9, mask=g_ok, other=0).to(tl.pointer_type(tl.float32))
            tl.store(gs_a + g_idx, tl.load(pa, mask=g_ok, other=1.0), mask=g_ok)
            tl.store(gs_b + 2 * g_idx, tl.load(pb, mask=g_ok, other=1.0) * POST, mask=g_ok)
            tl.store(gs_b + 2 * g_idx + 1, tl.load(pb2, mask=g_ok, other=1.0) * POST, mask=g_ok)

    _KERNEL = gather
    return _KERNEL


def _next_pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


class Plan:
    """The sizes of one gather: the header row, the grid, and where each output lies in the one scratch buffer."""

    def __init__(self, groups: int, n: int, k: int, n_pad: int, k_pad: int, nwg: int, blocks: int, dual: bool,
                 rows: int, kcu: int = KCU, warps: int = WARPS):
        if (n_pad + 128) * (k // 16 + 4) >= 1 << 31:  # the kernel's offsets inside one matrix are 32-bit
            raise ValueError(f"the gather takes weight matrices of fewer than 2^35 elements; one group's is {n} x {k}")
        self.groups, self.n, self.k, self.dual, self.rows, self.kcu = groups, n, k, dual, rows, kcu
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
    return bound(_kernel(), (plan.grid,), (packed, small, table_at), _consts(plan, swz_a, swz_b, post), plan.warps)


def _consts(plan: Plan, swz_a: bool, swz_b: bool, post: float) -> dict:
    consts = plan.consts.get((swz_a, swz_b, post))
    if consts is None:
        values = (plan.dual, swz_a, swz_b, max(16, _next_pow2(plan.groups)), post, A_ROWS, A_BYTES, plan.kcu)
        consts = plan.consts[(swz_a, swz_b, post)] = dict(zip(CONSTS, values))
    return consts


CONSTS = ("DUAL", "SWZ_A", "SWZ_B", "G_P2", "POST", "ROWS", "BYTES", "KCU")  # the kernel's constexprs, in order


def launch(table: torch.Tensor, groups: int, n: int, k: int, n_pad: int, k_pad: int, nwg: int, blocks: int,
           dual: bool, rows: int, *, swz_a: bool = False, swz_b: bool = False, post: float = 1.0,
           weights_only: bool = False, kcu: int = KCU):
    """Build the plan, put its header before ``table``'s group rows and run; returns ``(packed, a_codes [T, K/2],
    a_scales [T, K/16], offsets [G+1], gs_a [G], gs_b [G, 2])`` (no activation rows with ``weights_only``).
    ``table``: the group rows ``[groups·F]`` int64 on the device (for callers that build them there)."""
    plan = Plan(groups, n, k, n_pad, k_pad, nwg, blocks, dual, 0 if weights_only else rows, kcu)
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
