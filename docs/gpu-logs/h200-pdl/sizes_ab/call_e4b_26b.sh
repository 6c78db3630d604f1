#!/usr/bin/env bash
# Back-to-back launches on the E4B and the 26B-A4B: the current build (a57feba) against d1a0bad's,
# alternating (`all`, micro-batch 1, as in §1b).
set -uo pipefail
t0=$(date +%s)
source tools/gpu/machine_setup.sh
for f in .gpu/ab5/*_bench_train.xz; do xz -dkf "$f"; done; chmod +x .gpu/ab5/*
OUT=$OUT/ab CFG=crates/gemma4/tests/configs/gemma-4-E4B-it.json A=.gpu/ab5/pdl_bench_train B=.gpu/ab5/main_bench_train ROUNDS=2 bash tools/gpu/ab.sh \
  e4b_all_m1 "--micro-batch 1 --accum 8 --recompute all"
echo "t=$(( $(date +%s)-t0 ))"
OUT=$OUT/ab CFG=crates/gemma4/tests/configs/gemma-4-26B-A4B-it.json A=.gpu/ab5/pdl_bench_train B=.gpu/ab5/main_bench_train ROUNDS=2 bash tools/gpu/ab.sh \
  moe26b_all_m1 "--micro-batch 1 --accum 8 --recompute all"
echo "t=$(( $(date +%s)-t0 ))"
(cd $OUT/ab && tar czf ../ab_logs.tgz *.log && rm *.log)
