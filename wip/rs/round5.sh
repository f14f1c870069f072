#!/usr/bin/env bash
# PDL + auto: exactness of the auto candidates on every suite, then the same-run comparison with every peer.
#   bash wip/rs/round5.sh check|single|dual
set -o pipefail
source .gpu/env.sh || exit 1
export NVFP4LIB_GIT_COMMIT=$(cat wip/rs/COMMIT 2>/dev/null)
PEERS="--backend triton:graph=1 --backend torch-grouped-mm:graph=1 --backend torch-bf16:graph=1 --backend torch-bf16:strategy=streams,graph=1 --backend torch-compile:graph=1 --backend torch-dequant:graph=1"
OURS="--backend cute-hopper:graph=1 --backend cute-hopper --backend cute-hopper:config=baseline,graph=1 --backend cute-hopper:config=tile64x128_stages2_tma_batched_auto,graph=1"
case "$1" in
check)
  B=""; for c in rs_m128_t96_k128_s3 rs_m128_t128_k128_s4 rs_m128_t256_k128_s3_v32; do B="$B --backend cute-hopper:config=$c"; done
  timeout 240 python -m nvfp4lib check $B --suite correctness --suite edge --suite benchmark --modes uniform gaussian > $OUT/check_single.log 2>&1
  echo "single ok: $(grep -c '^ok' $OUT/check_single.log)"; grep -v "^ok" $OUT/check_single.log | tail -8
  B=""; for c in rs_dual_m64_t96_k128_s3 rs_dual_m128_t128_k128_s4 rs_dual_m64_t256_k128_s3_v32; do B="$B --backend cute-hopper:config=$c"; done
  timeout 200 python -m nvfp4lib check $B --suite correctness-dual --suite dual --problem E3-ragged-dual --problem E1-empty-group-dual --modes uniform gaussian > $OUT/check_dual.log 2>&1
  echo "dual ok: $(grep -c '^ok' $OUT/check_dual.log)"; grep -v "^ok" $OUT/check_dual.log | tail -8
  timeout 100 python -m nvfp4lib check --backend cute-hopper --suite benchmark --suite dual --suite edge --modes gaussian > $OUT/check_auto.log 2>&1
  echo "auto ok: $(grep -c '^ok' $OUT/check_auto.log)"; grep -v "^ok" $OUT/check_auto.log | tail -8
  ;;
single) timeout 560 python -m nvfp4lib bench --suite benchmark $OURS $PEERS --iters 30 --no-record --out $OUT/bench.jsonl 2>&1 | grep -A80 "^problem" ;;
dual) timeout 560 python -m nvfp4lib bench --suite dual $OURS $PEERS --iters 30 --no-record --out $OUT/bench.jsonl 2>&1 | grep -A80 "^problem" ;;
esac
case "$1" in
dual2)
  timeout 400 python -m nvfp4lib bench --suite dual $OURS $PEERS --iters 30 --no-record --out $OUT/bench.jsonl 2>&1 | grep -A80 "^problem"
  # S2 again: the auto runner, and its candidates by name, twice (was 73 us at prepare, 88 us in the bench)
  timeout 150 python -m nvfp4lib bench --problem S2 --problem S2 --backend cute-hopper:graph=1 --backend cute-hopper:config=rs_m128_t96_k128_s3,graph=1 --backend cute-hopper:config=rs_m128_t128_k128_s4,graph=1 --iters 30 --no-record --out $OUT/bench_s2.jsonl 2>&1 | grep -A20 "^problem" ;;
esac
