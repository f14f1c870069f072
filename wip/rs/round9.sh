#!/usr/bin/env bash
# staged epilogue (_e) against per-element stores; the split dual epilogue re-checked after the refactor
set -o pipefail
source .gpu/env.sh || exit 1
S="rs_m128_t96_k128_s3_e rs_m128_t128_k128_s4_e rs_m128_t256_k128_s3_v32_e"
D="rs_dual_m64_t96_k128_s3_e rs_dual_m128_t128_k128_s4_e rs_dual_m64_t256_k128_s3_v32_e rs_dual_m64_t96_k128_s3 rs_dual_m128_t128_k128_s4 rs_dual_m64_t256_k128_s3_v32"
B=""; for c in $S; do B="$B --backend cute-hopper:config=$c"; done
BD=""; for c in $D; do BD="$BD --backend cute-hopper:config=$c"; done
timeout 200 python -m nvfp4lib check $B --suite correctness --suite edge --suite benchmark --modes uniform > $OUT/check_single.log 2>&1
echo "single ok: $(grep -c '^ok' $OUT/check_single.log)"; grep -v "^ok" $OUT/check_single.log | tail -6
timeout 200 python -m nvfp4lib check $BD --suite correctness-dual --suite dual --problem E3-ragged-dual --problem E1-empty-group-dual --modes uniform > $OUT/check_dual.log 2>&1
echo "dual ok: $(grep -c '^ok' $OUT/check_dual.log)"; grep -v "^ok" $OUT/check_dual.log | tail -6
timeout 100 python wip/rs/profile.py S4,S3,S2,S1 rs_m128_t96_k128_s3,rs_m128_t128_k128_s4,rs_m128_t256_k128_s3_v32,$(echo $S | tr ' ' ',') 2>&1 | grep -v -i warn | tee $OUT/profile.log
timeout 100 python wip/rs/profile.py S4-dual,S3-dual,S2-dual,S1-dual $(echo $D | tr ' ' ',') 2>&1 | grep -v -i warn | tee -a $OUT/profile.log
