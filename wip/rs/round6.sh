#!/usr/bin/env bash
# non-blocking refill: exactness of the auto candidates, then the same-run comparison with every peer (single, dual)
set -o pipefail
source .gpu/env.sh || exit 1
export NVFP4LIB_GIT_COMMIT=b19f1e567ba7500a67eec97a7709f8be65a3bff2
B=""; for c in rs_m128_t96_k128_s3 rs_m128_t128_k128_s4 rs_m128_t256_k128_s3_v32; do B="$B --backend cute-hopper:config=$c"; done
timeout 150 python -m nvfp4lib check $B --suite correctness --suite edge --suite benchmark --modes gaussian > $OUT/check_single.log 2>&1
echo "single ok: $(grep -c '^ok' $OUT/check_single.log)"; grep -v "^ok" $OUT/check_single.log | tail -5
B=""; for c in rs_dual_m64_t96_k128_s3 rs_dual_m128_t128_k128_s4 rs_dual_m64_t256_k128_s3_v32; do B="$B --backend cute-hopper:config=$c"; done
timeout 150 python -m nvfp4lib check $B --suite correctness-dual --suite dual --problem E3-ragged-dual --modes gaussian > $OUT/check_dual.log 2>&1
echo "dual ok: $(grep -c '^ok' $OUT/check_dual.log)"; grep -v "^ok" $OUT/check_dual.log | tail -5
PEERS="--backend triton:graph=1 --backend torch-grouped-mm:graph=1 --backend torch-bf16:graph=1 --backend torch-bf16:strategy=streams,graph=1 --backend torch-compile:graph=1 --backend torch-dequant:graph=1"
timeout 250 python -m nvfp4lib bench --suite benchmark --suite dual --backend cute-hopper:graph=1 --backend cute-hopper $PEERS --iters 30 --no-record --out $OUT/bench.jsonl 2>&1 | grep -A80 "^problem" | grep "cute-hopper\|problem"
