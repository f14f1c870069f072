"""The Hopper smem-decode kernel's rules and named configs (no GPU, no cutlass): shared-memory and register
budgets, :func:`validate`, the shipped :data:`CONFIGS`, the study's sweep and ablation configs, and `auto`'s
candidates. Configs with ``swap_ab=True`` (``rs_*``) run the register-decode kernel of :mod:`.hopper_rs`.
"""
from __future__ import annotations

import torch

from .config import KernelConfig

SMEM_LIMIT = 232448  # bytes of shared memory one CTA may use on sm_90 (227 KB)
# ptxas asked for 154 registers for a 128-accumulator wgmma warpgroup under a 128-register bound
ACC_OVERHEAD_REGS = 26
MAX_ACC_REGS = 128  # fp32 accumulator registers per thread we allow (beyond it the kernel spills)
SUB_K = 64  # K elements per decode sub-block: one 128-byte swizzle row of fp16
RING = 2  # fp16 sub-block buffers (decode of one overlaps the wgmma of the other)
POST_SCALE = 2.0**14  # the decode's operands are value × 2^-7 each; the product carries 2^-14
OUT_DTYPES = {torch.float16: "Float16"}  # bf16 output compiles too, but is not yet checked on a GPU

# ---------------------------------------------------------------------------------------------
# Named configs
# ---------------------------------------------------------------------------------------------
_B = KernelConfig("baseline")
_PC = _B.with_(warp_spec="producer_consumer")
_T = _B.with_(epilogue="tma")
# Shipped: compiled in CI, exact on the H100 (see tests/gpu/test_hopper_gpu.py).
CONFIGS: dict[str, KernelConfig] = {}


def _ship(*cfgs: KernelConfig) -> None:
    CONFIGS.update((c.name, c) for c in cfgs)


_ship(
    _B,
    _B.with_(name="baseline_dual", tile_n=64, dual=True),
    _B.with_(name="stages2", ab_stages=2),
    _B.with_(name="stages3", ab_stages=3),
    _B.with_(name="stages4", ab_stages=4),
    _B.with_(name="tile64x128", tile_m=64),
    _B.with_(name="tile128x64", tile_n=64),
    _B.with_(name="tile64x64", tile_m=64, tile_n=64),
    _B.with_(name="tma_epilogue", epilogue="tma"),
    _PC.with_(name="producer_consumer"),
    _PC.with_(name="producer_consumer_stages2", ab_stages=2),
    _PC.with_(name="producer_consumer_dual", dual=True),
    _PC.with_(name="tile128x256", tile_n=256),
    # the TMA-store epilogue combined with the other knobs (round 3 × rounds 1, 2, 4)
    _T.with_(name="tma_stages2", ab_stages=2),
    _T.with_(name="tile64x128_tma", tile_m=64),
    _T.with_(name="tile64x64_tma", tile_m=64, tile_n=64),
    _T.with_(name="tile128x64_tma", tile_n=64),
    _T.with_(name="baseline_dual_tma", tile_n=64, dual=True),
    _PC.with_(name="producer_consumer_tma", epilogue="tma"),
    _PC.with_(name="producer_consumer_dual_tma", dual=True, epilogue="tma"),
    _PC.with_(name="tile128x256_tma", tile_n=256, epilogue="tma"),
)
# the batched decode (all shared loads of a sub-block first) on the TMA-epilogue configs
_ship(CONFIGS["tma_epilogue"].with_(name="tma_batched", decode="batched"),
      *(CONFIGS[n].with_(name=n + "_batched", decode="batched") for n in (
          "tma_stages2", "tile64x128_tma", "tile64x64_tma", "baseline_dual_tma", "producer_consumer_tma",
          "producer_consumer_dual_tma", "tile128x256_tma")))
# two producer (decode) warpgroups feeding two wgmma warpgroups
_ship(*(_PC.with_(name=name, epilogue="tma", decode="batched", decode_warpgroups=2, **kw) for name, kw in (
    ("pc2_tma_batched", {}), ("pc2_stages2_tma_batched", {"ab_stages": 2}),
    ("pc2_stages2_tile64x128_tma_batched", {"ab_stages": 2, "tile_m": 64}))))
