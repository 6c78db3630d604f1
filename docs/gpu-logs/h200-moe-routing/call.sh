#!/usr/bin/env bash
# moe_group by runs of consecutive slots per thread (one block prefix sum, no per-chunk barriers)
# and moe_combine in 16-byte packs (grp): the CUDA-vs-CPU table and the layer-wise tests on CUDA,
# the 26B-A4B step alternating with the build before (te: main's kernels).
set -uo pipefail
t0=$(date +%s)
source tools/gpu/machine_setup.sh
for f in .gpu/variants/*.xz; do xz -dkf "$f"; done; chmod +x .gpu/variants/*
echo "=== ops grp"; .gpu/variants/grp_ops_test gpu_kernels_table --test-threads 1 --nocapture > "$OUT/ops_grp.log" 2>&1; echo "exit $?"
grep -E "FAIL|^test result|not ok|panicked" "$OUT/ops_grp.log" | head -20; grep -c "| ok |" "$OUT/ops_grp.log"; grep "moe" "$OUT/ops_grp.log" | head -8
echo "t=$(( $(date +%s)-t0 ))"
G4FT_TEST_DEVICE=cuda .gpu/variants/grp_layerwise --test-threads 1 > "$OUT/layerwise.log" 2>&1; echo "layerwise exit $?"; grep -E "^test result|FAILED|panicked" "$OUT/layerwise.log"
echo "t=$(( $(date +%s)-t0 ))"
cfg=crates/gemma4/tests/configs/gemma-4-26B-A4B-it.json
OUT=$OUT/ab CFG=$cfg A=.gpu/variants/grp_bench_train B=.gpu/variants/te_bench_train ROUNDS=2 bash tools/gpu/ab.sh \
  moe26b_all_m1 "--micro-batch 1 --accum 8 --recompute all"
echo "t=$(( $(date +%s)-t0 ))"
(cd $OUT && tar czf logs.tgz ab && rm -rf ab)
