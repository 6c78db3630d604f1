#!/usr/bin/env bash
# wip/dropout-quads (16-bit dropout draws, one SplitMix64 output per 4 elements) against main's
# 24f2433 build (pipe3): the CUDA-vs-CPU table and the dropout launcher test, the layer-wise tests,
# then the 12B step alternating (the losses differ: other masks).
set -uo pipefail
t0=$(date +%s)
source tools/gpu/machine_setup.sh
for f in .gpu/ab2/*.xz; do xz -dkf "$f"; done; chmod +x .gpu/ab2/*
echo "=== ops"; .gpu/ab2/quads_ops_test gpu_ --test-threads 1 --nocapture > "$OUT/ops.log" 2>&1; echo "exit $?"; grep -E "FAIL|^test result|dropout|lora" "$OUT/ops.log" | head -40
echo "t=$(( $(date +%s)-t0 ))"
echo "=== layer-wise"; G4FT_TEST_DEVICE=cuda .gpu/ab2/quads_layerwise --test-threads 1 > "$OUT/layerwise.log" 2>&1; echo "exit $?"; grep -E "^test result" "$OUT/layerwise.log"
echo "t=$(( $(date +%s)-t0 ))"
OUT=$OUT/ab A=.gpu/ab2/quads_bench_train B=.gpu/ab2/pipe3_bench_train ROUNDS=2 bash tools/gpu/ab.sh \
  none_m2 "--micro-batch 2 --accum 4 --recompute none" \
  off_m2 "--micro-batch 2 --accum 4 --recompute all --offload-checkpoints"
echo "t=$(( $(date +%s)-t0 ))"
cd $OUT && tar czf ab.tgz ab && rm -rf ab; ls -la $OUT