# deeper TMA pipelines for the one-warpgroup kernel (what fits: 2 CTAs per SM up to ~113 KB each)
_ship(*(_T.with_(name=name, decode="batched", **kw) for name, kw in (
    ("tma_stages3_batched", {"ab_stages": 3}), ("tma_stages4_batched", {"ab_stages": 4}),
    ("tile64x128_stages2_tma_batched", {"tile_m": 64, "ab_stages": 2}),
    ("tile64x128_stages3_tma_batched", {"tile_m": 64, "ab_stages": 3}),
    ("tile64x64_stages2_tma_batched", {"tile_m": 64, "tile_n": 64, "ab_stages": 2}),
    ("dual_stages2_tma_batched", {"tile_n": 64, "dual": True, "ab_stages": 2}))))
# cooperative: two warpgroups that both decode and each run the MMA of its 64 rows
_ship(*(_T.with_(name=name, cooperative=True, decode="batched", **kw) for name, kw in (
    ("coop_tma_batched", {}), ("coop_stages2_tma_batched", {"ab_stages": 2}),
    ("coop_tile128x256_tma_batched", {"tile_n": 256}), ("coop_dual_tma_batched", {"dual": True}))))
# split-K (explicit, to test the path on every suite; and auto: only where the tiles do not fill the GPU)
_ship(
    _B.with_(name="tile64x128_stages2_batched_split3", tile_m=64, ab_stages=2, decode="batched", split_k=3),
    _PC.with_(name="producer_consumer_dual_batched_split3", dual=True, decode="batched", split_k=3),
    CONFIGS["tile64x128_stages2_tma_batched"].with_(name="tile64x128_stages2_tma_batched_auto", split_k=0),
    CONFIGS["producer_consumer_dual_tma_batched"].with_(name="producer_consumer_dual_tma_batched_auto", split_k=0),
)
# swap-AB (nvfp4lib.kernels.hopper_rs): weights decoded straight into wgmma's register operand, tokens on wgmma's N.
# rs_m{weight rows per CTA}_t{tokens per CTA}_k{K per stage}_s{stages}[_v{token step}]; a dual config covers half the
# rows of each matrix. _v: one wgmma N per multiple of the step, chosen per tile.
_RS = KernelConfig("rs", swap_ab=True, tile_m=128, tile_k=128, ab_stages=4)
_ship(*(_RS.with_(name=f"rs_m{tm}_t{bt}_k{bk}_s{st}", tile_m=tm, tile_n=bt, tile_k=bk, ab_stages=st)
        for tm, bt, bk, st in ((128, 64, 128, 4), (128, 128, 128, 4), (128, 96, 128, 3),
                               (256, 64, 128, 6), (256, 96, 128, 5), (256, 128, 128, 4))))
_ship(*(_RS.with_(name=f"rs_m{tm}_t{bt}_k{bk}_s{st}_v{ts}", tile_m=tm, tile_n=bt, tile_k=bk, ab_stages=st,
                  token_step=ts)
        for tm, bt, bk, st, ts in ((128, 256, 128, 3, 32), (128, 128, 128, 4, 16), (128, 192, 128, 3, 32))))
_ship(*(_RS.with_(name=f"rs_dual_m{tm}_t{bt}_k{bk}_s{st}", tile_m=tm, dual=True, tile_n=bt, tile_k=bk, ab_stages=st)
        for tm, bt, bk, st in ((64, 128, 128, 4), (128, 64, 128, 6), (128, 128, 128, 4), (64, 96, 128, 3),
                               (128, 128, 128, 3))))
_ship(*(_RS.with_(name=f"rs_dual_m{tm}_t{bt}_k{bk}_s{st}_v{ts}", tile_m=tm, dual=True, tile_n=bt, tile_k=bk,
                  ab_stages=st, token_step=ts)
        for tm, bt, bk, st, ts in ((64, 256, 128, 3, 32), (64, 128, 128, 4, 16), (128, 128, 128, 4, 16))))
# epilogue="staged" (suffix _e): the output tile goes through shared memory and leaves in 16-byte row chunks
_ship(*(CONFIGS[n].with_(name=f"{n}_e", epilogue="staged") for n in (
    "rs_m128_t96_k128_s3", "rs_m128_t128_k128_s4", "rs_m128_t256_k128_s3_v32", "rs_dual_m64_t96_k128_s3",
    "rs_dual_m128_t128_k128_s4", "rs_dual_m64_t256_k128_s3_v32")))
