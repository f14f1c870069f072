#!/usr/bin/env bash
# a repeat of the S4 / S4-dual comparison with every peer (the spread of the one shape still over 2x)
set -o pipefail
source .gpu/env.sh || exit 1
export NVFP4LIB_GIT_COMMIT=b3cfc8efb9bde45bb084b177b4ca30abaa00286e
PEERS="--backend triton:graph=1 --backend torch-grouped-mm:graph=1 --backend torch-bf16:graph=1 --backend torch-bf16:strategy=streams,graph=1 --backend torch-compile:graph=1 --backend torch-dequant:graph=1"
timeout 250 python -m nvfp4lib bench --problem S4 --problem S4-dual --backend cute-hopper:graph=1 $PEERS --iters 30 --no-record --out $OUT/bench.jsonl 2>&1 | grep -A30 "^problem"
