#!/usr/bin/env bash
# round 4 on the swap-AB kernel: ping-pong (_pp) beside none and producer/consumer (_dw), same tile, SIMT epilogue:
# canary, exactness on every single-GEMM suite, then one bench run of the three with a peer (recorded)
set -o pipefail
source .gpu/env.sh || exit 1
export NVFP4LIB_GIT_COMMIT=$(cat wip/rs/COMMIT 2>/dev/null || echo unknown)
P=rs_m128_t128_k128_s4_pp
timeout 45 python -m nvfp4lib check --backend cute-hopper:config=$P --problem C7 --problem S4 --problem C1 --modes uniform > $OUT/canary.log 2>&1
grep -E "^FAIL|failure" $OUT/canary.log; grep -q "^0 failure" $OUT/canary.log || { echo "canary failed"; tail -3 $OUT/canary.log; exit 1; }
timeout 100 python -m nvfp4lib check --backend cute-hopper:config=$P --backend cute-hopper:config=rs_m128_t128_k128_s4_dw --suite correctness --suite edge --suite benchmark --modes gaussian > $OUT/check.log 2>&1
echo "ok: $(grep -c '^ok' $OUT/check.log)"; grep -E "^FAIL|failure" $OUT/check.log
B=""; for c in rs_m128_t128_k128_s4 rs_m128_t128_k128_s4_dw $P; do B="$B --backend cute-hopper:config=$c,graph=1"; done
timeout 150 python -m nvfp4lib bench --suite benchmark $B --backend torch-grouped-mm:graph=1 --iters 30 --no-record --out $OUT/bench.jsonl 2>&1 | grep -A20 "^problem"
