#!/usr/bin/env bash
# per-CTA timelines (globaltimer) of the S4 GEMM, with and without its prologue
set -o pipefail
source .gpu/env.sh || exit 1
python wip/rs/diag24.py ${1:-S4:rs_m128_t128_k128_s4_e_timeline} 2>&1 | grep -v Warning | tee $OUT/diag24.log
