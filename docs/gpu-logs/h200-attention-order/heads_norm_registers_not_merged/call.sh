#!/usr/bin/env bash
# heads_norm_rope with the row in registers (hn) against 24f2433 (pipe3): the CUDA-vs-CPU table
# (its heads_norm rows also check the same bits as the composite on CUDA), the layer-wise tests,
# then bench_train alternating.
set -uo pipefail
t0=$(date +%s)
source tools/gpu/machine_setup.sh
for f in .gpu/ab2/*.xz; do xz -dkf "$f"; done; chmod +x .gpu/ab2/*
echo "=== ops"; .gpu/ab2/hn_ops_test gpu_kernels_table --test-threads 1 --nocapture > "$OUT/ops.log" 2>&1; echo "exit $?"; grep -E "FAIL|^test result|heads_norm" "$OUT/ops.log"
echo "t=$(( $(date +%s)-t0 ))"
echo "=== layer-wise"; G4FT_TEST_DEVICE=cuda .gpu/ab2/hn_layerwise --test-threads 1 > "$OUT/layerwise.log" 2>&1; echo "exit $?"; grep -E "^test result" "$OUT/layerwise.log"
echo "t=$(( $(date +%s)-t0 ))"
OUT=$OUT/ab A=.gpu/ab2/hn_bench_train B=.gpu/ab2/pipe3_bench_train ROUNDS=1 bash tools/gpu/ab.sh \
  none_m2 "--micro-batch 2 --accum 4 --recompute none" \
  off_m2 "--micro-batch 2 --accum 4 --recompute all --offload-checkpoints"
echo "t=$(( $(date +%s)-t0 ))"
cd $OUT && tar czf ab.tgz ab && rm -rf ab; ls -la $OUT
