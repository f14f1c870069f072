#!/usr/bin/env bash
# where the time goes: per-kernel times, ablations, occupancy variants (2 CTAs/SM)
set -o pipefail
source .gpu/env.sh || exit 1
C=rs_t128_k128_s4,rs_t128_k128_s2,rs_t64_k128_s4,rs_t96_k128_s3,rs_t192_k128_s2,rs_t128_k128_s4_no_dequant,rs_t128_k128_s4_no_mma,rs_t64_k128_s4_no_dequant,rs_t64_k128_s4_no_mma
timeout 400 python wip/rs/profile.py S1,S2,S3,S4 $C 2>&1 | grep -v Warning | tee $OUT/profile.log
timeout 120 python wip/rs/profile.py S1-dual,S4-dual rs_dual_t128_k128_s4 2>&1 | tee -a $OUT/profile.log
