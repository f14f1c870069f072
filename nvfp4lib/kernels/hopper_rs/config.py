"""The register-decode (swap-AB) kernel's knobs as rules: :class:`RSConfig`, what each config needs (accumulators,
shared memory, threads), :func:`validate`, which refuses what cannot work before compiling, and the named configs
it ships (the study's ``auto`` candidates, :data:`nvfp4lib.bench.backends.AUTO_CANDIDATES`, and round 4's structure
on this kernel).
No GPU, no cutlass.

Variants that lost left the package; their rows stay in ``data/bench.jsonl`` and their code in git at commit f7c5079
(``git show f7c5079:nvfp4lib/kernels/hopper_rs.py``): the decode warpgroup (``act_decode="warpgroup"``, configs
``*_dw``), the inline activation decode (``act_decode="inline"``, ``*_e_i``), ping-pong (``warp_spec="pingpong"``,
``*_pp``), the ablations (``no_dequant``, ``no_mma``, ``no_x``, ``no_store``, ``no_xload``) and the per-CTA
``timeline``, and the tilings no shape chose.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import ClassVar, Literal

from ..common.sm90 import SMEM_LIMIT
from .layout import UNIT_BYTES, UNIT_K, UNIT_ROWS
from .ops import ACT_SMEM, PARAM_GROUPS

NWG = 2  # warpgroups per CTA, each one 64-row wgmma
THREADS = 128 * NWG
MAX_ACC_REGS = 128
MAX_VARIANTS = 8  # wgmma N widths compiled into one kernel (code size and compile time grow with each)
ROW_BYTES = 128  # the prepacked weights are moved as rows of 128 bytes (18 per unit)
STAGE_PAD = 8  # elements of padding per staged output row (16 bytes: rows start in different banks)


@dataclass(frozen=True)
class RSConfig:
    """The swap-AB kernel's knobs. The roles of the operands swap, so the tile is Cᵀ's: ``tile_m`` is **weight rows**
    (output columns) per CTA, wgmma's M (two warpgroups of one or two 64-row blocks: 128 or 256 rows of one matrix,
    or for the dual GEMM 64 or 128 rows of each of gate and up); ``tile_n`` is **tokens** per CTA, wgmma's N (the
    widest variant); ``token_step``: a tile of w tokens runs a wgmma N of w rounded up to it (one variant per
    multiple, 0: always ``tile_n``); ``tile_k`` K per pipeline stage (128 or 256); ``ab_stages`` its depth;
    ``epilogue``: per-element stores ("simt") or the tile through shared memory in 16-byte row chunks ("staged").

    Host-side knobs of a call: ``cta_overhead_tokens``, a CTA's fixed cost (weight decode, pipeline fill) in tokens
    of MMA, which the token-tile planner weighs against narrower tiles (H100, S4 with 64- vs 128-token tiles);
    the activation prologue's ``prologue_smem``, dynamic shared memory it asks for and does not use, so that its SMs
    already run with the GEMM's carveout and GEMM CTAs start beside it (H100 round 29: S4 17.06 vs 17.31 us with 0);
    ``param_groups``: up to this many groups the prologue takes their addresses as kernel parameters instead of
    loading a row table."""

    family: ClassVar[str] = "hopper_rs"
    swap_ab: ClassVar[bool] = True
    name: str
    tile_m: int = 128
    tile_n: int = 128
    tile_k: int = 128
    ab_stages: int = 4
    token_step: int = 0
    epilogue: Literal["simt", "staged"] = "simt"
    dual: bool = False
    cta_overhead_tokens: int = 20
    prologue_smem: int = ACT_SMEM
    param_groups: int = PARAM_GROUPS

    def with_(self, **changes) -> "RSConfig":
        return replace(self, **changes)

    def as_dict(self) -> dict:
        return {"family": self.family, **asdict(self)}


# ---------------------------------------------------------------------------------------------
# Named configs: rs_m{weight rows per CTA}_t{tokens per CTA}_k{K per stage}_s{stages}[_v{token step}][_e], a dual
# config covering half the rows of each matrix; _v: one wgmma N per multiple of the step; _e: epilogue="staged".
# ---------------------------------------------------------------------------------------------
def _rs(tile_m: int, tile_n: int, ab_stages: int, token_step: int = 0, dual: bool = False,
        staged: bool = False) -> RSConfig:
    name = (f"rs_{'dual_' if dual else ''}m{tile_m}_t{tile_n}_k128_s{ab_stages}"
            f"{f'_v{token_step}' if token_step else ''}{'_e' if staged else ''}")
    return RSConfig(name, tile_m=tile_m, tile_n=tile_n, ab_stages=ab_stages, token_step=token_step, dual=dual,
                    epilogue="staged" if staged else "simt")


# ``auto``'s candidates (no single tiling won every shape on the H100, run of 2026-11-23 at 84fac66; three stages of
# 128-token tiles start sooner on one-wave shapes, S4 17.8 vs 18.1 us at 3cb93ac), and round 4's "none" structure on
# this kernel (rs_m128_t128_k128_s4: two warpgroups decode and run the same K tile; faster than the decode-warpgroup
# producer/consumer and ping-pong forms on every shape, notebook 05).
RS_CONFIGS: dict[str, RSConfig] = {c.name: c for c in (
    _rs(128, 96, 3, staged=True), _rs(128, 128, 3, staged=True), _rs(128, 128, 4, staged=True),
    _rs(128, 128, 5, staged=True), _rs(128, 64, 4, staged=True), _rs(128, 256, 3, token_step=32, staged=True),
    _rs(64, 96, 3, dual=True, staged=True), _rs(128, 128, 3, dual=True), _rs(128, 128, 4, dual=True, staged=True),
    _rs(128, 128, 4, dual=True), _rs(64, 256, 3, token_step=32, dual=True, staged=True),
    _rs(128, 128, 4),
)}


# ---------------------------------------------------------------------------------------------
# Rules
# ---------------------------------------------------------------------------------------------
def blocks_per_warpgroup(cfg) -> int:
    """64-row weight units per warpgroup: ``tile_m`` is 128·blocks weight rows (64·blocks for the dual GEMM,
    whose two warpgroups cover the same rows of gate and up)."""
    return cfg.tile_m * (2 if cfg.dual else 1) // (UNIT_ROWS * NWG)


def token_step(cfg) -> int:
    """Tokens per wgmma N variant: tiles run with N = their tokens rounded up to this."""
    return cfg.token_step or cfg.tile_n


def acc_registers(cfg) -> int:
    return blocks_per_warpgroup(cfg) * cfg.tile_n // 2


def xfer_bytes(cfg) -> int:
    """Dual: the accumulators handed between the warpgroups (fp32, one per thread and element); 0 otherwise."""
    return acc_registers(cfg) * 4 * 128 if cfg.dual else 0


def stage_bytes(cfg) -> int:
    """epilogue="staged": the output tile as C rows (tile_n tokens × the tile's columns + pad, 2 bytes each)."""
    return cfg.tile_n * (cfg.tile_m + STAGE_PAD) * 2 if cfg.epilogue == "staged" else 0


def stage_units(cfg: RSConfig) -> int:
    """64x64 weight units per pipeline stage: both warpgroups run the same K tile."""
    return cfg.tile_k // UNIT_K * NWG * blocks_per_warpgroup(cfg)


def smem_plan(cfg: RSConfig) -> dict:
    plan = {
        "barriers": cfg.ab_stages * 16,
        "weights": cfg.ab_stages * stage_units(cfg) * UNIT_BYTES,
        "activations": cfg.ab_stages * (cfg.tile_k // UNIT_K) * cfg.tile_n * UNIT_K * 2,
    }
    plan["total"] = 1024 + 1024 + plan["weights"] + 1024 + plan["activations"]
    plan["per_stage"] = (plan["weights"] + plan["activations"]) // cfg.ab_stages
    return plan


def validate(cfg: RSConfig) -> RSConfig:
    """Raise ValueError naming the rule a swap-AB config breaks; return it unchanged if it can work."""
    if not isinstance(cfg, RSConfig):
        raise TypeError(f"the register-decode kernel takes an RSConfig, not {type(cfg).__name__}")
    n = cfg.name
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
    if cfg.epilogue not in ("simt", "staged"):
        raise ValueError(f"{n}: epilogue={cfg.epilogue!r}: the swap_ab kernel stores per element ('simt') or "
                         "through a shared-memory tile ('staged')")
    if cfg.cta_overhead_tokens < 0 or cfg.prologue_smem < 0 or cfg.param_groups < 0:
        raise ValueError(f"{n}: cta_overhead_tokens={cfg.cta_overhead_tokens}, prologue_smem={cfg.prologue_smem} "
                         f"and param_groups={cfg.param_groups} must be >= 0")
    if cfg.prologue_smem > SMEM_LIMIT:
        raise ValueError(f"{n}: prologue_smem={cfg.prologue_smem} bytes > the sm_90 limit {SMEM_LIMIT}")
    x_bytes = smem_plan(cfg)["activations"]
    if xfer_bytes(cfg) + stage_bytes(cfg) > x_bytes:
        raise ValueError(f"{n}: the epilogue reuses the activation buffers ({x_bytes} bytes) for the dual hand-over "
                         f"({xfer_bytes(cfg)}) and the staged output tile ({stage_bytes(cfg)}): too small")
    plan = smem_plan(cfg)
    if plan["total"] > SMEM_LIMIT:
        raise ValueError(f"{n}: needs {plan['total']} bytes of shared memory > the sm_90 limit {SMEM_LIMIT} "
                         f"({cfg.ab_stages} stages of {plan['per_stage']} bytes: tile_n={cfg.tile_n} tokens × "
                         f"tile_k={cfg.tile_k} fp16 activations + packed weights)")
    return cfg
