#!/usr/bin/env bash
# Grouped GEMM on wgmma: tw = the row tile found by a warp's shuffle scan of the offsets (32
# experts a step, not one); te = tw + the output tile stored through shared memory (whole rows a
# warp). The CUDA-vs-CPU table of te, the layer-wise tests of both, then each alternating with
# fb8d484's build on the 26B-A4B step.
set -uo pipefail
t0=$(date +%s)
source tools/gpu/machine_setup.sh
for f in .gpu/variants/*.xz; do xz -dkf "$f"; done; chmod +x .gpu/variants/*
echo "=== ops te"; .gpu/variants/te_ops_test gpu_ --test-threads 1 --nocapture > "$OUT/ops_te.log" 2>&1; echo "exit $?"
grep -E "FAIL|^test result|not ok|panicked" "$OUT/ops_te.log" | head -20; grep -c "| ok |" "$OUT/ops_te.log"
echo "t=$(( $(date +%s)-t0 ))"
for v in tw te; do
  echo "=== layer-wise $v"; G4FT_TEST_DEVICE=cuda .gpu/variants/${v}_layerwise --test-threads 1 > "$OUT/layerwise_$v.log" 2>&1; echo "exit $?"; grep -E "^test result|FAILED|panicked" "$OUT/layerwise_$v.log"
done
echo "t=$(( $(date +%s)-t0 ))"
cfg=crates/gemma4/tests/configs/gemma-4-26B-A4B-it.json
OUT=$OUT/ab_te CFG=$cfg A=.gpu/variants/te_bench_train B=.gpu/variants/final_bench_train ROUNDS=2 bash tools/gpu/ab.sh \
  moe26b_all_m1 "--micro-batch 1 --accum 8 --recompute all"
echo "t=$(( $(date +%s)-t0 ))"
OUT=$OUT/ab_tw CFG=$cfg A=.gpu/variants/tw_bench_train B=.gpu/variants/final_bench_train ROUNDS=2 bash tools/gpu/ab.sh \
  moe26b_all_m1 "--micro-batch 1 --accum 8 --recompute all"
echo "t=$(( $(date +%s)-t0 ))"
(cd $OUT && tar czf logs.tgz ab_te ab_tw layerwise_*.log && rm -rf ab_te ab_tw layerwise_*.log)
