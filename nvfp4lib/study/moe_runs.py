"""The recorded runs notebook 11's rounds read (:mod:`.moe_rounds`): which commit of ``data/moe.jsonl`` holds which
A/B or measurement, with the command that made it. A run's rows carry the commit whose tree ran them
(``python -m nvfp4lib record``); a round names its runs by these constants."""
from __future__ import annotations

ONCE_WAIT_COMMIT = "819396d"  # moe-bench --once-wait off on (the single GEMM's study tiers)
SHORT_K_COMMIT = "aca63ef"  # moe-bench --short-k 0 4096 (the rule by K, switched off after it)
# moe-bench --tile-handoff 0 1 0 at 9967963 (8ea0fce's kernels, the handoff's first form: its loop search selected
# wrong tiles for split-K CTAs; rows recorded, the Mixtral-like ones wrong in both arms), then 1 0 1 at b667d96 (fixed
# in 52cddbf)
HANDOFF_COMMITS = ("9967963", "b667d96")
DUAL_96_K_COMMIT = "aa522f9"  # moe-bench --dual-96-k 0 2048 (Qwen3-like T = 1024, 2048; shipped at 2048 after it)
A16_SCALE_COMMIT = "1395acd"  # moe-bench --a16-int-scale 0 1 0 1 (W4A16, Qwen3- and Mixtral-like T = 1, 8, 64)
# the second run of that A/B: DeepSeek-like at decode, and prefill (T = 4096) beside the bf16 peer
A16_SCALE_MORE_COMMIT = "8ee1e22"
SMALL_TILES_COMMIT = "7d08f53"  # moe-bench --quant-small-tiles 0 1 0 1 (W4A4, T = 1, 8, 64); off after it
HANDOFF_DECODE_COMMIT = "2c902ae"  # moe-bench --tile-handoff 0 1 0 1 (Qwen3- and DeepSeek-like, T = 1 and 8)
PREFILL_H200_COMMIT = "2cddeb5"  # moe-bench at T = 4096, the three layers as shipped, beside the bf16 peer
A16_OWN_COMMIT = "f9d0202"  # moe-bench --a16-own-words 0 1 0 1 (W4A16, Qwen3- and Mixtral-like T = 1, 8, 64)
# its second run: DeepSeek-like T = 1, 8, 64 (0 1); T = 4096 beside the bf16 peer (0 1 0 1; Mixtral-like 0 1 0 1 0 1)
A16_OWN_MORE_COMMIT = "029a1f4"
A16_OWN_PROFILE_COMMIT = "271366c"  # its third: --profile, Qwen3- and Mixtral-like T = 1 (0 1 0 1), kernel by kernel
PAIR_COMMIT = "e2816a3"  # moe-bench --split-k idle pair idle pair --profile (Mixtral- and Qwen3-like T = 1, both modes)
PAIR_SHIPPED_COMMIT = "d9d64ea"  # the same with 'pair' shipped, Mixtral-like T = 1, 2, 8
DECODE_H200_COMMIT = "45985b8"  # moe-bench at T = 1, 8, 64, the three layers as shipped, beside the bf16 peer
CHAIN_PROFILE_COMMIT = "fbe952b"  # moe-bench --profile, Qwen3-like T = 1 and 8, both modes (the chain kernel by kernel)
DUAL_96_COMMIT = "93846e4"  # moe-bench --dual-96 off on (the dual tier of 65-128 rows, narrowed to 64 after it)
DUAL_64_COMMIT = "a3a7d06"  # moe-bench --dual-96 0 64 (the tiles up to 64 rows per expert, as shipped)
WIDE_COMMIT = "051a36f"  # the wide decode form's A/B (its code left the package after it; git keeps it there)
DEEP_COMMIT = "178dc1f"  # the deep decode form's A/B (likewise)
FUSE_COMMIT = "e44cfb2"  # hopper_varlen.kernel.FUSE_MAX_ROWS's A/B
CHAIN_COMMITS = ("0797664", "c1591b1", "a97ae1f")  # kernels.common.pdl: first A/B, second A/B, the shipped form's run
TIMELINE_COMMIT = "ad6bb18"  # moe-bench --timeline's run (per-CTA stamps: a probe, its rows not shipped)
OPERAND_COMMITS = ("0476cd6", "cb7456c", "1bf0e0a")  # nn.moe.QUANT_TO_OPERAND: first A/B, second A/B, shipped run
STATIC_COMMIT = "aaf13ca"  # moe-bench --input-scales dynamic static (W4A4)
PREFETCH_COMMIT = "b9eb5b9"  # nn.moe.PREFETCH_L2's A/B (its code left the package after it; git keeps it there)
PREWAIT_COMMITS = ("488aabc", "a7f6fab", "0df7533")  # kernel.PREWAIT_STAGES: first A/B (+ timeline), second, shipped
PREWAIT_EAGER_COMMIT = "14b59e8"  # PREWAIT_STAGES 0 2 2 0 in one run, each row with the host's speed after it
PAIR_MIN_COMMIT = "7ddfa5f"  # moe-bench --pair-min-k-tiles 16 8 16 8 --profile (Qwen3-like T = 1, both modes)
# moe-bench --route-gather 0 1 0 1 --profile (W4A16, Qwen3- and Mixtral-like T = 1, 8, 64; then 0 1 DeepSeek-like T = 1,
# 8): the first run, with the race (the route-gather arm wrong at T <= 8), then the fixed form's
ROUTE_GATHER_COMMITS = ("7ddfa5f", "3103cdb")
DECODE_H200_2_COMMIT = "3103cdb"  # moe-bench at T = 1, 8, 64 as shipped (route-gather in), beside the bf16 peer
CHAIN_A16_COMMIT = "23157ef"  # moe-bench --chain-gemm-a16 0 1 0 1 --profile (W4A16, T = 1 and 8; DeepSeek-like 0 1)
STATIC_SHIPPED_COMMIT = "dfdd33e"  # moe-bench --input-scales dynamic static, W4A4, T = 1, 8, 64, the layers as shipped
EARLY_DESC_COMMIT = "17ce2e5"  # moe-bench --early-descriptors 0 1 0 1 --profile (T = 1, 8, both modes; DeepSeek 0 1)
HANDOFF_WAIT_COMMIT = "3881c0e"  # moe-bench --handoff-wait 0 1 1 0 (three layers, T = 1 and 8, both modes, uniform)
# moe-bench --combine-in-gemm 0 1 0 1 --profile (T = 1, 8, both modes; DeepSeek-like 0 1): the first form (each copy's
# row, then its value, loaded in turn), then the second (top-k at compile time, the copies loaded together)
COMBINE_COMMITS = ("d305cae", "313e023")
# moe-bench --decode-s5: the 5-stage 16-token tiles on every decode call (off on on off, T = 1, 8), then with the
# shipped rule, at least 4 CTAs per SM of the grid (on off off on, T = 1, 8, 64, both routings)
DECODE_S5_COMMITS = ("807284b", "e5f54db")
DECODE_T32_COMMIT = "1b7b088"  # moe-bench --decode-t32-s4 off on on off (Mixtral-like T = 64, Qwen3-like T = 256, ...)
# moe-bench --decode-pair off on on off --profile (T = 1, 8, 64, both modes and routings: both tiers), then the
# 32-token tier shipped alone (T = 256, 512)
DECODE_PAIR_COMMITS = ("5f95b54", "cccf53e")
RAW_SCALE_COMMIT = "928c2a9"  # moe-bench --raw-scale 0 1 1 0 --profile (W4A4, T = 1, 8, 64, 4096, both routings)
AMAX_ROUTE_COMMIT = "0ad3277"  # moe-bench --amax-in-route 0 1 0 1 --profile (W4A4, T = 1 and 8; DeepSeek-like 0 1)
# moe-bench --narrow-pair off on on off --profile: the two-block tier on every narrow call whose grid keeps a CTA per SM
# (three layers, T = 1, 8, both modes and routings), then with the rule by slice length (Mixtral- and DeepSeek-like)
NARROW_PAIR_COMMITS = ("e44c601", "e96e92d")
