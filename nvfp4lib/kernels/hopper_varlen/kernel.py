"""The device-scheduled swap-AB kernel (sm_90a, CuTe DSL): an activation prologue and the grouped GEMM.

Two kernels per call, the second with programmatic dependent launch, launched from one compiled host function
(:class:`DecodeThenGemmSm90`: one TVM-FFI call per call, not one per kernel):

- **prologue** (:class:`ActivationDecodeSm90`): every row of the packed activations ``[T, K]`` (codes, E4M3
  scales) to fp16 ``value × scale × 2^-7`` (exact) in ``x16 [T, K_pad]`` (the padding columns written as zeros).
  It knows nothing of the groups;
- **GEMM** (:class:`GroupedVarlenGemmSm90`): CTA ``b`` reads the group offsets ``[G+1]`` and finds its tile
  (:meth:`_schedule`): group g owns rows ``offsets[g] .. offsets[g+1]`` (clamped to ``[0, T]``), split into
  ``ceil(m / tile_n)`` near-equal token tiles (multiples of ``token_step``), each crossed with the ``N / tile_m``
  weight blocks, in (group, weight block, token tile) order. The grid is sized for the worst split of T rows
  (:func:`~.config.max_token_tiles`); CTAs past this split's tiles exit before touching shared memory. Then, as in
  the host-scheduled kernel: weights by TMA from the prepacked tensor (a stage is one box), decoded per thread
  into wgmma's register A operand; the tile's tokens by TMA from ``x16`` in boxes of ``token_step`` rows starting
  at the group's first row (no alignment needed: rows past the tile belong to wgmma columns that are never
  stored, rows past T arrive as zeros); the narrowest compiled wgmma N that covers the tile; the epilogue
  multiplies by ``gs_A·gs_B·2^14`` (A's global scale one or per group; dual: silu(gate)·up, split over both
  warpgroups) and stores C rows ``[T, N]``.

Nothing here depends on the host knowing the split: the same launch is captured once in a CUDA graph and replayed
for any offsets.

With :data:`FUSED_PROLOGUE` (off by default) the call is one kernel (:meth:`GroupedVarlenGemmSm90.kernel_fused`): the
GEMM's first CTAs, by the order they start, decode the activations in slices, and each CTA's loading warp waits on a
per-stream counter until all slices are done; one launch less per call, some GPU time more per call (the measured
trade beside the knob).

With ``act="bf16"`` (W4A16) there is no prologue: the GEMM's B operand is the caller's bf16 activations ``[T, K]``
(TMA-loaded as they are; columns past K and rows past T arrive as zeros), the weights decode to bf16 value × scale ×
2^-14 (:func:`~..hopper_rs.ops.a16_decode_ptx`), wgmma runs bf16 × bf16 -> fp32, and the epilogue multiplies by the
weights' ``gs_B·2^14`` alone (the ``gs_A`` argument is not read).

With :data:`..common.pdl.CHAIN` on when a kernel is built, the prologue is launched chained too (it waits for the
kernel before it, then lets the GEMM launch); with :data:`..common.pdl.CHAIN_GEMM` as well, the GEMM of an
NVFP4-activation call lets the next kernel launch when its mainloop ends.
"""
from __future__ import annotations

from ..common import pdl
from ..common.decode_ptx import OPERAND_EXPONENT
from ..hopper_rs.layout import RAW_EXPONENT, UNIT_BYTES, UNIT_K, UNIT_ROWS
from ..hopper_rs.mainloop import tile_class
from ..hopper_rs.ops import ACT_SMEM, ACT_THREADS, ops
from .config import NWG, ROW_BYTES, VarlenConfig, validate
from .search import LOOP_GROUPS, search_class  # noqa: F401  (LOOP_GROUPS: its home is search)

