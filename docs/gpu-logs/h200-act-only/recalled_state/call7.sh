#!/usr/bin/env bash
# The recompute of a parked layer forms neither the normed attention input nor o_proj's input
# when it holds everything they would feed: the layer-wise tests on CUDA, then A/B against
# 8a8a5f1 (prev).
set -uo pipefail
source tools/gpu/machine_setup.sh
for f in .gpu/ab/*.xz; do xz -dkf "$f"; done; chmod +x .gpu/ab/*
echo "=== layer-wise"; G4FT_TEST_DEVICE=cuda .gpu/gemma4_layerwise --test-threads 1 > "$OUT/layerwise.log" 2>&1; echo "exit $?"; grep -E "^test result" "$OUT/layerwise.log"
OUT=$OUT/lazy A=.gpu/ab/bench_train_lazy B=.gpu/ab/bench_train_prev ROUNDS=2 bash tools/gpu/ab.sh \
  off_m2 "--micro-batch 2 --accum 4 --recompute all --offload-checkpoints"
cd $OUT && tar czf logs.tgz --remove-files lazy *.log 2>/dev/null; ls -la $OUT
