#!/usr/bin/env bash
# Back-to-back launches on the 31B: the current build (a57feba) against d1a0bad's, alternating.
set -uo pipefail
source tools/gpu/machine_setup.sh
for f in .gpu/ab5/*_bench_train.xz; do xz -dkf "$f"; done; chmod +x .gpu/ab5/*
OUT=$OUT/ab CFG=crates/gemma4/tests/configs/gemma-4-31B-it.json A=.gpu/ab5/pdl_bench_train B=.gpu/ab5/main_bench_train ROUNDS=2 STEPS=3 TIMEOUT_S=120 bash tools/gpu/ab.sh \
  31b_all_m1 "--micro-batch 1 --accum 8 --recompute all"
(cd $OUT/ab && tar czf ../ab_logs_31b.tgz *.log && rm *.log)
