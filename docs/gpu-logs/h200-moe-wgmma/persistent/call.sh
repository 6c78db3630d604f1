#!/usr/bin/env bash
# Persistent grouped-GEMM blocks (one per SM, the next tile's K tiles loading while a tile is
# stored): the CUDA-vs-CPU table and the layer-wise tests of that build, the 26B-A4B step
# alternating with fb8d484's build (one block per tile), then the kernel profile of the 6-layer cut.
set -uo pipefail
t0=$(date +%s)
source tools/gpu/machine_setup.sh
for f in .gpu/variants/*.xz; do xz -dkf "$f"; done; chmod +x .gpu/variants/*
echo "=== ops"; .gpu/variants/pers_ops_test gpu_ --test-threads 1 --nocapture > "$OUT/ops.log" 2>&1; echo "exit $?"
grep -E "FAIL|^test result|not ok|panicked" "$OUT/ops.log" | head -20; grep -c "| ok |" "$OUT/ops.log"; grep moe "$OUT/ops.log"
echo "t=$(( $(date +%s)-t0 ))"
echo "=== layer-wise"; G4FT_TEST_DEVICE=cuda .gpu/variants/pers_layerwise --test-threads 1 > "$OUT/layerwise.log" 2>&1; echo "exit $?"; grep -E "^test result|FAILED|panicked" "$OUT/layerwise.log"
echo "t=$(( $(date +%s)-t0 ))"
OUT=$OUT/ab CFG=crates/gemma4/tests/configs/gemma-4-26B-A4B-it.json A=.gpu/variants/pers_bench_train B=.gpu/variants/final_bench_train ROUNDS=2 bash tools/gpu/ab.sh \
  moe26b_all_m1 "--micro-batch 1 --accum 8 --recompute all"
echo "t=$(( $(date +%s)-t0 ))"
cp .gpu/variants/pers_bench_train .gpu/bench_train
OUT=$OUT/kprof CONFIG=crates/gemma4/tests/configs/gemma-4-26B-A4B-it.json LAYERS=6 \
  NCU_FLAGS="--clock-control none --cache-control none" bash tools/gpu/kernel_profile.sh 2>&1 | sed -n 4,10p
echo "t=$(( $(date +%s)-t0 ))"
(cd $OUT && tar czf ab_kprof_logs.tgz ab kprof && rm -rf ab kprof)
