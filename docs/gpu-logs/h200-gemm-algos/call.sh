#!/usr/bin/env bash
# GEMM algorithm choice: its CUDA test and the layer-wise tests, then the 12B step alternating with
# the build before it (te: the code of c6811d7, whose kernels are main's before this change).
set -uo pipefail
t0=$(date +%s)
source tools/gpu/machine_setup.sh
for f in .gpu/variants/*.xz; do xz -dkf "$f"; done; chmod +x .gpu/variants/*
.gpu/variants/tune_ops_test gpu_gemm_tuning --test-threads 1 --nocapture > $OUT/ops_tuning.log 2>&1; echo "ops test exit $?"
tail -5 $OUT/ops_tuning.log
G4FT_TEST_DEVICE=cuda .gpu/variants/tune_layerwise --test-threads 1 > $OUT/layerwise.log 2>&1; echo "layerwise exit $?"
tail -3 $OUT/layerwise.log
echo "t=$(( $(date +%s)-t0 ))"
OUT=$OUT/ab A=.gpu/variants/tune_bench_train B=.gpu/variants/te_bench_train ROUNDS=2 bash tools/gpu/ab.sh \
  none_m2 "--micro-batch 2 --accum 4 --recompute none" \
  off_m2 "--micro-batch 2 --accum 4 --recompute all --offload-checkpoints"
grep -h "GEMM algorithms" $OUT/ab/ab_*_a_*.log | head -4
echo "t=$(( $(date +%s)-t0 ))"
(cd $OUT && tar czf ab.tgz ab && rm -rf ab)
