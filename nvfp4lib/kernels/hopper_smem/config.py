"""The Hopper smem-decode kernel's knobs and rules (no GPU, no cutlass): :class:`SmemConfig`, shared-memory and
register budgets, :func:`validate`, and the named configs it ships: the study's baseline, the config each round's
pitch is measured with (notebooks 02-05, :mod:`nvfp4lib.study.claims`), and the configs this kernel's ``auto``
ended with.
The register-decode (swap-AB) kernel's configs are in :mod:`..hopper_rs.config`.

Variants that lost and diagnostics left the package; their rows stay in ``data/bench.jsonl`` and their code in git
(``git show f7c5079:nvfp4lib/kernels/hopper_configs.py`` lists them): the cooperative and two-producer-warpgroup
structures, the decode/MMA ablations, and the other points of the round sweeps.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import ClassVar, Literal

import torch

from ..common.sm90 import POST_SCALE, SMEM_LIMIT  # noqa: F401  (re-exported: hopper_smem.X)

# ptxas asked for 154 registers for a 128-accumulator wgmma warpgroup under a 128-register bound
ACC_OVERHEAD_REGS = 26
MAX_ACC_REGS = 128  # fp32 accumulator registers per thread we allow (beyond it the kernel spills)
SUB_K = 64  # K elements per decode sub-block: one 128-byte swizzle row of fp16
RING = 2  # fp16 sub-block buffers (decode of one overlaps the wgmma of the other)
OUT_DTYPES = {torch.float16: "Float16"}  # bf16 output compiles too, but is not yet checked on a GPU
DECODE_ROWS = 32  # rows a decoding warpgroup covers per pass (4 warps × 8 rows)


@dataclass(frozen=True)
class SmemConfig:
    """The smem-decode kernel's knobs. Both operands are decoded into shared memory, so the tile is the output's:
    ``tile_m`` token rows (A, wgmma's M) × ``tile_n`` output columns (weight rows of B, wgmma's N) per CTA, ``tile_k``
    K per pipeline stage (FP4 elements), ``ab_stages`` TMA stages of packed codes and scales.

    ``epilogue``: per-element stores ("simt") or shared memory and a TMA store ("tma"). ``warp_spec``: one warpgroup
    decodes and runs wgmma ("none"), or a producer warpgroup decodes into an fp16 ring for ``tile_m/64`` wgmma
    warpgroups ("producer_consumer"). ``decode``: per 16 codes load-convert-store ("chunked") or all of a sub-block's
    shared loads first ("batched"). ``split_k``: K tiles of every output tile over this many CTAs (fp32 partials summed
    after the kernel); 0 chooses at prepare, only where the tiles do not fill the GPU. ``dual``: the fused
    silu(A·B1ᵀ)·(A·B2ᵀ), set from the operands."""

    family: ClassVar[str] = "hopper_smem"
    swap_ab: ClassVar[bool] = False
    name: str
    tile_m: int = 128
    tile_n: int = 128
    tile_k: int = 256
    ab_stages: int = 1
    epilogue: Literal["simt", "tma"] = "simt"
    warp_spec: Literal["none", "producer_consumer"] = "none"
    decode: Literal["chunked", "batched"] = "chunked"
    split_k: int = 1
    dual: bool = False

    def with_(self, **changes) -> "SmemConfig":
        return replace(self, **changes)

    def as_dict(self) -> dict:
        return {"family": self.family, **asdict(self)}


# ---------------------------------------------------------------------------------------------
# Named configs
# ---------------------------------------------------------------------------------------------
_B = SmemConfig("baseline")
# Shipped: compiled in CI, exact on the H100 (see tests/gpu/test_hopper_gpu.py). The study's baseline (single and
# dual), the configs of the study's pitches that the round notebooks and nvfp4lib.study.claims measure (round 1: three
# stages; round 2: 64x64 tiles, the fastest tile of the chunked-decode sweep on every shape; round 3: the TMA-store
# epilogue, faster on every shape; round 4: producer/consumer), and what this kernel's `auto` ended with before the
# swap-AB kernel (rounds 1-4 combined: 64x128 tiles, 2 stages, batched decode, TMA epilogue, split-K where the tiles
# do not fill the GPU; the dual GEMM with producer/consumer).
SMEM_CONFIGS: dict[str, SmemConfig] = {c.name: c for c in (
    _B,
    _B.with_(name="baseline_dual", tile_n=64, dual=True),
    _B.with_(name="stages3", ab_stages=3),
    _B.with_(name="tile64x64", tile_m=64, tile_n=64),
    _B.with_(name="tma_epilogue", epilogue="tma"),
    _B.with_(name="producer_consumer", warp_spec="producer_consumer"),
    _B.with_(name="tile64x128_stages2_tma_batched_auto", tile_m=64, ab_stages=2, epilogue="tma", decode="batched",
             split_k=0),
    _B.with_(name="producer_consumer_dual_tma_batched_auto", warp_spec="producer_consumer", dual=True,
             epilogue="tma", decode="batched", split_k=0),
)}
# Candidates the study pitched that this kernel refuses (validate names the rule); notebooks 03 and 05 show why.
SWEEP_CONFIGS: dict[str, SmemConfig] = {c.name: c for c in (
    _B.with_(name="tile128x256_1wg", tile_n=256),
    _B.with_(name="tile128x128x512", tile_k=512),
    _B.with_(name="tile128x128x128", tile_k=128),
    _B.with_(name="pingpong", warp_spec="pingpong"),
    _B.with_(name="baseline_dual_128", dual=True),
)}


# ---------------------------------------------------------------------------------------------
# Validity and the storage plan (pure Python: asked before compiling)
# ---------------------------------------------------------------------------------------------
def math_warpgroups(cfg: SmemConfig) -> int:
    """Warpgroups that run wgmma: one per 64 rows for ``producer_consumer``, else one."""
    return cfg.tile_m // 64 if cfg.warp_spec == "producer_consumer" else 1


def threads_for(cfg: SmemConfig) -> int:
    """The wgmma warpgroups, and the producer warpgroup of ``producer_consumer``."""
    return 128 * (math_warpgroups(cfg) + (cfg.warp_spec == "producer_consumer"))


def launch_registers(cfg: SmemConfig) -> int:
    """Registers per thread at launch: 65536 / threads, rounded down to 8. ptxas compiles the whole kernel
    to this bound, whatever setmaxnreg does later."""
    return 65536 // threads_for(cfg) // 8 * 8


PRODUCER_REGS = 104  # setmaxnreg target of the producer warpgroup


def register_split(cfg: SmemConfig) -> tuple[int, int]:
    """setmaxnreg targets (producer, math) per thread for producer_consumer.

    The re-split must fit in the launch pool (e.g. 384 threads: 104 + 2*200 = 3*168), or setmaxnreg.inc
    waits forever."""
    nmath = math_warpgroups(cfg)
    pool = launch_registers(cfg) * (1 + nmath)
    return PRODUCER_REGS, min(240, (pool - PRODUCER_REGS) // nmath // 8 * 8)


def acc_registers(cfg: SmemConfig) -> int:
    """fp32 accumulator registers per math thread."""
    return (2 if cfg.dual else 1) * cfg.tile_m * cfg.tile_n // (128 * math_warpgroups(cfg))


def epilogue_tile(cfg: SmemConfig) -> tuple[int, int]:
    if math_warpgroups(cfg) > 1:
        return (min(128, cfg.tile_m), min(32, cfg.tile_n))
    return (min(64, cfg.tile_m), min(32, cfg.tile_n))


EPI_STAGES = 4


def smem_plan(cfg: SmemConfig) -> dict:
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


def validate(cfg: SmemConfig) -> SmemConfig:
    """Raise ValueError naming the rule a config breaks; return it unchanged if it can work."""
    if not isinstance(cfg, SmemConfig):
        raise TypeError(f"the smem-decode kernel takes an SmemConfig, not {type(cfg).__name__}")
    n = cfg.name
    if cfg.warp_spec == "pingpong":
        raise ValueError(f"{n}: warp_spec='pingpong' is not implemented in this kernel (implemented: 'none', "
                         "'producer_consumer'); the swap-AB kernel had it until commit f7c5079 (config "
                         "'rs_m128_t128_k128_s4_pp', slower than 'none' on every shape)")
    if cfg.warp_spec not in ("none", "producer_consumer"):
        raise ValueError(f"{n}: warp_spec={cfg.warp_spec!r}: must be 'none' or 'producer_consumer'")
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
    if cfg.tile_n % DECODE_ROWS:
        raise ValueError(f"{n}: tile_n={cfg.tile_n}: the decode maps {DECODE_ROWS} rows per warpgroup pass, so "
                         f"tile_n must be a multiple of {DECODE_ROWS}")
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
                         "the whole kernel to the launch bound, whatever setmaxnreg does later): use a smaller tile")
    plan = smem_plan(cfg)
    if plan["total"] > SMEM_LIMIT:
        raise ValueError(f"{n}: needs {plan['total']} bytes of shared memory > the sm_90 limit {SMEM_LIMIT} "
                         f"(tile {cfg.tile_m}x{cfg.tile_n}x{cfg.tile_k}, {cfg.ab_stages} stages of "
                         f"{plan['per_stage']} bytes, fp16 ring {plan['fp16_a'] + plan['fp16_b']} bytes)")
    if plan["epilogue_staging"] > plan["fp16_a"]:
        raise ValueError(f"{n}: the TMA epilogue stages {plan['epilogue_staging']} bytes in the fp16 A ring "
                         f"({plan['fp16_a']} bytes)")
    return cfg
