#!/usr/bin/env bash
# act_decode="fused" (no prologue launch) and the split dual epilogue: exactness first, then per-kernel time
set -o pipefail
source .gpu/env.sh || exit 1
SF="rs_m128_t128_k128_s4_f rs_m128_t128_k128_s8_f rs_m128_t96_k128_s3_f rs_m128_t256_k128_s3_v32_f"
DF="rs_dual_m128_t128_k128_s4 rs_dual_m128_t128_k128_s4_f rs_dual_m64_t96_k128_s3_f rs_dual_m64_t256_k128_s3_v32_f"
B=""; for c in $SF; do B="$B --backend cute-hopper:config=$c"; done
BD=""; for c in $DF; do BD="$BD --backend cute-hopper:config=$c"; done
timeout 150 python -m nvfp4lib check $B --suite correctness --problem S4 --problem E1-empty-group --modes uniform > $OUT/check_single.log 2>&1
echo "single ok: $(grep -c '^ok' $OUT/check_single.log)"; grep -v "^ok" $OUT/check_single.log | tail -6
timeout 150 python -m nvfp4lib check $BD --suite correctness-dual --problem S4-dual --problem E1-empty-group-dual --modes uniform > $OUT/check_dual.log 2>&1
echo "dual ok: $(grep -c '^ok' $OUT/check_dual.log)"; grep -v "^ok" $OUT/check_dual.log | tail -6
timeout 120 python wip/rs/profile.py S4,S3,S2,S1 $(echo $SF | tr ' ' ','),rs_m128_t128_k128_s4 2>&1 | grep -v -i warn | tee $OUT/profile.log
timeout 100 python wip/rs/profile.py S4-dual,S3-dual,S1-dual $(echo $DF | tr ' ' ',') 2>&1 | grep -v -i warn | tee -a $OUT/profile.log
