#!/usr/bin/env bash
# The wgmma grouped GEMM (kernels/moe_wgmma.cu): its CUDA-vs-CPU table and layer-wise tests, then
# the 26B-A4B step alternating with the build before (the mma.sync grouped GEMM).
set -uo pipefail
t0=$(date +%s)
source tools/gpu/machine_setup.sh
for f in .gpu/variants/*.xz; do xz -dkf "$f"; done; chmod +x .gpu/variants/*
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
echo "=== ops"; .gpu/variants/moewg_ops_test gpu_ --test-threads 1 --nocapture > "$OUT/ops.log" 2>&1; echo "exit $?"
grep -E "FAIL|^test result|rows ok|not ok|panicked|moe" "$OUT/ops.log" | head -30
echo "t=$(( $(date +%s)-t0 ))"
echo "=== layer-wise"; G4FT_TEST_DEVICE=cuda .gpu/variants/moewg_layerwise --test-threads 1 > "$OUT/layerwise.log" 2>&1; echo "exit $?"; grep -E "^test result|FAILED|panicked" "$OUT/layerwise.log"
echo "t=$(( $(date +%s)-t0 ))"
OUT=$OUT/ab CFG=crates/gemma4/tests/configs/gemma-4-26B-A4B-it.json A=.gpu/variants/moewg_bench_train B=.gpu/variants/base_bench_train ROUNDS=2 bash tools/gpu/ab.sh \
  moe26b_all_m1 "--micro-batch 1 --accum 8 --recompute all"
echo "t=$(( $(date +%s)-t0 ))"