_CLASSES = None
# The NVFP4-activation call as one kernel: the GEMM's first CTAs do the prologue's work (:meth:`kernel_fused`) instead
# of a prologue kernel before it. Prediction (2026-11-27, before the run): -4 to -6 us of host time per eager call
# (one launch of ~5.6 us less, H100 host profile of the two-kernel call), GPU time within +-2 us. Outcome (H100, one
# process, alternating rounds, development A/B): host -3 to -6 us per eager call (held); GPU +0.9 (S1), +2.6 (S2),
# +1.4 us (S4) in graph replays (the slices delay the first weight loads, which the prologue kernel's PDL launch
# overlapped). Off by default: it helps host-bound eager calls and costs every graph replay. Exact on every shape in
# those runs; memcheck: 0 errors on two earlier forms of it (e7bb3ce, db11cf9) and on this one (852c996).
FUSED_PROLOGUE = False
# With FUSED_PROLOGUE off: prepared weights' NVFP4 calls that are not being captured in a CUDA graph run the fused
# kernel (one launch: the host time of an eager call), and captured calls the two kernels (the replay's GPU time, with
# no host time to save). Each runner compiles the fused call on its first eager call. One-shot calls keep the two
# kernels (their host time is hidden behind the gather). Prediction (2026-11-27, before the run): eager calls -3 to
# -6 us of host time (the A/B above), graph replays unchanged. Outcome (H100, calls run at 8909dba against 6b02f58's
# on a host as fast, not an A/B in one run): eager host time -7 us median over the eight shapes (S3 +1.1 to S4-dual
# -8.8), eager GPU time back to back +1.8 to +7.5 us, graph replays within 2.6 us (every target of issue 18 held).
EAGER_FUSED = True
# Captured NVFP4 calls of at most this many rows run the fused kernel too (0: none; the runner compiles it when it is
# made, never inside a capture). Why (issue 41): in a graph replay of the Qwen3-like layer at T = 1 (H200 profile,
# 2026-11-28) each of the two prologue kernels takes 1.3-1.4 us for 8 rows, a launch in the chain of a ~39 us W4A4
# step; the fused kernel's slices of 8 rows are a few chunks per CTA, while the GEMM's replays of the study shapes
# (thousands of rows) lost 0.9-2.6 us to them (FUSED_PROLOGUE's note). Prediction (2026-11-28, before any run; not run
# on a GPU yet): at 64 (up to 8 tokens of a top-8 layer), the Qwen3-like T = 1 W4A4 layer ~2-3 us faster (two
# prologue launches gone, each GEMM a little longer), DeepSeek- and Mixtral-like decode likewise in absolute terms;
# steps past 64 rows unchanged. Outcome (H200, one run, moe-bench --fuse-max-rows 0 64, W4A4, T = 1, 8; notebook
# 11's round): slower in every case, Qwen3-like T = 1 39.2 -> 46.6 us (its GEMMs 1.4 + 11.5 -> 14.5 and 1.4 + 7.0 ->
# 9.2 us: the slices cost the GEMM more than the prologue launch they replace, and the layer lost ~5 us more than its
# kernels, in the gaps before the fused kernels), DeepSeek-like T = 8 475 -> 578 us. Off.
FUSE_MAX_ROWS = 0
# A development timeline (0: off, as shipped): the device address of an int64 buffer [2, TIMELINE_CTAS, 8] that GEMMs
# built while it is set stamp into, per CTA (dual GEMMs in [0], single in [1]; CTAs past TIMELINE_CTAS not
# stamped): %clock64 at entry (0), once its tile is found (1), after the wait for the kernel before (2), when its
# first stage has landed (3), at the mainloop's end (4) and the epilogue's (5); %globaltimer at entry (6) and at the
# end (7). Thread 0 of each CTA writes them; a CTA with no tile stops after (1). Read by moe-bench --timeline
# (bench.timeline); a runner's compile key holds it.
TIMELINE = 0
TIMELINE_CTAS = 4096
# The stages whose weights a GEMM CTA asks for before its wait for the kernel before (0: all its first stages, up to
# ab_stages, as before; the rest are asked for after the wait with their activations); read when a GEMM is built, a
# runner's compile key holds it. Why (issue 41): the decode GEMMs' first stage lands ~2 us after the wait even with
# their weights already in L2 (the L2 prefetch's A/B, beside SPLIT_RULE), and a stage is full only when its
# activations, asked for after the wait, have landed too; the CTA's copy engine may take requests in order, so the
# activations of stage 0 queue behind the 8 stages of weights (72 KB) asked for first. The deep-decode A/B (16 stages
# before the wait) was slower, as this would predict. Prediction (2026-11-28, before any run): with 2, the first stage
# lands ~1 us sooner after the wait, each decode GEMM ~1 us faster: Qwen3-like T = 1 ~2 us faster in both modes
# (W4A4 ~29 -> ~27, W4A16 ~27 -> ~25), DeepSeek- and Mixtral-like decode ~1-2 us faster, prefill unchanged. If the
# copy engine does not take them in order: no change, or slower (the first stages' weights asked for later).
# Outcome (H200, moe-bench --prewait-stages 0 2, one run, three layers at T = 1 and 8, uniform; notebook 11's rounds):
# W4A16 faster in 6 of 6 cases (Qwen3-like T = 8 81.2 -> 75.5 us, DeepSeek-like T = 1 100.4 -> 96.1, Qwen3-like T = 1
# 27.2 -> 26.9), W4A4 within 1% in all 6. The per-CTA timeline (Qwen3-like T = 1) shows why: W4A16's first stage
# landed 1.1 us after the wait instead of 2.0-2.3 (its gate/up CTAs 12.0 -> 9.9 us), while W4A4's operand GEMMs wait
# ~2 us for their slow quantization and had their first stage in 0.6-1.05 us already. Taken for the decode tilings
# (16 and 32 tokens, 6-8 stages), where it was measured; the study shapes' tilings (3-5 stages) as before.
# Second A/B (the other order, 2 then 0, at a7f6fab, T = 1, 8 and 64): W4A16 faster in 8 of 9 (Qwen3-like T = 1 28.3 ->
# 25.2 us, Mixtral-like T = 64 379.7 -> 347.3; DeepSeek-like T = 64 2187.5 -> 2211.5, +1.1%); W4A4 mixed: Qwen3-like
# T = 1 29.5 -> 27.7 and Mixtral-like T = 64 324.6 -> 304.2, but DeepSeek-like T = 64 1739.6 -> 1854.3 (+6.6%, a case
# that had read 1720-1736 in four runs), the rest within 1.3%. Shipped for the W4A16 GEMMs only, where the timeline
# shows the mechanism (their first stage waited ~2 us behind the weights); the W4A4 GEMMs, whose wait for their
# quantization already hid it, keep all first stages before the wait. Why DeepSeek-like T = 64 lost is not known.
# Eager calls: in both A/Bs the PREWAIT arm's eager time per call was higher (Qwen3-like T = 1 195.8 -> 331.4 us, then
# 159.1 -> 262.7). Re-measured (H200, one run at 14b59e8, --prewait-stages 0 2 2 0, W4A16, Qwen3- and Mixtral-like
# T = 1 and 8, each row with calls.host_probe read just after it): the eager times followed the host's speed, not
# the arm (an eager call's host time was 5.17 probes with 0 and 5.16 with 2, means over 8 rows each; Qwen3-like T = 1
# 144 and 128 us with 0, 246 and 140 with 2, the 246 at a probe of 48 us against 26-30 for the others); graph replay
# faster with 2 in 4 of 4 cases. PREWAIT stays.
PREWAIT_STAGES = 2
# Warp 0 alone finds the CTA's tile and hands it to the other warps in shared memory (_found_tile; False: every warp
# finds it, as before); read when a GEMM is built, a runner's compile key holds it. Why (issue 41): at the same tiling
# the serving GEMM ran 8.6-8.8% more warp instructions than the host-scheduled one on S2 and S2-dual (H200 ncu rows,
# data/profiles.jsonl), uniform-datapath UISETP/UIADD3/USEL; the SASS of both (cuobjdump of the offline compiles, S2's
# t96 tiling) places them before the mainloop, not in it: 325 instructions per warp before the first barrier against
# the host-scheduled kernel's 72, the tile search each of the 8 warps ran (the mainloops are 299 and 279, the extra 20
# the once-wait's inline retry). Measured 4.18 M more warp instructions on S2-dual is ~259 per warp of its 2016 CTAs.
# The search was shortened too (unsigned divisions, four selects per group: 325 -> 237). Prediction
# (2026-11-29, before any run): the GEMM's instructions within ~2% of the host-scheduled kernel's; S2 ~1 us faster
# in graph replay (66.4 -> ~65.4, the host-scheduled 65.0), S3 and S4 ~0.5 us, the duals alike. Outcome (H200, one
# process per shape, bench --backend cute-hopper:handoff=0 beside the default and the host-scheduled kernel, graph
# replay, medians of two rows each; notebook 10's rounds): S2 66.7 -> 65.7 us (host-scheduled 65.3), S3 31.9 -> 30.3
# (30.9), S4 17.7 -> 16.8 (16.8), S1 122.0 -> 121.5, S1-dual 219.0 -> 217.7, S2-dual 134.4 -> 133.0, S3-dual and
# S4-dual within 0.1 us: S2 held, S3 and S4 past it. ncu of S2's 96-token GEMM: 25.60 -> 24.25 M warp instructions
# (host-scheduled 23.54 M: +3.0%, the ~2% missed). MoE decode (moe-bench --tile-handoff 1 0 1, notebook 11): Qwen3-like
# T = 1 0.1-1.5 us faster, the rest within 1%. The first form compared Uint32 casts, which came out signed for
# split-K CTAs: the GPU tests and Mixtral-like decode found it (rows recorded as wrong); two signed compares since.
# Exact in the serving, split-K, W4A16 and MoE GPU tests (84 passed); memcheck clean on the split-K tests; racecheck's
# reports on the fused kernel stay at the staged epilogue's site (notes below), none at barrier 4. Again at decode with
# more than 32 groups (the warp search; moe-bench --tile-handoff 0 1 0 1, H200, notebook 11), after a 10-replay sanity
# run had Qwen3-like W4A16 T = 1 1.4 us faster without it: off -> on within -2% to +3% in the 8 cases (Qwen3-like
# T = 1 W4A16 25.1 -> 25.9 us, its first off arm 24.3 and second 25.8: the run's drift), DeepSeek-like T = 8 1-2%
# faster with it. Kept on everywhere.
TILE_HANDOFF = True
# With the tile handoff, warp 0 waits at the handoff's barrier with the other warps (bar.sync 4) instead of arriving
# without waiting (bar.arrive 4); read when a GEMM is built (a runner's compile key holds it). Why (issue 41's
# "racecheck clean"): racecheck's only reports on the serving GEMM, at the staged epilogue (the staging stores against
# the copy-out loads, which a barrier of all the CTA's threads separates: the racecheck note below), come with the
# handoff's bar.arrive. A probe on an H200 (2026-11-29; compute-sanitizer --tool racecheck --kernel-name
# kns=GroupedVarlenGemmSm90 over one eager call and three graph replays with new routings (the calls of
# tools/racecheck_probe.py, which says how to run it) of vl_a16_m256_t16_k128_s4_e_x_b2 at 64 groups, N 1024, K 4096, 4
# rows: 8 K slices; kernels built ahead, the same binary but for the arm): as shipped 4 errors at that site; the
# epilogue's barrier as bar.sync 0 instead of bar.sync 1, 256, still 4; the handoff off (every warp searches, no
# bar.arrive), 0 hazards; exact in every arm; synccheck 0 errors as shipped. The site is not the handoff's data, so this
# reads as racecheck's model of the non-waiting arrival, not a race (PTX orders the memory of threads that arrive at a
# barrier before those that wait on it). Waiting costs warp 0 nothing where the other warps reached the barrier during
# its search (they do nothing else before it). Prediction (2026-11-29, before any run): racecheck clean on the plain
# GEMM; times unchanged within the run's noise (every case within 1%), the same bits. Outcome (H200, one run: moe-bench
# --handoff-wait 0 1 1 0, three layers at T = 1 and 8, both modes, uniform; bench of the study shapes with
# cute-hopper:graph=1,handoff_wait=0 beside the default; notebooks 10 and 11): racecheck on the plain GEMM 0 hazards
# (the probe above, twice); the study shapes within 0.5% in graph replay (S2 64.9 -> 64.6 us, S4 17.2 -> 17.2, S1-dual
# 215.1 -> 215.0); the MoE layers within 1% in 10 of 12 cases, Qwen3-like T = 1 +2.5% (W4A16, 23.8 -> 24.4 us, its two
# arrive arms 23.2 and 24.4 us) and +1.2% (W4A4), inside that case's spread between arms of one setting; every row
# exact. On. Then synccheck (H200, 2026-11-30, the one-kernel call's probe config): "divergent thread(s) in block" at
# warp 0's BAR.SYNC 0x4, 0x100: warp 0 waited from its own branch, the other warps at their own instruction, and an
# aligned barrier must be one instruction for all. Now every thread meets barrier 4 at one instruction
# (:meth:`GroupedVarlenGemmSm90._found_tile`): synccheck 0 errors and racecheck 0 hazards on the one-kernel call
# (vl_m128_t16_k128_s8_e_x) and the plain split GEMM (vl_a16_m256_t16_k128_s4_e_x_b2), memcheck 0 errors, exact.
HANDOFF_WAIT = True
# In the fused kernel warp 0 meets the slices' barrier 2 with warps 1.. (every thread of the CTA) instead of warps 1..
# meeting it alone (the racecheck note's next probe); read when a GEMM is built. Prediction (2026-11-29, before any
# run): racecheck clean on the fused kernel; exact; eager W4A4 calls unchanged (warp 0 waits for the slices at the
# ring's barrier right after anyway). First form (warp 0 at barrier instructions of its own; H200, 2026-11-30, the
# racecheck probe's config): racecheck 0 hazards (1 error with the knob off, in the same run), memcheck 0 errors,
# exact; but synccheck "divergent threads in block" at warp 0's barrier, and a timed calls run hung in its third shape:
# an aligned barrier is one instruction for all the threads that meet it. This form: warp 0 takes warps 1..'s path to
# both barriers and skips only the decode. Outcome (H200, one run, 2026-11-30): racecheck 0 hazards (the knob off: 1
# error, its staged-epilogue site), memcheck 0 errors, exact; the calls suite with the prologue fused in every call
# (calls --fused-prologue on, off then on) unchanged: graph replay S1 123.7 -> 124.3 us, S3 30.5 -> 30.3, S4 17.4 ->
# 17.1, S1-dual 220.9 -> 219.7, the rest within 0.3 us. synccheck still reported "divergent threads" in both arms, at
# the tile handoff's barrier 4 (HANDOFF_WAIT's warp 0 waited at an instruction of its own: now one for every thread,
# :meth:`GroupedVarlenGemmSm90._found_tile`). On.
SLICE_BARRIER_ALL = True
# A diagnostic, never shipped (read when a GEMM is built; the recipe field ``ablation``): "no_decode" feeds wgmma the
# loaded code words instead of their decode, "no_mma" decodes and issues no wgmma (the decoded words folded into one
# accumulator, so the decode stays). Wrong by design: the bench harness times such rows and does not check them (``bench
# --problem M1-G8-N4096-K7168 --problem M1-G8-N7168-K2048 --backend cute-hopper:graph=1,ablation=no_mma``: the
# DeepSeek-like layer's T = 1 GEMMs on their 8 experts, the m-sweep suite). What it is for (issue 41): at T = 1 the
# DeepSeek-like gate/up GEMM runs at 64% of DRAM with its issue slots 52% busy and 21% of its stall samples at a stage's
# wait (data/profiles.jsonl), so neither the memory nor the decode is plainly the limit. Prediction (2026-11-30, before
# any run): the decode tilings are issue-bound, so "no_decode" takes 25-35% off the T = 1 GEMMs and "no_mma" 10-15%.
ABLATION = ""
ABLATIONS = ("", "no_decode", "no_mma")
# Warp 0 asks for the two TMA descriptors (weights, activations) at the kernel's entry, before it searches for the CTA's
# tile, instead of after it, just before the first loads (read when a GEMM is built: a runner's compile key holds
# it). Why (issue 41): Nsight Compute's warp-stall samples by SASS line (H200, 2026-11-29, data/profiles.jsonl, cases
# *-sites; ncu replays each kernel alone) put the Qwen3-like T = 1 W4A16 down GEMM's warps 28% at the stage-full
# barrier's wait (the mainloop's first instructions) and 12% at the tile hand-off's barrier, the gate/up GEMM's 12%
# and 6%; the per-CTA timeline (moe-bench --timeline) has each decode CTA spend ~0.9 us between its tile and its first
# weight requests going out (the "wait" phase) even where the kernel before had ended, and its first stage landing
# 1-2 us after that with the weights already in L2 (the L2 prefetch's A/B). A descriptor not yet fetched holds the
# first copy up; asked for at entry, its fetch overlaps the tile search (~0.9 us). Prediction (2026-11-29, before any
# run): the GEMMs that start after the kernel before has ended (W4A16's down GEMM: pdl.CHAIN_GEMM_A16 is off) 0.3-0.9
# us shorter, so W4A16 at T = 1 and 8 0.3-0.9 us faster on every layer; the GEMMs launched early (W4A4's, W4A16's
# gate/up) have their search and fetch hidden behind the kernel before already: unchanged. Outcome (H200, moe-bench
# --early-descriptors 0 1 0 1 --profile, three layers at T = 1 and 8, both modes; notebook 11's rounds): no case
# faster beyond its noise, the down GEMM unchanged in every profile (Qwen3-like T = 1 W4A16 6.4 -> 6.5 us, the layer
# 24.1 -> 25.1), 12 cases at 1.00-1.04x; the same bits (GPU test). So the first copy does not wait for its
# descriptor. Off.
EARLY_DESCRIPTORS = False
# W4A4's weight decode without the scale's × 2^7 (hopper_rs.layout.rs_decode_ptx(raw=True): one fp16x2 multiply per k16
# word fewer; the epilogue's factor × 2^7 instead, _alpha). Why (issue 41): the decode GEMMs' mainloop is issue-bound
# (ncu: issue slots 68-71% busy at the three-CTA tiers), and in the SASS of the offline compile (sm_90a, the W4A4
# decode configs) that multiply is 8 of the ~209 instructions a consumer warp issues per K tile (the decode's 124).
# The outputs' bits cannot change: every decoded weight is exact either way and its product with the activation exact
# in fp32, so the accumulators are the old ones × 2^-7 (no fp32 subnormal is reached) and the factor × 2^7 restores
# them. Prediction (2026-11-29, before any GPU run): W4A4 decode GEMMs' mainloops ~4% shorter where they are
# issue-bound (T = 8 and 64), so those layers 1.5-3% faster; T = 1 (latency-bound) within 1%; the same bits.
# Outcome (H200, moe-bench --raw-scale 0 1 1 0 --profile, W4A4, T = 1, 8, 64, 4096, both routings; notebook 11's
# rounds): held at the prediction's low end where the GEMMs are issue-bound, DeepSeek-like T = 8 409 -> 401 us
# (uniform), Mixtral-like T = 8 220 -> 215 (its GEMMs 131 + 77 -> 129 + 75 us), T = 64 -1 to -1.5%; Qwen3-like T = 8
# and every T = 1 unchanged within the run's noise; prefill T = 4096 -1% (Qwen3-like, DeepSeek-like). The same bits
# in every case (rel_err equal in both arms), and exact on the GPU for every code x every finite scale. On. The study
# shapes (no prediction was written for them, no A/B run): the first run with it on (H200, 034a790, one process per
# shape, graph replay; notebook 10's serving-against-host table) has the serving kernel at or below the host-scheduled
# kernel on all eight, S2 64.3 us against 65.0 and S2-dual 122.3 against 124.7, the two it trailed before by 0.3-0.5%.
RAW_SCALE = True
PREWAIT_MAX_TILE_N = 32  # the tilings it applies to: at most this many tokens per tile (the decode tilings), W4A16
# The racecheck reports on these kernels and the probes that settled them, run by run: docs/sanitizers.md.


