#!/usr/bin/env bash
# act_decode="inline" (configs *_e_i): canary, exactness, event times against the prologue configs, S4 timeline
set -o pipefail
source .gpu/env.sh || exit 1
I="rs_m128_t128_k128_s6_e_i rs_m128_t96_k128_s6_e_i rs_m128_t64_k128_s8_e_i"
B=""; for c in $I; do B="$B --backend cute-hopper:config=$c"; done
timeout 60 python -m nvfp4lib check --backend cute-hopper:config=rs_m128_t128_k128_s6_e_i --problem C7 --problem S4 > $OUT/canary.log 2>&1
cat $OUT/canary.log | grep -v Warn | tail -4; grep -q "^0 failure" $OUT/canary.log || { echo "canary failed"; exit 1; }
timeout 120 python -m nvfp4lib check $B --suite correctness --suite benchmark --modes gaussian > $OUT/check.log 2>&1
echo "ok: $(grep -c '^ok' $OUT/check.log)"; grep -hE "^FAIL|failure" $OUT/check.log | head
timeout 150 python wip/rs/diag25.py S4,S3,S2,S1 rs_m128_t128_k128_s4_e,rs_m128_t128_k128_s5_e,rs_m128_t96_k128_s3_e,rs_m128_t128_k128_s6_e_i,rs_m128_t96_k128_s6_e_i,rs_m128_t64_k128_s8_e_i 2>&1 | grep -v Warn | tee $OUT/diag25.log
timeout 60 python wip/rs/diag24.py S4:rs_m128_t128_k128_s6_e_i_timeline 2>&1 | grep -v Warn | head -8