_ship(*(_RS.with_(name=f"rs_m128_t{bt}_k{bk}_s{st}_e", tile_n=bt, tile_k=bk, ab_stages=st, epilogue="staged")
        for bt, bk, st in ((128, 128, 5), (64, 128, 4), (128, 128, 3))))
# act_decode="warpgroup" (suffix _dw): a third warpgroup decodes each CTA's token rows into the ring and issues the
# weight loads; no prologue launch
_ship(*(CONFIGS[n].with_(name=f"{n}_dw", act_decode="warpgroup") for n in (
    "rs_m128_t128_k128_s4_e", "rs_m128_t96_k128_s3_e", "rs_m128_t64_k128_s4_e", "rs_dual_m64_t96_k128_s3_e")))
# act_decode="inline" (suffix _i): the MMA warpgroups copy their raw activation rows (cp.async) and decode them into a
# two-slot fp16 ring one K tile ahead; no prologue launch, no third warpgroup
_ship(*(_RS.with_(name=f"rs_m128_t{bt}_k128_s{st}_e_i", tile_n=bt, ab_stages=st, epilogue="staged", act_decode="inline")
        for bt, st in ((128, 6), (96, 6), (64, 8))))
# Round 4 on the swap-AB kernel, same tile and SIMT epilogue: none (rs_m128_t128_k128_s4: the MMA warpgroups load),
# producer/consumer (_dw: the decode warpgroup loads and feeds both) and ping-pong (_pp: the same producer; the MMA
# warpgroups run their K loops one after the other, each on its own stages)
_ship(CONFIGS["rs_m128_t128_k128_s4"].with_(name="rs_m128_t128_k128_s4_dw", act_decode="warpgroup"),
      CONFIGS["rs_m128_t128_k128_s4"].with_(name="rs_m128_t128_k128_s4_pp", act_decode="warpgroup",
                                              warp_spec="pingpong"))
# Candidates the study pitched that are not shipped (refused by validate, or not verified on a GPU).
SWEEP_CONFIGS: dict[str, KernelConfig] = {c.name: c for c in (
    _B.with_(name="tile128x256_1wg", tile_n=256),
    _B.with_(name="tile128x128x512", tile_k=512),
    _B.with_(name="tile128x128x128", tile_k=128),
    _B.with_(name="pingpong", warp_spec="pingpong"),
    _B.with_(name="baseline_dual_128", dual=True),
    _PC.with_(name="tile128x256_pc2", tile_n=256, decode_warpgroups=2),  # 512 threads leave 128 registers
    # two stages of 128-token tiles: exact on its canary, and the pipeline starves (S4 25.5 vs 17.8 us with three)
    _RS.with_(name="rs_m128_t128_k128_s2_e", ab_stages=2, epilogue="staged"),
    # round 1 on the dual GEMM (128x64 tiles, as baseline_dual)
    *(_B.with_(name=f"baseline_dual_stages{s}", tile_n=64, dual=True, ab_stages=s) for s in (2, 3, 4)),
)}
# Diagnostics (wrong results by design; timed, never checked, never shipped).
ABLATIONS: dict[str, KernelConfig] = {c.name: c for c in (
    _B.with_(name="baseline_no_dequant", ablate="no_dequant"),
    _B.with_(name="baseline_no_mma", ablate="no_mma"),
    _T.with_(name="tma_batched_no_dequant", decode="batched", ablate="no_dequant"),
    _T.with_(name="tma_batched_no_mma", decode="batched", ablate="no_mma"),
    *(CONFIGS[n].with_(name=f"{n}_{a}", ablate=a) for n in ("rs_m128_t128_k128_s4", "rs_m256_t128_k128_s4")
      for a in ("no_dequant", "no_mma")),
    *(CONFIGS[n].with_(name=f"{n}_{a}", ablate=a) for n in ("rs_m128_t128_k128_s4", "rs_dual_m128_t128_k128_s4")
      for a in ("no_x", "no_store")),
    *(CONFIGS["rs_m128_t128_k128_s4_e_dw"].with_(name=f"rs_m128_t128_k128_s4_e_dw_{a}", ablate=a)
      for a in ("no_xload", "no_mma", "no_dequant", "no_store")),
    # per-CTA %globaltimer stamps written into the output (hopper_rs.read_timeline)
    *(CONFIGS[n].with_(name=f"{n}_timeline", ablate="timeline") for n in (
        "rs_m128_t128_k128_s4_e", "rs_m128_t128_k128_s4", "rs_dual_m128_t128_k128_s4", "rs_m128_t128_k128_s4_e_dw",
        "rs_m128_t128_k128_s6_e_i", "rs_m128_t128_k128_s3_e")),
    SWEEP_CONFIGS["rs_m128_t128_k128_s2_e"].with_(name="rs_m128_t128_k128_s2_e_timeline", ablate="timeline"),
    CONFIGS["rs_m128_t128_k128_s4_e_dw"].with_(name="rs_m128_t128_k128_s4_e_dw_no_xload_timeline",
                                               ablate="no_xload+timeline"),
)}
# "auto" (the default): prepare times these swap-AB candidates on the problem at hand and keeps the fastest. No
# single tiling won every shape on the H100 (run of 2026-11-23 at 84fac66): 96-token tiles (S2, S1-dual, S2-dual),
# 128 with 4 stages (S3, S4) or 5 (S1), the per-element dual epilogue (S3-dual, S4-dual; within 1% of the staged one),
# variable N up to 256 (large M); "baseline" (the study's kernel) and every other config stay selectable by name.
# The decode-warpgroup configs (_dw) were candidates in the runs at db91a56 and 30f2014 and lost every shape (S4 22.6
# vs 18.0 us, S1 198 vs 131 at 30f2014): they stay selectable by name, out of auto (each candidate costs a compile
# and timing at prepare); so do the inline-decode configs (_i: S4 24.5 vs 18.0 us, S1 232 vs 133 at 6c6a2e6). Three
# stages of 128-token tiles start sooner on one-wave shapes (a smaller first burst of loads: S4 17.8 vs 18.1 us at
# 3cb93ac); two starve the pipeline (S4 25.5).
AUTO_CANDIDATES = {
    False: ("rs_m128_t96_k128_s3_e", "rs_m128_t128_k128_s3_e", "rs_m128_t128_k128_s4_e", "rs_m128_t128_k128_s5_e",
            "rs_m128_t64_k128_s4_e", "rs_m128_t256_k128_s3_v32_e"),
    True: ("rs_dual_m64_t96_k128_s3_e", "rs_dual_m128_t128_k128_s3", "rs_dual_m128_t128_k128_s4_e",
           "rs_dual_m128_t128_k128_s4", "rs_dual_m64_t256_k128_s3_v32_e"),
}
DEFAULT_SINGLE = DEFAULT_DUAL = "auto"