def call_knobs() -> dict:
    """The knobs an NVFP4 call's times depend on, as set now: what calls rows carry
    (:func:`nvfp4lib.bench.calls.bench_calls`) and what the report keeps rows at
    (:func:`nvfp4lib.study.serving_report.shipped_calls`)."""
    return {"fused_prologue": int(FUSED_PROLOGUE), "eager_fused": int(EAGER_FUSED), "fuse_max_rows": FUSE_MAX_ROWS,
            "tile_handoff": int(TILE_HANDOFF), "handoff_wait": int(HANDOFF_WAIT),
            "slice_barrier_all": int(SLICE_BARRIER_ALL)}


# CTAs of the fused call that decode a slice of the activations: one per SM of an H100 SXM (fewer SMs only delays
# the last slices' CTAs; the wait stays safe)
PROLOGUE_CTAS = 132
SLICE_BATCH = 8  # 16-code chunks a thread of a slice loads before it stores them


def kernel_classes():
    """(ActivationDecodeSm90, GroupedVarlenGemmSm90, DecodeThenGemmSm90), built on first use (importing nvfp4lib
    never imports cutlass)."""
    global _CLASSES
    if _CLASSES is None:
        _CLASSES = _build()
    return _CLASSES


def _build():
    import cutlass
    import cutlass.cute as cute
    import cutlass.pipeline as pipeline

    o = ops()
    decode_act16, zero32 = o.decode_act16, o.zero32

    @cute.jit
    def chunk_at(mCodes: cute.Tensor, mScales: cute.Tensor, mX: cute.Tensor, i, per_row):
        """Chunk ``i`` of the activations (row ``i // per_row``, 16 codes): (its column ``c`` among the row's
        ``per_row`` chunks, the addresses of its 8 code bytes, of its scale byte, and of its 16 fp16 in ``mX``)."""
        r = i // per_row
        c = i - r * per_row
        return (c, (mCodes.iterator + r * mCodes.stride[0] + 8 * c).toint(),
                (mScales.iterator + r * mScales.stride[0] + c).toint(),
                (mX.iterator + r * mX.stride[0] + 16 * c).toint())

    @cute.jit
    def decode_chunk(mCodes: cute.Tensor, mScales: cute.Tensor, mX: cute.Tensor, i, per_row, chunks):
        """Chunk ``i`` of the activations to fp16 in ``mX``; the chunks past the row's codes (``chunks`` per row) to
        zeros."""
        c, src, sf, dst = chunk_at(mCodes, mScales, mX, i, per_row)
        if c < chunks:
            decode_act16(src, sf, dst)
        else:
            zero32(dst)  # a zero operand: the weights' padding is zero too, but 0 × NaN is not

    class ActivationDecodeSm90:
        """``mCodes`` uint8 [T, K/2], ``mScales`` E4M3 bytes [T, K/16] (row-major, the caller's tensors), ``mX``
        fp16 [R >= T, K_pad]: rows 0 .. T-1 written (a runner keeps one buffer for every T up to R). ``chain``:
        launched chained (:mod:`..common.pdl`), it first waits for the kernel before it."""

        def __init__(self, chain: bool = False):
            self.chain = chain

        @cute.jit
        def __call__(self, mCodes: cute.Tensor, mScales: cute.Tensor, mX: cute.Tensor, stream):
            work = cute.size(mCodes, mode=[0]) * (cute.size(mX, mode=[1]) // 16)
            self.kernel(mCodes, mScales, mX).launch(
                grid=((work + ACT_THREADS - 1) // ACT_THREADS, 1, 1), block=(ACT_THREADS, 1, 1), stream=stream,
                smem=ACT_SMEM, use_pdl=self.chain)

        @cute.kernel
        def kernel(self, mCodes: cute.Tensor, mScales: cute.Tensor, mX: cute.Tensor):
            if cutlass.const_expr(self.chain):
                cute.arch.griddepcontrol_wait()  # the codes' writer has finished
            cute.arch.griddepcontrol_launch_dependents()  # the GEMM may start its set-up and weight loads now
            tidx, _, _ = cute.arch.thread_idx()
            bidx, _, _ = cute.arch.block_idx()
            i = bidx * ACT_THREADS + tidx
            per_row = cute.size(mX, mode=[1]) // 16  # 16-code chunks of a padded row
            if i < cute.size(mCodes, mode=[0]) * per_row:
                decode_chunk(mCodes, mScales, mX, i, per_row, cute.size(mScales, mode=[1]))

    class GroupedVarlenGemmSm90(tile_class(), search_class()):
        """Swap-AB: weights (register A, decoded per thread) × tokens (smem B, fp16; bf16 with ``act="bf16"``) -> Cᵀ
        tiles, one per CTA, each found from the group offsets on the device. ``groups``, ``n`` (columns of C) and
        ``k_pad`` are those of the prepared weights and fixed per compile."""

        def __init__(self, cfg: VarlenConfig, groups: int, n: int, k_pad: int, combine: int = 0):
            self.cfg = validate(cfg)
            if combine and cfg.dual:
                raise ValueError(f"config {cfg.name}: the weighted un-permute follows a single GEMM, not a dual one")
            self._fused = None  # (set while the fused kernel is traced: its ticket, slice count, operands)
            # the weighted un-permute after the epilogue (:meth:`call_combine`) of ``combine`` copies per token (0:
            # none); set while that kernel is traced: (rows of the copies, their weights, the output, the column
            # blocks' counters, the groups' rows)
            self.combine, self._combine = combine, None
            self.tile_words = 5 if combine else 4  # (the tile handed from warp 0: + the rows the groups cover)
            self.groups, self.n, self.k_tiles = groups, n, k_pad // cfg.tile_k
            self.n_blocks = -(-n // cfg.tile_m)
            self.boxes, self.n_packed = cfg.boxes, -(-n // cfg.packed_m)  # (the packed layout's CTA blocks per group)
            self.bt, self.step = cfg.tile_n, cfg.step
            self.variants = tuple(range(self.step, self.bt + 1, self.step))
            self.per_lane = -(-groups // 32)  # groups per lane of the tile search (_schedule)
            self.nsub = cfg.tile_k // UNIT_K
            self.blocks = cfg.blocks
            self.stages = cfg.ab_stages
            self.dual = cfg.dual
            self.threads = 128 * NWG
            self.stage_units = cfg.stage_units
            self.w_rows = self.stage_units * UNIT_BYTES // ROW_BYTES  # 128-byte rows per stage
            self.a16 = cfg.act == "bf16"  # bf16 activations as they are, weights decoded to bf16
            self.op_dtype = cutlass.BFloat16 if self.a16 else cutlass.Float16
            self.split_k = cfg.split_k
            # (read when the kernel is built: a runner's compile key holds both) the prologue launched chained; the
            # GEMM letting the next kernel launch at its mainloop's end: NVFP4-activation GEMMs, which the layer
            # follows with a quantization, and bf16-activation ones with pdl.CHAIN_GEMM_A16 (pdl.CHAIN_GEMM's note)
            self.chain, self.chain_next = pdl.CHAIN, pdl.gemm_chained(self.a16)
            self.timeline, self.region = TIMELINE, 0 if cfg.dual else 1  # (TIMELINE's note)
            if PREWAIT_STAGES < 0:
                raise ValueError(f"PREWAIT_STAGES={PREWAIT_STAGES}: the stages asked for before the wait, 0 (all the "
                                 "first stages) or more")
            self.prewait = PREWAIT_STAGES if self.a16 and cfg.tile_n <= PREWAIT_MAX_TILE_N else 0  # (its note)
            self.handoff = TILE_HANDOFF  # (read when the kernel is built: a runner's compile key holds it)
            self.handoff_wait = HANDOFF_WAIT  # (likewise)
            self.slice_barrier_all = SLICE_BARRIER_ALL  # (likewise)
            if ABLATION not in ABLATIONS:
                raise ValueError(f"ABLATION={ABLATION!r}: one of {ABLATIONS}")
            self.ablation = ABLATION  # (likewise; a diagnostic)
            self.early_descriptors = EARLY_DESCRIPTORS  # (likewise)
            self.raw_scale = RAW_SCALE and not self.a16  # (likewise; the fp16 decode only)
            self._split = None  # (set while a kernel is traced: partials, counters, slices, this slice, the tile)

        @cute.jit
        def __call__(self, mW: cute.Tensor, mX: cute.Tensor, mC: cute.Tensor, mOffsets: cute.Tensor,
                     mGsA: cute.Tensor, mGsB: cute.Tensor, mPart: cute.Tensor, mSplits: cute.Tensor, stream):
            sx_layout, sw_layout, tma_w, tW, tma_x, tX = self._operands(mW, mX)
            tiles_max = self._grid(mC)
            self.kernel(tma_w, tW, tma_x, tX, mC, mOffsets, mGsA, mGsB, mPart, mSplits, sw_layout, sx_layout).launch(
                grid=(tiles_max * self._slices(mPart), 1, 1), block=(self.threads, 1, 1), stream=stream,
                use_pdl=True)

        @cute.jit
        def _slices(self, mPart):
            """K slices per tile: the partials' first mode (``split_k`` configs; the call's
            :func:`~.config.choose_splits`), else 1 (the partials are not read)."""
            if cutlass.const_expr(self.split_k):
                return cute.size(mPart, mode=[0])
            return 1

        @cute.jit
        def _tile_of(self, bidx, mPart, mSplits):
            """(this CTA's tile, its K slice): CTAs ``tile·S .. tile·S + S-1`` share a tile; stashes what
            :meth:`_tile` and :meth:`_finish` need in ``self._split``."""
            tile, split = bidx, 0
            if cutlass.const_expr(self.split_k):
                tile = bidx // self._slices(mPart)
                split = bidx - tile * self._slices(mPart)
            self._split = (mPart, mSplits, self._slices(mPart), split, tile)
            return tile

        @cute.jit
        def _grid(self, mC):
            """CTAs of a launch: the tiles of the worst split of C's T rows (:func:`~.config.max_token_tiles`) times
            the weight blocks (x16 may have more rows than T: stale, finite, never stored)."""
            rows = cute.size(mC, mode=[0])
            return cutlass.min(rows, (rows + self.groups * (self.bt - 1)) // self.bt) * self.n_blocks

        @cute.jit
        def _found_tile(self, storage, mOffsets, rows, tile):
            """This CTA's tile (:meth:`_schedule`). With :data:`TILE_HANDOFF` warp 0 finds it, lane 0 stores it in
            shared memory; with :data:`HANDOFF_WAIT` every thread then meets barrier 4 at one instruction, else warp 0
            arrives there without waiting; the other warps wait there and read it. Without, every warp finds it."""
            if cutlass.const_expr(not self.handoff):
                return self._schedule(mOffsets, rows, tile)
            found = storage.tile.get_tensor(cute.make_layout(self.tile_words))
            group, tok_row0, tokens, n0, covered = (cutlass.Int32(0), cutlass.Int32(0), cutlass.Int32(0),
                                                    cutlass.Int32(0), cutlass.Int32(0))
            warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
            if warp == 0:
                group, tok_row0, tokens, n0, covered = self._schedule(mOffsets, rows, tile)
                if cute.arch.lane_idx() == 0:
                    found[0], found[1], found[2], found[3] = group, tok_row0, tokens, n0
                    if cutlass.const_expr(self.combine):
                        found[4] = covered
                if cutlass.const_expr(not self.handoff_wait):
                    cute.arch.barrier_arrive(barrier_id=4, number_of_threads=self.threads)
            if cutlass.const_expr(self.handoff_wait):  # (HANDOFF_WAIT: one instruction for every thread, as an
                cute.arch.barrier(barrier_id=4, number_of_threads=self.threads)  # aligned barrier must be)
            if warp > 0:
                if cutlass.const_expr(not self.handoff_wait):
                    cute.arch.barrier(barrier_id=4, number_of_threads=self.threads)
                group, tok_row0, tokens, n0 = found[0], found[1], found[2], found[3]
                if cutlass.const_expr(self.combine):
                    covered = found[4]
            return group, tok_row0, tokens, n0, covered

        @cute.kernel
        def kernel(self, tma_w: cute.CopyAtom, tW: cute.Tensor, tma_x: cute.CopyAtom, tX: cute.Tensor,
                   mC: cute.Tensor, mOffsets: cute.Tensor, mGsA: cute.Tensor, mGsB: cute.Tensor, mPart: cute.Tensor,
                   mSplits: cute.Tensor, sw_layout: cute.Layout, sx_layout: cute.ComposedLayout):
            self._fused, self._combine = None, None
            self._body(tma_w, tW, tma_x, tX, mC, mOffsets, mGsA, mGsB, mPart, mSplits, sw_layout, sx_layout)

        # -- the GEMM then the weighted un-permute (combine): the column block's last CTA sums the copies ------------
        @cute.jit
        def call_combine(self, mW: cute.Tensor, mX: cute.Tensor, mC: cute.Tensor, mOffsets: cute.Tensor,
                         mGsA: cute.Tensor, mGsB: cute.Tensor, mPart: cute.Tensor, mSplits: cute.Tensor,
                         mRow: cute.Tensor, mTopW: cute.Tensor, mOut: cute.Tensor, mDone: cute.Tensor, stream):
            """:meth:`__call__` (C: the copies' rows, scratch), then ``mOut [T, N] = Σ_j mTopW[t, j] · C[mRow[t·k +
            j]]`` in fp32 in j's order (a negative row adds 0 · the weight), each column block's by its last CTA
            (:meth:`_combine_tail`); ``mDone`` int32 [N / tile_m], zeros (each block's last CTA zeroes its word)."""
            sx_layout, sw_layout, tma_w, tW, tma_x, tX = self._operands(mW, mX)
            self.kernel_combine(tma_w, tW, tma_x, tX, mC, mOffsets, mGsA, mGsB, mPart, mSplits, sw_layout,
                                sx_layout, mRow, mTopW, mOut, mDone).launch(
                grid=(self._grid(mC) * self._slices(mPart), 1, 1), block=(self.threads, 1, 1), stream=stream,
                use_pdl=True)

        @cute.kernel
        def kernel_combine(self, tma_w: cute.CopyAtom, tW: cute.Tensor, tma_x: cute.CopyAtom, tX: cute.Tensor,
                           mC: cute.Tensor, mOffsets: cute.Tensor, mGsA: cute.Tensor, mGsB: cute.Tensor,
                           mPart: cute.Tensor, mSplits: cute.Tensor, sw_layout: cute.Layout,
                           sx_layout: cute.ComposedLayout, mRow: cute.Tensor, mTopW: cute.Tensor, mOut: cute.Tensor,
                           mDone: cute.Tensor):
            self._fused, self._combine = None, (mRow, mTopW, mOut, mDone, None)
            self._body(tma_w, tW, tma_x, tX, mC, mOffsets, mGsA, mGsB, mPart, mSplits, sw_layout, sx_layout)

        @cute.jit
        def _combine_tail(self, storage, mC, tokens, n0, n_valid):
            """After this CTA's tile is stored: count its rows in at its column block's word (acq_rel, GPU scope,
            after every thread's fence); the CTA that brings the count to the rows the groups cover is the block's
            last, zeroes the word for the next call and sums every token's copies over the block's columns, reading
            C from L2 (rows other CTAs wrote), in j's order, so the result does not depend on which CTA was last.
            A thread's first output's rows and weights (inputs of the call) are read before the count; each
            output's k copies are loaded together, then summed."""
            mRow, mTopW, mOut, mDone, covered = self._combine
            tidx, _, _ = cute.arch.thread_idx()
            n_out = cute.size(mOut, mode=[0]) * n_valid
            first = self._copies(mRow, mTopW, tidx, n_valid, tidx < n_out)
            if self._count_in(storage, (mDone.iterator + n0 // self.cfg.tile_m).toint(), covered - tokens,
                              tokens) != 0:
                o.fence_acq_rel()
                if tidx < n_out:
                    self._sum_copies(mC, mOut, first, n0)
                for q in cutlass.range(tidx + self.threads, n_out, self.threads, unroll=1):
                    self._sum_copies(mC, mOut, self._copies(mRow, mTopW, q, n_valid, True), n0)

        @cute.jit
        def _copies(self, mRow, mTopW, q, n_valid, valid):
            """Output ``q`` of the column block (token t, column c) and its copies' rows and weights (where
            ``valid``; rows -1 otherwise)."""
            t = q // n_valid
            rows, weights = [], []
            for j in cutlass.range_constexpr(self.combine):
                r, w = cutlass.Int64(-1), cutlass.Float32(0.0)
                if valid:
                    r, w = cutlass.Int64(mRow[t * self.combine + j]), cutlass.Float32(mTopW[t, j])
                rows.append(r)
                weights.append(w)
            return t, q - t * n_valid, rows, weights

        @cute.jit
        def _sum_copies(self, mC, mOut, copies, n0):
            """``mOut[t, n0 + c] = Σ_j w_j · C[r_j, n0 + c]`` in fp32 in j's order (a row r_j < 0 adds 0 · w_j): the
            k loads first, then the fused multiply-adds."""
            t, c, rows, weights = copies
            ys = []
            for j in cutlass.range_constexpr(self.combine):
                y = cutlass.Float32(0.0)
                if rows[j] >= 0:
                    y = o.load_bf16_gpu((mC.iterator + rows[j] * mC.stride[0] + n0 + c).toint())
                ys.append(y)
            acc = cutlass.Float32(0.0)
            for j in cutlass.range_constexpr(self.combine):
                acc = o.fma_f32(ys[j], weights[j], acc)
            mOut[t, n0 + c] = acc.to(mOut.element_type)

        @cute.jit
        def _body(self, tma_w, tW, tma_x, tX, mC, mOffsets, mGsA, mGsB, mPart, mSplits, sw_layout, sx_layout):
            """A CTA of :meth:`kernel` (and :meth:`kernel_combine`): its tile found, then run."""
            self._stamp(0)
            self._stamp(6, "globaltimer")
            if cutlass.const_expr(self.early_descriptors):
                self._prefetch_descriptors(tma_w, tma_x)  # (before the tile search: EARLY_DESCRIPTORS)
            bidx, _, _ = cute.arch.block_idx()
            tile = self._tile_of(bidx, mPart, mSplits)
            storage = cutlass.utils.SmemAllocator().allocate(self.shared_storage)
            group, tok_row0, tokens, n0, covered = self._found_tile(storage, mOffsets, cute.size(mC, mode=[0]), tile)
            if cutlass.const_expr(self._combine is not None):
                self._combine = (*self._combine[:4], covered)
            self._stamp(1)
            if tokens > 0:
                self._run_tile(storage, tma_w, tW, tma_x, tX, mC, mGsA, mGsB, group, tok_row0, tokens, n0,
                               sw_layout, sx_layout)

        @cute.jit
        def _run_tile(self, storage, tma_w, tW, tma_x, tX, mC, mGsA, mGsB, group, tok_row0, tokens, n0, sw_layout,
                      sx_layout):
            if cutlass.const_expr(not self.early_descriptors or self._fused is not None):
                self._prefetch_descriptors(tma_w, tma_x)
            if cutlass.const_expr(self._fused is not None):
                # once, before the tile-width variants: inlined into each variant's mainloop (after its first weight
                # loads) it ran S1 and S2 5-8 us slower (H100 graph replays, 2026-11-27), with the same registers
                self._prologue_slice()
            variant = (tokens + self.step - 1) // self.step - 1
            for v in cutlass.range_constexpr(len(self.variants)):
                if variant == v:
                    self._tile(self.variants[v], storage, tma_w, tW, tma_x, tX, mC, (mGsA, mGsB, group),
                               tok_row0, tokens, n0, sw_layout, sx_layout)

        @cute.jit
        def _prefetch_descriptors(self, tma_w, tma_x):
            """Warp 0 asks for the TMA descriptors of the weights and the activations (EARLY_DESCRIPTORS: where)."""
            if cute.arch.make_warp_uniform(cute.arch.warp_idx()) == 0:
                cute.nvgpu.cpasync.prefetch_descriptor(tma_w)
                cute.nvgpu.cpasync.prefetch_descriptor(tma_x)

        # -- the fused call: the prologue's work done by the GEMM's first CTAs (FUSED_PROLOGUE) ---------------------
        @cute.jit
        def call_fused(self, mCodes: cute.Tensor, mScales: cute.Tensor, mX: cute.Tensor, mW: cute.Tensor,
                       mC: cute.Tensor, mOffsets: cute.Tensor, mGsA: cute.Tensor, mGsB: cute.Tensor,
                       mCount: cute.Tensor, mPart: cute.Tensor, mSplits: cute.Tensor, stream):
            sx_layout, sw_layout, tma_w, tW, tma_x, tX = self._operands(mW, mX)
            grid = self._grid(mC) * self._slices(mPart)
            self.kernel_fused(tma_w, tW, tma_x, tX, mC, mOffsets, mGsA, mGsB, mPart, mSplits, sw_layout, sx_layout,
                              mCodes, mScales, mX, mCount, cutlass.min(grid, PROLOGUE_CTAS)).launch(
                grid=(grid, 1, 1), block=(self.threads, 1, 1), stream=stream)

        @cute.kernel
        def kernel_fused(self, tma_w: cute.CopyAtom, tW: cute.Tensor, tma_x: cute.CopyAtom, tX: cute.Tensor,
                         mC: cute.Tensor, mOffsets: cute.Tensor, mGsA: cute.Tensor, mGsB: cute.Tensor,
                         mPart: cute.Tensor, mSplits: cute.Tensor, sw_layout: cute.Layout,
                         sx_layout: cute.ComposedLayout, mCodes: cute.Tensor,
                         mScales: cute.Tensor, mX: cute.Tensor, mCount: cute.Tensor, n_pro: cutlass.Int32):
            """:meth:`kernel` with the prologue inside (:meth:`_prologue_slice`, :meth:`_await_x`). The tile is the
            block index, as in :meth:`kernel`; warps 1.. of each CTA take a ticket (the order in which CTAs started);
            tickets below ``n_pro`` decode a strided slice of the activations into ``mX`` and count it done. Warp 0
            loads the activations once all ``n_pro`` slices are done: every slice belongs to a CTA that started
            before and whose slice waits for nothing, so the wait always ends. The grid's last ticket prepares the
            counters for the next call on the stream (the next epoch), so no CTA counts itself out at the end."""
            storage = cutlass.utils.SmemAllocator().allocate(self.shared_storage)
            self._combine = None
            self._fused = (storage.ticket.data_ptr().toint(), n_pro, mCodes, mScales, mX, mCount.iterator.toint())
            bidx, _, _ = cute.arch.block_idx()
            tile = self._tile_of(bidx, mPart, mSplits)
            group, tok_row0, tokens, n0, _ = self._found_tile(storage, mOffsets, cute.size(mC, mode=[0]), tile)
            if tokens > 0:
                self._run_tile(storage, tma_w, tW, tma_x, tX, mC, mGsA, mGsB, group, tok_row0, tokens, n0,
                               sw_layout, sx_layout)
            else:
                self._prologue_slice()

        @cute.jit
        def _ticket(self):
            """(this CTA's ticket, the address of its epoch's done word), after the ticket's barrier."""
            slot, count = self._fused[0], self._fused[5]
            word = o.load_shared_u32(slot)
            return word & 0xFFFFF, count + 4 + 4 * cutlass.Int64((word >> 20) & 1)

        @cute.jit
        def _prologue_slice(self):
            """Warps 1..: thread 32 takes the CTA's ticket (warp 0 reads it after the ring's barrier of every thread,
            :meth:`_await_x`); tickets below ``n_pro`` decode chunks ``ticket·S + t`` strided by
            ``n_pro·S`` (S = the slice threads) into ``mX``, then one release of the epoch's done word once all of
            them are done. With :data:`SLICE_BARRIER_ALL` warp 0 meets both of barrier 2's instructions too and
            skips the decode."""
            _, n_pro, mCodes, mScales, mX, count = self._fused
            tidx, _, _ = cute.arch.thread_idx()
            nt = self.threads - 32
            # (SLICE_BARRIER_ALL: warp 0 meets barrier 2 too, at the same two instructions: an aligned barrier must be
            # one instruction for every thread that meets it; a form where warp 0 met it at its own instructions was
            # synccheck's "divergent threads" and hung a call)
            met, first = (self.threads, 0) if cutlass.const_expr(self.slice_barrier_all) else (nt, 1)
            warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
            if warp >= first:
                if tidx == 32:
                    o.take_ticket(count, self._fused[0], cute.arch.grid_dim()[0])
                cute.arch.barrier(barrier_id=2, number_of_threads=met)
                ticket, done = self._ticket()
                if ticket < n_pro:
                    if warp > 0:
                        per_row = cute.size(mX, mode=[1]) // 16
                        chunks = cute.size(mScales, mode=[1])
                        work = cute.size(mCodes, mode=[0]) * per_row
                        stride = n_pro * nt
                        for i0 in cutlass.range(ticket * nt + tidx - 32, work, SLICE_BATCH * stride, unroll=1):
                            loaded = []  # a batch's loads first, then its stores: SLICE_BATCH loads in flight
                            for j in cutlass.range_constexpr(SLICE_BATCH):
                                i = i0 + j * stride
                                c, src, sf, dst = chunk_at(mCodes, mScales, mX, i, per_row)
                                valid = cutlass.Int32((c < chunks) & (i < work))  # zeros past the codes
                                loaded.append((i, dst, o.load_act16(src, sf, valid)))
                            for i, dst, words in loaded:
                                if i < work:
                                    o.store_act16_global(words, dst)
                        o.fence_async_global()
                    cute.arch.barrier(barrier_id=2, number_of_threads=met)
                    if tidx == 32:
                        o.release_add(done)

        @cute.jit
        def _await_x(self):
            """The plain GEMM waits for the prologue kernel (programmatic dependent launch). In the fused one (the
            slices decoded in :meth:`_run_tile`) warp 0, which loads the activations, reads the CTA's ticket (thread 32
            stored it before the ring's barrier of every thread, :meth:`_ring`, which warp 0 has passed), then waits
            until every slice of its epoch is done."""
            if cutlass.const_expr(self._fused is None):
                cute.arch.griddepcontrol_wait()
                self._stamp(2)
            else:
                if cute.arch.make_warp_uniform(cute.arch.warp_idx()) == 0:
                    _, done = self._ticket()
                    n = o.load_acquire(done)
                    while n < self._fused[1]:
                        n = o.load_acquire(done)
                    o.fence_async_global()

        @cute.jit
        def _tile(self, nv: int, storage, tma_w, tW, tma_x, tX, mC, scales, tok_row0, tokens, n0, sw_layout, sx_layout):
            """One output tile with a wgmma N of ``nv`` tokens."""
            n_valid = cutlass.min(self.cfg.tile_m, self.n - n0)
            boxes = nv // self.step
            load_pipe, sW, sX, sXv = self._ring(nv, storage, sw_layout, sx_layout)

            group = scales[2]
            k0, k_tiles = 0, self.k_tiles  # this CTA's K tiles: all, or its slice's (split_k)
            if cutlass.const_expr(self.split_k):
                slices, split = self._split[2], self._split[3]
                per = (self.k_tiles + slices - 1) // slices
                k0 = split * per
                k_tiles = cutlass.min(per, self.k_tiles - k0)
            # weights: stage tiles of w_rows 128-byte rows, CTA-block-major (a block's K tiles adjacent); with two
            # boxes the stage's second half is the next packed block's tile (_issue_w), past a group's last block
            # rows the epilogue masks (n_valid)
            w_tile0 = (group * self.n_packed + n0 // self.cfg.packed_m) * self.k_tiles + k0
            gW = cute.local_tile(tW, (self.w_rows // self.boxes, ROW_BYTES), (None, 0))
            tWs, tWg = cute.nvgpu.cpasync.tma_partition(tma_w, 0, cute.make_layout(1), cute.group_modes(sW, 0, 2),
                                                        cute.group_modes(gW, 0, 2))
            # activations: boxes of step rows from the tile's first token row (any row: TMA takes element
            # coordinates); smem (box, (row block, 1, slot)), gmem (box, (row block, 64-K block))
            tXs, tXg = cute.nvgpu.cpasync.tma_partition(
                tma_x, 0, cute.make_layout(1), cute.zipped_divide(sX, (self.step, UNIT_K)),
                cute.zipped_divide(cute.domain_offset((tok_row0, 0), tX), (self.step, UNIT_K)))
            loads = (tma_w, tWs, tWg, w_tile0, tma_x, tXs, tXg, k0, boxes)
            self._mainloop(nv, storage, load_pipe, loads, sXv, mC, scales, tok_row0, tokens, n0, n_valid, k_tiles)

        @cute.jit
        def _alpha(self, mGsA, mGsB, group):
            """The group's epilogue factors (gate, up): A's global scale (one, or the group's) times gs_B·2^14; bf16
            activations have no global scale (their weights' 2^-14 is what the 2^14 undoes); the raw decode's weights
            (RAW_SCALE) carry 2^-7 more, which a further 2^7 undoes (exact: a power of two)."""
            if cutlass.const_expr(self.a16):
                return mGsB[group, 0], mGsB[group, 1]
            gs = mGsA[0]
            if cute.size(mGsA, mode=[0]) > 1:
                gs = mGsA[group]
            if cutlass.const_expr(self.raw_scale):
                gs = gs * 2.0 ** (-(RAW_EXPONENT - OPERAND_EXPONENT))
            return gs * mGsB[group, 0], gs * mGsB[group, 1]

        @cute.jit
        def _x_box(self, loads, j, prod, s: int):
            """Box j of 64-K block s of stage ``prod`` (the partition starts at the tile's first token row; a K slice
            at its first K tile, ``loads[7]``)."""
            if cutlass.const_expr(self.split_k):
                return (j, (loads[7] + prod.count) * self.nsub + s)
            return (j, prod.count * self.nsub + s)

        # -- split-K (split_k configs): the tile's last CTA adds the K slices and runs the epilogue ----------------
        @cute.jit
        def _finish(self, nv: int, accs, tCcC, storage, mC, scales, row0, tokens, n0, n_valid, wg, t):
            self._stamp(4)
            if cutlass.const_expr(self.chain_next and self._fused is None):  # (the plain GEMM; not the fused call)
                cute.arch.griddepcontrol_launch_dependents()  # the next kernel may launch (it waits for this one)
            last = cutlass.Int32(1)  # (the tile's last K slice runs the epilogue; without split-K, every CTA)
            if cutlass.const_expr(self.split_k):
                if self._split[2] > 1:
                    last = self._add_slices(accs, tCcC, storage, row0, tokens, n0, n_valid, wg)
            if last != 0:
                self._epilogue(nv, accs, tCcC, storage, mC, self._alpha(*scales), row0, tokens, n0, n_valid, wg, t)
                if cutlass.const_expr(self._combine is not None):
                    self._combine_tail(storage, mC, tokens, n0, n_valid)
            self._stamp(5)
            self._stamp(7, "globaltimer")

        @cute.jit
        def _stamp(self, i: cutlass.Constexpr, timer: cutlass.Constexpr = "clock64"):
            """Stamp ``i`` of :data:`TIMELINE` (thread 0 of a CTA; nothing where it is off)."""
            if cutlass.const_expr(self.timeline != 0):
                tidx, _, _ = cute.arch.thread_idx()
                bidx, _, _ = cute.arch.block_idx()
                if tidx == 0 and bidx < TIMELINE_CTAS:
                    o.stamp_to(cutlass.Int64(self.timeline) + ((self.region * TIMELINE_CTAS + bidx) * 8 + i) * 8,
                               timer)

        def _part_rows(self, wg, b: int):
            """(the partials' column of block b's first weight row, the block's first row within the tile): dual
            configs keep gate in columns 0 .. N-1 and up in N .. 2N-1 (warpgroup 0 holds gate, 1 up)."""
            if self.dual:
                return wg * self.n + b * UNIT_ROWS, b * UNIT_ROWS
            return (wg * self.blocks + b) * UNIT_ROWS, (wg * self.blocks + b) * UNIT_ROWS

        @cute.jit
        def _count_in(self, storage, counter, last, add=None):
            """The CTA hand-over of split-K and of the combine: every thread's stores made visible (a GPU-scope fence,
            then the CTA's barrier), thread 0 counts the CTA in at the global word ``counter`` (``split_arrive``: 1,
            or ``add``, against ``last``, the count before the last CTA's), and after a second barrier every thread
            reads whether this CTA was the last (nonzero) from the shared slot (the fused call's ticket word, read
            before the mainloop ends)."""
            o.fence_acq_rel()
            bar = pipeline.NamedBarrier(barrier_id=1, num_threads=self.threads)
            bar.arrive_and_wait()
            slot = storage.ticket.data_ptr().toint()
            tidx, _, _ = cute.arch.thread_idx()
            if tidx == 0:
                o.split_arrive(counter, slot, last, add)
            bar.arrive_and_wait()
            return o.load_shared_u32(slot)

        @cute.jit
        def _add_slices(self, accs, tCcC, storage, row0, tokens, n0, n_valid, wg):
            """This CTA's fp32 partial sums (unscaled) to its slice of ``mPart [S, R, W]``; then one thread counts the
            CTA in at the tile's counter (:func:`~..hopper_rs.ops` ``split_arrive``: acq_rel, GPU scope, after every
            thread's fence). The last CTA of the tile (returns 1; the others 0) sums the S slices in slice order — its
            own from registers, the others' from L2 — into ``accs``, so the result does not depend on which CTA
            finished last, and zeroes the counter for the next call."""
            mPart, mSplits, slices, split, tile = self._split
            size = cute.size(accs[0])
            for b in cutlass.range_constexpr(self.blocks):
                c0, r0 = self._part_rows(wg, b)
                for i in cutlass.range_constexpr(size):
                    m, n = tCcC[i]
                    if n < tokens and r0 + m < n_valid:
                        mPart[split, row0 + n, n0 + c0 + m] = accs[b][i]
            last = self._count_in(storage, (mSplits.iterator + tile).toint(), slices - 1)
            if last != 0:
                o.fence_acq_rel()
                for b in cutlass.range_constexpr(self.blocks):
                    c0, r0 = self._part_rows(wg, b)
                    for i in cutlass.range_constexpr(size):
                        m, n = tCcC[i]
                        if n < tokens and r0 + m < n_valid:
                            total = cutlass.Float32(0.0)
                            at = mPart.iterator + (row0 + n) * mPart.stride[1] + n0 + c0 + m  # slice 0's
                            for q in cutlass.range(slices, unroll=1):
                                v = accs[b][i]
                                if q != split:
                                    v = o.load_f32_gpu((at + q * mPart.stride[0]).toint())
                                total = total + v
                            accs[b][i] = total
            return last

    class DecodeThenGemmSm90:
        """The prologue and the GEMM of an NVFP4-activation call from one host function: a call costs one TVM-FFI
        entry (argument conversion, stream lookup) instead of two; the kernels and their launches are unchanged.
        Predicted -6 to -12 us of host time per call; measured -0.3 to -0.9 us (H100 host profile, 2026-11-26):
        the entry is cheap, each kernel launch inside it costs ~4 us."""

        def __init__(self, gemm: GroupedVarlenGemmSm90, fused: bool | None = None):
            self.prologue, self.gemm = ActivationDecodeSm90(gemm.chain), gemm
            self.fused = FUSED_PROLOGUE if fused is None else fused

        @cute.jit
        def __call__(self, mCodes: cute.Tensor, mScales: cute.Tensor, mX: cute.Tensor, mW: cute.Tensor,
                     mC: cute.Tensor, mOffsets: cute.Tensor, mGsA: cute.Tensor, mGsB: cute.Tensor,
                     mCount: cute.Tensor, mPart: cute.Tensor, mSplits: cute.Tensor, stream):
            if cutlass.const_expr(self.fused):
                self.gemm.call_fused(mCodes, mScales, mX, mW, mC, mOffsets, mGsA, mGsB, mCount, mPart, mSplits,
                                     stream)
            else:
                self.prologue(mCodes, mScales, mX, stream)
                self.gemm(mW, mX, mC, mOffsets, mGsA, mGsB, mPart, mSplits, stream)

    return ActivationDecodeSm90, GroupedVarlenGemmSm90, DecodeThenGemmSm90
