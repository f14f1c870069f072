#!/usr/bin/env bash
# diagnosis of S4's fixed costs (no code change): graphs of prologue+GEMM, GEMM alone, prologue alone, K = 128..3072
set -o pipefail
source .gpu/env.sh || exit 1
python wip/rs/diag22.py rs_m128_t128_k128_s4_e,rs_m128_t128_k128_s4 2>&1 | tee $OUT/diag22.log | grep -v Warning
python wip/rs/profile.py S4 rs_m128_t128_k128_s4_e 2>&1 | tail -2
