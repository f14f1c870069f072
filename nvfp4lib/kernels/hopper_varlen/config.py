"""Knobs of the device-scheduled swap-AB kernel, and the rules a config must keep (no GPU, no cutlass).

The kernel is the register-decode design of :mod:`nvfp4lib.kernels.hopper_rs.kernel` (weights decoded per thread into
wgmma's register A operand, tokens on wgmma's N), with the activation prologue and the staged epilogue of its
default configs, and one difference that serving needs: every CTA finds its tile from the group offsets in device
memory, so one compiled launch serves any split of the rows. Only this family's fields live here.

``act`` picks what the activations are: "nvfp4" (W4A4: a prologue decodes them to fp16, weights decoded to fp16) or
"bf16" (W4A16: the caller's bf16 rows are wgmma's B operand as they are, weights decoded to bf16; no prologue). The
same kernel, weight layout and scheduling serve both.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace

from ..common.sm90 import SMEM_LIMIT
from ..hopper_rs.config import (  # noqa: F401  (the same kernel's rules: one definition)
    MAX_ACC_REGS,
    MAX_VARIANTS,
    NWG,
    ROW_BYTES,
    STAGE_PAD,
    blocks_per_warpgroup,
    stage_bytes,
    xfer_bytes,
)
from ..hopper_rs.layout import UNIT_BYTES, UNIT_K

EPILOGUES = ("simt", "staged")
ACTS = ("nvfp4", "bf16")
WAITS = ("suspend", "spin", "once")


@dataclass(frozen=True)
class VarlenConfig:
    """``tile_m`` weight rows per CTA (a dual CTA covers the same ``tile_m`` rows of gate and up), ``tile_n`` tokens
    per CTA (the widest wgmma N), ``token_step`` (a tile of w tokens runs a wgmma N of w rounded up to it; 0: always
    ``tile_n``), ``tile_k`` K per pipeline stage, ``ab_stages`` pipeline depth, ``epilogue``: per-element stores
    ("simt") or a shared-memory tile copied out in 16-byte row chunks ("staged"), ``act`` the activations' type
    (:data:`ACTS`: NVFP4 through the fp16 prologue, or bf16 straight into wgmma), ``split_k``: a call may split every
    tile's K over several CTAs (how many is the call's, :func:`choose_splits`; the tile's last CTA to finish adds the
    others' fp32 partial sums, in split order, and runs the epilogue), ``boxes``: 1, or 2 where the CTA covers two
    tiles of the packed weights' layout (``packed_m`` = ``tile_m`` / 2 rows each, its stage two TMA boxes): two
    64-row wgmma blocks per warpgroup on weights packed for one (names ending _b2)."""

    name: str
    tile_m: int = 128
    tile_n: int = 128
    token_step: int = 0
    tile_k: int = 128
    ab_stages: int = 3
    epilogue: str = "staged"
    dual: bool = False
    act: str = "nvfp4"
    wait: str = "suspend"
    split_k: bool = False
    boxes: int = 1

    def with_(self, **changes) -> "VarlenConfig":
        return replace(self, **changes)

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def step(self) -> int:
        return self.token_step or self.tile_n

    @property
    def packed_m(self) -> int:
        """tile_m of the packed weights this config reads (:func:`~.runner.layout_of`)."""
        return self.tile_m // self.boxes

    @property
    def blocks(self) -> int:
        """64-row weight units per warpgroup."""
        return blocks_per_warpgroup(self)

    @property
    def acc_registers(self) -> int:
        return self.blocks * self.tile_n // 2

    @property
    def stage_units(self) -> int:
        return self.tile_k // UNIT_K * NWG * self.blocks

    def smem_bytes(self) -> int:
        weights = self.ab_stages * self.stage_units * UNIT_BYTES
        acts = self.ab_stages * self.tile_k * self.tile_n * 2
        return 3 * 1024 + weights + acts


def validate(cfg: VarlenConfig) -> VarlenConfig:
    """Raise ValueError naming the rule ``cfg`` breaks; return it unchanged if it can work."""
    n = cfg.name
    allowed = (64, 128) if cfg.dual else (128, 256)
    if cfg.tile_m not in allowed:
        raise ValueError(f"{n}: tile_m={cfg.tile_m}: a CTA covers {' or '.join(map(str, allowed))} weight rows "
                         f"(two warpgroups of one or two 64-row wgmma blocks{', gate and up' if cfg.dual else ''})")
    if cfg.tile_n % 8 or not 8 <= cfg.tile_n <= 256:
        raise ValueError(f"{n}: tile_n={cfg.tile_n} tokens: wgmma's N must be a multiple of 8 in [8, 256]")
    if cfg.step % 8 or cfg.tile_n % cfg.step or cfg.tile_n // cfg.step > MAX_VARIANTS:
        raise ValueError(f"{n}: token_step={cfg.token_step}: must be a multiple of 8 dividing tile_n={cfg.tile_n} "
                         f"into at most {MAX_VARIANTS} wgmma N variants")
    if cfg.acc_registers > MAX_ACC_REGS:
        raise ValueError(f"{n}: tile_n={cfg.tile_n} tokens × {cfg.blocks} block(s) per warpgroup need "
                         f"{cfg.acc_registers} fp32 accumulator registers per thread (at most {MAX_ACC_REGS})")
    if cfg.tile_k not in (128, 256):
        raise ValueError(f"{n}: tile_k={cfg.tile_k}: must be 128 or 256 (an even number of 64-K sub-blocks, and a "
                         "stage's weights are one TMA box of at most 256 rows of 128 bytes)")
    if cfg.stage_units * UNIT_BYTES // ROW_BYTES > 256:
        raise ValueError(f"{n}: a stage's weights are {cfg.stage_units * UNIT_BYTES // ROW_BYTES} rows of 128 bytes, "
                         "over the TMA box limit of 256")
    if cfg.boxes not in (1, 2) or (cfg.boxes == 2 and cfg.blocks != 2):
        raise ValueError(f"{n}: boxes={cfg.boxes}: 1, or 2 where each warpgroup holds two 64-row blocks (tile_m "
                         f"{256 if not cfg.dual else 128}{', dual' if cfg.dual else ''})")
    if cfg.ab_stages < 2:
        raise ValueError(f"{n}: ab_stages={cfg.ab_stages}: the loads of one stage overlap the MMA of another (>= 2)")
    if cfg.act not in ACTS:
        raise ValueError(f"{n}: act={cfg.act!r}: must be one of {ACTS}")
    if cfg.wait not in WAITS:
        raise ValueError(f"{n}: wait={cfg.wait!r}: must be one of {WAITS}")
    if cfg.epilogue not in EPILOGUES:
        raise ValueError(f"{n}: epilogue={cfg.epilogue!r}: must be one of {EPILOGUES}")
    acts = cfg.ab_stages * cfg.tile_k * cfg.tile_n * 2
    if xfer_bytes(cfg) + stage_bytes(cfg) > acts:
        raise ValueError(f"{n}: the epilogue reuses the activation ring ({acts} bytes) for the dual hand-over "
                         f"({xfer_bytes(cfg)}) and the staged output tile ({stage_bytes(cfg)}): too small")
    if cfg.smem_bytes() > SMEM_LIMIT:
        raise ValueError(f"{n}: needs {cfg.smem_bytes()} bytes of shared memory > the sm_90 limit {SMEM_LIMIT}")
    return cfg


def _name(dual: bool, tm: int, tn: int, tk: int, st: int, ts: int, epi: str, act: str = "nvfp4",
          wait: str = "suspend", split_k: bool = False, boxes: int = 1) -> str:
    return (f"vl_{'a16_' if act == 'bf16' else ''}{'dual_' if dual else ''}m{tm}_t{tn}_k{tk}_s{st}"
            + (f"_v{ts}" if ts else "") + ("_e" if epi == "staged" else "") + {"spin": "_w", "once": "_o"}.get(wait, "")
            + ("_x" if split_k else "") + (f"_b{boxes}" if boxes > 1 else ""))


def make(dual: bool, tile_m: int, tile_n: int, ab_stages: int, token_step: int = 0, tile_k: int = 128,
         epilogue: str = "staged", act: str = "nvfp4", wait: str = "suspend", split_k: bool = False,
         boxes: int = 1) -> VarlenConfig:
    return validate(VarlenConfig(_name(dual, tile_m, tile_n, tile_k, ab_stages, token_step, epilogue, act, wait,
                                       split_k, boxes),
                                 tile_m=tile_m, tile_n=tile_n, token_step=token_step, tile_k=tile_k,
                                 ab_stages=ab_stages, epilogue=epilogue, dual=dual, act=act, wait=wait,
                                 split_k=split_k, boxes=boxes))


def _wait_arms(wait: str, single, dual) -> tuple[VarlenConfig, ...]:
    """The study shapes' tilings with another stage wait (A/B arms): single GEMMs (tile_n, stages, token_step) and dual
    ones (tile_m, tile_n, stages, token_step, epilogue)."""
    return (*(make(False, 128, tn, st, token_step=ts, wait=wait) for tn, st, ts in single),
            *(make(True, tm, tn, st, token_step=ts, epilogue=e, wait=wait) for tm, tn, st, ts, e in dual))


# The tilings `auto` chooses among: those of the host-scheduled kernel's AUTO_CANDIDATES (each ran exact on the H100
# there), under this family's names.
CONFIGS: dict[str, VarlenConfig] = {c.name: c for c in (
    make(False, 128, 96, 3), make(False, 128, 128, 3), make(False, 128, 128, 4), make(False, 128, 128, 5),
    make(False, 128, 64, 4), make(False, 128, 256, 3, token_step=32),
    make(True, 64, 96, 3), make(True, 128, 128, 3, epilogue="simt"), make(True, 128, 128, 4),
    make(True, 128, 128, 4, epilogue="simt"), make(True, 64, 256, 3, token_step=32),
    # W4A16 (bf16 activations): the tilings tuning.PREFERENCE ranks first for the NVFP4 kernel, under vl_a16_ names
    make(False, 128, 256, 3, token_step=32, act="bf16"), make(False, 128, 128, 4, act="bf16"),
    make(False, 128, 128, 3, act="bf16"), make(True, 64, 256, 3, token_step=32, act="bf16"),
    make(True, 128, 128, 3, epilogue="simt", act="bf16"), make(True, 64, 96, 3, act="bf16"),
    # Decode (a few rows per expert, MoE layers): the GEMM streams weights. Narrow token tiles (16, 32) free the
    # activation ring for deeper weight pipelines (6-8 stages of 9 KB) at ~110 KB of shared memory: two CTAs per SM.
    # Predicted (2026-11-26): from ~1 TB/s with the 3-stage t256 tiles to 2 TB/s or more. Measured on the H100 the
    # same day: 1.3-1.6x faster on the MoE layers' GEMMs (tuning.PREFERENCE), short of 2x. The 32-token tiles with 8
    # stages (142 KB, one CTA per SM) were 1.26-1.4x slower than with 6: two CTAs per SM beat a deeper pipeline
    *(make(dual, 64 if dual else 128, tn, st, act=act) for act in ACTS for dual in (False, True)
      for tn, st in ((16, 8), (32, 6))),
    # Split-K at decode (split_k, names ending _x): the 16-token decode tilings, whose calls may split each tile's K
    # over several CTAs when the tiles alone leave SMs idle (choose_splits). Why: a Qwen3-like layer at T=1 runs its
    # gate/up GEMM as 96 CTAs and its down GEMM as 128 on 132 SMs, each streaming ~12 GB/s (H200 profile,
    # 2026-11-27: 15.0 and 8.2 us, ~0.8 TB/s); a Mixtral-like down GEMM at T=1 fills 64 SMs. Prediction (2026-11-27,
    # before any run, for a rule filling two CTAs per SM): Qwen3-like T=1 gate/up 15 -> 8-10 us and down 8 -> 5-6 us
    # (twice the CTAs at about the same rate each), the layer 32.5 -> ~25 us (W4A16) and 43 -> ~35 us (W4A4);
    # Mixtral-like T=1's down GEMM (4 splits) about 2x faster. Outcome (H100 A/B, moe-bench --split-k off on): Qwen3
    # 7-10 us slower, Mixtral 19-27 us faster, the rest unsplit and unchanged (choose_splits' doc); the rule now fills
    # one CTA per SM. Prediction for it: Qwen3-like T=1 unsplit (as with split-K off), Mixtral-like T=1 down in 2
    # slices about as fast as in 4.
    *(make(dual, 64 if dual else 128, 16, 8, act=act, split_k=True) for act in ACTS for dual in (False, True)),
    # The same with 5 stages (70 KB: three CTAs per SM), taken at decode with tuning.DECODE_S5 (its note: why, and the
    # prediction); and the 32-token tiles with 4 stages (73 KB, three CTAs per SM), with tuning.DECODE_T32_S4
    *(make(dual, 64 if dual else 128, 16, 5, act=act, split_k=True) for act in ACTS for dual in (False, True)),
    *(make(dual, 64 if dual else 128, 32, 4, act=act) for act in ACTS for dual in (False, True)),
    # Two tiles of the packed layout per CTA (boxes=2, names ending _b2): the 16- and 32-token decode tiles with each
    # warpgroup decoding two 64-row blocks, 4 stages (two CTAs per SM), taken with tuning.DECODE_PAIR (its note)
    *(make(dual, 128 if dual else 256, tn, 4, act=act, boxes=2) for act in ACTS for dual in (False, True)
      for tn in (16, 32)),
    # and the 16-token two-block tiles in split-K form (names ending _x_b2), taken at narrow decode calls with
    # tuning.NARROW_PAIR (its note: why, and the prediction)
    *(make(dual, 128 if dual else 256, 16, 4, act=act, split_k=True, boxes=2) for act in ACTS
      for dual in (False, True)),
    # The consumer's wait without the suspend-time hint (wait="spin", names ending _w), an A/B of the study shapes'
    # tilings. Why (H100 ncu source counters, S4, 2026-11-27): this kernel's GEMM ran 7% (S4) to 11% (S3) more cycles
    # than the host-scheduled kernel's with the same tiling, same PTX loop; in its SASS the stage wait is an inline
    # TRYWAIT + NANOSLEEP.SYNCS loop (20,525 tries for 12,288 waits, the top stall: 233 of 1,384 samples) where the
    # host-scheduled kernel's tries once inline and retries out of line (2,476 retries, no samples).
    *_wait_arms("spin", ((128, 3, 0), (128, 4, 0), (96, 3, 0), (256, 3, 32)),
                ((128, 128, 3, 0, "simt"), (64, 96, 3, 0, "staged"), (64, 256, 3, 32, "staged"))),
    # The stage wait tried once without a hint, then the hinted wait (wait="once", names ending _o): the
    # host-scheduled kernel's SASS shape (one inline try, the retries out of line). Why: the spin wait (_w) ran S3
    # 33.2 -> 31.9 us on the H200 but S1 122.9 -> 167.2 in graph replay, on two GPUs (tuning.py's note), a failure
    # not understood; a stage that has landed costs one try either way, and a stage that has not waits with the
    # hint, as the shipped wait does, instead of spinning. Prediction (2026-11-28, before any run): S3 and S2 take
    # most of the spin wait's gain (S3 ~32 us, S2 ~67) and S1 stays at the hinted wait's ~123 us; S4 and the duals
    # within 1%. If S1 also regresses, the slowdown is in the unhinted try itself, not in sustained spinning.
    # Outcome (H200, one process per shape, graph replay, notebook 10's rounds): S3 33.8 -> 32.2 us, S2 68.9 -> 67.1,
    # S1 124.2 -> 122.4 (held: no regression, so S1's was the sustained spinning), S4 18.0 -> 17.6; the duals within
    # 0.6 us, S4-dual 26.3 -> 27.0 the only one slower. A second run with the single GEMM's tiers taking them
    # (tuning.ONCE_WAIT): S1-S4 0.9-2.7 us faster in graph replay and 0.5-3.3 us in eager calls. Exact (the serving GPU
    # tests), memcheck clean on S4 (H200, 2026-11-28). Shipped for the single GEMM; the dual configs stay A/B arms.
    # The 96-token tilings with the once-wait (vl_m128_t96_k128_s3_e_o, vl_dual_m64_t96_k128_s3_e_o), named A/B arms,
    # not tuning candidates until run (serving.auto_layout takes the _o configs a tier ships). Why: with the once-wait
    # S2 and S2-dual are still 1.4 and 9.6 us behind the host-scheduled kernel, which runs them with 96-token tiles;
    # the 96-token spin-wait forms ran them in 65.7 and 127.7 us (H200, 2026-11-28), and the once-wait kept the spin
    # wait's gain on S2 without its S1 regression. Prediction (2026-11-28, before any run): S2 ~65 us and S2-dual
    # ~127 in graph replay, level with the host-scheduled kernel (64.9, 125.7); S1 and S1-dual, which share their tier,
    # slower with 96-token tiles (S1 141.0 us on the H100 with the hinted wait), so a tier cannot take them: a tuned
    # choice per shape (nvfp4lib tune) could.
    *_wait_arms("once", ((128, 3, 0), (256, 3, 32), (96, 3, 0)),
                ((128, 128, 3, 0, "simt"), (64, 256, 3, 32, "staged"), (64, 96, 3, 0, "staged"))),
    # The 96-token tilings in 32-token steps (vl_m128_t96_k128_s3_v32_e_o, vl_dual_m64_t96_k128_s3_v32_e_o), A/B arms.
    # Why: the rule by K (tuning.SHORT_K) lost on uniform routing, read as 128-row groups padded to two 96-token
    # tiles (192 columns of MMA) and their weights decoded twice; 32-token steps split 128 rows into two tiles of 64
    # (128 columns), so the A/B separates the padding from the second decode. Prediction (2026-11-29, before any run;
    # tile arithmetic: the steps cut the MMA columns by 12% on S2 and 13% on S1, by a third at 128 rows per group):
    # graph replay S2 65.7 -> ~65 us, S2-dual 128.4 -> ~126.5, S1 131.7 -> ~128 (still behind the shipped 120.7);
    # with the rule on these tiles, W4A4 Mixtral-like T = 512 uniform ~735 us (698 off, 800 with the 96-token tiles)
    # and DeepSeek-like T = 4096 uniform ~7000 (6790, 7276): the padding about two thirds of the loss, the second
    # decode the rest, so the rule stays off.
    *_wait_arms("once", ((96, 3, 32),), ((64, 96, 3, 32, "staged"),)),
)}


def get_config(name, dual: bool, act: str | None = None) -> VarlenConfig:
    if isinstance(name, VarlenConfig):
        cfg = name
    elif name not in CONFIGS:
        raise ValueError(f"unknown cute-hopper serving config {name!r}; known: {', '.join(CONFIGS)}")
    else:
        cfg = CONFIGS[name]
    if cfg.dual != dual:
        raise ValueError(f"config {cfg.name} is for the {'dual' if cfg.dual else 'single'} GEMM; these weights are "
                         f"{'dual (b2 given)' if dual else 'single'}")
    if act is not None and cfg.act != act:
        raise ValueError(f"config {cfg.name} takes {cfg.act} activations; these weights were prepared for {act} "
                         f"activations (the {act} configs: "
                         f"{', '.join(c for c, v in CONFIGS.items() if v.act == act and v.dual == dual)})")
    return validate(cfg)


def max_token_tiles(rows: int, groups: int, tile_n: int) -> int:
    """The most token tiles any split of ``rows`` rows over ``groups`` groups can need (each non-empty group of m
    rows needs ceil(m / tile_n)): the grid is sized for it, CTAs past the split's tiles exit at once."""
    return min(rows, (rows + groups * (tile_n - 1)) // tile_n)


def grid_ctas(cfg: VarlenConfig, rows: int, groups: int, n: int) -> int:
    """CTAs of a call of ``cfg`` for ``rows`` rows over ``groups`` groups of N = ``n`` before any K split: the most
    token tiles the rows can need (:func:`max_token_tiles`) times the weight blocks."""
    return max_token_tiles(rows, groups, cfg.tile_n) * -(-n // cfg.tile_m)


SPLIT_K = True  # the knob: off, split_k configs run one CTA per tile (moe-bench --split-k off: the A/B)
MAX_SPLITS = 8  # K slices of one tile at most (choose_splits)
MIN_SPLIT_K_TILES = 4  # K tiles per slice at least (a guess between the A/B's 3-8, slower, and 28, faster)
SPLIT_TILES = 1024  # tiles a split call counts at most: the per-stream counters (runner.SplitScratch)
# How choose_splits counts slices: "idle" (shipped, measured) fills the idle SMs, one CTA each; "balance" takes the
# fewest slices that minimise the busiest SM's K tiles, ceil(CTAs·S / SMs) · ceil(K tiles / S), two co-resident CTAs
# sharing an SM's decode throughput (the model the first A/B suggested). They differ where a grid nearly fills the
# SMs: the Qwen3-like gate/up GEMM at T=1 (96 CTAs, 16 K tiles) stays whole with "idle" (16 K tiles on the busiest SM)
# and takes 4 slices with "balance" (3 CTAs of 4 K tiles on the busiest SM). Predicted (2026-11-27): that GEMM ~25%
# faster (W4A4 12.1 -> ~9-10 us). Measured (the A/B at d8f8ad5, H100, notebook 11): it got slower, 12.2 -> 18.3 us
# (W4A4) and 13.8 -> 19.1 (W4A16), every other case within 5%. The model is wrong: a CTA costs more than its K
# tiles. Fitting f + 16·t = 12.2 and 3·(f + 4·t) = 18.3 gives ~4 us per CTA (start, pipeline fill, partials, hand-over)
# and ~0.5 us per K tile: a slice pays off only where it lands on an idle SM, as "idle" does. "idle" stayed (until
# "pair", below, took a second CTA per SM for long slices only).
# What bounds a decode GEMM (issue 41; ncu of the CUDA 13 tools on the H100, unlocked clocks, one eager layer call per
# case, a development probe, not recorded in data/): the Qwen3-like layer at T = 1 runs its gate/up GEMM as 96 CTAs of
# 256 threads (one per SM, 36 SMs idle) and its down GEMM as 128; per scheduler 2 warps active and 0.3-0.6 eligible,
# issue slots 18-26% busy (IPC 0.9-1.8 of 4), DRAM 20-28% of peak; W4A16 4.8 (gate/up) and 5.5 (down) thread
# instructions per weight element (W4A4 4.0 and 4.8), of which the bf16 decode's PTX is 3.4 (27 per 8 elements, 8 of
# them the scale's conversion, which the 4 threads of a quad each repeat). The Mixtral-like layer at T = 1 (448 CTAs,
# 1.7 waves) reaches DRAM 53-68%. So at decode the kernel is issue-bound at low occupancy plus the ~4 us per CTA of the
# split-K fit above, not memory-bound. The levers, predicted, not built: more warps issuing decode per SM (a third and
# fourth consumer warpgroup, or half-height tiles at 2 CTAs per SM: 192 CTAs on 132 SMs), the scale converted once per
# quad or by the producer warp into shared memory (-25% of the decode's instructions), and one persistent launch for
# gate/up and down (the fixed cost per CTA paid once).
# The first lever, built and measured (issue 41, 2026-11-28, H200): a wide form of the decode tilings, four warpgroups
# per CTA with the second pair taking each stage's odd 64-K sub-block into its own accumulators (a hand-over through
# shared memory after the mainloop), taken where a call's grid fits one CTA per SM. Predicted: the Qwen3-like T = 1
# gate/up GEMM 12 -> ~8 us, down 8 -> ~6.5 us. Measured (moe-bench --wide-decode off idle all, one run, notebook 11's
# rounds): slower, gate/up 11.5 -> 12.0 and down 7.0 -> 7.7 us (W4A4), the layer 38.8 -> 45.1 us (W4A4) and 28.6 ->
# 32.0 (W4A16); every call wide went wrong in 5 of 18 cases, and a split dual GPU test of it did not finish (neither
# debugged). An ncu
# probe of both forms (development): the wide GEMMs had twice the active and eligible warps per scheduler (3.9-4.0 and
# 0.6-1.1 against 2.0 and 0.3-0.6), issue slots 28 -> 32% busy, 20% more instructions (the second pair's set-up and
# hand-over), DRAM still 14-20%, and took as long or longer (gate/up W4A16 14.1 -> 14.8 us). More warps do not shorten
# a decode CTA's time: what bounds it is not the number of warps issuing. The form left the package (git keeps it at
# the A/B's commit, notebook 11 names it); the other two levers stand.
# The ncu source counters of the same probe, at the SASS line (development): the top stall of the Qwen3-like gate/up
# GEMM is the consumers' wait for a stage's TMA data (22% of the samples, on the branch after the full barrier's
# TRYWAIT), then long scoreboard. The second lever tried on that reading (2026-11-28, H200): a deep form, the same
# tilings at 16 stages (216 KB, one CTA per SM) taken where a call's grid fits one CTA per SM, so a CTA requests twice
# the stages at once (all 16 K tiles of that GEMM). Predicted: that GEMM 11.5-13 -> ~7-8 us, the layer ~4-5 us faster.
# Measured (moe-bench --deep-decode off on, one run, notebook 11's rounds): slower, gate/up 11.5 -> 13.3 us (W4A4) and
# 13.2 -> 15.1 (W4A16), the layer 39.1 -> 46.1 and 28.8 -> 33.3 us; every other case within 3%. So the wait is not for
# want of stages in flight. In both lost A/Bs the layer lost more than its GEMMs' own time (W4A4: +7 us against +2): a
# GEMM CTA that needs more of the SM (216 KB, or 512 threads) seems to start later beside the kernel before it (the
# programmatic dependent launch overlap), a reading not yet measured. The deep form left the package too (git keeps it
# at its A/B's commit).
# Where a decode CTA's time goes (moe-bench --timeline, per-CTA stamps, one graph replay, H200, 2026-11-28; notebook
# 11's rounds). Qwen3-like T = 1 W4A4, median per CTA: gate/up (96 CTAs, 16 K tiles) tile search 0.9 us, wait for the
# kernel before 1.0, first stage landed 2.0 after that (3.0 after its weights were requested, before the wait), the
# other 15 K tiles 6.3, epilogue 0.5; down (128 CTAs, 6 K tiles) 0.9, 0.9, 2.2, 2.1, 0.5. So the ~4 us per CTA of the
# split-K fit is tile search + wait + first stage + epilogue (~4.4 us), and at T = 1 the down GEMM is two thirds
# fixed cost. The first stage lands ~3 us after the request because every CTA asks for its 8 stages at once (96 x 8
# x 9 KB, 7 MB: ~1.5-2 us at the copy rate, behind the latency), not for want of stages. The mainloop then takes
# ~0.39 us per K tile (W4A4) and ~0.48 (W4A16), the ratio of the decode's instructions per weight (4.0 and 4.8, the
# ncu probe above): once the stages are in, the decode's issue rate bounds it. The tile search and the wait overlap
# the kernel before (the GEMM starts early); the first stage and the mainloop do not. Levers this points at, not
# built: the weights' first stages requested before the kernel before ends (a GEMM launched earlier, or an L2
# prefetch of the experts' weights by the kernel before), fewer decode instructions per weight, one persistent
# launch for gate/up and down.
# The first of those levers, built and measured (issue 41, 2026-11-28, H200): the routing launch asked L2 for the
# packed weights of every expert the step touched (64 more programs of bulk L2 prefetches, where the experts' bytes
# fit half the L2: of the bench's cases only the Qwen3-like layer at T = 1, ~20 MB). Predicted: that layer 2-3.5 us
# faster in both modes (the down GEMM's first stage from L2, and part of the gate/up GEMM's). Measured (moe-bench
# --prefetch-l2 off on off on, one run, notebook 11's rounds): slower, W4A4 ~29.7 -> ~32.2 us, W4A16 ~27.9 -> ~30.3,
# in every pair. The profile says why: the routing launch ended 2.3-3 us later (its prefetching programs), and with
# their weights already in L2 neither GEMM got faster from its predecessor's end (gate/up 7.4 -> 8.7 us after the
# quantization, W4A16 11.0 -> 11.6 after the gather; down 7.6 -> 7.5). So a decode GEMM's first stage does not wait
# for DRAM: what it waits for after the kernel before has ended is still to be found (its activation loads, issued
# after the wait, are the candidate). The prefetch left the package (git keeps it at the A/B's commit).
# A third rule, "pair" (issue 41, 2026-11-29, H200): as "idle", but two CTAs per SM where every slice still has at least
# PAIR_MIN_K_TILES K tiles. Why: Nsight Compute (data/profiles.jsonl, notebook 11) has the Mixtral-like down GEMM at
# T = 1 (64 tiles of 112 K tiles, 2 slices by "idle": 128 CTAs) at 2 warps per scheduler, issue slots 43% busy, DRAM
# 45%: a second CTA per SM (107.5 KB of shared memory each: two fit) issues while the first waits. The Qwen3-like
# GEMMs at T = 1 (16 and 6 K tiles), where two CTAs per SM lost, keep their splits. Predicted: that down GEMM ~30 ->
# ~20-22 us in both modes, the layer W4A16 ~90 -> ~80-82 us, W4A4 ~106 -> ~96-98; Qwen3-like unchanged. Measured
# (moe-bench --split-k idle pair idle pair --profile, notebook 11's rounds): W4A4 106.2, 106.9 -> 93.0, 92.7 us (its
# down GEMM 42.6 -> 28.3 us in the profile), W4A16 89.6, 91.3 -> 87.2, 87.3 (down 30.6 -> 26.8: the prediction's
# half), Qwen3-like within its noise. Shipped. Of the bench's MoE cases it changes only the Mixtral-like down GEMM at
# T = 1 and 2; the study shapes' grids never leave SMs idle.
SPLIT_RULES = ("idle", "balance", "pair")
# An A/B of 8 (H200, moe-bench --pair-min-k-tiles 16 8 16 8 --profile; notebook 11's rounds): of the decode cases only
# the Qwen3-like T = 1 gate/up GEMM splits then (192 CTAs of 8 K tiles); predicted ~3 us faster, it was slower:
# W4A4 29.5 -> 33.2 us, that GEMM 11.7 -> 14.6 us in the profile. The second CTA on an SM and the slices' hand-over
# cost more than the latency they hide there. 16 stays.
PAIR_MIN_K_TILES = 16
SHIPPED_SPLIT_RULE = "pair"
SPLIT_RULE = SHIPPED_SPLIT_RULE


@contextmanager
def split_setting(split_k: bool | str | None):
    """:data:`SPLIT_K` and :data:`SPLIT_RULE` inside a ``with`` block, as they were after it: True, on with the
    shipped rule; False, off; a rule of :data:`SPLIT_RULES`, on with it; None, as they are."""
    global SPLIT_K, SPLIT_RULE
    if isinstance(split_k, str) and split_k not in SPLIT_RULES:
        raise ValueError(f"split_k {split_k!r}: True, False or one of {SPLIT_RULES}")
    old = SPLIT_K, SPLIT_RULE
    if split_k is not None:
        SPLIT_K = split_k is not False
        SPLIT_RULE = split_k if isinstance(split_k, str) else SHIPPED_SPLIT_RULE
    try:
        yield
    finally:
        SPLIT_K, SPLIT_RULE = old


def partials_width(cfg: VarlenConfig, n: int) -> int:
    """Columns of a split call's fp32 partial sums ``[S, R, W]``: N, or 2N for dual (gate, then up)."""
    return n * (2 if cfg.dual else 1)


def choose_splits(cfg: VarlenConfig, rows: int, groups: int, n: int, k_pad: int, sms: int,
                  rule: str | None = None) -> int:
    """K slices per tile for a call of ``rows`` rows (1 for a config without ``split_k``, or with :data:`SPLIT_K`
    off), only for grids (:func:`max_token_tiles` x the weight blocks) of at most ``sms`` CTAs, at most
    :data:`MAX_SPLITS`, each slice at least :data:`MIN_SPLIT_K_TILES` K tiles; ``rule`` (default
    :data:`SPLIT_RULE`): "idle", as many as fit the idle SMs, one CTA per SM (``sms // CTAs``); "balance", the fewest
    that minimise the busiest SM's K tiles (:data:`SPLIT_RULE`'s note); "pair", two CTAs per SM where each slice keeps
    :data:`PAIR_MIN_K_TILES` K tiles, else as "idle".

    One CTA per SM, not two: in the first A/B (H100, 2026-11-27; the rule then filled two CTAs per SM with slices of
    at least 2 K tiles) the Qwen3-like layer at T=1, whose GEMMs have 96 and 128 CTAs, split both into 2 slices (8
    and 3 K tiles) and got slower (W4A4 41.4 -> 51.8 us, W4A16 29.8 -> 37.3): a second CTA on an SM shares its
    decode throughput, so only the SMs left idle gain, and each tile pays the slices' hand-over. The Mixtral-like
    down GEMM at T=1 (64 CTAs, 4 slices of 28 K tiles) was faster (the layer 139.6 -> 120.9 us W4A4, 138.2 -> 111.2
    W4A16)."""
    if not (cfg.split_k and SPLIT_K):
        return 1
    ctas = grid_ctas(cfg, rows, groups, n)
    if ctas == 0 or ctas > sms or ctas > SPLIT_TILES:
        return 1
    rule = rule or SPLIT_RULE
    if rule not in SPLIT_RULES:
        raise ValueError(f"split rule {rule!r}: must be one of {SPLIT_RULES}")
    k_tiles = k_pad // cfg.tile_k
    most = max(1, min(MAX_SPLITS, k_tiles // MIN_SPLIT_K_TILES))
    if rule == "idle":
        slices = min(most, sms // ctas)
    elif rule == "pair":
        slices = max(min(most, sms // ctas), min(most, 2 * sms // ctas, k_tiles // PAIR_MIN_K_TILES))
    else:
        slices = min(range(1, most + 1), key=lambda s: (-(-ctas * s // sms) * -(-k_tiles // s), s))
    per = -(-k_tiles // slices)  # K tiles per slice, the last one's fewer: no slice left empty
    return -(-k_tiles // per)


MAX_FUSED_CTAS = (1 << 20) - 1  # CTAs of one call (the fused kernel's ticket field: kernel_fused)


def check_grid(cfg: VarlenConfig, rows: int, groups: int, n: int) -> None:
    """Raise ValueError where a call of ``rows`` rows would launch more CTAs than the fused call counts."""
    ctas = grid_ctas(cfg, rows, groups, n)  # (split calls have few: choose_splits)
    if ctas > MAX_FUSED_CTAS:
        raise ValueError(f"{rows} rows over {groups} groups need up to {ctas} CTAs of config {cfg.name}; one call "
                         f"launches at most {MAX_FUSED_CTAS}: split the rows over several calls")
