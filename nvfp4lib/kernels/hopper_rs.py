"""``cute-hopper`` with ``swap_ab``: weights decoded straight into wgmma's register operand (sm_90a, CuTe DSL).

The smem kernel (:mod:`.hopper`) decodes both operands into shared memory for every output tile, so a
weight is decoded once per token tile and the tokens pad wgmma's 64-row M. Here the roles swap:

- the **weights** are wgmma's A operand (M = 64 weight rows per warpgroup), read from **registers**:
  each thread loads its 16 prepacked code bytes and 8 scale bytes of a 64-K unit from shared memory
  and decodes them into exactly the 16 fp16 registers of its wgmma fragment (:mod:`.rs_layout`);
- the **tokens** are wgmma's N (any multiple of 8 up to 256): a group of 40 tokens costs a 40-wide
  MMA, not a 64- or 128-row tile; with ``tile_n`` ≥ the group's rows, each weight is decoded once;
- the **activations** are decoded once per call by a one-launch prologue that reads the caller's tensors in
  place (a table of row addresses) into fp16 (value × scale × 2^-7, exact) and writes the per-group factors
  ``alpha``; they reach shared memory by TMA (128-byte swizzle, the K-major B operand) in boxes of
  ``token_step`` rows. The GEMM is launched with programmatic dependent launch: its set-up and first weight
  loads overlap the prologue, which it waits for (``griddepcontrol.wait``) before loading activations;
  Up to :data:`PARAM_GROUPS` groups the prologue takes the groups' addresses as kernel parameters (no row table to
  load first), and it asks for :data:`ACT_SMEM` bytes of shared memory so that its SMs already run with the GEMM's
  carveout and the GEMM's CTAs start beside it;
- or (``act_decode="warpgroup"``, configs ``*_dw``) a third warpgroup in every CTA decodes the tile's token rows from
  the caller's tensors straight into the fp16 ring and issues the weight loads: one launch, no prologue. Exact, and
  slower than the prologue pair on every benchmark shape on the H100 (its global loads, notebook 09 steps 21–23);
- or (``act_decode="inline"``, configs ``*_e_i``) the MMA warpgroups copy their raw activation rows into each stage
  with cp.async and decode them into a two-slot fp16 ring one K tile ahead. Exact, and slower still (a K tile costs
  1.26 instead of 0.66 us on S4; notebook 09 step 26);
- two warpgroups per CTA, each with one or two 64-row wgmma blocks (``tile_m`` = 128 or 256 weight rows of one
  matrix), or (dual) the same 64 or 128 rows of B1 (warpgroup 0) and B2 (warpgroup 1). One thread issues the TMA
  loads (weights: one contiguous prepacked block per stage) into an ``ab_stages``-deep mbarrier pipeline;
- per 64-K sub-block: two shared loads and 4 × 14 decode instructions per block, then 4 wgmma (k16) per block
  that run while the next sub-block is decoded into the other register set (``wait_group(1)`` before reuse);
- with ``token_step`` the kernel holds one wgmma N per multiple of the step up to ``tile_n`` and each tile runs
  the narrowest that covers its tokens (:func:`plan_token_tiles` chooses the tiles, widest first);
- epilogue: fp32 × ``alpha = gs_A·gs_B·2^14`` (the tile is Cᵀ: weight rows × tokens), rounded to the output type and
  stored per element (``epilogue="simt"``), or written to shared memory as C rows and copied out in 16-byte row
  chunks (``"staged"``, configs ``*_e``). Dual: both warpgroups hand half of their accumulators to the other and
  compute silu(gate)·up (fast exp and reciprocal) for their own half.

Knobs (``KernelConfig``): ``tile_m`` weight rows per CTA, ``tile_n`` tokens per CTA (the widest), ``token_step``,
``tile_k`` K per stage (128 or 256), ``ab_stages``, ``epilogue``, ``act_decode``; :func:`validate` refuses what cannot
work before compiling. Configs are named ``rs_*`` in :data:`nvfp4lib.kernels.hopper.CONFIGS`.
"""
from __future__ import annotations

import time

import torch

from ..backends import Runner
from .config import KernelConfig
from .hopper import (
    _DECODE_REGS,
    CONVERT16_PTX,
    POST_SCALE,
    SMEM_LIMIT,
    _convert_store_ptx,
    _cute,
    _require_hopper,
)
from .packing import (
    WIDE_TILE_COLUMNS,
    check_scales_finite,
    padded_row_offsets,
    round_up,
    stack_weights,
    tile_fields,
)
from .rs_layout import RS_DECODE_PTX, UNIT_BYTES, UNIT_CODE_BYTES, UNIT_K, UNIT_ROWS, prepack_weights

NWG = 2  # warpgroups per CTA, each one 64-row wgmma
MAX_ACC_REGS = 128
MAX_VARIANTS = 8  # wgmma N widths compiled into one kernel (code size and compile time grow with each)
CTA_OVERHEAD_TOKENS = 20  # a CTA's fixed cost (weight decode, pipeline fill), in tokens of MMA: H100, S4 t64 vs t128
ROW_BYTES = 128  # the prepacked weights are moved as rows of 128 bytes (18 per unit)
# where the activations are decoded: a prologue launch (to fp16 in global memory, then TMA), a third warpgroup of every
# CTA (from global memory into the fp16 ring), or the MMA warpgroups themselves (raw codes and scales copied to shared
# memory by cp.async, decoded into a two-slot fp16 ring one K tile ahead of the wgmma that reads it)
ACT_DECODES = ("prologue", "warpgroup", "inline")
# act_decode="warpgroup": 384 threads share 64K registers (168 each); the MMA warpgroups hold their accumulators,
# two A fragment sets and the staged loads of a sub-block, the decode warpgroup DW_BATCH K tiles of raw codes
DW_MAX_ACC_REGS = 64
DW_BATCH = 2  # K tiles whose raw activations the decode warpgroup loads at once (their latency is paid once)
# diagnostics (wrong results by design): the weight words fed to wgmma undecoded; no wgmma (decode kept alive);
# no activation loads (their smem slots hold stale data); no output stores (kept alive by an impossible test); the
# decode warpgroup decoding zeros instead of loading the activations from global memory; "timeline": exact, but thread 0
# of every CTA also writes TIMELINE_POINTS %globaltimer stamps (ns, int64) over the first 32 outputs of its tile's first
# token row (read by :func:`read_timeline`)
ABLATE = ("", "no_dequant", "no_mma", "no_x", "no_store", "no_xload", "timeline")
TIMELINE_POINTS = ("entry", "weights_issued", "prologue_done", "first_stage", "k_loop_done", "stored")


def ablated(cfg: KernelConfig, what: str) -> bool:
    """Whether diagnostic ``what`` (:data:`ABLATE`) is on: ``cfg.ablate`` names one, or several joined by '+'."""
    return what in cfg.ablate.split("+")


def blocks_per_warpgroup(cfg: KernelConfig) -> int:
    """64-row weight units per warpgroup: ``tile_m`` is 128·blocks weight rows (64·blocks for the dual GEMM,
    whose two warpgroups cover the same rows of gate and up)."""
    return cfg.tile_m * (2 if cfg.dual else 1) // (UNIT_ROWS * NWG)


def token_step(cfg: KernelConfig) -> int:
    """Tokens per wgmma N variant: tiles run with N = their tokens rounded up to this."""
    return cfg.token_step or cfg.tile_n


def acc_registers(cfg: KernelConfig) -> int:
    return blocks_per_warpgroup(cfg) * cfg.tile_n // 2


def block_threads(cfg: KernelConfig) -> int:
    """The MMA warpgroups, and the decode warpgroup of act_decode="warpgroup"."""
    return 128 * (NWG + (cfg.act_decode == "warpgroup"))


STAGE_PAD = 8  # elements of padding per staged output row (16 bytes: rows start in different banks)


def xfer_bytes(cfg: KernelConfig) -> int:
    """Dual: the accumulators handed between the warpgroups (fp32, one per thread and element); 0 otherwise."""
    return acc_registers(cfg) * 4 * 128 if cfg.dual else 0


def stage_bytes(cfg: KernelConfig) -> int:
    """epilogue="staged": the output tile as C rows (tile_n tokens × the tile's columns + pad, 2 bytes each)."""
    return cfg.tile_n * (cfg.tile_m + STAGE_PAD) * 2 if cfg.epilogue == "staged" else 0


def stage_warpgroups(cfg: KernelConfig) -> int:
    """Warpgroups whose weights one pipeline stage holds: both (they run the same K tile together), or with
    ``warp_spec="pingpong"`` one (each runs its whole K loop on its own stages, one after the other)."""
    return 1 if cfg.warp_spec == "pingpong" else NWG


def stage_units(cfg: KernelConfig) -> int:
    return cfg.tile_k // UNIT_K * stage_warpgroups(cfg) * blocks_per_warpgroup(cfg)


def x_slots(cfg: KernelConfig) -> int:
    """Slots of the fp16 activation ring: one per pipeline stage, or (act_decode="inline") two, written one K tile
    ahead of the wgmma that reads them."""
    return 2 if cfg.act_decode == "inline" else cfg.ab_stages


