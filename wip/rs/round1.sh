#!/usr/bin/env bash
# swap-AB kernel, first GPU contact: correctness on every suite, then S1-S4 (+dual) timing beside the current default.
set -o pipefail
source .gpu/env.sh || exit 1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
S="rs_t32_k256_s6 rs_t64_k256_s4 rs_t128_k128_s4 rs_t128_k256_s2 rs_t256_k128_s3"
B=""; for c in $S; do B="$B --backend cute-hopper:config=$c"; done
timeout 200 python -m nvfp4lib check $B --suite correctness --suite edge --suite benchmark --modes uniform gaussian > $OUT/check_single.log 2>&1
grep -c "^ok" $OUT/check_single.log; grep -v "^ok" $OUT/check_single.log | tail -15
timeout 100 python -m nvfp4lib check --backend cute-hopper:config=rs_dual_t64_k256_s4 --backend cute-hopper:config=rs_dual_t128_k128_s4 --suite correctness-dual --suite dual --problem E3-ragged-dual --modes uniform gaussian > $OUT/check_dual.log 2>&1
grep -c "^ok" $OUT/check_dual.log; grep -v "^ok" $OUT/check_dual.log | tail -15
BB=""; for c in $S; do BB="$BB --backend cute-hopper:config=$c,graph=1"; done
timeout 200 python -m nvfp4lib bench --suite benchmark $BB --backend cute-hopper:graph=1 --iters 20 --no-record --out $OUT/bench_single.jsonl 2>&1 | grep -A60 "^problem" 
timeout 100 python -m nvfp4lib bench --suite dual --backend cute-hopper:config=rs_dual_t64_k256_s4,graph=1 --backend cute-hopper:config=rs_dual_t128_k128_s4,graph=1 --backend cute-hopper:graph=1 --iters 20 --no-record --out $OUT/bench_dual.jsonl 2>&1 | grep -A30 "^problem"
