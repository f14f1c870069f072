#!/usr/bin/env bash
# variable wgmma N per tile (token_step variants), makespan-planned token tiles, widest tiles first
set -o pipefail
source .gpu/env.sh || exit 1
S="rs_m128_t256_k128_s3_v32 rs_m128_t128_k128_s4_v16 rs_m128_t192_k128_s3_v32"
D="rs_dual_m64_t256_k128_s3_v32 rs_dual_m64_t128_k128_s4_v16 rs_dual_m128_t128_k128_s4_v16"
B=""; for c in $S; do B="$B --backend cute-hopper:config=$c"; done
timeout 240 python -m nvfp4lib check $B --suite correctness --suite edge --suite benchmark --modes uniform gaussian > $OUT/check_single.log 2>&1
echo "single ok: $(grep -c '^ok' $OUT/check_single.log)"; grep -v "^ok" $OUT/check_single.log | tail -8
BD=""; for c in $D; do BD="$BD --backend cute-hopper:config=$c"; done
timeout 200 python -m nvfp4lib check $BD --suite correctness-dual --suite dual --problem E3-ragged-dual --problem E1-empty-group-dual --modes uniform gaussian > $OUT/check_dual.log 2>&1
echo "dual ok: $(grep -c '^ok' $OUT/check_dual.log)"; grep -v "^ok" $OUT/check_dual.log | tail -8
timeout 150 python wip/rs/profile.py S1,S2,S3,S4 $(echo $S | tr ' ' ','),rs_m128_t128_k128_s4,rs_m128_t96_k128_s3 2>&1 | grep -v -i warn | tee $OUT/profile.log
timeout 100 python wip/rs/profile.py S1-dual,S2-dual,S3-dual,S4-dual $(echo $D | tr ' ' ','),rs_dual_m128_t128_k128_s4 2>&1 | grep -v -i warn | tee -a $OUT/profile.log
