#!/usr/bin/env bash
# the prologue asks for 32 KB of dynamic shared memory (unused) so that its SMs run with a large carveout and the GEMM's
# CTAs can start beside it: A/B event times and S4 timelines
set -o pipefail
source .gpu/env.sh || exit 1
timeout 150 python wip/rs/diag29.py S4,S3,S2,S1 rs_m128_t128_k128_s3_e 2>&1 | grep -v Warn | tee $OUT/diag29.log
timeout 40 python wip/rs/diag29.py S4-dual,S3-dual rs_dual_m128_t128_k128_s3 2>&1 | grep -v Warn | tee -a $OUT/diag29.log
for smem in 0 32768; do timeout 40 python -c "
import sys, runpy
from nvfp4lib.kernels import hopper_rs
hopper_rs.ACT_SMEM = $smem
sys.argv = ['diag24.py', 'S4:rs_m128_t128_k128_s3_e_timeline']
print('ACT_SMEM', $smem)
runpy.run_path('wip/rs/diag24.py', run_name='__main__')
" 2>&1 | grep -v Warn | head -9 | tee -a $OUT/timeline.log; done
