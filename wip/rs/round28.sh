#!/usr/bin/env bash
# the prologue prefetches each CTA block's first weight stages into L2: canary, A/B event times, S4 timeline
set -o pipefail
source .gpu/env.sh || exit 1
timeout 60 python -m nvfp4lib check --backend cute-hopper:config=rs_m128_t128_k128_s3_e --backend cute-hopper:config=rs_dual_m128_t128_k128_s3 --problem C7 --problem S4 --problem E4-2880 --problem S4-dual --modes gaussian > $OUT/canary.log 2>&1
grep -E "^FAIL|failure" $OUT/canary.log; grep -q "^0 failure" $OUT/canary.log || { echo "canary failed"; exit 1; }
timeout 150 python wip/rs/diag28.py S4,S3,S2,S1 rs_m128_t128_k128_s3_e 2>&1 | grep -v Warn | tee $OUT/diag28.log
timeout 40 python wip/rs/diag28.py S4-dual,S3-dual rs_dual_m128_t128_k128_s3 2>&1 | grep -v Warn | tee -a $OUT/diag28.log
timeout 40 python wip/rs/diag24.py S4:rs_m128_t128_k128_s3_e_timeline 2>&1 | grep -v Warn | head -8 | tee $OUT/timeline.log
