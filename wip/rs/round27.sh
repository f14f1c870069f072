#!/usr/bin/env bash
# the three-stage candidates (single rs_m128_t128_k128_s3_e, dual rs_dual_m128_t128_k128_s3) joined auto: exactness,
# S4's timeline with three stages, then the same-run comparison of the default (auto) with every peer
set -o pipefail
source .gpu/env.sh || exit 1
export NVFP4LIB_GIT_COMMIT=$(cat wip/rs/COMMIT 2>/dev/null || echo unknown)
timeout 40 python -m nvfp4lib check --backend cute-hopper:config=rs_m128_t128_k128_s3_e --problem C7 --problem S4 --problem E4-2880 > $OUT/canary.log 2>&1
grep -E "^FAIL|failure" $OUT/canary.log; grep -q "^0 failure" $OUT/canary.log || { echo "canary failed"; exit 1; }
timeout 100 python -m nvfp4lib check --backend cute-hopper:config=rs_m128_t128_k128_s3_e --suite correctness --suite edge --suite benchmark --modes gaussian > $OUT/check_single.log 2>&1
timeout 60 python -m nvfp4lib check --backend cute-hopper:config=rs_dual_m128_t128_k128_s3 --suite correctness-dual --suite dual --modes gaussian > $OUT/check_dual.log 2>&1
echo "single ok: $(grep -c '^ok' $OUT/check_single.log) dual ok: $(grep -c '^ok' $OUT/check_dual.log)"; grep -hE "^FAIL|failure" $OUT/check_*.log
timeout 40 python wip/rs/diag24.py S4:rs_m128_t128_k128_s3_e_timeline > $OUT/timeline_s3.log 2>&1
PEERS="--backend triton:graph=1 --backend torch-grouped-mm:graph=1 --backend torch-bf16:graph=1 --backend torch-bf16:strategy=streams,graph=1 --backend torch-compile:graph=1 --backend torch-dequant:graph=1"
timeout 300 python -m nvfp4lib bench --suite benchmark --suite dual --backend cute-hopper:graph=1 $PEERS --iters 30 --no-record --out $OUT/bench.jsonl 2>&1 | grep -A80 "^problem" | grep "cute-hopper\|problem"
