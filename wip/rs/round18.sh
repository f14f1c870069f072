#!/usr/bin/env bash
# why the decode warpgroup is slow: its ablations (no global loads, no wgmma, no weight decode, no output stores)
# against the full _dw kernel and the prologue kernel, per-kernel GPU time and the span of one call
set -o pipefail
source .gpu/env.sh || exit 1
D=rs_m128_t128_k128_s4_e_dw
timeout 150 python wip/rs/profile.py S4,S1 rs_m128_t128_k128_s4_e,$D,${D}_no_xload,${D}_no_mma,${D}_no_dequant,${D}_no_store 2>&1 | grep -v -i warn | tee $OUT/profile.log
