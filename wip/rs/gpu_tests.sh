#!/usr/bin/env bash
# the GPU tests of the swap-AB configs on the H100, in two halves that fit a 10-minute call:
#   bash wip/rs/gpu_tests.sh staged   (every _e config, the auto default and the edge/exactness tests)
#   bash wip/rs/gpu_tests.sh rest     (every other swap-AB config)
set -o pipefail
source .gpu/env.sh || exit 1
python -m pip install -q pytest 2>/dev/null >/dev/null || true
if [ "$1" = staged ]; then K="(rs_ and _e) or subnormal or default or runner or empty or nan"; else K="rs_ and not _e"; fi
timeout 570 python -m pytest -q tests/gpu/test_hopper_gpu.py -k "$K" -p no:cacheprovider 2>&1 | tee $OUT/gpu_tests_$1.log | tail -15
