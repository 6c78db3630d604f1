#!/usr/bin/env bash
# PDL (programmatic stream serialization on every g4ft-ops launch) against main's build (d1a0bad):
# the CUDA-vs-CPU table and the layer-wise tests of the PDL build, then alternating A/Bs.
set -uo pipefail
t0=$(date +%s)
source tools/gpu/machine_setup.sh
for f in .gpu/ab/*.xz; do xz -dkf "$f"; done; chmod +x .gpu/ab/*
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
echo "=== ops"; .gpu/ab/pdl_ops_test gpu_ --test-threads 1 --nocapture > "$OUT/ops.log" 2>&1; echo "exit $?"; grep -E "FAIL|^test result|rows ok|not ok|panicked" "$OUT/ops.log" | head -30
echo "t=$(( $(date +%s)-t0 ))"
echo "=== layer-wise"; G4FT_TEST_DEVICE=cuda .gpu/ab/pdl_layerwise --test-threads 1 > "$OUT/layerwise.log" 2>&1; echo "exit $?"; grep -E "^test result|FAILED|panicked" "$OUT/layerwise.log"
echo "t=$(( $(date +%s)-t0 ))"
OUT=$OUT/ab A=.gpu/ab/pdl_bench_train B=.gpu/ab/main_bench_train ROUNDS=2 bash tools/gpu/ab.sh \
  none_m2 "--micro-batch 2 --accum 4 --recompute none" \
  off_m2 "--micro-batch 2 --accum 4 --recompute all --offload-checkpoints"
echo "t=$(( $(date +%s)-t0 ))"
OUT=$OUT/ab CFG=crates/gemma4/tests/configs/gemma-4-E2B-it.json A=.gpu/ab/pdl_bench_train B=.gpu/ab/main_bench_train ROUNDS=2 bash tools/gpu/ab.sh \
  e2b_all_m1 "--micro-batch 1 --accum 8 --recompute all"
echo "t=$(( $(date +%s)-t0 ))"
