#!/usr/bin/env bash
# the GPU tests of every shipped swap-AB config (and the new exactness tests), on the H100
set -o pipefail
source .gpu/env.sh || exit 1
python -m pip install -q pytest 2>/dev/null >/dev/null || true
timeout 560 python -m pytest -q -x tests/gpu/test_hopper_gpu.py -k "rs_ or subnormal or default or runner or empty or nan" -p no:cacheprovider 2>&1 | tee $OUT/gpu_tests.log | tail -15
