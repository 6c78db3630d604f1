#!/usr/bin/env bash
# A/B: whole tapes for kept layers (A) against the commit before (B, b8c055c), --recompute none.
set -uo pipefail
source tools/gpu/machine_setup.sh
for f in .gpu/ab/*.xz; do xz -dkf "$f"; done; chmod +x .gpu/ab/*
OUT=$OUT/whole A=.gpu/ab/bench_train_whole B=.gpu/ab/bench_train_p1 ROUNDS=2 bash tools/gpu/ab.sh \
  none_m2 "--micro-batch 2 --accum 4 --recompute none" \
  none_m4 "--micro-batch 4 --accum 2 --recompute none"
cd $OUT && tar czf logs.tgz --remove-files whole 2>/dev/null; ls -la $OUT
