#!/usr/bin/env bash
# fused activation decode with the loads after the proxy fence (a fence waits for the thread's outstanding loads)
# ran at commit 171c302 (the *_f configs were removed after it)
set -o pipefail
source .gpu/env.sh || exit 1
SF="rs_m128_t128_k128_s4_e_f rs_m128_t96_k128_s3_e_f"
DF="rs_dual_m128_t128_k128_s4_f rs_dual_m64_t96_k128_s3_e_f"
B=""; for c in $SF $DF; do B="$B --backend cute-hopper:config=$c"; done
timeout 100 python -m nvfp4lib check $B --suite correctness --suite benchmark --suite correctness-dual --suite dual --modes uniform > $OUT/check.log 2>&1
echo "ok: $(grep -c '^ok' $OUT/check.log)"; grep -v "^ok" $OUT/check.log | tail -4
timeout 90 python wip/rs/profile.py S4,S3,S1 rs_m128_t128_k128_s4_e,$(echo $SF | tr ' ' ',') 2>&1 | grep -v -i warn | tee $OUT/profile.log
timeout 60 python wip/rs/profile.py S4-dual,S1-dual rs_dual_m128_t128_k128_s4,$(echo $DF | tr ' ' ',') 2>&1 | grep -v -i warn | tee -a $OUT/profile.log
