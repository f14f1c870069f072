#!/usr/bin/env bash
# the decode warpgroup with coalesced loads (consecutive threads read one row): canary, exactness, kernel times, then
# the same-run comparison of the default (auto: prologue and _dw candidates) with every peer
set -o pipefail
source .gpu/env.sh || exit 1
export NVFP4LIB_GIT_COMMIT=$(cat wip/rs/COMMIT 2>/dev/null || echo unknown)
timeout 40 python -m nvfp4lib check --backend cute-hopper:config=rs_m128_t128_k128_s4_e_dw --problem C7 --problem S4 --problem E4-2880 > $OUT/canary.log 2>&1
grep -E "^FAIL|failure" $OUT/canary.log; grep -q "^0 failure" $OUT/canary.log || { echo "canary failed"; exit 1; }
S="--backend cute-hopper:config=rs_m128_t128_k128_s4_e_dw --backend cute-hopper:config=rs_m128_t96_k128_s3_e_dw --backend cute-hopper:config=rs_m128_t64_k128_s4_e_dw"
timeout 100 python -m nvfp4lib check $S --suite correctness --suite edge --suite benchmark --modes gaussian > $OUT/check_single.log 2>&1
timeout 40 python -m nvfp4lib check --backend cute-hopper:config=rs_dual_m64_t96_k128_s3_e_dw --suite correctness-dual --suite dual --modes gaussian > $OUT/check_dual.log 2>&1
echo "single ok: $(grep -c '^ok' $OUT/check_single.log) dual ok: $(grep -c '^ok' $OUT/check_dual.log)"; grep -hE "^FAIL|failure" $OUT/check_*.log
grep -q "^0 failure" $OUT/check_single.log || exit 1
timeout 60 python wip/rs/profile.py S4,S3,S1 rs_m128_t128_k128_s4_e,rs_m128_t128_k128_s4_e_dw,rs_m128_t64_k128_s4_e_dw 2>&1 | grep -v -i warn | tee $OUT/profile.log
PEERS="--backend triton:graph=1 --backend torch-grouped-mm:graph=1 --backend torch-bf16:graph=1 --backend torch-bf16:strategy=streams,graph=1 --backend torch-compile:graph=1 --backend torch-dequant:graph=1"
timeout 280 python -m nvfp4lib bench --suite benchmark --suite dual --backend cute-hopper:graph=1 $PEERS --iters 30 --no-record --out $OUT/bench.jsonl 2>&1 | grep -A80 "^problem" | grep "cute-hopper\|problem"
