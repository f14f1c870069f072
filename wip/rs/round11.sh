#!/usr/bin/env bash
# one-trip table row in the prologue, robust auto: exactness, then the same-run comparison with every peer
set -o pipefail
source .gpu/env.sh || exit 1
export NVFP4LIB_GIT_COMMIT=84fac664b628bf2fd51de5318ed124d954aead77
B=""; for c in rs_m128_t96_k128_s3_e rs_m128_t128_k128_s4_e rs_m128_t64_k128_s4_e; do B="$B --backend cute-hopper:config=$c"; done
timeout 120 python -m nvfp4lib check $B --suite correctness --suite edge --suite benchmark --modes gaussian > $OUT/check_single.log 2>&1
echo "single ok: $(grep -c '^ok' $OUT/check_single.log)"; grep -v "^ok" $OUT/check_single.log | tail -5
grep -q "^0 failure" $OUT/check_single.log || exit 1
PEERS="--backend triton:graph=1 --backend torch-grouped-mm:graph=1 --backend torch-bf16:graph=1 --backend torch-bf16:strategy=streams,graph=1 --backend torch-compile:graph=1 --backend torch-dequant:graph=1"
timeout 300 python -m nvfp4lib bench --suite benchmark --suite dual --backend cute-hopper:graph=1 --backend cute-hopper $PEERS --iters 30 --no-record --out $OUT/bench.jsonl 2>&1 | grep -A80 "^problem" | grep "cute-hopper\|problem"
