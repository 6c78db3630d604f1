#!/usr/bin/env bash
# The act-only GeGLU pass in the checkpointing forward: CUDA tests (the fused pass against the
# projections, the CUDA-vs-CPU table, the layer-wise backward), then A/B against a8704b4 (head).
set -uo pipefail
t0=$(date +%s)
source tools/gpu/machine_setup.sh
for f in .gpu/ab/*.xz; do xz -dkf "$f"; done; chmod +x .gpu/ab/*
echo "=== ops"; .gpu/g4ft_ops_test gpu_lora_up_geglu_against_the_projection gpu_kernels_table --nocapture --test-threads=1 > "$OUT/ops.log" 2>&1; echo "exit $?"; grep -E "^test |result|B scale|lora_up|FAIL|mismatch" "$OUT/ops.log" | head -30
echo "=== layer-wise"; G4FT_TEST_DEVICE=cuda .gpu/gemma4_layerwise --test-threads 1 > "$OUT/layerwise.log" 2>&1; echo "exit $?"; grep -E "^test result" "$OUT/layerwise.log"
echo "t=$(( $(date +%s)-t0 ))"
OUT=$OUT/act A=.gpu/ab/bench_train_act B=.gpu/ab/bench_train_head ROUNDS=2 bash tools/gpu/ab.sh \
  off_m2 "--micro-batch 2 --accum 4 --recompute all --offload-checkpoints" \
  all_m1 "--micro-batch 1 --accum 8 --recompute all"
echo "t=$(( $(date +%s)-t0 ))"
cd $OUT && tar czf logs.tgz --remove-files act *.log 2>/dev/null; ls -la $OUT