def raw_stage_bytes(cfg: KernelConfig) -> int:
    """act_decode="inline": a stage's raw activations (tile_n rows of tile_k/2 code bytes, then of tile_k/16 scales)."""
    return cfg.tile_n * (cfg.tile_k // 2 + cfg.tile_k // 16) if cfg.act_decode == "inline" else 0


def smem_plan(cfg: KernelConfig) -> dict:
    nsub = cfg.tile_k // UNIT_K
    plan = {
        "barriers": cfg.ab_stages * 16,
        "weights": cfg.ab_stages * stage_units(cfg) * UNIT_BYTES,
        "activations": x_slots(cfg) * nsub * cfg.tile_n * UNIT_K * 2,
        "raw_activations": cfg.ab_stages * raw_stage_bytes(cfg),
    }
    plan["total"] = 1024 + 1024 + plan["weights"] + 1024 + plan["activations"] + plan["raw_activations"]
    plan["per_stage"] = (plan["weights"] + plan["raw_activations"]) // cfg.ab_stages + (
        0 if cfg.act_decode == "inline" else plan["activations"] // cfg.ab_stages)
    return plan


def validate(cfg: KernelConfig) -> KernelConfig:
    """Raise ValueError naming the rule a swap-AB config breaks; return it unchanged if it can work."""
    n = cfg.name
    if not cfg.swap_ab:
        raise ValueError(f"{n}: the register-sourced kernel is the swap_ab=True kernel")
    allowed = (64, 128) if cfg.dual else (128, 256)
    if cfg.tile_m not in allowed:
        raise ValueError(f"{n}: tile_m={cfg.tile_m}: with swap_ab a CTA covers {' or '.join(map(str, allowed))} "
                         "weight rows (two warpgroups of one or two 64-row wgmma blocks"
                         f"{', gate and up' if cfg.dual else ''})")
    if cfg.tile_n % 8 or not 8 <= cfg.tile_n <= 256:
        raise ValueError(f"{n}: tile_n={cfg.tile_n} tokens: wgmma's N must be a multiple of 8 in [8, 256]")
    step = token_step(cfg)
    if step % 8 or cfg.tile_n % step or cfg.tile_n // step > MAX_VARIANTS:
        raise ValueError(f"{n}: token_step={cfg.token_step}: must be a multiple of 8 dividing tile_n={cfg.tile_n} "
                         f"into at most {MAX_VARIANTS} wgmma N variants")
    if acc_registers(cfg) > MAX_ACC_REGS:
        raise ValueError(f"{n}: tile_n={cfg.tile_n} tokens × {blocks_per_warpgroup(cfg)} block(s) per warpgroup need "
                         f"{acc_registers(cfg)} fp32 accumulator registers per thread (at most {MAX_ACC_REGS})")
    if cfg.tile_k not in (128, 256):
        raise ValueError(f"{n}: tile_k={cfg.tile_k}: must be 128 or 256: an even number of 64-K sub-blocks (the two "
                         "register sets alternate within a stage), and a stage's weights are one TMA box of at most "
                         "256 rows of 128 bytes (18 per sub-block and warpgroup)")
    if stage_units(cfg) * UNIT_BYTES // ROW_BYTES > 256:
        raise ValueError(f"{n}: tile_k={cfg.tile_k} with {blocks_per_warpgroup(cfg)} blocks per warpgroup: a stage's "
                         f"weights are {stage_units(cfg) * UNIT_BYTES // ROW_BYTES} rows of 128 bytes, over the TMA "
                         "box limit of 256")
    if cfg.ab_stages < 1:
        raise ValueError(f"{n}: ab_stages={cfg.ab_stages} must be >= 1")
    if cfg.warp_spec not in ("none", "pingpong") or cfg.cooperative or cfg.decode_warpgroups != 1:
        raise ValueError(f"{n}: swap_ab runs two decoding+MMA warpgroups on the same K tiles (warp_spec='none') or one "
                         f"after the other (warp_spec='pingpong'); got warp_spec={cfg.warp_spec!r}, "
                         f"cooperative={cfg.cooperative}, decode_warpgroups={cfg.decode_warpgroups}")
    if cfg.warp_spec == "pingpong" and (cfg.act_decode != "warpgroup" or cfg.dual or cfg.epilogue != "simt"):
        raise ValueError(f"{n}: warp_spec='pingpong' needs the decode warpgroup as its producer "
                         f"(act_decode='warpgroup', got {cfg.act_decode!r}), a single GEMM (the dual's warpgroups hold "
                         f"gate and up of the same rows; dual={cfg.dual}) and epilogue='simt' (one warpgroup stores "
                         f"while the other still reads the activation ring; got {cfg.epilogue!r})")
    if cfg.epilogue not in ("simt", "staged"):
        raise ValueError(f"{n}: epilogue={cfg.epilogue!r}: the swap_ab kernel stores per element ('simt') or "
                         "through a shared-memory tile ('staged')")
    if cfg.split_k != 1:
        raise ValueError(f"{n}: split_k={cfg.split_k}: not implemented for swap_ab")
    x_bytes = smem_plan(cfg)["activations"]
    if xfer_bytes(cfg) + stage_bytes(cfg) > x_bytes:
        raise ValueError(f"{n}: the epilogue reuses the activation buffers ({x_bytes} bytes) for the dual hand-over "
                         f"({xfer_bytes(cfg)}) and the staged output tile ({stage_bytes(cfg)}): too small")
    if any(a not in ABLATE for a in cfg.ablate.split("+")):
        raise ValueError(f"{n}: ablate={cfg.ablate!r}: must be one of {ABLATE}, or several joined by '+'")
    if cfg.act_decode not in ACT_DECODES:
        raise ValueError(f"{n}: act_decode={cfg.act_decode!r}: must be one of {ACT_DECODES}")
    if cfg.act_decode != "prologue" and acc_registers(cfg) > DW_MAX_ACC_REGS:
        why = (f"runs {block_threads(cfg)} threads, which leaves at most {65536 // block_threads(cfg)} registers each"
               if cfg.act_decode == "warpgroup" else
               "keeps the addresses of its activation rows in registers beside the accumulators")
        raise ValueError(f"{n}: act_decode={cfg.act_decode!r} {why}: at most {DW_MAX_ACC_REGS} accumulator registers "
                         f"per thread, not {acc_registers(cfg)} (tile_n={cfg.tile_n}, {blocks_per_warpgroup(cfg)} "
                         "block(s) per warpgroup)")
    if cfg.act_decode == "inline" and (ablated(cfg, "no_x") or ablated(cfg, "no_xload")):
        raise ValueError(f"{n}: ablate={cfg.ablate!r}: act_decode='inline' has neither activation TMA loads "
                         "('no_x') nor a decode warpgroup ('no_xload')")
    if cfg.act_decode == "warpgroup":
        if ablated(cfg, "no_x"):
            raise ValueError(f"{n}: ablate='no_x' removes the activations' TMA loads, which act_decode='warpgroup' "
                             "does not have")
    elif ablated(cfg, "no_xload"):
        raise ValueError(f"{n}: ablate='no_xload' removes the decode warpgroup's loads: act_decode='warpgroup' only")
    plan = smem_plan(cfg)
    if plan["total"] > SMEM_LIMIT:
        raise ValueError(f"{n}: needs {plan['total']} bytes of shared memory > the sm_90 limit {SMEM_LIMIT} "
                         f"({cfg.ab_stages} stages of {plan['per_stage']} bytes: tile_n={cfg.tile_n} tokens × "
                         f"tile_k={cfg.tile_k} fp16 activations + packed weights)")
    return cfg


# activation prologue: one thread decodes 16 codes (8 bytes + 1 scale byte) into 32 bytes of fp16 in global memory
ACT_DECODE_PTX = "\n".join([
    "{", _DECODE_REGS, ".reg .b16 sp;",
    "ld.global.nc.v2.b32 {w0, w1}, [$0];",
    "ld.global.nc.u8 s, [$1];",
    _convert_store_ptx("$2", "$3", space="global"),
    "}",
])
ACT_THREADS = 256
# dynamic shared memory the prologue asks for (unused by it): enough that its SMs run with the large shared-memory
# carveout the GEMM needs, so that GEMM CTAs start beside prologue CTAs (PDL) instead of after them (H100, round 29:
# S4 17.06 vs 17.31 us with 0, the other shapes equal)
ACT_SMEM = 32768
# alpha[g] = gs_A[g] · (gs_B1[g], gs_B2[g]) · 2^14, from the 0-d global-scale tensor of A's group g
ALPHA_PTX = "\n".join([
    "{", ".reg .f32 a, b0, b1;",
    "ld.global.f32 a, [$0];", "ld.global.v2.f32 {b0, b1}, [$1];",
    "mul.rn.f32 b0, a, b0;", "mul.rn.f32 b1, a, b1;",
    "st.global.v2.f32 [$2], {b0, b1};", "}",
])
ROW_COLUMNS = ("codes_addr", "scales_addr", "chunks")  # per padded activation row; chunks = 0 for padding rows
# up to PARAM_GROUPS groups, the prologue takes these per group as kernel parameters instead of reading the row table
GROUP_PARAMS = ("codes_addr", "scales_addr", "codes_row_stride", "scales_row_stride", "row0", "rows", "chunks")
PARAM_GROUPS = 16
# act_decode="warpgroup": one 16-code block of an activation row from global memory ($0, $1 codes, $2 scale byte
# from addresses $3, $4), or zeros where $5 == 0 (past the row's K, a padding row): a zero scale decodes to zeros
ACT_LOAD_PTX = "\n".join([
    "{", ".reg .pred p;", "setp.ne.u32 p, $5, 0;", "mov.b32 $0, 0;", "mov.b32 $1, 0;", "mov.b32 $2, 0;",
    "@p ld.global.nc.v2.b32 {$0, $1}, [$3];", "@p ld.global.nc.u8 $2, [$4];", "}",
])


def _kernel_classes():
    global _CLASSES
    if _CLASSES is not None:
        return _CLASSES

    import cutlass
    import cutlass.cute as cute
    import cutlass.pipeline as pipeline
    import cutlass.utils as utils
    import cutlass.utils.hopper_helpers as sm90_utils
    from cutlass._mlir.dialects import llvm
    from cutlass.cute.nvgpu import warpgroup
    from cutlass.cutlass_dsl import dsl_user_op

    def _asm(ptx, outs, ins, constraints, side_effects):
        """Inline PTX over MLIR values ``ins``; returns its ``outs`` 32-bit results."""
        i32 = cutlass.Int32.mlir_type
        res = llvm.inline_asm(llvm.StructType.get_literal([i32] * outs) if outs else None, ins, ptx, constraints,
                              has_side_effects=side_effects, is_align_stack=False,
                              asm_dialect=llvm.AsmDialect.AD_ATT)
        return [llvm.extractvalue(i32, res, [i]) for i in range(outs)] if outs else None

    @dsl_user_op
    def load_unit(codes, scales, *, loc=None, ip=None):
        """A thread's 16 code bytes and 8 scale bytes of one unit (shared addresses)."""
        return _asm("{\nld.shared.v4.b32 {$0, $1, $2, $3}, [$6];\nld.shared.v2.b32 {$4, $5}, [$7];\n}",
                    6, [cutlass.Int32(v).ir_value(loc=loc, ip=ip) for v in (codes, scales)],
                    "=r,=r,=r,=r,=r,=r,r,r", True)

    @dsl_user_op
    def decode_unit(loaded, *, loc=None, ip=None):
        return [cutlass.Uint32(v) for v in _asm(RS_DECODE_PTX, 16, loaded, ",".join(["=r"] * 16 + ["r"] * 6),
                                                False)]

    @dsl_user_op
    def copy16(src, dst, *, loc=None, ip=None):
        """16 bytes from shared address ``src`` to global address ``dst``."""
        _asm("{\n.reg .b32 a, b, c, d;\nld.shared.v4.b32 {a, b, c, d}, [$0];\nst.global.v4.b32 [$1], {a, b, c, d};\n}",
             0, [cutlass.Int32(src).ir_value(loc=loc, ip=ip), cutlass.Int64(dst).ir_value(loc=loc, ip=ip)], "r,l",
             True)

    @dsl_user_op
    def cp_async8(dst, src, size, *, loc=None, ip=None):
        """8 bytes from global ``src`` to shared ``dst`` by cp.async; ``size`` (8 or 0) bytes are read, zeros fill."""
        _asm("cp.async.ca.shared.global [$0], [$1], 8, $2;", 0,
             [cutlass.Int32(dst).ir_value(loc=loc, ip=ip), cutlass.Int64(src).ir_value(loc=loc, ip=ip),
              cutlass.Int32(size).ir_value(loc=loc, ip=ip)], "r,l,r", True)

    @dsl_user_op
    def cp_async_arrive(bar, *, loc=None, ip=None):
        """Arrive on the mbarrier at shared ``bar`` once this thread's earlier cp.async copies have landed (counts as
        one of its expected arrivals: .noinc)."""
        _asm("cp.async.mbarrier.arrive.noinc.shared.b64 [$0];", 0, [cutlass.Int32(bar).ir_value(loc=loc, ip=ip)], "r",
             True)

    @dsl_user_op
    def load_raw16(codes, scale, *, loc=None, ip=None):
        """A 16-code block in shared memory: its two code words and its scale byte."""
        return [cutlass.Uint32(v) for v in _asm("{\nld.shared.v2.b32 {$0, $1}, [$3];\nld.shared.u8 $2, [$4];\n}", 3,
                                                [cutlass.Int32(v).ir_value(loc=loc, ip=ip) for v in (codes, scale)],
                                                "=r,=r,=r,r,r", True)]

    @dsl_user_op
    def stamp_to(addr, *, loc=None, ip=None):
        """%globaltimer (ns) to the shared address ``addr``."""
        _asm("{\n.reg .u64 t;\nmov.u64 t, %globaltimer;\nst.shared.u64 [$0], t;\n}", 0,
             [cutlass.Int32(addr).ir_value(loc=loc, ip=ip)], "r", True)

    def _silu_mul(g, u):
        """silu(g)·u with the fast exp and reciprocal (~2 ulp of fp32 before the rounding to the output type)."""
        return g * cute.arch.rcp_approx(1.0 + cute.math.exp(-g, fastmath=True)) * u

    def _i64(vals, loc, ip):
        return [cutlass.Int64(v).ir_value(loc=loc, ip=ip) for v in vals]

    @dsl_user_op
    def decode_act16(src, sf, dst, *, loc=None, ip=None):
        _asm(ACT_DECODE_PTX, 0, _i64((src, sf, dst, dst + 16), loc, ip), "l,l,l,l", True)

    @dsl_user_op
    def load_row(addr, *, loc=None, ip=None):
        """A row of the activation table (:data:`ROW_COLUMNS`) in one go: the three loads issue together (loaded
        where used, the chunk count's branch put the two address loads a memory round trip later)."""
        i64 = cutlass.Int64.mlir_type
        res = llvm.inline_asm(llvm.StructType.get_literal([i64] * 3), _i64((addr,), loc, ip),
                              "{\nld.global.nc.u64 $0, [$3];\nld.global.nc.u64 $1, [$3+8];\n"
                              "ld.global.nc.u64 $2, [$3+16];\n}", "=l,=l,=l,l", has_side_effects=True,
                              is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)
        return [cutlass.Int64(llvm.extractvalue(i64, res, [i])) for i in range(3)]

    @dsl_user_op
    def alpha_row(gs_a, gs_b, out, *, loc=None, ip=None):
        _asm(ALPHA_PTX, 0, _i64((gs_a, gs_b, out), loc, ip), "l,l,l", True)

    @dsl_user_op
    def load_act16(src, sf, valid, *, loc=None, ip=None):
        """A 16-code block of one activation row (2 code words, the scale byte), zeros unless ``valid``."""
        return [cutlass.Uint32(v) for v in _asm(
            ACT_LOAD_PTX, 3, [*_i64((src, sf), loc, ip), cutlass.Int32(valid).ir_value(loc=loc, ip=ip)],
            "=r,=r,=r,l,l,r", True)]

    @dsl_user_op
    def store_act16(words, dst0, dst1, *, loc=None, ip=None):
        """Decode a loaded block to fp16 (value × scale × 2^-7) and store its two 16-byte halves to shared memory."""
        _asm(CONVERT16_PTX, 0, [cutlass.Uint32(w).ir_value(loc=loc, ip=ip) for w in words]
             + [cutlass.Int32(d).ir_value(loc=loc, ip=ip) for d in (dst0, dst1)], "r,r,r,r,r", True)

    @dsl_user_op
    def load_f32(addr, *, loc=None, ip=None):
        return cutlass.Float32(llvm.inline_asm(cutlass.Float32.mlir_type, _i64((addr,), loc, ip),
                                               "ld.global.nc.f32 $0, [$1];", "=f,l", has_side_effects=True,
                                               is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT))

    class ActivationPrologueSm90:
        """One launch per call: every activation row decoded from the caller's own tensors into the padded fp16
        buffer (value × scale × 2^-7), and the per-group epilogue factors ``alpha``.

        ``mRows`` int64 [R, 3] (:data:`ROW_COLUMNS`): the row's code and scale addresses and its 16-code chunk
        count (0: a padding row, left as the zeros it was allocated with). ``mGsA`` int64 [G]: addresses of A's
        global scales; ``mGsB`` float32 [G, 2]: gs_B1·2^14, gs_B2·2^14. ``groups``: empty, or (for at most
        :data:`PARAM_GROUPS` groups) :data:`GROUP_PARAMS` per group as kernel parameters, from which each thread
        computes its row's addresses instead of loading them from ``mRows`` (one dependent memory round trip less)."""

        @cute.jit
        def __call__(self, mRows: cute.Tensor, mX: cute.Tensor, mGsA: cute.Tensor, mGsB: cute.Tensor,
                     mAlpha: cute.Tensor, groups: tuple, stream):
            work = cute.size(mRows, mode=[0]) * (cute.size(mX, mode=[1]) // 16)
            self.kernel(mRows, mX, mGsA, mGsB, mAlpha, groups).launch(
                grid=((work + ACT_THREADS - 1) // ACT_THREADS, 1, 1), block=(ACT_THREADS, 1, 1), stream=stream,
                smem=ACT_SMEM)

        @cute.kernel
        def kernel(self, mRows: cute.Tensor, mX: cute.Tensor, mGsA: cute.Tensor, mGsB: cute.Tensor,
                   mAlpha: cute.Tensor, groups: tuple):
            cute.arch.griddepcontrol_launch_dependents()  # the GEMM may start its set-up and weight loads now
            tidx, _, _ = cute.arch.thread_idx()
            bidx, _, _ = cute.arch.block_idx()
            i = bidx * ACT_THREADS + tidx
            per_row = cute.size(mX, mode=[1]) // 16
            if i < cute.size(mRows, mode=[0]) * per_row:
                r = i // per_row
                c = i - r * per_row
                if cutlass.const_expr(len(groups) == 0):
                    codes, scales, chunks = load_row((mRows.iterator + r * mRows.stride[0]).toint())
                else:
                    codes, scales, chunks = self._group_row(groups, r)
                if c < chunks:
                    dst = (mX.iterator + r * mX.stride[0] + 16 * c).toint()
                    decode_act16(codes + 8 * c, scales + c, dst)
            if i < cute.size(mGsA):
                alpha_row(mGsA[i], (mGsB.iterator + 2 * i).toint(), (mAlpha.iterator + 2 * i).toint())

        @cute.jit
        def _group_row(self, groups, r):
            """(code address, scale address, 16-code chunks) of padded row ``r`` from the groups' parameters
            (chunks 0: a padding row)."""
            rr = cutlass.Int64(r)
            codes, scales, chunks = cutlass.Int64(0), cutlass.Int64(0), cutlass.Int64(0)
            for g in cutlass.range_constexpr(len(groups) // len(GROUP_PARAMS)):
                ca, sa, cs, ss, r0, n, ch = groups[g * len(GROUP_PARAMS): (g + 1) * len(GROUP_PARAMS)]
                if rr >= r0 and rr < r0 + n:
                    codes = ca + (rr - r0) * cs
                    scales = sa + (rr - r0) * ss
                    chunks = ch
            return codes, scales, chunks

    class GroupedNvfp4GemmSm90RS:
        """Swap-AB: weights (register A, decoded per thread) × tokens (smem B, fp16) -> Cᵀ tiles.

        Every tile row carries its token count class: the CTA runs the variant of the kernel whose wgmma N is the
        tile's tokens rounded up to ``token_step`` (one specialised mainloop per multiple of the step)."""

        def __init__(self, cfg: KernelConfig):
            self.cfg = validate(cfg)
            self.bt = cfg.tile_n
            self.step = token_step(cfg)
            self.variants = tuple(range(self.step, self.bt + 1, self.step))
            self.nsub = cfg.tile_k // UNIT_K
            self.blocks = blocks_per_warpgroup(cfg)
            self.stages = cfg.ab_stages
            self.dual = cfg.dual
            self.threads = 128 * NWG  # the MMA warpgroups (the epilogue's barriers count these)
            self.dw = cfg.act_decode == "warpgroup"
            self.inline = cfg.act_decode == "inline"
            self.direct = self.dw or self.inline  # no prologue: the kernel reads the caller's activations itself
            self.raw_bytes = raw_stage_bytes(cfg)
            self.pp = cfg.warp_spec == "pingpong"  # each MMA warpgroup runs its K loop alone, one after the other
            self.stage_wgs = stage_warpgroups(cfg)
            self.stage_units = stage_units(cfg)
            self.w_rows = self.stage_units * UNIT_BYTES // ROW_BYTES  # 128-byte rows per stage
            self.rows_per_cta = cfg.tile_m
            self.stores = not ablated(cfg, "no_store")  # False: the no_store diagnostic

        def _sx_layout(self, rows: int):
            """The fp16 activation ring (nsub·stages slots) for ``rows`` tokens: K-major, 128-byte swizzle."""
            return sm90_utils.make_smem_layout_b(utils.LayoutEnum.ROW_MAJOR, (UNIT_ROWS, rows, UNIT_K),
                                                 cutlass.Float16, self.nsub * x_slots(self.cfg))

        @cute.jit
        def __call__(self, mW: cute.Tensor, mX: cute.Tensor, mC: cute.Tensor, mTiles: cute.Tensor,
                     mAlpha: cute.Tensor, mGsA: cute.Tensor, stream):
            """``mX``: the fp16 activations written by the prologue, with ``mAlpha`` its per-group factors
            (act_decode="prologue"); or the row table of :func:`activation_rows`, with ``mAlpha`` = gs_B·2^14 and
            ``mGsA`` the addresses of A's global scales (act_decode="warpgroup"). ``mGsA`` [G] also gives G."""
            sx_layout = self._sx_layout(self.bt)
            sw_layout = cute.make_layout((self.w_rows, ROW_BYTES, self.stages),
                                         stride=(ROW_BYTES, 1, self.w_rows * ROW_BYTES))
            g2s = cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp()
            tma_w, tW = cute.nvgpu.cpasync.make_tiled_tma_atom(
                g2s, mW, cute.slice_(sw_layout, (None, None, 0)), (self.w_rows, ROW_BYTES))
            if cutlass.const_expr(self.direct):
                tma_x, tX = tma_w, tW  # (unused: the CTA writes the ring itself)
            else:
                # activations move in boxes of token_step rows: a tile of n tokens is n/step boxes per 64-K slot
                tma_x, tX = cute.nvgpu.cpasync.make_tiled_tma_atom(
                    g2s, mX, cute.slice_(self._sx_layout(self.step), (None, None, 0)), (self.step, UNIT_K))

            i64, u8, f16 = cutlass.Int64, cutlass.Uint8, cutlass.Float16  # (a class body sees no closure names)

            @cute.struct
            class SharedStorage:
                load_bars: cute.struct.MemRange[i64, self.stages * 2]
                stamps: cute.struct.MemRange[i64, 8]  # ablate="timeline"
                sw: cute.struct.Align[cute.struct.MemRange[u8, cute.cosize(sw_layout)], 1024]
                sx: cute.struct.Align[cute.struct.MemRange[f16, cute.cosize(sx_layout)], 1024]

            @cute.struct
            class SharedStorageInline:  # act_decode="inline": also the raw activation stages
                load_bars: cute.struct.MemRange[i64, self.stages * 2]
                stamps: cute.struct.MemRange[i64, 8]
                sw: cute.struct.Align[cute.struct.MemRange[u8, cute.cosize(sw_layout)], 1024]
                sx: cute.struct.Align[cute.struct.MemRange[f16, cute.cosize(sx_layout)], 1024]
                sa: cute.struct.Align[cute.struct.MemRange[u8, self.stages * self.raw_bytes], 128]

            self.shared_storage = SharedStorageInline if self.inline else SharedStorage
            # prologue: programmatic dependent launch, so set-up and the first weight loads overlap the prologue
            self.kernel(tma_w, tW, tma_x, tX, mX, mC, mTiles, mAlpha, mGsA, sw_layout, sx_layout).launch(
                grid=(cute.size(mTiles, mode=[0]), 1, 1), block=(block_threads(self.cfg), 1, 1), stream=stream,
                use_pdl=not self.direct)

        @cute.kernel
        def kernel(self, tma_w: cute.CopyAtom, tW: cute.Tensor, tma_x: cute.CopyAtom, tX: cute.Tensor,
                   mX: cute.Tensor, mC: cute.Tensor, mTiles: cute.Tensor, mAlpha: cute.Tensor, mGsA: cute.Tensor,
                   sw_layout: cute.Layout, sx_layout: cute.ComposedLayout):
            warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
            bidx, _, _ = cute.arch.block_idx()
            if warp_idx == 0:
                cute.nvgpu.cpasync.prefetch_descriptor(tma_w)
                if cutlass.const_expr(not self.direct):
                    cute.nvgpu.cpasync.prefetch_descriptor(tma_x)
            storage = cutlass.utils.SmemAllocator().allocate(self.shared_storage)
            self._stamp(storage, 0)
            variant = tile_fields(mTiles, bidx)["pad"]  # the swap-AB table keeps the wgmma N variant in "pad"
            for v in cutlass.range_constexpr(len(self.variants)):
                if variant == v:
                    self._tile(self.variants[v], storage, tma_w, tW, tma_x, tX, mX, mC, mTiles, mAlpha, mGsA,
                               sw_layout, sx_layout)

        @cute.jit
        def _tile(self, nv: int, storage, tma_w, tW, tma_x, tX, mX, mC, mTiles, mAlpha, mGsA, sw_layout,
                  sx_layout):
            """One output tile with a wgmma N of ``nv`` tokens."""
            tidx, _, _ = cute.arch.thread_idx()
            bidx, _, _ = cute.arch.block_idx()
            wg = cute.arch.make_warp_uniform(tidx // 128)
            f = tile_fields(mTiles, bidx)  # tokens are the tile's rows: row0/m_valid count tokens
            group, tok_row0, tok_valid, n0, n_valid = f["group"], f["row0"], f["m_valid"], f["n0"], f["n_valid"]
            b_row0, k_tiles, k_tile0, out_row0 = f["b_row0"], f["k_tiles"], f["k_tile0"], f["out_row0"]

            boxes = nv // self.step
            tx_bytes = self.stage_units * UNIT_BYTES
            if cutlass.const_expr(not ablated(self.cfg, "no_x") and not self.direct):
                tx_bytes += self.nsub * nv * UNIT_K * 2
            # a stage is full when its weights have landed (TMA bytes, one arrive) and, with a decode warpgroup,
            # when its 128 threads have each arrived after writing their activations, or (inline) when the
            # cp.async copies of the raw activations of each of the CTA's threads have landed (one arrive each)
            writers = 128 if self.dw else (self.threads if self.inline else 0)
            load_pipe = pipeline.PipelineTmaAsync.create(
                barrier_storage=storage.load_bars.data_ptr(), num_stages=self.stages,
                producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 1 + writers),
                consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 4 * self.stage_wgs),
                tx_count=tx_bytes, cta_layout_vmnk=cute.make_layout((1, 1, 1, 1)), defer_sync=True)
            cute.arch.mbarrier_init_fence()
            cute.arch.sync_threads()

            sW = storage.sw.get_tensor(sw_layout)
            sX = storage.sx.get_tensor(sx_layout.outer, swizzle=sx_layout.inner)
            # this variant's view of the ring: the first nv token rows of every slot
            full = sx_layout.outer
            sXv = storage.sx.get_tensor(
                cute.make_layout(((8, nv // 8), full.shape[1], full.shape[2]),
                                 stride=(full.stride[0], full.stride[1], full.stride[2])),
                swizzle=sx_layout.inner)

            # TMA partitions. Weights: stage tiles of w_rows 128-byte rows, CTA-block-major (a block's K tiles
            # adjacent): G·n_pad/tile_m blocks of k_tiles_all stage tiles (n_pad is C's width); with pingpong each
            # block holds the K tiles of warpgroup 0, then those of warpgroup 1
            w_parts = NWG // self.stage_wgs
            k_tiles_all = cute.size(tW, mode=[0]) * self.rows_per_cta // (
                self.w_rows * w_parts * cute.size(mGsA, mode=[0]) * cute.size(mC, mode=[1]))
            w_tile0 = (b_row0 // self.rows_per_cta) * (w_parts * k_tiles_all) + k_tile0
            gW = cute.local_tile(tW, (self.w_rows, ROW_BYTES), (None, 0))
            tWs, tWg = cute.nvgpu.cpasync.tma_partition(tma_w, 0, cute.make_layout(1), cute.group_modes(sW, 0, 2),
                                                        cute.group_modes(gW, 0, 2))
            loads = (tma_w, tWs, tWg, w_tile0)
            if cutlass.const_expr(not self.direct):
                # Activations: boxes of step rows; smem (box, (row block, 1, slot)), gmem (box, (row block, 64-K
                # block))
                tXs, tXg = cute.nvgpu.cpasync.tma_partition(tma_x, 0, cute.make_layout(1),
                                                            cute.zipped_divide(sX, (self.step, UNIT_K)),
                                                            cute.zipped_divide(tX, (self.step, UNIT_K)))
                loads = (*loads, tma_x, tXs, tXg, tok_row0 // self.step, k_tile0 * self.nsub, boxes)

            if cutlass.const_expr(self.inline):
                self._mma_inline(nv, storage, load_pipe, loads, sXv, mX, mC, mAlpha, mGsA, group, tok_row0,
                                 out_row0, tok_valid, n0, n_valid, k_tiles, k_tile0)
            elif cutlass.const_expr(self.dw):
                if wg == NWG:
                    self._decode_warpgroup(nv, storage, load_pipe, loads, mX, tok_row0, tok_valid, k_tiles, k_tile0,
                                           k_tiles_all)
                else:
                    self._mma_warpgroups(nv, storage, load_pipe, loads, sXv, mC, mAlpha, mGsA, group, out_row0,
                                         tok_valid, n0, n_valid, k_tiles)
            else:
                self._mma_warpgroups(nv, storage, load_pipe, loads, sXv, mC, mAlpha, mGsA, group, out_row0, tok_valid,
                                     n0, n_valid, k_tiles)

        @cute.jit
        def _mma_warpgroups(self, nv: int, storage, load_pipe, loads, sXv, mC, mAlpha, mGsA, group, out_row0,
                            tok_valid, n0, n_valid, k_tiles):
            """Warpgroups 0 and 1: decode their weights into registers, wgmma against the ring, the epilogue. With
            the prologue, warp 0 also issues the loads."""
            tidx, warp_idx, wg, t, tiled_mma, tCrB, rA, rA32, tCcC, accs = self._mma_setup(nv, sXv)
            sw_base = storage.sw.data_ptr().toint()

            prod = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
            if cutlass.const_expr(self.pp):
                # warpgroup w consumes pipeline iterations w·k_tiles ... (w+1)·k_tiles - 1; warpgroup 1 starts once
                # warpgroup 0 has issued its last wgmma (the ping-pong order: one K loop on the tensor cores at a
                # time, the first warpgroup's epilogue under the second's K loop)
                base = wg * k_tiles
                cons = self._pipeline_state(base, producer=False)
                rel = cons.clone()
                order = pipeline.NamedBarrier(barrier_id=2, num_threads=self.threads)
                if wg == 1:
                    order.arrive_and_wait()  # 128 arrivals here + warpgroup 0's 128 after its K loop
            else:
                cons = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
                rel = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)

            if cutlass.const_expr(not self.dw):
                # first stages: the weights (independent of the prologue) before waiting for the prologue's grid,
                # then their activations; every thread waits before it can read what the prologue wrote
                first = cutlass.min(self.stages, k_tiles)
                if warp_idx == 0:
                    for _ in cutlass.range(first, unroll=1):
                        load_pipe.producer_acquire(prod)
                        self._issue_w(load_pipe, prod, loads)
                        prod.advance()
                self._stamp(storage, 1)
                cute.arch.griddepcontrol_wait()
                self._stamp(storage, 2)
                if warp_idx == 0:
                    early = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
                    for _ in cutlass.range(first, unroll=1):
                        self._issue_x(load_pipe, early, loads)
                        early.advance()

            sink = cutlass.Uint32(0)
            for kt in cutlass.range(k_tiles, unroll=1):
                load_pipe.consumer_wait(cons)
                if cutlass.const_expr(ablated(self.cfg, "timeline")):
                    if kt == 0:
                        self._stamp(storage, 3)
                loaded = self._load_units(sw_base, cons.index, wg, t)
                for s in cutlass.range_constexpr(self.nsub):
                    sink = self._decode_mma(s, loaded, tiled_mma, rA, rA32, accs, tCrB, cons.index, sink)
                    if cutlass.const_expr(s == 0):
                        # the previous stage's last wgmma group is done: hand its buffers back, and (prologue mode)
                        # refill them if the other warpgroup has too. Warp 0 must not wait for it here: wgmma is
                        # warpgroup-wide, so a blocked warp 0 would stall all of warpgroup 0; if the slot is not
                        # free yet, warp 0 refills it at the end of this stage instead.
                        if kt > 0:
                            load_pipe.consumer_release(rel)
                            rel.advance()
                            if cutlass.const_expr(not self.dw):
                                if warp_idx == 0:
                                    if prod.count < k_tiles:
                                        if load_pipe.producer_try_acquire(prod):
                                            self._issue(load_pipe, prod, loads, acquired=True)
                                            prod.advance()
                if cutlass.const_expr(not self.dw):
                    if warp_idx == 0:
                        if kt > 0:
                            if prod.count < cutlass.min(k_tiles, kt - 1 + self.stages):
                                self._issue(load_pipe, prod, loads)
                                prod.advance()
                cons.advance()
            if cutlass.const_expr(self.pp):
                if wg == 0:
                    order.arrive()
            warpgroup.wait_group(0)
            self._stamp(storage, 4)
            if cutlass.const_expr(self.pp):
                load_pipe.consumer_release(rel)  # the last stage too: the other warpgroup's K tiles follow in it
            if cutlass.const_expr(ablated(self.cfg, "no_mma")):
                accs[0][0] = cutlass.Float32(sink)
            self._epilogue(nv, accs, tCcC, storage, mC, self._alpha(mAlpha, mGsA, group), out_row0, tok_valid, n0,
                           n_valid, wg, t)

        @cute.jit
        def _mma_inline(self, nv: int, storage, load_pipe, loads, sXv, mRows, mC, mAlpha, mGsA, group, tok_row0,
                        out_row0, tok_valid, n0, n_valid, k_tiles, k_tile0):
            """act_decode="inline": both warpgroups copy their tile's raw activation rows (codes, scales) from the
            caller's tensors into the stage with cp.async beside the weights' TMA, and decode them into the two-slot
            fp16 ring one K tile ahead: the activations of K tile kt+1 are decoded, half after each sub-block's wgmma
            of K tile kt is issued, then a barrier of both warpgroups publishes the slot and frees the stage for
            K tile kt+stages. Thread i of the CTA owns 16-code blocks i, i+256, ... of the tile (block j: token row
            j // (tile_k/16), block j % (tile_k/16) of the K tile) for the copies and the decode alike."""
            tidx, warp_idx, wg, t, tiled_mma, tCrB, rA, rA32, tCcC, accs = self._mma_setup(nv, sXv)
            sw_base = storage.sw.data_ptr().toint()
            per_row = self.cfg.tile_k // 16  # 16-code blocks of a row per K tile
            # this thread's blocks: (code address, scale address, bytes to copy (0: a padding row, zeros), token row,
            # block); a padding row reads a valid row of the tile with a copy size of 0
            items = []
            for j in cutlass.range_constexpr(-(-nv * per_row // self.threads)):
                i = tidx + self.threads * j
                n = i // per_row
                codes, scales, _ = load_row(
                    (mRows.iterator + (tok_row0 + cutlass.min(n, tok_valid - 1)) * mRows.stride[0]).toint())
                size = cutlass.Int32(8)
                if n >= tok_valid:
                    size = cutlass.Int32(0)
                items.append((codes, scales, size, n, i - n * per_row, i < nv * per_row))
            half = -(-len(items) // 2)
            sa_base = storage.sa.data_ptr().toint()
            sx_base = storage.sx.data_ptr().toint()
            slot_bytes = self.nsub * self.bt * UNIT_K * 2
            fence_bar = pipeline.NamedBarrier(barrier_id=3, num_threads=self.threads)

            first = cutlass.min(self.stages, k_tiles)
            if warp_idx == 0:
                for it in cutlass.range(first, unroll=1):
                    st = self._pipeline_state(it, producer=True)
                    load_pipe.producer_acquire(st)
                    self._issue_w(load_pipe, st, loads, loads[3] + it)
            for it in cutlass.range(first, unroll=1):
                self._inline_copy(load_pipe, items, sa_base, it, k_tile0)
            self._stamp(storage, 1)
            # K tile 0's activations, then every K tile: its wgmma, and the next K tile's activations decoded under it
            load_pipe.consumer_wait(self._pipeline_state(0, producer=False))
            self._stamp(storage, 3)
            self._inline_decode(items, 0, len(items), sa_base, 0, sx_base)
            cute.arch.fence_proxy(cute.arch.ProxyKind.async_shared, space=cute.arch.SharedSpace.shared_cta)
            fence_bar.arrive_and_wait()
            sink = cutlass.Uint32(0)
            for kt in cutlass.range(k_tiles, unroll=1):
                cur = self._pipeline_state(kt, producer=False)
                loaded = self._load_units(sw_base, cur.index, wg, t)
                slot = kt % 2
                nxt = self._pipeline_state(kt + 1, producer=False)
                for s in cutlass.range_constexpr(self.nsub):
                    sink = self._decode_mma(s, loaded, tiled_mma, rA, rA32, accs, tCrB, slot, sink)
                    # K tile kt+1's activations into the other slot (its last reader, K tile kt-1, has retired)
                    lo, hi = (0, half) if cutlass.const_expr(s == 0) else (half, len(items))
                    if cutlass.const_expr(s == 0 or s == self.nsub - 1):
                        if kt + 1 < k_tiles:
                            if cutlass.const_expr(s == 0):
                                load_pipe.consumer_wait(nxt)
                            self._inline_decode(items, lo, hi, sa_base, nxt.index, sx_base + (1 - slot) * slot_bytes)
                cute.arch.fence_proxy(cute.arch.ProxyKind.async_shared, space=cute.arch.SharedSpace.shared_cta)
                # both warpgroups: the next slot is written, and stage kt is read (weights and activations)
                fence_bar.arrive_and_wait()
                if kt + self.stages < k_tiles:
                    load_pipe.consumer_release(cur)
                    ref = self._pipeline_state(kt + self.stages, producer=True)
                    if warp_idx == 0:
                        load_pipe.producer_acquire(ref)
                        self._issue_w(load_pipe, ref, loads, loads[3] + kt + self.stages)
                    self._inline_copy(load_pipe, items, sa_base, kt + self.stages, k_tile0)
            warpgroup.wait_group(0)
            self._stamp(storage, 4)
            if cutlass.const_expr(ablated(self.cfg, "no_mma")):
                accs[0][0] = cutlass.Float32(sink)
            self._epilogue(nv, accs, tCcC, storage, mC, self._alpha(mAlpha, mGsA, group), out_row0, tok_valid, n0,
                           n_valid, wg, t)

        @cute.jit
        def _alpha(self, mAlpha, mGsA, group):
            """The group's epilogue factors (gate, up): written by the prologue, or (no prologue) gs_A, read from the
            caller's 0-d tensor, times gs_B·2^14."""
            if cutlass.const_expr(self.direct):
                gs_a = load_f32(mGsA[group])
                return gs_a * mAlpha[group, 0], gs_a * mAlpha[group, 1]
            return mAlpha[group, 0], mAlpha[group, 1]

        @cute.jit
        def _inline_copy(self, load_pipe, items, sa_base, it, k_tile0):
            """cp.async this thread's raw blocks of K tile ``it`` into its stage; then arrive on the stage's barrier
            when they have landed (every thread arrives, with or without blocks)."""
            st = self._pipeline_state(it, producer=True)
            base = sa_base + st.index * self.raw_bytes
            per_row = self.cfg.tile_k // 16
            scales0 = base + self.bt * (self.cfg.tile_k // 2)
            kb = (k_tile0 + it) * per_row  # the K tile's first 16-code block in the row
            for codes, scales, size, n, c, active in items:
                if active:
                    cp_async8(base + n * (self.cfg.tile_k // 2) + 8 * c, codes + 8 * (kb + c), size)
                    if c % 8 == 0:  # the row's scale bytes of blocks c .. c+7
                        cp_async8(scales0 + n * per_row + c, scales + kb + c, size)
            cp_async_arrive(load_pipe.producer_get_barrier(st).toint())

        @cute.jit
        def _inline_decode(self, items, lo: int, hi: int, sa_base, stage, slot_base):
            """Decode this thread's blocks ``lo`` .. ``hi`` - 1 of raw stage ``stage`` into the fp16 slot at
            ``slot_base``."""
            base = sa_base + stage * self.raw_bytes
            per_row = self.cfg.tile_k // 16
            scales0 = base + self.bt * (self.cfg.tile_k // 2)
            for j in cutlass.range_constexpr(lo, hi):
                _, _, _, n, c, active = items[j]
                if active:
                    words = load_raw16(base + n * (self.cfg.tile_k // 2) + 8 * c, scales0 + n * per_row + c)
                    store_act16(words, *self._ring_halves(*self._ring_block(slot_base, n, c)))

        @cute.jit
        def _mma_setup(self, nv: int, sXv):
            """This thread's indices (in the CTA, its warp, its warpgroup, in the warpgroup) and the wgmma of N = ``nv``
            tokens for it: the tiled MMA, the B fragments over the ring, two register sets of A fragments (sub-blocks
            alternate; one fragment per block), the C coordinates and the zeroed accumulators."""
            tidx, _, _ = cute.arch.thread_idx()
            warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
            wg = cute.arch.make_warp_uniform(tidx // 128)
            t = tidx % 128
            tiled_mma = sm90_utils.make_trivial_tiled_mma(
                cutlass.Float16, cutlass.Float16, warpgroup.OperandMajorMode.K, warpgroup.OperandMajorMode.K,
                cutlass.Float32, (1, 1, 1), (UNIT_ROWS, nv), warpgroup.OperandSource.RMEM)
            thr_mma = tiled_mma.get_slice(t)
            tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sXv))
            a_shape = thr_mma.partition_shape_A((UNIT_ROWS, UNIT_K))
            rA = [[tiled_mma.make_fragment_A(a_shape) for _ in range(self.blocks)] for _ in range(2)]
            rA32 = [[cute.recast_tensor(r, cutlass.Uint32) for r in rs] for rs in rA]
            tCcC = thr_mma.partition_C(cute.make_identity_tensor((UNIT_ROWS, nv)))
            accs = [cute.make_rmem_tensor(tCcC.shape, cutlass.Float32) for _ in range(self.blocks)]
            for acc in accs:
                acc.fill(0.0)
            tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
            return tidx, warp_idx, wg, t, tiled_mma, tCrB, rA, rA32, tCcC, accs

        @cute.jit
        def _load_units(self, sw_base, stage, wg, t):
            """This thread's code and scale words of every unit of weight stage ``stage``: unit (sub, wg, block) at
            ((sub·NWG + wg)·blocks + block)·UNIT_BYTES; pingpong (a stage holds one warpgroup's units) at
            (sub·blocks + block)·UNIT_BYTES."""
            wg_off = 0 if cutlass.const_expr(self.pp) else wg * self.blocks * UNIT_BYTES
            code_off = wg_off + 16 * t
            scale_off = wg_off + UNIT_CODE_BYTES + 8 * (8 * (t // 32) + (t % 32) // 4)
            stage_base = sw_base + stage * (self.stage_units * UNIT_BYTES)
            units = [((i // self.blocks) * self.stage_wgs * self.blocks + i % self.blocks) * UNIT_BYTES
                     for i in range(self.nsub * self.blocks)]
            return [load_unit(stage_base + u + code_off, stage_base + u + scale_off) for u in units]

        @cute.jit
        def _decode_mma(self, s: int, loaded, tiled_mma, rA, rA32, accs, tCrB, slot, sink):
            """Sub-block ``s``: decode its weights into register set s % 2, issue its wgmma against ring slot ``slot``,
            commit, and wait until only this group is in flight. Returns the no_mma diagnostic's sink."""
            for b in cutlass.range_constexpr(self.blocks):
                words = loaded[s * self.blocks + b]
                if cutlass.const_expr(ablated(self.cfg, "no_dequant")):  # diagnostic: loaded words as operands
                    regs = [cutlass.Uint32(words[q % 4]) for q in range(16)]
                else:
                    regs = decode_unit(words)
                if cutlass.const_expr(ablated(self.cfg, "no_mma")):  # diagnostic: keep the decode alive
                    for q in cutlass.range_constexpr(16):
                        sink = sink ^ regs[q]
                else:
                    for q in cutlass.range_constexpr(16):
                        rA32[s % 2][b][q] = regs[q]
            if cutlass.const_expr(not ablated(self.cfg, "no_mma")):
                warpgroup.fence()
                for b in cutlass.range_constexpr(self.blocks):
                    for kb in cutlass.range_constexpr(UNIT_K // 16):
                        cute.gemm(tiled_mma, accs[b], rA[s % 2][b][None, None, kb],
                                  tCrB[None, None, kb, slot * self.nsub + s], accs[b])
            warpgroup.commit_group()
            warpgroup.wait_group(1)
            return sink

        @cute.jit
        def _decode_warpgroup(self, nv: int, storage, load_pipe, loads, mRows, tok_row0, tok_valid, k_tiles,
                              k_tile0, k_tiles_all):
            """act_decode="warpgroup", warpgroup 2: the weight loads (its first warp) and the activations. Per K tile,
            thread t decodes 16-code block t mod (tile_k/16) of every (128·16/tile_k)-th token row of the tile from
            the caller's tensors into the ring slot (128-byte swizzle: 16-byte chunk c of row n at c ^ n%8), then
            arrives on the stage's barrier. Consecutive threads read consecutive 8-byte pieces of one row (a first
            version gave each thread a row: every warp load touched 32 rows, and the loads cost 9 us on S4). The raw
            codes of DW_BATCH K tiles are loaded together, after the last proxy fence of the batch before."""
            tidx, _, _ = cute.arch.thread_idx()
            t = tidx % 128
            per_row = self.cfg.tile_k // 16  # 16-code blocks of a row per K tile
            rows_per_pass = 128 // per_row
            blk = t % per_row  # the same block of each of this thread's rows: a warp reads whole row segments
            # per row this thread owns: code and scale addresses of the row, index of the block in K tile 0, the
            # row's chunk count, smem offset of the row in its sub-block, its swizzle, the block's 32-byte half,
            # and the threads that store it (t < limit; past the limit a thread's row is past the tile's
            # ``nv`` tokens: it loads a clamped row but never stores)
            items = []
            for i in cutlass.range_constexpr(-(-nv // rows_per_pass)):
                n = t // per_row + rows_per_pass * i
                limit = per_row * (nv - rows_per_pass * i)
                row = n if cutlass.const_expr(limit >= 128) else cutlass.min(n, nv - 1)
                codes, scales, chunks = load_row((mRows.iterator + (tok_row0 + row) * mRows.stride[0]).toint())
                chunks = cutlass.Int32(chunks)
                if n >= tok_valid:
                    chunks = cutlass.Int32(0)
                items.append((codes, scales, k_tile0 * per_row + blk, chunks, *self._ring_block(0, n, blk), limit))
            xr = cute.make_rmem_tensor((DW_BATCH * len(items) * 3,), cutlass.Uint32)
            slot_bytes = self.nsub * self.bt * UNIT_K * 2
            sx_base = storage.sx.data_ptr().toint()

            # the first stages' weights, then every K tile: its activations (and, past the first stages, its weights).
            # Stage states are computed from the K tile, not carried: nothing to keep in step between the threads.
            # pipeline iterations: the K tiles, or (pingpong) those of warpgroup 0, then those of warpgroup 1, whose
            # weights follow warpgroup 0's in the CTA block and whose activations are decoded again
            iters = k_tiles * (NWG if cutlass.const_expr(self.pp) else 1)
            first = cutlass.min(self.stages, iters)
            # the weights' producer is a whole warp: the TMA copy and the arrive with its byte count elect one lane
            # (elect.sync), which a single diverged thread must not run (the first version hung past the first
            # stages)
            w_warp = cute.arch.make_warp_uniform(cute.arch.warp_idx()) == 4 * NWG
            if w_warp:
                for it in cutlass.range(first, unroll=1):
                    st = self._pipeline_state(it, producer=True)
                    load_pipe.producer_acquire(st)
                    self._issue_w(load_pipe, st, loads, self._w_tile(loads, it, k_tiles, k_tiles_all))
            self._dw_load(xr, items, 0, iters, k_tiles)
            for kb in cutlass.range(0, iters, DW_BATCH, unroll=1):
                for p in cutlass.range_constexpr(DW_BATCH):
                    it = kb + p
                    if it < iters:
                        st = self._pipeline_state(it, producer=True)
                        if w_warp:
                            if it >= first:
                                load_pipe.producer_acquire(st)
                                self._issue_w(load_pipe, st, loads, self._w_tile(loads, it, k_tiles, k_tiles_all))
                        load_pipe.sync_object_empty.wait(st.index, st.phase)
                        base = sx_base + st.index * slot_bytes
                        for i in cutlass.range_constexpr(len(items)):
                            self._dw_store(xr, p * len(items) + i, items[i], base, t)
                        # the ring is read by wgmma (the async proxy): publish the generic stores to it first
                        cute.arch.fence_proxy(cute.arch.ProxyKind.async_shared, space=cute.arch.SharedSpace.shared_cta)
                        cute.arch.mbarrier_arrive(load_pipe.producer_get_barrier(st))
                self._dw_load(xr, items, kb + DW_BATCH, iters, k_tiles)

        def _w_tile(self, loads, it, k_tiles, k_tiles_all):
            """The weights' stage tile of pipeline iteration ``it``."""
            if cutlass.const_expr(self.pp):
                return loads[3] + (it // k_tiles) * k_tiles_all + it % k_tiles
            return loads[3] + it

        def _pipeline_state(self, it, producer: bool):
            """The state of pipeline iteration ``it``, computed rather than carried: its slot and the parity of the
            phase to wait for (a producer's parity starts at 1: a fresh slot is free; a consumer's at 0)."""
            return pipeline.PipelineState(self.stages, it, it % self.stages,
                                          ((it // self.stages) % 2) ^ 1 if producer else (it // self.stages) % 2)

        def _ring_block(self, slot, n, c):
            """Where 16-code block ``c`` (of a K tile) of token row ``n`` goes in the fp16 ring slot at ``slot``: the
            start of its row in its 64-K sub-block, the row's swizzle (n % 8) and the block's 32-byte half (c % 4)."""
            return slot + (c // 4) * (self.bt * UNIT_K * 2) + n * (UNIT_K * 2), n % 8, c % 4

        def _ring_halves(self, dst, swizzle, half):
            """The two 16-byte chunks of a block whose row starts at ``dst`` (128-byte swizzle: chunk q of a row at
            q ^ row % 8)."""
            return dst + (swizzle ^ (2 * half)) * 16, dst + (swizzle ^ (2 * half + 1)) * 16

        @cute.jit
        def _dw_store(self, xr, j, item, base, t):
            """Decode raw block ``j`` of ``xr`` into its two 16-byte chunks of the slot at ``base``."""
            words = [xr[j * 3 + w] for w in range(3)]
            halves = self._ring_halves(base + item[4], item[5], item[6])
            if cutlass.const_expr(item[7] >= 128):  # every thread holds this block
                store_act16(words, *halves)
            elif t < item[7]:
                store_act16(words, *halves)

        @cute.jit
        def _dw_load(self, xr, items, it0, iters, k_tiles):
            """The raw blocks of pipeline iterations it0 .. it0 + DW_BATCH - 1 (those below ``iters``) into ``xr``."""
            per_row = self.cfg.tile_k // 16
            for p in cutlass.range_constexpr(DW_BATCH):
                if it0 + p < iters:
                    kt = (it0 + p) % k_tiles if cutlass.const_expr(self.pp) else it0 + p
                    for i in cutlass.range_constexpr(len(items)):
                        codes, scales, blk0, chunks = items[i][:4]
                        c = blk0 + kt * per_row
                        if cutlass.const_expr(ablated(self.cfg, "no_xload")):  # diagnostic: zeros, no loads
                            w = [cutlass.Uint32(c * 0), cutlass.Uint32(0), cutlass.Uint32(0)]
                        else:
                            w = load_act16(codes + 8 * c, scales + c, cutlass.Int32(c < chunks))
                        for q in cutlass.range_constexpr(3):
                            xr[(p * len(items) + i) * 3 + q] = w[q]

        @cute.jit
        def _issue(self, pipe, prod, loads, acquired: bool = False):
            """Acquire stage ``prod`` (its barrier then expects the whole stage; ``acquired``: a try_acquire already
            saw it free) and load it."""
            pipe.producer_acquire(prod, cutlass.Boolean(True) if acquired else None)
            self._issue_w(pipe, prod, loads)
            self._issue_x(pipe, prod, loads)

        @cute.jit
        def _issue_w(self, pipe, prod, loads, tile=None):
            """The weights of stage ``prod``: stage tile ``tile``, by default the next of this CTA block."""
            tma_w, tWs, tWg, w_tile0 = loads[:4]
            cute.copy(tma_w, tWg[None, w_tile0 + prod.count if tile is None else tile], tWs[None, prod.index],
                      tma_bar_ptr=pipe.producer_get_barrier(prod))

        @cute.jit
        def _issue_x(self, pipe, prod, loads):
            tma_x, tXs, tXg, x_blk0, x_sub0, boxes = loads[4:]
            bar = pipe.producer_get_barrier(prod)
            for s in cutlass.range_constexpr(self.nsub if not ablated(self.cfg, "no_x") else 0):
                for j in cutlass.range_constexpr(boxes):
                    cute.copy(tma_x, tXg[None, (x_blk0 + j, x_sub0 + prod.count * self.nsub + s)],
                              tXs[None, (j, 0, prod.index * self.nsub + s)], tma_bar_ptr=bar)

        @cute.jit
        def _epilogue(self, nv: int, accs, tCcC, storage, mC, alpha, out_row0, tok_valid, n0, n_valid, wg, t):
            """Cᵀ tiles -> C: element (weight row m of block b, token n) to C[out_row0 + n, n0 + col].

            epilogue="simt": each element stored by its thread (2-byte stores, 4 token rows per warp store);
            "staged": the tile is written to shared memory as C rows, then copied out in 16-byte row chunks."""
            size = cute.size(accs[0])
            staged = self.cfg.epilogue == "staged"
            bar = pipeline.NamedBarrier(barrier_id=1, num_threads=self.threads)
            if cutlass.const_expr(not self.pp):  # (pingpong stores per element: it reuses no buffer)
                bar.arrive_and_wait()  # every wgmma of both warpgroups has read its operands: the buffers are free
            sx = storage.sx.data_ptr()
            cols = self.cfg.tile_m  # output columns of the tile (dual: the rows of gate = the rows of up)
            ld = cols + STAGE_PAD
            stage_ptr = cute.recast_ptr(sx + xfer_bytes(self.cfg) // 2, dtype=mC.element_type)
            sC = cute.make_tensor(stage_ptr, cute.make_layout((self.bt, ld), stride=(ld, 1)))
            if cutlass.const_expr(self.dual):
                # the two warpgroups hold gate and up of the same elements: each hands the other half of its
                # accumulators over in shared memory, then computes silu(gate)·up for its own half
                xfer = cute.make_tensor(cute.recast_ptr(sx, dtype=cutlass.Float32),
                                        cute.make_layout((size * self.blocks, 128), stride=(128, 1)))
                half = size // 2
                if wg == 1:
                    for b in cutlass.range_constexpr(self.blocks):
                        for i in cutlass.range_constexpr(half):
                            xfer[b * size + i, t] = accs[b][i]
                else:
                    for b in cutlass.range_constexpr(self.blocks):
                        for i in cutlass.range_constexpr(half, size):
                            xfer[b * size + i, t] = accs[b][i]
                bar.arrive_and_wait()
                a_gate, a_up = alpha
                if wg == 0:
                    for b in cutlass.range_constexpr(self.blocks):
                        for i in cutlass.range_constexpr(half):
                            self._put(staged, sC, mC, _silu_mul(accs[b][i] * a_gate, xfer[b * size + i, t] * a_up),
                                      tCcC[i], b * UNIT_ROWS, out_row0, tok_valid, n0, n_valid)
                else:
                    for b in cutlass.range_constexpr(self.blocks):
                        for i in cutlass.range_constexpr(half, size):
                            self._put(staged, sC, mC, _silu_mul(xfer[b * size + i, t] * a_gate, accs[b][i] * a_up),
                                      tCcC[i], b * UNIT_ROWS, out_row0, tok_valid, n0, n_valid)
            else:
                for b in cutlass.range_constexpr(self.blocks):
                    for i in cutlass.range_constexpr(size):
                        self._put(staged, sC, mC, accs[b][i] * alpha[0], tCcC[i], (wg * self.blocks + b) * UNIT_ROWS,
                                  out_row0, tok_valid, n0, n_valid)
            if cutlass.const_expr(staged):
                bar.arrive_and_wait()
                tidx, _, _ = cute.arch.thread_idx()
                per_row = cols // 8  # 16-byte chunks per token row
                total = nv * per_row
                for r in cutlass.range_constexpr(-(-total // self.threads)):
                    q = tidx + self.threads * r
                    n = q // per_row
                    c8 = (q - n * per_row) * 8
                    if q < total and n < tok_valid and c8 < n_valid and cutlass.const_expr(self.stores):
                        copy16((sC.iterator + n * ld + c8).toint(),
                               (mC.iterator + (out_row0 + n) * mC.stride[0] + n0 + c8).toint())

            if cutlass.const_expr(ablated(self.cfg, "timeline")):
                bar.arrive_and_wait()  # every thread has issued its stores
                self._stamp(storage, 5)
                tidx, _, _ = cute.arch.thread_idx()
                base = storage.stamps.data_ptr().toint()
                if tidx == 0:
                    for part in cutlass.range_constexpr(4):
                        copy16(base + 16 * part, (mC.iterator + out_row0 * mC.stride[0] + n0 + 8 * part).toint())

        @cute.jit
        def _stamp(self, storage, point: int):
            """ablate="timeline": thread 0 keeps the %globaltimer at ``point`` (:data:`TIMELINE_POINTS`)."""
            if cutlass.const_expr(ablated(self.cfg, "timeline")):
                tidx, _, _ = cute.arch.thread_idx()
                addr = storage.stamps.data_ptr().toint() + 8 * point
                if tidx == 0:
                    stamp_to(addr)

        @cute.jit
        def _put(self, staged: bool, sC, mC, v, coord, col0, out_row0, tok_valid, n0, n_valid):
            """Element (m, n) of a block starting at tile column col0: to the staging tile, or straight to C."""
            m, n = coord
            if cutlass.const_expr(staged):
                sC[n, col0 + m] = v.to(mC.element_type)
            elif n < tok_valid and col0 + m < n_valid and cutlass.const_expr(self.stores):
                mC[out_row0 + n, n0 + col0 + m] = v.to(mC.element_type)

    _CLASSES = (ActivationPrologueSm90, GroupedNvfp4GemmSm90RS)
    return _CLASSES


_CLASSES = None
_compiled: dict = {}


def _compile_cached(key, make, args):
    import cutlass.cute as cute

    if key not in _compiled:
        _compiled[key] = cute.compile(make(), *args)
    return _compiled[key]


def split_tokens(mg: int, parts: int, step: int) -> list[tuple[int, int]]:
    """(first token, tokens) of ``parts`` near-equal tiles of a group of ``mg`` tokens, each but the last a
    multiple of ``step`` wide (fewer tiles if the rounding leaves some empty)."""
    size = round_up(-(-mg // parts), step)
    return [(m0, min(size, mg - m0)) for m0 in range(0, mg, size)]


def makespan(costs: list[float], machines: int) -> float:
    """Longest-processing-time-first schedule of ``costs`` on ``machines``: the finish time of the last."""
    import heapq

    load = [0.0] * min(machines, max(1, len(costs)))
    for c in sorted(costs, reverse=True):
        heapq.heapreplace(load, load[0] + c)
    return max(load)


def plan_token_tiles(m, k_tiles, n_blocks, tile_n: int, step: int, sms: int) -> list[list[tuple[int, int]]]:
    """Token tiles per group: start from the fewest tiles of at most ``tile_n`` tokens, then keep splitting the
    group with the widest tiles while the estimated makespan (LPT over ``sms`` SMs, one CTA each, a CTA's cost
    ``k_tiles × (tokens rounded to step + CTA_OVERHEAD_TOKENS)``) improves: small problems get more, narrower
    CTAs to fill the GPU; large ones keep wide tiles (each weight decoded once per tile)."""
    parts = [-(-mg // tile_n) if mg else 0 for mg in m]

    def tiles(p):
        return [split_tokens(mg, pg, step) if pg else [] for mg, pg in zip(m, p)]

    def cost(t):
        return makespan([kt * (round_up(w, step) + CTA_OVERHEAD_TOKENS)
                         for tg, kt, nb in zip(t, k_tiles, n_blocks) for _, w in tg for _ in range(nb)], sms)

    cur = tiles(parts)
    best, best_cost = cur, cost(cur)
    for _ in range(4 * len(m) + 8):
        widths = [max((w for _, w in tg), default=0) for tg in cur]
        g = max(range(len(m)), key=lambda i: widths[i])
        if widths[g] <= step:
            break
        parts[g] += 1
        cur = tiles(parts)
        c = cost(cur)
        if c < best_cost:
            best, best_cost = cur, c
    return best


def swap_tile_table(m, n, k, row_offsets, n_pad: int, cfg: KernelConfig, sms: int, device) -> torch.Tensor:
    """int32 [tiles, 10] (:data:`WIDE_TILE_COLUMNS`; column ``pad`` holds the wgmma N variant) for the swap-AB kernel,
    widest tiles first so the hardware's in-order CTA dispatch approximates a longest-first schedule."""
    step = token_step(cfg)
    k_tiles = [-(-kg // cfg.tile_k) for kg in k]
    n_blocks = [-(-ng // cfg.tile_m) for ng in n]
    plan = plan_token_tiles(m, k_tiles, n_blocks, cfg.tile_n, step, sms)
    rows = []
    for g, tg in enumerate(plan):
        for n0 in range(0, n[g], cfg.tile_m):
            for m0, w in tg:
                r0 = row_offsets[g] + m0
                rows.append((g, r0, w, n0, min(cfg.tile_m, n[g] - n0), g * n_pad + n0, k_tiles[g],
                             round_up(w, step) // step - 1, 0, r0))
    rows.sort(key=lambda r: (-r[7] * r[6], r[0], r[3], r[1]))
    if not rows:
        return torch.zeros((0, len(WIDE_TILE_COLUMNS)), dtype=torch.int32, device=device)
    return torch.tensor(rows, dtype=torch.int32, device=device)


def activation_rows(a, row_offsets, rows: int, device) -> torch.Tensor:
    """int64 [rows, 3] (:data:`ROW_COLUMNS`): where each row of the padded activation buffer comes from.

    The prologue reads the caller's tensors in place (a runner captures ``a``; a CUDA graph replays the
    addresses), so each group's codes and scales must be row-major with 8-byte aligned code rows."""
    table = torch.zeros((rows, 3), dtype=torch.int64)
    for g, (t, o) in enumerate(zip(a, row_offsets)):
        mg = int(t.shape[0])
        if mg == 0:
            continue
        codes, scales = t.data, t.scales
        if codes.stride(-1) != 1 or scales.stride(-1) != 1 or codes.data_ptr() % 8 or codes.stride(0) % 8:
            raise ValueError(f"a[{g}]: cute-hopper swap_ab reads activations in place and needs row-major codes and "
                             f"scales with 8-byte aligned code rows (strides {tuple(codes.stride())}, "
                             f"{tuple(scales.stride())}); pass .contiguous() tensors")
        r = torch.arange(mg, dtype=torch.int64)
        table[o: o + mg, 0] = codes.data_ptr() + r * codes.stride(0)
        table[o: o + mg, 1] = scales.data_ptr() + r * scales.stride(0)
        table[o: o + mg, 2] = int(t.shape[1]) // 16
    return table.to(device)


def group_parameters(a, row_offsets) -> tuple:
    """The prologue's kernel parameters (:data:`GROUP_PARAMS` per group, as cutlass.Int64), or () past
    :data:`PARAM_GROUPS` groups (the prologue then reads the row table)."""
    import cutlass

    if len(a) > PARAM_GROUPS:
        return ()
    vals = []
    for t, o in zip(a, row_offsets):
        vals += [t.data.data_ptr(), t.scales.data_ptr(), t.data.stride(0) * t.data.element_size(),
                 t.scales.stride(0) * t.scales.element_size(), o, int(t.shape[0]), int(t.shape[1]) // 16]
    return tuple(cutlass.Int64(v) for v in vals)


def check_inline(a, cfg: KernelConfig) -> None:
    """act_decode="inline" copies whole K tiles of raw activations 8 bytes at a time: refuse, naming the rule, a group
    whose K is not a multiple of tile_k or whose scale rows are not 8-byte aligned."""
    for g, t in enumerate(a):
        if int(t.shape[0]) == 0:
            continue
        k, scales = int(t.shape[1]), t.scales
        if k % cfg.tile_k:
            raise ValueError(f"a[{g}]: K={k} is not a multiple of tile_k={cfg.tile_k}, which config {cfg.name} "
                             "(act_decode='inline') needs; the prologue configs (e.g. 'rs_m128_t128_k128_s4_e') take "
                             "any K that is a multiple of 32")
        if scales.data_ptr() % 8 or scales.stride(0) % 8:
            raise ValueError(f"a[{g}]: config {cfg.name} (act_decode='inline') copies scale rows 8 bytes at a time and "
                             f"needs them 8-byte aligned (address % 8 = {scales.data_ptr() % 8}, row stride "
                             f"{scales.stride(0)}); pass .contiguous() tensors with K a multiple of 128")


def prepare(a, b, b2, cfg: KernelConfig, *, out_dtype=torch.float16) -> Runner:
    """Prepack the weights (once), compile (cached); each call is two launches, the activation prologue (decode +
    global scales) and the GEMM, or (act_decode="warpgroup" or "inline") the GEMM alone."""
    t0 = time.perf_counter()
    validate(cfg)
    device = a[0].data.device
    _require_hopper(device)
    import cuda.bindings.driver as cuda

    pro_cls, gemm_cls = _kernel_classes()
    check_scales_finite(a, "a")
    blocks = blocks_per_warpgroup(cfg)
    weights = stack_weights([b] if b2 is None else [b, b2], cfg.tile_m, cfg.tile_k)
    packed = prepack_weights(list(zip(weights.codes, weights.scales)), NWG, blocks,
                             wg_major=cfg.warp_spec == "pingpong")
    m = tuple(int(t.shape[0]) for t in a)
    offs, rows = padded_row_offsets(m, token_step(cfg))  # each group starts at a TMA box (token_step rows)
    row_table = activation_rows(a, offs, rows, device)
    direct = cfg.act_decode != "prologue"  # the GEMM reads the caller's activations itself
    if cfg.act_decode == "inline":
        check_inline(a, cfg)
    x16 = None if direct else torch.zeros((rows, weights.k_pad), dtype=torch.float16, device=device)
    tiles = swap_tile_table(m, weights.n, weights.k, offs, weights.n_pad, cfg,
                            torch.cuda.get_device_properties(device).multi_processor_count, device)
    c_all = torch.empty((rows, weights.n_pad), dtype=out_dtype, device=device)
    outputs = [c_all[o: o + mg, :ng] for o, mg, ng in zip(offs, m, weights.n)]
    gs_a = torch.tensor([t.global_scale.data_ptr() for t in a], dtype=torch.int64).to(device)
    gs_b = torch.stack([weights.global_scales[0], weights.global_scales[-1]], dim=1) * POST_SCALE
    alpha = None if direct else torch.zeros((len(a), 2), dtype=torch.float32, device=device)

    def stream():
        return cuda.CUstream(torch.cuda.current_stream(device).cuda_stream)

    prologue = pro_args = None
    if not direct:
        groups = group_parameters(a, offs)
        pro_args = (_cute(row_table, 8), _cute(x16), _cute(gs_a, 8), _cute(gs_b, 8), _cute(alpha, 8), groups)
        prologue = _compile_cached(("prologue", ACT_SMEM, len(groups)), pro_cls, (*pro_args, stream()))
    gemm_args = ((_cute(packed.view(-1, ROW_BYTES)), _cute(row_table, 8), _cute(c_all), _cute(tiles), _cute(gs_b, 8))
                 if direct else
                 (_cute(packed.view(-1, ROW_BYTES)), _cute(x16), _cute(c_all), _cute(tiles), _cute(alpha, 8)))
    gemm_args = (*gemm_args, _cute(gs_a, 8))
    gemm = (_compile_cached((cfg, str(out_dtype)), lambda: gemm_cls(cfg), (*gemm_args, stream()))
            if len(tiles) else None)

    def run():
        if prologue is not None:
            prologue(*pro_args, stream())
        if gemm is not None:
            gemm(*gemm_args, stream())

    torch.cuda.synchronize(device)
    return Runner(run, outputs, prepare_s=time.perf_counter() - t0, held_bytes=packed.numel(),
                  notes=f"weights prepacked once for the register decode ({packed.numel() / 1e6:.1f} MB); "
                        f"config {cfg.name}",
                  info={"config": cfg.name, "tiles": len(tiles), "split_k": 1},
                  keepalive=(a, packed, row_table, x16, tiles, c_all, gs_a, gs_b, alpha))


# ---------------------------------------------------------------------------------------------
# Compile reports (no GPU needed)
# ---------------------------------------------------------------------------------------------
def fake_arguments(cfg: KernelConfig):
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_compact_tensor

    def fake(dtype, shape, align=16):
        return make_fake_compact_tensor(dtype, shape, stride_order=(1, 0), assumed_align=align)

    s = cute.sym_int
    groups = s()
    x = (fake(cutlass.Int64, (s(), len(ROW_COLUMNS)), 8) if cfg.act_decode != "prologue"
         else fake(cutlass.Float16, (s(), s(divisibility=cfg.tile_k))))
    return (fake(cutlass.Uint8, (s(), ROW_BYTES)), x, fake(cutlass.Float16, (s(), s(divisibility=8))),
            fake(cutlass.Int32, (s(), len(WIDE_TILE_COLUMNS))), fake(cutlass.Float32, (groups, 2), 8),
            make_fake_compact_tensor(cutlass.Int64, (groups,), assumed_align=8), cuda.CUstream(0))


def fake_prologue_arguments(param_groups: int = 0):
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_compact_tensor

    s = cute.sym_int
    groups = s()
    return (make_fake_compact_tensor(cutlass.Int64, (s(), 3), stride_order=(1, 0), assumed_align=8),
            make_fake_compact_tensor(cutlass.Float16, (s(), s(divisibility=64)), stride_order=(1, 0),
                                     assumed_align=16),
            make_fake_compact_tensor(cutlass.Int64, (groups,), assumed_align=8),
            make_fake_compact_tensor(cutlass.Float32, (groups, 2), stride_order=(1, 0), assumed_align=8),
            make_fake_compact_tensor(cutlass.Float32, (groups, 2), stride_order=(1, 0), assumed_align=8),
            tuple(cutlass.Int64(0) for _ in range(len(GROUP_PARAMS) * param_groups)), cuda.CUstream(0))


def compile_report(cfg: KernelConfig, dump_dir: str | None = None) -> dict:
    """Compile ``cfg`` (and the activation prologue) for sm_90a with fake tensors: PTX instruction counts, ptxas
    resources, the smem plan. No GPU needed."""
    from .compiling import compile_offline, count_instructions

    validate(cfg)
    t0 = time.perf_counter()
    art = compile_offline(kernel_for(cfg), *fake_arguments(cfg), arch="sm_90a", dump_dir=dump_dir)
    plan = smem_plan(cfg)
    log = art.ptxas.get("ptxas_log", "")
    return {
        **cfg.as_dict(), "compile_s": round(time.perf_counter() - t0, 2), "threads": block_threads(cfg),
        "math_warpgroups": NWG, "acc_registers": acc_registers(cfg), "smem_bytes": plan["total"],
        "smem_per_stage": plan["per_stage"], "ctas_per_sm_by_smem": 233472 // (plan["total"] + 1024),
        "wgmma_n_variants": cfg.tile_n // token_step(cfg),
        **{k: v for k, v in art.ptxas.items() if k != "ptxas_log"}, **art.instructions,
        **count_instructions(art.ptx, ("lop3.b32", "mul.rn.f16x2", "cvt.rn.f16x2.e4m3x2", "ld.shared.v4.b32",
                                       "ld.shared.v2.b32", "griddepcontrol.wait", "st.shared", "st.shared.b16",
                                       "st.shared.v4.b32", "fence.proxy.async", "ld.global.nc.v2.b32",
                                       "st.global.v4.b32", "st.global.b16", "bar.sync", "bar.arrive",
                                       "cp.async.ca.shared.global", "cp.async.mbarrier.arrive.noinc")),
        # ptxas serialises every wgmma when it cannot prove the register operand safe (C7513): a silent slowdown
        "wgmma_serialized": "C7513" in log, "ptx_path": art.ptx_path,
    }


def prologue_report(param_groups: int = 0, dump_dir: str | None = None) -> dict:
    """Compile the activation prologue for sm_90a with fake tensors (reading the row table, or with the parameters of
    ``param_groups`` groups): its PTX instruction counts and ptxas resources."""
    from .compiling import compile_offline, count_instructions

    art = compile_offline(prologue_kernel(), *fake_prologue_arguments(param_groups), arch="sm_90a", dump_dir=dump_dir)
    return {**{k: v for k, v in art.ptxas.items() if k != "ptxas_log"}, **art.instructions,
            "params": art.ptx.count(".param .u64"),
            **count_instructions(art.ptx, ("griddepcontrol.launch_dependents", "ld.global.nc.u64",
                                           "cvt.rn.f16x2.e4m3x2", "ld.global.nc.v2.b32", "st.global.v4.b32"))}


def kernel_for(cfg: KernelConfig):
    return _kernel_classes()[1](cfg)


def prologue_kernel():
    return _kernel_classes()[0]()


def read_timeline(runner) -> dict:
    """ablate="timeline": per CTA, the stamps of :data:`TIMELINE_POINTS` in µs from the earliest CTA's entry, read
    from the outputs of a prepared (not graphed or graphed) runner after a call. {point: [per CTA]}."""
    if isinstance(runner.keepalive[0], type(runner)):  # a graphed runner keeps the runner it captured
        return read_timeline(runner.keepalive[0])
    tiles, c_all = runner.keepalive[4], runner.keepalive[5]
    t = tiles.cpu()
    cols = {c: i for i, c in enumerate(WIDE_TILE_COLUMNS)}
    raw = c_all.view(torch.int64).cpu()  # [rows, n_pad / 4]: the stamps are int64 at columns n0 .. n0 + 31 (fp16)
    stamps = torch.stack([raw[int(r[cols["out_row0"]]), int(r[cols["n0"]]) // 4: int(r[cols["n0"]]) // 4 + 8]
                          for r in t])
    stamps = stamps[:, :len(TIMELINE_POINTS)].to(torch.float64)
    stamps = (stamps - stamps[:, 0].min()) / 1e3
    return {p: stamps[:, i].tolist() for i, p in enumerate(TIMELINE_POINTS)}
