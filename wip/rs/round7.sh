#!/usr/bin/env bash
# where S4 / S4-dual time goes: ablations (no activation loads, no stores) and, if present, Nsight Compute
set -o pipefail
source .gpu/env.sh || exit 1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: ${NCU:-none}"
S=rs_m128_t128_k128_s4
D=rs_dual_m128_t128_k128_s4
timeout 200 python wip/rs/profile.py S4 $S,${S}_no_x,${S}_no_store,${S}_no_mma,${S}_no_dequant,rs_m128_t256_k128_s3_v32 2>&1 | grep -v -i warn | tee $OUT/profile.log
timeout 150 python wip/rs/profile.py S4-dual,S2-dual $D,${D}_no_x,${D}_no_store 2>&1 | grep -v -i warn | tee -a $OUT/profile.log
if [ -n "$NCU" ]; then
  for pc in "S4 $S" "S4-dual $D"; do
    set -- $pc
    timeout 120 $NCU --kernel-name regex:Gemm --launch-skip 1 --launch-count 1 --section SpeedOfLight \
      --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy \
      --section LaunchStats python wip/rs/ncu_one.py $1 $2 > $OUT/ncu_$1.txt 2>&1
    grep -E "Duration|Throughput|Busy|Pipe|Stall|Warp Cycles|Issued|Eligible|L2 Hit|Mem Pipes|Registers|Hit Rate|Bandwidth" $OUT/ncu_$1.txt | head -60
  done
fi
