"""Notebook 11's rounds on the decode GEMMs' tiles (:mod:`.moe_rounds` holds the rest and the table): how many stages
and CTAs per SM the few-rows-per-expert calls run, how a consumer warp decodes its weights, and how many 64-row blocks
it holds. Each :class:`~.moe_reader.Round` as :mod:`.moe_rounds` describes: the prediction typed as written before the
run, the outcome computed from ``data/moe.jsonl``."""
from __future__ import annotations

from . import moe_runs as runs
from .moe_reader import Round, arm_means_at, in_turn

__all__ = ["TILE_ROUNDS"]


def _ab_runs(d):
    """The A/B's runs at a commit (T = 1 and 8 only), not the run as shipped that followed it there (T up to 4096)."""
    return ~d["run_id"].isin(d.loc[d["tokens"] >= 64, "run_id"])


TILE_ROUNDS = (
    Round("Up to 4 rows per expert, the 16-token tiles with 5 stages instead of 8 (70 KB: three CTAs per SM; "
          "tuning.DECODE_S5), after the per-CTA budget above put a third of the DeepSeek-like T = 8 down GEMM's CTA "
          "time outside its mainloop. Two runs on an H200: every decode call (moe-bench --decode-s5 off on on off, "
          "T = 1, 8), then the rule shipped, grids of at least 4 CTAs per SM (on off off on, T = 1, 8, 64, both "
          "routings)", "DeepSeek-like T = 8 5-10% faster in both modes, Mixtral-like T = 8 1-4%; steps of one wave "
          "or less (T = 1) unchanged or up to 5% slower.", runs.DECODE_S5_COMMITS,
          in_turn([arm_means_at(c, "decode_s5", ("8 stages", "5"), "both modes", values=(False, True))
                    for c in runs.DECODE_S5_COMMITS], "; then, with the rule: ")),
    Round("From 5 to 16 rows per expert, the 32-token tiles with 4 stages instead of 6 (73 KB: three CTAs per SM; "
          "tuning.DECODE_T32_S4) under the same rule. One run on an H200 (moe-bench --decode-t32-s4 off on on off: "
          "Mixtral-like T = 64, both routings; Qwen3-like T = 256; DeepSeek-like T = 512 off on)",
          "Mixtral-like T = 64 3-5% faster (its gate/up GEMM 4-8%), Qwen3-like T = 256 and DeepSeek-like T = 512 "
          "5-10%.", (runs.DECODE_T32_COMMIT,),
          arm_means_at(runs.DECODE_T32_COMMIT, "decode_t32_s4", ("6 stages", "4"), "both modes",
                       values=(False, True))),
    Round("W4A4's weight decode without the block scale's x 2^7, the epilogue's factor carrying it (hopper_varlen."
          "kernel.RAW_SCALE: 8 of the ~209 instructions a consumer warp issues per K tile, in the offline SASS). One "
          "run on an H200 (moe-bench --raw-scale 0 1 1 0 --profile, W4A4, T = 1, 8, 64, 4096, both routings)",
          "W4A4 1.5-3% faster where the decode GEMMs are issue-bound (T = 8, 64), T = 1 within 1%; the same bits.",
          (runs.RAW_SCALE_COMMIT,), arm_means_at(runs.RAW_SCALE_COMMIT, "raw_scale", ("x 2^7", "raw"), "W4A4")),
    Round("Wide decode calls on two-block tiles (each warpgroup two 64-row blocks, 256 rows per CTA, two CTAs per SM: "
          "tuning.DECODE_PAIR). One run on an H200 (moe-bench --decode-pair off on on off --profile, T = 1, 8, 64, "
          "both modes and routings); then the 32-token tier alone, as shipped, at T = 256 and 512",
          "The wide calls' GEMMs 5-12% faster, the layers at T = 8 and 64 3-8%; T = 1 unchanged.",
          runs.DECODE_PAIR_COMMITS, in_turn([arm_means_at(c, "decode_pair", ("three-CTA", "two-block"), "both modes",
                                             values=v) for c, v in zip(runs.DECODE_PAIR_COMMITS, ((False, True),
                                                                        ("off", "t32")))], "; then: ")),
    Round("Narrow decode calls (up to 4 rows per expert, not a wide grid: T = 1, and Mixtral-like T = 8's down GEMM) "
          "on the 16-token two-block tiles in split-K form (names ending _x_b2: 4 stages, two CTAs per SM; "
          "tuning.NARROW_PAIR) where their grid keeps a CTA per SM. Two runs on an H200: wherever that holds "
          "(moe-bench --narrow-pair off on on off --profile, three layers, T = 1, 8, both modes and routings), then "
          "with the rule by slice length read from it (unsplit, or slices of at least 32 K tiles; Mixtral- and "
          "DeepSeek-like)",
          "The Mixtral- and DeepSeek-like GEMMs at T = 1 8-15% faster, the layers 6-12% in both modes; Qwen3-like "
          "T = 1 and every T >= 8 unchanged. For the rule by slice length (after the first run): Mixtral-like T = 1 "
          "6-7% faster, DeepSeek-like T = 1 ~4%, Mixtral-like T = 8 as the first run's two-block arms.",
          runs.NARROW_PAIR_COMMITS,
          in_turn([arm_means_at(runs.NARROW_PAIR_COMMITS[0], "narrow_pair", ("8 stages", "two-block"), "both modes",
                                values=(False, True)),
                   arm_means_at(runs.NARROW_PAIR_COMMITS[1], "narrow_pair", ("8 stages", "two-block"), "both modes",
                                values=("off", "k32"), keep=_ab_runs)], "; then, with the rule by slice length: ")),
)
