"""Which config a prepared grouped GEMM runs: chosen from a cache, never by timing inside a call.

``config="auto"`` resolves per call from the problem's key — (GPU name, backend, dual, out dtype, G, N, K, M bucket,
package version), the M bucket being the rows per group rounded up to a power of two (the call knows T from the
tensor's shape: no synchronisation). The cache lives in memory and in ``<cache dir>/tuning.json`` (the user cache
directory, ``NVFP4LIB_CACHE`` to override). A miss takes :func:`heuristic` at once; timing happens only where asked
(:func:`tune`, ``prepare_weights(..., tune=True)`` or ``python -m nvfp4lib tune``).
"""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from ._version import __version__

__all__ = ["cache_dir", "m_bucket", "problem_key", "lookup", "store", "heuristic", "rule_knobs", "shipped", "tune"]

_lock = threading.Lock()
_memory: dict[str, str] | None = None


def cache_dir() -> Path:
    env = os.environ.get("NVFP4LIB_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "nvfp4lib"


def _path() -> Path:
    return cache_dir() / "tuning.json"


def m_bucket(rows: int, groups: int) -> int:
    """Rows per group rounded up to a power of two (at least 1)."""
    per = max(1, -(-rows // max(1, groups)))
    return 1 << (per - 1).bit_length()


def problem_key(gpu: str, backend: str, dual: bool, out_dtype, groups: int, n: int, k: int, bucket: int,
                layout: str = "") -> str:
    return "|".join(map(str, (gpu, backend, "dual" if dual else "single", str(out_dtype).replace("torch.", ""),
                              groups, n, k, bucket, layout, __version__)))


def _load() -> dict[str, str]:
    global _memory
    if _memory is None:
        try:
            _memory = json.loads(_path().read_text())
            if not isinstance(_memory, dict):
                _memory = {}
        except (OSError, ValueError):
            _memory = {}
    return _memory


def lookup(key: str) -> str | None:
    with _lock:
        return _load().get(key)


def store(key: str, config: str) -> None:
    """Remember ``config`` for ``key`` in memory and on disk (written atomically; other keys kept)."""
    with _lock:
        table = _load()
        table[key] = config
        path = _path()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(table, indent=1, sort_keys=True))
            os.replace(tmp, path)
        except OSError as e:  # a read-only home still tunes, for this process
            import warnings

            warnings.warn(f"nvfp4lib: could not write the tuning cache {path}: {e}", stacklevel=2)


def forget_memory() -> None:
    """Drop the in-memory copy (the next lookup rereads the file)."""
    global _memory
    with _lock:
        _memory = None


# A miss's choice, from the H100 run of 2026-11-25 (device-scheduled kernel, S1-S4 and the dual forms, graph replay):
# up to 128 rows per group the 256-token tile with 32-token steps was fastest or within 2% (S1 129.5 vs 141.0 us for
# 96-token tiles, S2 70.4 vs 69.2, S1-dual 228.9 vs 242.4, S2-dual 138.1 vs 137.4); from 256 rows per group the
# 128-token tiles (S3 33.5 us, S4 18.6, S3-dual 50.7, S4-dual 26.9). At 256 rows per group, three stages: the
# prediction (0.3 us faster on one-wave shapes, as the host-scheduled kernel's were) against `nvfp4lib tune` on the
# H100 on 2026-11-27 (S4 17.7 us with 3 stages, 18.1 with 4, 18.4 with 5; S3 33.6, 33.8, 40.5); above 256 rows per
# group (several waves) four stages stay, as no run has compared them there.
# Decode (MoE layers, 1-16 rows per expert), from the H100 sweep of 2026-11-26 (every candidate of both GEMMs of the
# DeepSeek-, Qwen3- and Mixtral-like layers at T = 1, 8, 64, uniform routing, both activation types, each checked
# against an fp32 reference): up to 4 rows per group the 16-token tiles with 8 stages were fastest or within 3% in 28
# of 30 cases (1.3-1.6x faster than the 256-token tiles on DeepSeek, e.g. its T=8 down GEMM 355 vs 557 us); at 16 rows
# per group (Mixtral T=64) the 32-token tiles with 6 stages (1.13-1.3x). Both hold two CTAs per SM (~110 KB of shared
# memory, 72-82 registers); the same tiles with 8 stages and one CTA per SM were 1.26-1.4x slower.
# The stage wait without a suspend hint (the _w configs, VarlenConfig.wait): A/B on the H100 on 2026-11-27 (one run,
# graph replay, each tiling with and without): S3 33.9 -> 32.5 us, S2 71.3 -> 70.1, S2-dual 137.3 -> 136.4, S4 17.8 ->
# 17.8, S4-dual 26.5 -> 27.0. Adopted for the single GEMM from 128 rows per group, the next run found S1 (not in the
# A/B) at 170.6 us in graph replay against 129.6 (its eager call, the fused kernel with the same wait: 128.4), a
# failure not understood. Until it is, every tier keeps the hinted wait (the configs measured at cacb795 and before);
# the _w configs stay as named configs for the next A/B. Again on an H200 (2026-11-28, one process per shape, the
# shipped config first and last, the host-scheduled kernel between; notebook 10's rounds): S1 122.9 -> 167.2 us in
# graph replay with the spin wait (the regression is the spin wait's, on two GPUs), S3 33.2 -> 31.9, S2 68.1 -> 66.6,
# S4 17.7 -> 17.4, S2-dual 134.2 -> 133.2, S1-dual 217.6 -> 216.7, S3-dual and S4-dual within 0.4 us. The 96-token
# _w tiling ran S2 in 65.7 and S2-dual in 127.7 (host-scheduled: 65.0 and 125.1), but S1 shares S2's tier and ran
# 141.0 with 96-token tiles on the H100: a tier cannot hold both. The hinted wait stays; `nvfp4lib tune` picks per
# shape.
# Up to 4 rows per group, the 16-token tiles' split-K form (_x: a call splits K only where its tiles leave SMs idle,
# hopper_varlen.config.choose_splits; otherwise it runs as the plain tile). Prediction and outcome: beside the configs
# in hopper_varlen/config.py.
# The stage wait tried once without a hint, then the hinted wait (the _o configs, wait="once": the host-scheduled
# kernel's SASS shape; prediction beside them in hopper_varlen/config.py). A/B on an H200 (2026-11-28, one process per
# shape, the shipped config first and last, graph replay; notebook 10's rounds): S3 33.4, 34.1 -> 32.2 us, S2 68.7,
# 69.2 -> 67.1, S1 123.8, 124.7 -> 122.4 (no regression: the spin wait's was its sustained spinning), S4 17.5, 18.5 ->
# 17.6; the duals within 0.5 us except S4-dual 26.0, 26.7 -> 27.0. Taken for the single GEMM's two study tiers, where it
# ran as fast or faster on every shape (ONCE_WAIT); the dual GEMMs keep the hinted wait. Where the _o config is not a
# candidate (the bf16-activation configs have no _o form) the tier's next name is taken. ONCE_WAIT off: the tiers as
# before (moe-bench --once-wait off on, the A/B). The second run, with the tiers taking it (H200, 819396d, notebook
# 10's rounds): S1-S4 graph replay 0.9-2.7 us faster than the hinted config, eager calls 0.5-3.3 us; S1 ahead of the
# host-scheduled kernel, S2, S3 and S4 1.4, 0.9 and 0.3 us behind it (medians of the run's rows). MoE layers
# (moe-bench --once-wait off on, W4A4, Qwen3- and DeepSeek-like at T = 512 and 4096): within 1.2% either way, the
# run's noise (DeepSeek-like T = 512, 16 rows per expert, does not reach these tiers and moved 0.9%). Buckets of 17-64
# rows per expert, which tier 128 also holds, were not in either run.
# The 96-token tilings with the once-wait on the tier S1 and S2 share (A/B arms beside the configs). Prediction
# (2026-11-28, before the run) for the two shapes the arms' note does not give in numbers: S1 ~135 us (the H100's
# 96-token S1 was 9% slower than the 256-token tile) and S1-dual ~221 (the host-scheduled 96-token dual ran 223.0
# on the H200, the shipped 256-token dual 218.9). If S1-dual is within 1% and S2-dual ~8 us faster, the dual tier
# takes the 96-token tile; the single GEMM's cannot (S1). Outcome (H200, the run below): S1 131.7 us (held), S1-dual
# 226.8 (missed: 3.4% slower, not within 1%), so neither tier takes it; SHORT_K below tried a rule by K (off: its note).
ONCE_WAIT = True
PREFERENCE = (
    (4, ("vl_m128_t16_k128_s8_e_x", "vl_dual_m64_t16_k128_s8_e_x", "vl_m128_t16_k128_s8_e",
         "vl_dual_m64_t16_k128_s8_e")),
    (16, ("vl_m128_t32_k128_s6_e", "vl_dual_m64_t32_k128_s6_e")),
    (128, ("vl_m128_t256_k128_s3_v32_e_o", "vl_m128_t256_k128_s3_v32_e", "vl_dual_m64_t96_k128_s3_v32_e_o",
           "vl_dual_m64_t256_k128_s3_v32_e", "vl_dual_m128_t128_k128_s3")),
    (256, ("vl_m128_t128_k128_s3_e_o", "vl_m128_t128_k128_s3_e", "vl_m128_t128_k128_s4_e", "vl_dual_m128_t128_k128_s3",
           "vl_dual_m64_t96_k128_s3_e")),
    (1 << 30, ("vl_m128_t128_k128_s4_e", "vl_m128_t128_k128_s3_e", "vl_dual_m128_t128_k128_s3",
               "vl_dual_m64_t96_k128_s3_e")),
)


# Short K at 65-128 rows per group: the 96-token tiles (two CTAs per SM; the 256-token tile holds one). A/B on an
# H200 (2026-11-28, one process per shape, the shipped config first and last, graph replay; notebook 10's rounds):
# S2 (K = 2048) 66.3, 66.9 -> 65.7 us with vl_m128_t96_k128_s3_e_o, S2-dual 134.6, 135.3 -> 128.4 with
# vl_dual_m64_t96_k128_s3_e_o (the host-scheduled kernel, 96-token tiles: 64.9 and 125.4); S1 (K = 7168) 120.7, 122.0
# -> 131.7, S1-dual 219.4, 219.7 -> 226.8. A rule by K (SHORT_K: at most this K takes them) was read from that: a
# 256-token CTA runs alone on its SM, so its pipeline fill and epilogue are not hidden, a larger share over S2's 16 K
# steps than over S1's 56. Prediction for the MoE layers it reaches in the study's grid (written before their run):
# W4A4 Mixtral-like T = 512 (128 rows per expert; the gate/up GEMM, K = 4096) ~3% faster, DeepSeek-like T = 4096 (the
# down GEMM: S2's N and K over 256 experts) ~1% faster. Outcome (H200, moe-bench --short-k 0 4096, graph replay, one
# run): Mixtral-like uniform 698 -> 800 us, Zipf 766 -> 770; DeepSeek-like uniform 6790 -> 7276, Zipf 7504 -> 7724:
# slower everywhere, most with uniform routing. A reading of it: uniform routing gives every expert ~128 rows, which
# 96-token tiles pad to 192 (50% more MMA work, twice the tiles' weight decode) where the 32-token steps of the
# 256-token tile pad to 128; S2's groups (40-196 rows) padded 13.5% more. The call knows only the mean rows per group
# (no read-back), not how they spread, so no rule here can tell S2 from uniform routing: SHORT_K = 0, off. The two
# arms are tuning candidates (exact in the serving GPU tests, timed in these runs). With the rule on (aca63ef) the auto
# call ran S2 in 65.4, 66.4 us and S2-dual in 128.2, 129.6 (host-scheduled 65.2 and 125.1). `nvfp4lib tune` with it
# off (H200, data/tuned.jsonl): S2 kept the 256-token tile (eager 67.9 us against 68.3), S2-dual took the 96-token one
# (134.7 against 139.0), then ran 126.5, 128.2 in graph replay (host-scheduled 124.0).
# The tier the rule would take was then changed to the same tiles in 32-token steps (the next A/B, its prediction
# beside the configs in hopper_varlen/config.py); moe rows carry it as short_k_tier.
SHORT_K = 0
SHORT_K_TIER = (128, ("vl_m128_t96_k128_s3_v32_e_o", "vl_dual_m64_t96_k128_s3_v32_e_o"))
# The dual GEMMs of up to DUAL_96 rows per group (the bucket) take the 96-token tiles in 32-token steps with the
# once-wait (vl_dual_m64_t96_k128_s3_v32_e_o: two CTAs per SM; their prediction beside the configs in
# hopper_varlen/config.py), first tried on the whole tier of 65-128 rows.
# A/B on an H200 (2026-11-29, one process per shape, the shipped config first and last, the arms and the
# host-scheduled kernel between, graph replay; notebook 10's rounds): S2-dual 134.6, 135.8 -> 125.0 us (the 96-token
# tiles without the steps 129.1, host-scheduled 125.6), S1-dual 218.9, 220.1 -> 215.0 (227.1, 221.5); eager S2-dual
# 138.9 -> 130.4, S1-dual 221.6 -> 222.8. The single GEMM's form gained nothing (S2 66.3, 67.2 -> 66.4; S1 120.8,
# 121.7 -> 130.6): the single tiers keep the 256-token tile. ncu (data/profiles.jsonl) shows the two-CTA form's issue
# slots ~46% busy against ~26% for the 256-token dual (194 registers, one CTA per SM). Prediction for the MoE layers
# (2026-11-29, before their run; 65-128 rows per expert reach the tier, 17-64 too): W4A4 Mixtral-like T = 512 and
# DeepSeek-like T = 4096 (128 rows per expert: two 64-token tiles each, the weights decoded twice as on S1-dual, which
# still gained 2%) 1-3% faster, Qwen3-like T = 512 (32 rows per expert, one tile either way, two CTAs per SM) 3-8%
# faster; W4A16 unchanged (its bf16 configs have no such form). Outcome (H200, moe-bench --dual-96 off on, one run per
# layer, W4A4, graph replay): Qwen3-like T = 512 346.4 -> 309.2 us uniform, 368.9 -> 334.5 Zipf (held, -10%);
# Mixtral-like T = 512 694.7 -> 719.1 uniform (+3.5%, missed), 769.0 -> 740.4 Zipf; DeepSeek-like T = 4096 6632 ->
# 7161 uniform (+8.0%, missed), 7290 -> 7294 Zipf. A reading: where every expert has ~128 rows (uniform routing) the
# 96-token tiles double the tiles and the weights' decode, and two CTAs per SM do not pay for that; where the rows
# spread (S1-dual, S2-dual, Zipf) the tiles grow 1.6-1.75x and they do; at up to 64 rows one tile covers a group
# either way. The call knows only the bucket (no read-back), so the tiles are taken up to 64 rows per group, where
# the tile count cannot grow: DUAL_96 = 64 (0: off; moe-bench --dual-96 0 64, the A/B), and S1-dual and S2-dual keep
# the 256-token tile unless tuned (`nvfp4lib tune` has the 96-token form as a candidate). Prediction for the bucket of
# 33-64 rows (2026-11-29, before its run): W4A4 Mixtral-like T = 256 and DeepSeek-like T = 2048 (64 rows per expert)
# 3-8% faster. Outcome (H200, moe-bench --dual-96 0 64, graph replay): Mixtral-like T = 256 496.9 -> 435.4 us uniform
# (-12.4%), 533.3 -> 483.4 Zipf; DeepSeek-like T = 2048 4722.5 -> 4403.1 uniform (-6.8%), 5130.1 -> 5062.9 Zipf: faster
# in all four, two past the prediction. Tuned (`nvfp4lib tune`, H200, data/tuned.jsonl): S2-dual takes the 96-token
# form and replays in 124.5, 125.0 us (host-scheduled 124.4); S1-dual keeps the 256-token tile (218.3, 218.1; 221.0).
DUAL_96 = 64
DUAL_96_CONFIG = "vl_dual_m64_t96_k128_s3_v32_e_o"
# Dual GEMMs of K at most DUAL_96_K take DUAL_96_CONFIG in the whole tier of 65-128 rows per group too (0: off). Why:
# with the tile handoff (hopper_varlen.kernel.TILE_HANDOFF) S2-dual (K = 2048) is the one study shape still behind the
# host-scheduled kernel by default (the 256-token tile: one CTA per SM, whose pipeline fill and epilogue are not
# hidden over 16 K steps), while its tuned choice is this config; the losses of the tier's first A/B were at K = 4096
# (Mixtral-like) and 7168 (DeepSeek-like). Of the MoE layers only Qwen3-like (K = 2048) reaches it, at T = 1024-2048.
# Prediction (2026-11-29, before the run): S2-dual's auto call ~124 us in graph replay (133.0 with the 256-token tile,
# host-scheduled 125.6); W4A4 Qwen3-like T = 1024 (64 rows per expert: DUAL_96 already) unchanged, T = 2048 (128 rows
# per expert: two 64-token tiles, the weights decoded twice, as in the losses) within +-3%, not known which way.
# Outcome (H200, one run, graph replay; notebooks 10 and 11): S2-dual 131.7, 133.3 us with the 256-token tile, 126.0,
# 125.8 with this config (host-scheduled 125.7; eager 136.6 -> 130.6): level with the host-scheduled kernel, not the
# ~124 predicted. Qwen3-like W4A4 (moe-bench --dual-96-k 0 2048): T = 2048 uniform 633.9 -> 646.8 us (+2.0%), Zipf
# 714.3 -> 670.5 (-6.1%); T = 1024, which the knob does not reach, 424.8 -> 432.5 and 456.3 -> 465.6 (+1.8-2.0%: the
# run's drift). Held within +-3% on uniform routing, past it on Zipf. Shipped: DUAL_96_K = 2048.
DUAL_96_K = 2048
# Up to 4 rows per group, DECODE_S5_TIER's 16-token tiles with 5 stages (70 KB of shared memory: three CTAs per SM)
# instead of 8 (110 KB: two); False: as before. Why (issue 41): the per-CTA timeline of the DeepSeek-like layer at
# T = 8 (H200, 2026-11-29, notebook 11's budget table) has its down GEMM's 3248 CTAs (~25 per SM) spend a third of
# their time outside the mainloop (tile search, wait, first stage, epilogue: ~3.8 of 11.4 us each) and its span would
# be ~110 us rather than 164 with those phases hidden; the gate/up GEMM's (14 per SM) a tenth. A third CTA per SM runs
# its mainloop while another is in those phases; the issue slots, 60-64% busy at two (ncu, the same step), have room
# for it. The same stages in flight per SM (15 against 16). Prediction (2026-11-29, before any run): DeepSeek-like T = 8
# 5-10% faster in both modes, Mixtral-like T = 8 (gate/up 12 CTAs per SM, down under 2) 1-4%; steps of at most one
# wave (Qwen3-like and DeepSeek-like T = 1, Mixtral-like T = 1) unchanged or up to 5% slower (fewer stages per CTA).
DECODE_S5 = True
DECODE_S5_TIER = (4, ("vl_m128_t16_k128_s5_e_x", "vl_dual_m64_t16_k128_s5_e_x"))
# Outcome (H200, moe-bench --decode-s5 off on on off, three layers at T = 1 and 8, both modes, uniform; notebook 11's
# rounds): faster where the 16-token grid has many CTAs per SM, slower where it has few. Per GEMM (profile, the two
# runs of each arm): DeepSeek-like T = 8 gate/up (2048 CTAs) -7.5%, down (3584) -10%; Qwen3-like T = 8 gate/up (768)
# -7 to -10%, down (1024) -10%; Mixtral-like T = 8 gate/up (1792) -6%, down (256) unchanged; Qwen3-like T = 1 (96,
# 128) unchanged; Mixtral-like T = 1 gate/up (448) +11 to +12%, its split down GEMM +2 to +20%; DeepSeek-like T = 1
# gate/up (256) -5% W4A16 but +22% W4A4, down (448) -5 to -8%. The layer: DeepSeek-like T = 8 W4A4 444 -> 407 us,
# W4A16 476 -> 439; Qwen3-like T = 8 78 -> 70 and 71 -> 65; Mixtral-like T = 8 229 -> 219 and 237 -> 228 (held);
# Mixtral-like T = 1 92 -> 103 and 86 -> 94, DeepSeek-like T = 1 W4A4 88 -> 96 (missed: slower). So the tier is taken
# per call where the 16-token grid (the most CTAs the call's rows can need) has at least DECODE_S5_MIN_CTAS per SM:
# every case that gained has 5.8 or more, every one that lost 3.4 or fewer. On, with that rule. The second run
# (moe-bench --decode-s5 on off off on, T = 1, 8, 64, both routings and modes, 144 rows; notebook 11's rounds): every
# case the rule takes 3-9.5% faster (DeepSeek-like T = 8 W4A4 449 -> 412 us, T = 64 Zipf W4A4 1050 -> 959, Qwen3-like
# T = 64 W4A4 155 -> 141), every other case within 1.5%.
DECODE_S5_MIN_CTAS = 4
# From 5 to 16 rows per group, DECODE_T32_TIER's 32-token tiles with 4 stages (73 KB, 75 registers: three CTAs per SM)
# instead of 6 (108 KB: two), under the same rule (wide_grid, the 32-token grid). Why: DECODE_S5's gain, and the
# Mixtral-like T = 64 timeline (notebook 11's budget: its gate/up GEMM's 1792 CTAs, 13.6 per SM, 13-17% of each
# outside the mainloop). Prediction (2026-11-29, before any run): Mixtral-like T = 64 gate/up 4-8% faster, the layer
# 3-5% (its down GEMM, 352 CTAs, 2.7 per SM, is not taken); Qwen3-like T = 256 and DeepSeek-like T = 512 (16 rows per
# expert, grids of 17 and more CTAs per SM) 5-10%. Outcome (H200, moe-bench --decode-t32-s4 off on on off, one run,
# graph replay; DeepSeek-like off on; notebook 11's rounds): Mixtral-like T = 64 -3.0% (W4A16) and -4.0% (W4A4) with
# either routing (uniform W4A4 310.6 -> 298.1 us; the gate/up GEMMs 4-7% faster in the profile, the down GEMMs, not
# taken, unchanged), Qwen3-like T = 256 -5.0% and -5.5% (W4A4 235.8 -> 222.5). DeepSeek-like T = 512 ran one pair, off
# then on: 2430 -> 2269 us (W4A16) and 2669 -> 2252 (W4A4), but the W4A16 pair's profile has its GEMMs slower (1446 +
# 791 -> 1507 + 798 us): not a clean result. The rows checked against the reference in the run; the 4-stage configs
# exact in the serving and W4A16 GPU tests. On.
DECODE_T32_S4 = True
DECODE_T32_TIER = (16, ("vl_m128_t32_k128_s4_e", "vl_dual_m64_t32_k128_s4_e"))
# Wide decode calls (wide_grid) take the two-block tiles instead of the three-CTA tiers (first tried on both decode
# tiers, as predicted here; shipped as DECODE_PAIR_TIER, 5-16 rows, after the outcome below): the same token tiles with
# each warpgroup decoding two 64-row blocks (two boxes of the packed layout per stage, names ending _b2: 256 rows per
# CTA, 128 of gate and of up for the dual GEMM), 4 stages, ~123-127 registers, two CTAs per SM; False: the three-CTA
# tiers. Why (issue 41): the decode GEMMs are issue-bound at the three-CTA tiers (ncu: issue slots 68-71% busy), and a
# consumer warp's K tile issues ~209 instructions in the offline SASS of which the decode is 124: the rest (the wgmma
# descriptors, the pipeline's waits, releases and refills) is paid per K tile whatever the rows, so two blocks per
# warpgroup cut the instructions per weight by ~18-24% (offline SASS, the t16 and t32 forms), and each CTA's fixed cost
# (tile search, first stage, epilogue) covers twice the rows. Against: two CTAs per SM, 16 warps, where the three-CTA
# tiers run 24. Prediction (2026-11-29, before any run): the wide calls' GEMMs 5-12% faster, DeepSeek-like T = 8 and 64,
# Mixtral-like T = 8 gate/up and T = 64, Qwen3-like T = 8 and 64 3-8% faster as layers; the calls the rule leaves narrow
# (T = 1) unchanged.
# Outcome (H200, moe-bench --decode-pair off on on off --profile, T = 1, 8, 64, both routings and modes; notebook 11's
# rounds): held for the 32-token tiles (5-16 rows per expert: Mixtral-like T = 64), faster in both modes, W4A4
# 293.5 -> 273.2 us (uniform; its gate/up GEMM 180.5 -> 159.5), 369.9 -> 342.7 (Zipf), W4A16 275.9 -> 267.8 and
# 347.3 -> 337.1; missed for the 16-token tiles (up to 4 rows: DeepSeek-like T = 8 and 64, Qwen3-like T = 8 and 64,
# Mixtral-like T = 8): W4A4 slower in five of six layer-T cases (DeepSeek-like T = 8 400 -> 435 us, its gate/up GEMM
# 255 -> 281), W4A16 mixed (DeepSeek-like T = 64 -4%, Mixtral-like T = 8 -2%, Qwen3-like T = 8 uniform +5%,
# DeepSeek-like T = 8 +1 to +4%). T = 1 unchanged (not taken). Exact (the serving and W4A16 GPU tests, every code x
# every finite scale; memcheck 0 errors). A reading: where the decode is cheap (fp16) or the tile short (16 tokens),
# the third CTA's warps hide more latency than the saved instructions buy. So the 32-token tier only: DECODE_PAIR on
# from 5 to 16 rows per group; the 16-token _b2 configs stay tuning candidates (`nvfp4lib tune`). Then as shipped, where
# the tier is taken and the first run did not reach (moe-bench --decode-pair off on on off --profile, T = 256 and 512,
# both modes and routings; the rows carry decode_pair "off" / "t32"): DeepSeek-like T = 256 W4A4 2123 -> 1844 us (-13%),
# W4A16 2226 -> 2067 (-7%), T = 512 -13% and -6% (Zipf -9% and -4%), Qwen3-like T = 256 -3% (W4A4), -1 to -2% (W4A16).
DECODE_PAIR = True
DECODE_PAIR_TIER = (16, ("vl_m256_t32_k128_s4_e_b2", "vl_dual_m128_t32_k128_s4_e_b2"))
# Narrow decode calls (up to 4 rows per group, not wide_grid: T = 1 and 2 of the bench's layers) take the 16-token
# two-block tiles in split-K form (NARROW_PAIR_TIER, names ending _x_b2: 4 stages, two CTAs per SM) where their grid,
# with its K slices (hopper_varlen.config.choose_splits), still has at least one CTA per SM (decode_grid's "pair");
# False: the 8-stage 16-token tiles as before. Why (issue 41): every T = 1 decode layer is 1.8-1.9x its NVFP4 floor, and
# its GEMMs are what is slow: Mixtral-like T = 1 W4A16 (H200, cccf53e) gate/up 52.7 us, down 27.3, against ~30 and ~15
# at the copy rate. ncu has that gate/up GEMM (448 CTAs) issuing 53% of the time at IPC 2.5, DRAM 54%, its SMs idle 17%
# of the kernel (data/profiles.jsonl): its 25.7 M warp instructions alone are ~27 us at 4 per cycle. The two-block tiles
# cut the instructions per weight by ~18-24% (offline SASS; DECODE_PAIR's note) at the same two CTAs per SM and the same
# bytes in flight per CTA (4 stages of two boxes against 8 of one), where the wide calls' DECODE_PAIR lost to a third
# CTA per SM that narrow calls do not have. The SMs' share of the work is no worse: Mixtral-like gate/up 448 tiles (3 or
# 4 per SM) become 224 CTAs of two (2 or 4 tiles per SM); its down GEMM 64 tiles in 4 slices (256 CTAs of 28 K tiles)
# become 32 in 7 (224 of 16, two boxes each); DeepSeek-like gate/up 256 CTAs of 56 K tiles become 128 in 2 slices (256
# of 28), down 448 CTAs become 224. The Qwen3-like GEMMs at T = 1 (96 and 64 CTAs as two-block tiles) have fewer than
# one per SM and keep theirs. Prediction (2026-11-29, before any run): the Mixtral- and DeepSeek-like GEMMs at T = 1
# 8-15% faster, the layers 6-12% in both modes (Mixtral-like W4A16 ~87 -> ~78-82 us); Qwen3-like T = 1 and every T >= 8
# unchanged (not taken).
# Outcome (H200, moe-bench --narrow-pair off on on off --profile, T = 1 and 8, both modes and routings; notebook 11's
# rounds), per GEMM (profile, the arms' means): faster where the two-block grid runs unsplit, Mixtral-like T = 1
# gate/up 53.1 -> 46.9 us (W4A16; -12%) and DeepSeek-like T = 1 down 29.0 -> 25.6 (W4A16), 30.1 -> 24.6 (W4A4:
# -18%), and where it splits into long slices, Mixtral-like T = 8 down (2 slices of 56 K tiles) 82.5 -> 78.7 (-5%);
# level or slower where its slices are short, DeepSeek-like T = 1 gate/up (2 slices of 28) 48.6 -> 48.6 (W4A16),
# 47.0 -> 48.7 (W4A4), Mixtral-like T = 1 down (7 slices of 16) 26.9 -> 31.7 (+18%). The layers: Mixtral-like T = 1
# -2% (W4A16) and -3.5% (W4A4), DeepSeek-like T = 1 -4%, Mixtral-like T = 8 -1 to -2%; Qwen3-like and DeepSeek-like
# T = 8 (not taken) within 1%. Short of the prediction (6-12%) because the split forms gave back what the unsplit
# ones gained. A reading: a two-block CTA's fixed cost (4 double stages to fill, the partials' hand-over) wants a
# long K run; so the tier is taken where the grid runs unsplit or its slices keep at least NARROW_PAIR_MIN_K_TILES
# K tiles (a rule read from this one run: between the 28 that tied and the 56 that gained). Prediction for it
# (before its run): Mixtral-like T = 1 ~6-7% faster in both modes (its gate/up alone), DeepSeek-like T = 1 ~4%
# (its down alone), Mixtral-like T = 8 as this run's "on" arms; the rest unchanged. Outcome (H200, the same A/B on
# the Mixtral- and DeepSeek-like layers): Mixtral-like T = 1 -6.6% (W4A16 86.6 -> 80.9 us) and -7% (W4A4 91.5 ->
# 85.1), DeepSeek-like T = 1 -4% (W4A16) and -6.6% (W4A4 89.3 -> 83.4: its gate/up no longer the slower split form),
# Mixtral-like T = 8 -1.6% to -2%; held. ncu (data/profiles.jsonl) of the GEMMs it takes: 14-16% fewer instructions
# (Mixtral-like gate/up 25.7 -> 22.1 M), DRAM 54 -> 61% and 44 -> 56% busy, the SMs still idle ~18% of the kernel
# (the grid's tail: 2 or 4 tiles per SM), issue slots 40-51% busy. On.
NARROW_PAIR = True
NARROW_PAIR_TIER = (4, ("vl_m256_t16_k128_s4_e_x_b2", "vl_dual_m128_t16_k128_s4_e_x_b2"))
NARROW_PAIR_MIN_K_TILES = 32


def wide_grid(dual: bool, rows: int, groups: int, n: int, sms: int) -> bool:
    """Whether a decode call (at most 16 rows per group) of ``rows`` rows over ``groups`` groups of N = ``n`` has a
    wide grid: at least :data:`DECODE_S5_MIN_CTAS` CTAs per SM (of ``sms``) in its three-CTA tier's tiling (16-token
    tiles up to 4 rows per group, 32 above), counted as the most CTAs its rows can need. Where :data:`DECODE_S5` (up
    to 4 rows) or :data:`DECODE_T32_S4` (5-16) is on, such a call takes the three-CTA tier (:func:`heuristic`)."""
    from .kernels.hopper_varlen.config import CONFIGS, grid_ctas

    bucket = m_bucket(rows, groups)
    if bucket > DECODE_T32_TIER[0]:
        return False
    single, dual_name = (DECODE_S5_TIER if bucket <= DECODE_S5_TIER[0] else DECODE_T32_TIER)[1]
    return grid_ctas(CONFIGS[dual_name if dual else single], rows, groups, n) >= DECODE_S5_MIN_CTAS * sms


GRID_CLASSES = ("", "wide", "pair")  # what decode_grid returns


def decode_grid(dual: bool, rows: int, groups: int, n: int, k: int, sms: int) -> str:
    """A call's grid as the shape rule sees it (``rows`` rows over ``groups`` groups, N = ``n``, K = ``k``, ``sms``
    SMs): "wide" (:func:`wide_grid`); "pair" where it takes :data:`NARROW_PAIR_TIER` (with :data:`NARROW_PAIR`): at
    most its rows per group, not wide, and its two-block grid with its K slices (``choose_splits``) has at least one
    CTA per SM, unsplit or in slices of at least :data:`NARROW_PAIR_MIN_K_TILES` K tiles; else "" (:func:`heuristic`
    takes it as ``grid``)."""
    from .kernels.common.packing import round_up
    from .kernels.hopper_varlen.config import CONFIGS, choose_splits, grid_ctas

    if wide_grid(dual, rows, groups, n, sms):
        return "wide"
    if not NARROW_PAIR or m_bucket(rows, groups) > NARROW_PAIR_TIER[0]:
        return ""
    cfg = CONFIGS[NARROW_PAIR_TIER[1][dual]]
    k_tiles = round_up(k, cfg.tile_k) // cfg.tile_k
    slices = choose_splits(cfg, rows, groups, n, k_tiles * cfg.tile_k, sms)
    long_slices = slices == 1 or -(-k_tiles // slices) >= NARROW_PAIR_MIN_K_TILES
    return "pair" if long_slices and grid_ctas(cfg, rows, groups, n) * slices >= sms else ""


# Configs no rule takes that stay tuning candidates (`nvfp4lib tune`): the 96-token tiles of the first A/B above.
TUNING_ARMS = ("vl_m128_t96_k128_s3_e_o", "vl_dual_m64_t96_k128_s3_e_o")


def rule_knobs() -> dict:
    """The knobs of the shape rule as set now: what bench and calls rows of config="auto" carry, and what the reports
    keep the serving kernel's rows at (``study.serving_report``)."""
    return {"once_wait": bool(ONCE_WAIT), "short_k": int(SHORT_K), "dual_96": int(DUAL_96), "dual_96_k": int(DUAL_96_K),
            "decode_s5": bool(DECODE_S5), "decode_s5_min_ctas": int(DECODE_S5_MIN_CTAS),
            "decode_t32_s4": bool(DECODE_T32_S4),
            # (the two-block tier as shipped, the 32-token one: "t32"; rows of its first A/B, both tiers, carry True)
            "decode_pair": "t32" if DECODE_PAIR else "off",
            # (the narrow two-block tier with its rule by slice length, "k32"; its first A/B's rows carry bools)
            "narrow_pair": f"k{NARROW_PAIR_MIN_K_TILES}" if NARROW_PAIR else "off"}


def shipped() -> set[str]:
    """Every config a rule of this module can choose (:data:`PREFERENCE`, :data:`SHORT_K_TIER` and the three-CTA
    tiers), and the :data:`TUNING_ARMS`: the candidates of tuning."""
    tiers = PREFERENCE + (SHORT_K_TIER, DECODE_S5_TIER, DECODE_T32_TIER, DECODE_PAIR_TIER, NARROW_PAIR_TIER)
    return {name for _, names in tiers for name in names} | set(TUNING_ARMS)


def heuristic(dual: bool, bucket: int, candidates: list[str], k: int | None = None, grid: str = "") -> str:
    """A shape rule for a cache miss: the first of :data:`PREFERENCE`'s configs for the bucket that is a candidate
    (the candidates share the prepared weights' layout), else the first candidate; in the bucket of
    :data:`SHORT_K_TIER` with ``k`` at most :data:`SHORT_K`, its configs first, and for a wide call (``grid``
    "wide": :func:`decode_grid`) :data:`DECODE_S5_TIER`'s first up to 4 rows per group (with :data:`DECODE_S5`) and
    :data:`DECODE_T32_TIER`'s from 5 to 16 (with :data:`DECODE_T32_S4`; before it :data:`DECODE_PAIR_TIER`'s, with
    :data:`DECODE_PAIR`); for a "pair" call :data:`NARROW_PAIR_TIER`'s first. With
    :data:`ONCE_WAIT` off the once-wait configs (named ``*_o`` by ``hopper_varlen.config.make``) are passed over, and
    :data:`DUAL_96_CONFIG` in :data:`PREFERENCE`'s tiers over the bucket :data:`DUAL_96` unless ``k`` is at most
    :data:`DUAL_96_K`."""
    tiers, wide = list(PREFERENCE), grid == "wide"
    if k is not None and k <= SHORT_K and bucket == SHORT_K_TIER[0]:
        tiers.insert(0, SHORT_K_TIER)
    if wide and DECODE_S5 and bucket <= DECODE_S5_TIER[0]:
        tiers.insert(0, DECODE_S5_TIER)
    if wide and DECODE_T32_S4 and bucket > DECODE_S5_TIER[0]:
        tiers.insert(0, DECODE_T32_TIER)
    if wide and DECODE_PAIR and bucket > DECODE_S5_TIER[0]:
        tiers.insert(0, DECODE_PAIR_TIER)
    if grid == "pair" and bucket <= NARROW_PAIR_TIER[0]:
        tiers.insert(0, NARROW_PAIR_TIER)
    for tier in tiers:
        limit, names = tier
        if bucket <= limit:
            for name in names:
                if name in candidates and (ONCE_WAIT or not name.endswith("_o")) \
                        and (name != DUAL_96_CONFIG or bucket <= DUAL_96 or tier is SHORT_K_TIER
                             or (k is not None and k <= DUAL_96_K)):
                    return name
    return candidates[0]


def tune(run, candidates: list[str], *, iters: int = 20, progress: bool = True) -> tuple[str, dict[str, float]]:
    """Time ``run(candidate)`` (a callable launching one call) for every candidate: median of ``iters`` CUDA-event
    timings with the L2 flushed before each; return (fastest, {candidate: microseconds})."""
    from .timing import L2Flusher, time_runner

    flush = L2Flusher()
    times = {}
    it = candidates
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(candidates, desc="nvfp4lib tune", leave=False)
    for c in it:
        samples = time_runner(lambda c=c: run(c), iters=iters, warmup=1, flush=flush)  # warm-up compiles
        times[c] = sorted(samples)[len(samples) // 2]
    return min(times, key=times.get), times
