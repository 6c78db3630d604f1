#!/usr/bin/env bash
# The 26B-A4B against the PyTorch script (run_sizes.sh) with the build of the grouping and
# combine kernels (grp).
set -uo pipefail
t0=$(date +%s)
xz -dkf .gpu/v3/grp_bench_train.xz && cp .gpu/v3/grp_bench_train .gpu/bench_train && chmod +x .gpu/bench_train
OUT=$OUT/run_sizes SIZES=26B-A4B bash tools/gpu/run_sizes.sh 2>&1 | tail -6
echo "t=$(( $(date +%s)-t0 ))"
(cd $OUT && tar czf sizes_logs.tgz run_sizes && rm -rf run_sizes)
