#!/usr/bin/env bash
# the prologue takes up to 16 groups' addresses as kernel parameters (no row table) and asks for 32 KB of shared memory:
# exactness, A/B on S4/S3, then the same-run comparison of the default (auto) with every peer
set -o pipefail
source .gpu/env.sh || exit 1
export NVFP4LIB_GIT_COMMIT=$(cat wip/rs/COMMIT 2>/dev/null || echo unknown)
timeout 90 python -m nvfp4lib check --backend cute-hopper:config=rs_m128_t128_k128_s3_e --backend cute-hopper:config=rs_m128_t96_k128_s3_e --suite correctness --suite edge --suite benchmark --modes gaussian > $OUT/check_single.log 2>&1
timeout 40 python -m nvfp4lib check --backend cute-hopper:config=rs_dual_m128_t128_k128_s3 --suite correctness-dual --suite dual --modes gaussian > $OUT/check_dual.log 2>&1
echo "single ok: $(grep -c '^ok' $OUT/check_single.log) dual ok: $(grep -c '^ok' $OUT/check_dual.log)"; grep -hE "^FAIL|failure" $OUT/check_*.log
grep -q "^0 failure" $OUT/check_single.log && grep -q "^0 failure" $OUT/check_dual.log || exit 1
timeout 60 python wip/rs/diag30.py S4,S3 rs_m128_t128_k128_s3_e 2>&1 | grep -v Warn | tee $OUT/diag30.log
PEERS="--backend triton:graph=1 --backend torch-grouped-mm:graph=1 --backend torch-bf16:graph=1 --backend torch-bf16:strategy=streams,graph=1 --backend torch-compile:graph=1 --backend torch-dequant:graph=1"
timeout 300 python -m nvfp4lib bench --suite benchmark --suite dual --backend cute-hopper:graph=1 $PEERS --iters 30 --no-record --out $OUT/bench.jsonl 2>&1 | grep -A80 "^problem" | grep "cute-hopper\|problem"
