#!/usr/bin/env bash
# issue 6's M-sweep with the swap-AB default (auto) beside the best peers, same run; $1 = commit for provenance,
# $2 = a problem-name filter (N4096 or N7168: one half fits a 10-minute call)
set -o pipefail
source .gpu/env.sh || exit 1
export NVFP4LIB_GIT_COMMIT=$(git rev-parse HEAD 2>/dev/null || true)
[ -n "$1" ] && export NVFP4LIB_GIT_COMMIT=$1
timeout 580 python -m nvfp4lib bench --suite m-sweep ${2:+--only $2} --backend cute-hopper:graph=1 --backend triton:graph=1 --backend torch-grouped-mm:graph=1 --backend torch-bf16:strategy=streams,graph=1 --iters 20 --no-record --out $OUT/msweep.jsonl 2>&1 | grep -A300 "^problem" | grep "cute-hopper"
