#!/usr/bin/env bash
# Kernel profile of the 26B-A4B cut to 6 layers (one micro-batch, every layer recomputed), Nsight
# Compute at real clocks: the wgmma grouped GEMM build with its detail sections, then the build
# before (times only).
set -uo pipefail
t0=$(date +%s)
for f in .gpu/variants/*_bench_train.xz; do xz -dkf "$f"; done; chmod +x .gpu/variants/*
cfg=crates/gemma4/tests/configs/gemma-4-26B-A4B-it.json
cp .gpu/variants/moewg_bench_train .gpu/bench_train
OUT=$OUT/kprof_wgmma CONFIG=$cfg LAYERS=6 NCU_FLAGS="--clock-control none --cache-control none" \
  DETAIL_KERNELS="grouped_wgmma" DETAIL_COUNT=4 bash tools/gpu/kernel_profile.sh 2>&1 | tail -30
echo "t=$(( $(date +%s)-t0 ))"
cp .gpu/variants/base_bench_train .gpu/bench_train
OUT=$OUT/kprof_base CONFIG=$cfg LAYERS=6 NCU_FLAGS="--clock-control none --cache-control none" \
  bash tools/gpu/kernel_profile.sh 2>&1 | tail -30
echo "t=$(( $(date +%s)-t0 ))"
