#!/usr/bin/env bash
# The CUDA-vs-CPU table of a build for compute capability 8.0 (CUDA_COMPUTE_CAP=80: no wgmma, so
# the mma.sync grouped GEMM with the warp-scan row tiles; its PTX is compiled for the H200 at
# load), then the 26B-A4B against the PyTorch script (run_sizes.sh) and the 6-layer kernel
# profile with c6811d7's build.
set -uo pipefail
t0=$(date +%s)
source tools/gpu/machine_setup.sh
for f in .gpu/variants/*.xz; do xz -dkf "$f"; done; chmod +x .gpu/variants/*
echo "=== ops, compute capability 8.0 build"; .gpu/variants/cc80_ops_test gpu_ --test-threads 1 --nocapture > "$OUT/ops_cc80.log" 2>&1; echo "exit $?"
grep -E "FAIL|^test result|not ok|panicked" "$OUT/ops_cc80.log" | head -20; grep -c "| ok |" "$OUT/ops_cc80.log"; grep "grouped_matmul" "$OUT/ops_cc80.log"
echo "t=$(( $(date +%s)-t0 ))"
cp .gpu/variants/te_bench_train .gpu/bench_train
OUT=$OUT/run_sizes SIZES=26B-A4B bash tools/gpu/run_sizes.sh 2>&1 | tail -6
echo "t=$(( $(date +%s)-t0 ))"
OUT=$OUT/kprof CONFIG=crates/gemma4/tests/configs/gemma-4-26B-A4B-it.json LAYERS=6 \
  NCU_FLAGS="--clock-control none --cache-control none" bash tools/gpu/kernel_profile.sh 2>&1 | sed -n 3,10p
echo "t=$(( $(date +%s)-t0 ))"
(cd $OUT && tar czf kprof_logs.tgz kprof && rm -rf kprof)
