"""The register-decode (swap-AB) kernel's knobs as rules: what each config needs (accumulators, shared memory,
threads) and :func:`validate`, which refuses what cannot work before compiling. No GPU, no cutlass."""
from __future__ import annotations

from .config import KernelConfig
from .hopper_configs import SMEM_LIMIT
from .rs_layout import UNIT_BYTES, UNIT_K, UNIT_ROWS

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
