#!/usr/bin/env bash
# The dK / dV kernels' split partials summed in order instead of by atomics: the ops' CUDA-vs-CPU
# table and the determinism test, the layer-wise tests on CUDA, then A/B against 1c296b2
# (bench_train_base) on the E2B and the E4B (whose one or two kv heads split every GQA group) and
# on the 12B.
set -uo pipefail
source tools/gpu/machine_setup.sh
timeout 240 .gpu/g4ft_ops_test gpu_attention_backward_is_deterministic gpu_kernels_table --nocapture --test-threads=1 > "$OUT/ops.log" 2>&1
echo "ops rc=$?"; grep -E "test result|FAIL|panicked|^\| attention" "$OUT/ops.log" | grep -v "| ok |" | head -20; grep -c "| ok |" "$OUT/ops.log"
G4FT_TEST_DEVICE=cuda .gpu/gemma4_layerwise --test-threads 1 > "$OUT/layerwise.log" 2>&1; echo "layerwise rc=$?"; grep -E "test result|FAIL|panicked" "$OUT/layerwise.log" | head
for size in E2B-it E4B-it; do
  OUT="$OUT/$size" CFG=crates/gemma4/tests/configs/gemma-4-$size.json ROUNDS=2 TIMEOUT_S=150 \
    bash tools/gpu/ab.sh "${size%-it}_all" "--micro-batch 1 --accum 8 --recompute all" 2>&1 | tail -1
done
OUT="$OUT/12B" ROUNDS=1 TIMEOUT_S=150 bash tools/gpu/ab.sh none_m1 "--micro-batch 1 --accum 8 --recompute none" 2>&1 | tail -1
(cd "$OUT" && tar czf logs.tgz ./*.log ./*/*.log && rm -rf ./*.log ./*-it ./12B)
