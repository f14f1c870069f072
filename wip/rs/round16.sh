#!/usr/bin/env bash
# act_decode="warpgroup" (_dw): exactness of the new configs, then where the time goes (profile) and a same-run
# comparison against the prologue configs on S1-S4 and the duals (no peers: they come in the final run)
set -o pipefail
source .gpu/env.sh || exit 1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
export NVFP4LIB_GIT_COMMIT=$(cat wip/rs/COMMIT 2>/dev/null || echo unknown)
# canary: K tiles beyond the stages (C7: 6 > 4; C1-dual: 4 > 3) hung the first version
timeout 60 python -m nvfp4lib check --backend cute-hopper:config=rs_m128_t128_k128_s4_e_dw --problem C7 --problem S2 2>&1 | grep -v -i warn | tail -4
timeout 60 python -m nvfp4lib check --backend cute-hopper:config=rs_dual_m64_t96_k128_s3_e_dw --problem C1-dual 2>&1 | grep -v -i warn | tail -3
S="--backend cute-hopper:config=rs_m128_t128_k128_s4_e_dw --backend cute-hopper:config=rs_m128_t96_k128_s3_e_dw --backend cute-hopper:config=rs_m128_t64_k128_s4_e_dw"
timeout 150 python -m nvfp4lib check $S --suite correctness --suite edge --suite benchmark --modes gaussian > $OUT/check_single.log 2>&1
echo "single ok: $(grep -c '^ok' $OUT/check_single.log)"; grep -v "^ok" $OUT/check_single.log | grep -v -i warn | tail -6
timeout 90 python -m nvfp4lib check --backend cute-hopper:config=rs_dual_m64_t96_k128_s3_e_dw --suite correctness-dual --suite dual --modes gaussian > $OUT/check_dual.log 2>&1
echo "dual ok: $(grep -c '^ok' $OUT/check_dual.log)"; grep -v "^ok" $OUT/check_dual.log | grep -v -i warn | tail -6
grep -q "^0 failure" $OUT/check_single.log || exit 1
timeout 100 python wip/rs/profile.py S4,S3,S2,S1 rs_m128_t128_k128_s4_e,rs_m128_t128_k128_s4_e_dw,rs_m128_t96_k128_s3_e_dw,rs_m128_t64_k128_s4_e_dw 2>&1 | grep -v -i warn | tee $OUT/profile.log
timeout 50 python wip/rs/profile.py S4-dual,S2-dual rs_dual_m64_t96_k128_s3_e,rs_dual_m64_t96_k128_s3_e_dw 2>&1 | grep -v -i warn | tee -a $OUT/profile.log
B=""; for c in rs_m128_t128_k128_s4_e rs_m128_t128_k128_s4_e_dw rs_m128_t96_k128_s3_e rs_m128_t96_k128_s3_e_dw rs_m128_t64_k128_s4_e_dw rs_dual_m64_t96_k128_s3_e rs_dual_m64_t96_k128_s3_e_dw rs_dual_m128_t128_k128_s4; do B="$B --backend cute-hopper:config=$c,graph=1"; done
timeout 150 python -m nvfp4lib bench --suite benchmark --suite dual $B --iters 30 --no-record --out $OUT/bench.jsonl 2>&1 | grep -A80 "^problem"
