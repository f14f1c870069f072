#!/usr/bin/env bash
# per-CTA timelines (globaltimer) of the S4 GEMM, with and without its prologue
set -o pipefail
source .gpu/env.sh || exit 1
python wip/rs/diag24.py S4:rs_m128_t128_k128_s4_e_timeline,S4:rs_m128_t128_k128_s4_timeline,S4-dual:rs_dual_m128_t128_k128_s4_timeline,S3:rs_m128_t128_k128_s4_e_timeline 2>&1 | grep -v Warning | tee $OUT/diag24.log
