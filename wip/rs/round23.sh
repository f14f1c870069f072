#!/usr/bin/env bash
# launch mode: the same runner launched directly vs replayed as a CUDA graph (events, L2 flushed)
set -o pipefail
source .gpu/env.sh || exit 1
python wip/rs/diag23.py S4:rs_m128_t128_k128_s4_e,S3:rs_m128_t128_k128_s4_e,S2:rs_m128_t96_k128_s3_e,S4-dual:rs_dual_m128_t128_k128_s4,S1:rs_m128_t128_k128_s5_e 2>&1 | grep -v Warning | tee $OUT/diag23.log
