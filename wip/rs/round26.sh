#!/usr/bin/env bash
# fewer stages on the small shapes (a smaller first burst of loads): event times against s4/s5, S4 timelines
set -o pipefail
source .gpu/env.sh || exit 1
timeout 60 python -m nvfp4lib check --backend cute-hopper:config=rs_m128_t128_k128_s3_e --backend cute-hopper:config=rs_m128_t128_k128_s2_e --problem C7 --problem S4 --problem E4-2880 --modes gaussian > $OUT/canary.log 2>&1
grep -E "^FAIL|failure" $OUT/canary.log
timeout 150 python wip/rs/diag25.py S4,S3 rs_m128_t128_k128_s4_e,rs_m128_t128_k128_s3_e,rs_m128_t128_k128_s2_e 2>&1 | grep -v Warn | tee $OUT/diag26.log
timeout 60 python wip/rs/diag24.py S4:rs_m128_t128_k128_s3_e_timeline,S4:rs_m128_t128_k128_s2_e_timeline 2>&1 | grep -v Warn | grep -v "GEMM alone" | head -16