# ---------------------------------------------------------------------------------------------
# Validity and the storage plan (pure Python: asked before compiling)
# ---------------------------------------------------------------------------------------------
def math_warpgroups(cfg: KernelConfig) -> int:
    """Warpgroups that run wgmma: one per 64 rows for ``producer_consumer`` or ``cooperative``, else one."""
    return cfg.tile_m // 64 if cfg.warp_spec == "producer_consumer" or cfg.cooperative else 1


def decode_warpgroups(cfg: KernelConfig) -> int:
    """Warpgroups that decode: the producers for ``producer_consumer``; else every warpgroup."""
    return cfg.decode_warpgroups if cfg.warp_spec == "producer_consumer" else math_warpgroups(cfg)


def threads_for(cfg: KernelConfig) -> int:
    return 128 * (math_warpgroups(cfg) + (decode_warpgroups(cfg) if cfg.warp_spec == "producer_consumer" else 0))


def launch_registers(cfg: KernelConfig) -> int:
    """Registers per thread at launch: 65536 / threads, rounded down to 8. ptxas compiles the whole kernel
    to this bound, whatever setmaxnreg does later."""
    return 65536 // threads_for(cfg) // 8 * 8


def register_split(cfg: KernelConfig) -> tuple[int, int]:
    """setmaxnreg targets (producer, math) per thread for producer_consumer.

    The re-split must fit in the launch pool (e.g. 384 threads: 104 + 2*200 = 3*168), or setmaxnreg.inc
    waits forever."""
    nprod, nmath = decode_warpgroups(cfg), math_warpgroups(cfg)
    pool = launch_registers(cfg) * (nprod + nmath)
    producer = 104 if nprod == 1 else 88
    return producer, min(240, (pool - nprod * producer) // nmath // 8 * 8)


def acc_registers(cfg: KernelConfig) -> int:
    """fp32 accumulator registers per math thread."""
    return (2 if cfg.dual else 1) * cfg.tile_m * cfg.tile_n // (128 * math_warpgroups(cfg))


def epilogue_tile(cfg: KernelConfig) -> tuple[int, int]:
    if math_warpgroups(cfg) > 1:
        return (min(128, cfg.tile_m), min(32, cfg.tile_n))
    return (min(64, cfg.tile_m), min(32, cfg.tile_n))


EPI_STAGES = 4


def smem_plan(cfg: KernelConfig) -> dict:
    """Bytes of shared memory per buffer, as the kernel's SharedStorage lays them out."""
    nb = 2 if cfg.dual else 1
    kb, ks = cfg.tile_k // 2, cfg.tile_k // 16
    plan = {
        "barriers": cfg.ab_stages * 16 + (RING * 16 if cfg.warp_spec == "producer_consumer" else 0),
        "packed_a": cfg.ab_stages * cfg.tile_m * kb,
        "packed_b": nb * cfg.ab_stages * cfg.tile_n * kb,
        "scales_a": cfg.ab_stages * cfg.tile_m * ks,
        "scales_b": nb * cfg.ab_stages * cfg.tile_n * ks,
        "fp16_a": RING * cfg.tile_m * SUB_K * 2,
        "fp16_b": nb * RING * cfg.tile_n * SUB_K * 2,
    }
    aligns = {"barriers": 8, "packed_a": 1024, "packed_b": 1024, "scales_a": 128, "scales_b": 128,
              "fp16_a": 1024, "fp16_b": 1024}
    off = 0
    for k, v in plan.items():
        off = (off + aligns[k] - 1) // aligns[k] * aligns[k] + v
    plan["total"] = off + 1024  # the allocator's own base alignment
    plan["per_stage"] = (cfg.tile_m + nb * cfg.tile_n) * (kb + ks)
    em, en = epilogue_tile(cfg)
    plan["epilogue_staging"] = em * en * 2 * EPI_STAGES if cfg.epilogue == "tma" else 0
    return plan


def validate(cfg: KernelConfig) -> KernelConfig:
    """Raise ValueError naming the rule a config breaks; return it unchanged if it can work."""
    n = cfg.name
    if cfg.swap_ab:
        from . import hopper_rs

        return hopper_rs.validate(cfg)
    if cfg.warp_spec not in ("none", "producer_consumer", "pingpong"):
        raise ValueError(f"{n}: warp_spec={cfg.warp_spec!r}: must be 'none', 'producer_consumer' or 'pingpong'")
    if cfg.warp_spec == "pingpong":
        raise ValueError(f"{n}: warp_spec='pingpong' is not implemented in this kernel "
                         "(implemented: 'none', 'producer_consumer'); the swap-AB kernel has it (swap_ab=True, "
                         "act_decode='warpgroup', e.g. config 'rs_m128_t128_k128_s4_pp')")
    if cfg.epilogue not in ("simt", "tma"):
        raise ValueError(f"{n}: epilogue={cfg.epilogue!r}: must be 'simt' or 'tma'")
    if cfg.tile_m not in (64, 128):
        raise ValueError(f"{n}: tile_m={cfg.tile_m}: wgmma covers 64 rows per warpgroup instruction; this "
                         "kernel supports tile_m 64 or 128")
    if cfg.tile_n % 8 or not 8 <= cfg.tile_n <= 256:
        raise ValueError(f"{n}: tile_n={cfg.tile_n}: wgmma's N must be a multiple of 8 in [8, 256]")
    if cfg.tile_k not in (256, 512):
        raise ValueError(f"{n}: tile_k={cfg.tile_k}: must be 256 or 512 FP4 elements: a TMA box of scale "
                         "bytes (tile_k/16 per row) must be a multiple of 16 bytes, and the packed codes are "
                         "read in 128-byte swizzle panels")
    if cfg.ab_stages < 1:
        raise ValueError(f"{n}: ab_stages={cfg.ab_stages} must be >= 1")
    if cfg.decode not in ("chunked", "batched"):
        raise ValueError(f"{n}: decode={cfg.decode!r}: must be 'chunked' or 'batched'")
    if cfg.split_k < 0 or cfg.split_k > 16:
        raise ValueError(f"{n}: split_k={cfg.split_k}: must be 0 (auto) or 1..16")
    if cfg.split_k > 1 and cfg.epilogue == "tma":
        raise ValueError(f"{n}: split_k={cfg.split_k} writes fp32 partial sums through the SIMT epilogue; "
                         "use epilogue='simt' (split_k=0 switches to it by itself when it splits)")
    if cfg.cooperative and cfg.warp_spec != "none":
        raise ValueError(f"{n}: cooperative=True is the warp_spec='none' kernel with one decoding+MMA warpgroup per "
                         "64 rows; producer_consumer already has one MMA warpgroup per 64 rows")
    if cfg.decode_warpgroups not in (1, 2):
        raise ValueError(f"{n}: decode_warpgroups={cfg.decode_warpgroups}: must be 1 or 2")
    if cfg.decode_warpgroups > 1 and cfg.warp_spec != "producer_consumer":
        raise ValueError(f"{n}: decode_warpgroups={cfg.decode_warpgroups} needs warp_spec='producer_consumer' "
                         "(with 'none' the one warpgroup decodes and runs the MMA)")
    step = 32 * decode_warpgroups(cfg)
    if cfg.tile_n % step:
        raise ValueError(f"{n}: tile_n={cfg.tile_n}: the decode maps 32 rows per warpgroup pass "
                         f"({decode_warpgroups(cfg)} decode warpgroup(s)), so tile_n must be a multiple of {step}")
    if cfg.ablate not in ("", "no_dequant", "no_mma"):
        raise ValueError(f"{n}: ablate={cfg.ablate!r}: must be '', 'no_dequant' or 'no_mma'")
    if cfg.ablate and cfg.warp_spec != "none":
        raise ValueError(f"{n}: ablations are implemented for warp_spec='none' only")
    acc = acc_registers(cfg)
    if acc > MAX_ACC_REGS:
        raise ValueError(f"{n}: {acc} fp32 accumulator registers per thread (tile {cfg.tile_m}x{cfg.tile_n}"
                         f"{', two accumulators' if cfg.dual else ''}, {math_warpgroups(cfg)} math warpgroup(s)) "
                         f"exceed {MAX_ACC_REGS}: it would spill; use a smaller tile_n or "
                         "warp_spec='producer_consumer' (one warpgroup per 64 rows)")
    launch_regs = launch_registers(cfg)
    if acc + ACC_OVERHEAD_REGS > launch_regs:
        raise ValueError(f"{n}: {acc} accumulator registers per thread need about {acc + ACC_OVERHEAD_REGS} "
                         f"registers, but {threads_for(cfg)} threads leave {launch_regs} per thread (ptxas compiles "
                         "the whole kernel to the launch bound, whatever setmaxnreg does later): use fewer "
                         "decode_warpgroups or a smaller tile")
    plan = smem_plan(cfg)
    if plan["total"] > SMEM_LIMIT:
        raise ValueError(f"{n}: needs {plan['total']} bytes of shared memory > the sm_90 limit {SMEM_LIMIT} "
                         f"(tile {cfg.tile_m}x{cfg.tile_n}x{cfg.tile_k}, {cfg.ab_stages} stages of "
                         f"{plan['per_stage']} bytes, fp16 ring {plan['fp16_a'] + plan['fp16_b']} bytes)")
    if plan["epilogue_staging"] > plan["fp16_a"]:
        raise ValueError(f"{n}: the TMA epilogue stages {plan['epilogue_staging']} bytes in the fp16 A ring "
                         f"({plan['fp16_a']} bytes)")
    return cfg


def get_config(config, dual: bool) -> KernelConfig:
    """A KernelConfig (validated) from a name or a config; ``dual`` is set from the operands."""
    if isinstance(config, KernelConfig):
        cfg = config
    else:
        name = config or (DEFAULT_DUAL if dual else DEFAULT_SINGLE)
        if name == "auto":
            raise ValueError("config 'auto' is a choice among AUTO_CANDIDATES made by prepare, not one config")
        table = {**CONFIGS, **SWEEP_CONFIGS, **ABLATIONS}
        if name not in table:
            raise ValueError(f"unknown cute-hopper config {name!r}; known: {', '.join(table)}")
        cfg = table[name]
    if cfg.swap_ab and cfg.dual != dual:  # a swap-AB CTA's warpgroups split tile_m rows, or cover gate and up alike
        cfg = cfg.with_(tile_m=cfg.tile_m // 2 if dual else cfg.tile_m * 2)
    return validate(cfg.with_(dual=dual))
