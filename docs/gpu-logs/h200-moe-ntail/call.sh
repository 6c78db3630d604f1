#!/usr/bin/env bash
# The wgmma grouped GEMM's last column tile with n192 / n128 products where that few columns are
# left (ntail) against the build before (grp: 81cac38's kernels): the 26B-A4B step alternating,
# then the CUDA-vs-CPU table of ntail.
set -uo pipefail
t0=$(date +%s)
source tools/gpu/machine_setup.sh
for f in .gpu/variants/*.xz; do xz -dkf "$f"; done; chmod +x .gpu/variants/*
cfg=crates/gemma4/tests/configs/gemma-4-26B-A4B-it.json
OUT=$OUT/ab CFG=$cfg A=.gpu/variants/ntail_bench_train B=.gpu/variants/grp_bench_train ROUNDS=1 bash tools/gpu/ab.sh \
  moe26b_all_m1 "--micro-batch 1 --accum 8 --recompute all"
echo "t=$(( $(date +%s)-t0 ))"
(cd $OUT && tar czf logs.tgz ab && rm -rf ab)
echo "=== ops ntail"; .gpu/variants/ntail_ops_test gpu_kernels_table --test-threads 1 --nocapture > "$OUT/ops_ntail.log" 2>&1; echo "exit $?"
grep -E "FAIL|^test result|not ok|panicked" "$OUT/ops_ntail.log" | head -20; grep -c "| ok |" "$OUT/ops_ntail.log"; grep "moe" "$OUT/ops_ntail.log" | head -8
echo "t=$(( $(date +%s)-t0 ))"
