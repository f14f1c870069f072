#!/usr/bin/env bash
# act_decode="fused" with the weight-tile count fixed (it came from the activation tensor's width, which fused mode
# ran at commit 3eccde4 (the *_f configs were removed after it: exact, but slower than the prologue path)
# does not pass): exactness, then per-kernel time against the prologue path
set -o pipefail
source .gpu/env.sh || exit 1
timeout 60 python wip/rs/debug_fused.py 2>&1 | grep -v -i warn | grep rel_err
SF="rs_m128_t128_k128_s4_e_f rs_m128_t96_k128_s3_e_f"
DF="rs_dual_m128_t128_k128_s4_f rs_dual_m64_t96_k128_s3_e_f"
B=""; for c in $SF; do B="$B --backend cute-hopper:config=$c"; done
BD=""; for c in $DF; do BD="$BD --backend cute-hopper:config=$c"; done
timeout 120 python -m nvfp4lib check $B --suite correctness --suite edge --suite benchmark --modes uniform > $OUT/check_single.log 2>&1
echo "single ok: $(grep -c '^ok' $OUT/check_single.log)"; grep -v "^ok" $OUT/check_single.log | tail -4
timeout 120 python -m nvfp4lib check $BD --suite correctness-dual --suite dual --problem E1-empty-group-dual --modes uniform > $OUT/check_dual.log 2>&1
echo "dual ok: $(grep -c '^ok' $OUT/check_dual.log)"; grep -v "^ok" $OUT/check_dual.log | tail -4
timeout 100 python wip/rs/profile.py S4,S3,S2,S1 rs_m128_t128_k128_s4_e,$(echo $SF | tr ' ' ','),rs_m128_t96_k128_s3_e 2>&1 | grep -v -i warn | tee $OUT/profile.log
timeout 80 python wip/rs/profile.py S4-dual,S3-dual,S1-dual rs_dual_m128_t128_k128_s4,$(echo $DF | tr ' ' ','),rs_dual_m64_t96_k128_s3_e 2>&1 | grep -v -i warn | tee -a $OUT/profile.log
