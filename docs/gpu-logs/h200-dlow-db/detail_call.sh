#!/usr/bin/env bash
# Nsight Compute's detail sections for lora_dlow_db (the first 7 launches of the step: one
# layer's projections) in the 12B's 6-layer cut, micro-batch 1, --recompute none.
set -uo pipefail
xz -dkf .gpu/ab2/dlowdb4_bench_train.xz; chmod +x .gpu/ab2/dlowdb4_bench_train
cp .gpu/ab2/dlowdb4_bench_train .gpu/bench_train
OUT=$OUT/kprof LAYERS=6 BENCH_EXTRA="--recompute none" NCU_FLAGS="--clock-control none --cache-control none" \
  NCU_TIMEOUT_S=150 DETAIL_KERNELS="lora_dlow_db" DETAIL_COUNT=7 bash tools/gpu/kernel_profile.sh > $OUT/kprof.out 2>&1
cp $OUT/kprof/kprof_detail.txt $OUT/dlow_db_detail.txt; rm -rf $OUT/kprof
grep -E "Grid Size|Duration|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers|L2 Hit|Block Limit|One or More|No Eligible|Issued Warp" $OUT/dlow_db_detail.txt | head -70
