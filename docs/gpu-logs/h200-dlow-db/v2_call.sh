#!/usr/bin/env bash
# The dlow / dB kernel with B in registers and dB summed with dA, against main's build (pipe3):
# CUDA-vs-CPU table, the layer-wise tests, then the 12B step alternating.
set -uo pipefail
t0=$(date +%s)
source tools/gpu/machine_setup.sh
for f in .gpu/ab2/*.xz; do xz -dkf "$f"; done; chmod +x .gpu/ab2/*
echo "=== ops"; .gpu/ab2/dlowdb2_ops_test gpu_ --test-threads 1 --nocapture > "$OUT/ops.log" 2>&1; echo "exit $?"; grep -E "FAIL|^test result|lora_linear|rows ok|not ok" "$OUT/ops.log" | head -60
echo "t=$(( $(date +%s)-t0 ))"
echo "=== layer-wise"; G4FT_TEST_DEVICE=cuda .gpu/ab2/dlowdb2_layerwise --test-threads 1 > "$OUT/layerwise.log" 2>&1; echo "exit $?"; grep -E "^test result|FAILED|mismatch" "$OUT/layerwise.log"
echo "t=$(( $(date +%s)-t0 ))"
OUT=$OUT/ab A=.gpu/ab2/dlowdb2_bench_train B=.gpu/ab2/pipe3_bench_train ROUNDS=2 bash tools/gpu/ab.sh \
  none_m2 "--micro-batch 2 --accum 4 --recompute none" \
  off_m2 "--micro-batch 2 --accum 4 --recompute all --offload-checkpoints"
echo "t=$(( $(date +%s)-t0 ))"
cd $OUT && tar czf ab.tgz ab && rm -rf ab; ls -la $OUT
cd - >/dev/null
cp .gpu/ab2/dlowdb2_bench_train .gpu/bench_train
OUT=$OUT/kprof LAYERS=6 BENCH_EXTRA="--recompute none" NCU_FLAGS="--clock-control none --cache-control none" NCU_TIMEOUT_S=200 bash tools/gpu/kernel_profile.sh > $OUT/kprof.out 2>&1
python3 tools/gpu/ncu_summary.py $OUT/kprof/kprof_ncu.csv > $OUT/kprof_summary.log 2>&1
python3 tools/gpu/ncu_summary.py $OUT/kprof/kprof_ncu.csv --families > $OUT/kprof_families.log 2>&1
rm -rf $OUT/kprof
head -45 $OUT/kprof_summary.log | grep -E "launches|lora|nvjet_sm90_t.._(32|64)x|splitK|sum_splits"
