#!/usr/bin/env bash
# the prologue-mode kernel after this session's changes (weight tile count from the weights, alpha in the epilogue's
# arguments): every auto candidate on the correctness and edge suites (single) and correctness-dual (dual)
set -o pipefail
source .gpu/env.sh || exit 1
B=""; for c in rs_m128_t96_k128_s3_e rs_m128_t128_k128_s4_e rs_m128_t128_k128_s5_e rs_m128_t64_k128_s4_e rs_m128_t256_k128_s3_v32_e; do B="$B --backend cute-hopper:config=$c"; done
timeout 110 python -m nvfp4lib check $B --suite correctness --suite edge --modes gaussian > $OUT/check_single.log 2>&1
echo "single ok: $(grep -c '^ok' $OUT/check_single.log)"; grep -E "^FAIL|failure" $OUT/check_single.log
B=""; for c in rs_dual_m64_t96_k128_s3_e rs_dual_m128_t128_k128_s4_e rs_dual_m128_t128_k128_s4 rs_dual_m64_t256_k128_s3_v32_e; do B="$B --backend cute-hopper:config=$c"; done
timeout 60 python -m nvfp4lib check $B --suite correctness-dual --modes gaussian > $OUT/check_dual.log 2>&1
echo "dual ok: $(grep -c '^ok' $OUT/check_dual.log)"; grep -E "^FAIL|failure" $OUT/check_dual.log
