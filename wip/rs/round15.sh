#!/usr/bin/env bash
# does PDL overlap the prologue with the GEMM? the span of one call (first kernel start to last kernel end) vs the sum
set -o pipefail
source .gpu/env.sh || exit 1
timeout 100 python wip/rs/profile.py S4,S4-dual,S3 rs_m128_t128_k128_s4_e,rs_dual_m128_t128_k128_s4 2>&1 | grep -v -i warn | tee $OUT/profile.log
