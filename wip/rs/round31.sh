#!/usr/bin/env bash
# the prologue with group parameters under every auto candidate (the prologue is shared): correctness and edge suites
set -o pipefail
source .gpu/env.sh || exit 1
B=""; for c in rs_m128_t96_k128_s3_e rs_m128_t128_k128_s4_e rs_m128_t128_k128_s5_e rs_m128_t64_k128_s4_e rs_m128_t256_k128_s3_v32_e; do B="$B --backend cute-hopper:config=$c"; done
timeout 100 python -m nvfp4lib check $B --suite correctness --suite edge --modes gaussian > $OUT/check_single.log 2>&1
echo "single ok: $(grep -c '^ok' $OUT/check_single.log)"; grep -hE "^FAIL|failure" $OUT/check_single.log
B=""; for c in rs_dual_m64_t96_k128_s3_e rs_dual_m128_t128_k128_s4_e rs_dual_m128_t128_k128_s4 rs_dual_m64_t256_k128_s3_v32_e; do B="$B --backend cute-hopper:config=$c"; done
timeout 50 python -m nvfp4lib check $B --suite correctness-dual --modes gaussian > $OUT/check_dual.log 2>&1
echo "dual ok: $(grep -c '^ok' $OUT/check_dual.log)"; grep -hE "^FAIL|failure" $OUT/check_dual.log
