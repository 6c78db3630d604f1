#!/usr/bin/env bash
# A/B of the loss head's chunk: 512 rows (ce27) and 1024 rows (ce28) against 256 (head, a8704b4).
set -uo pipefail
source tools/gpu/machine_setup.sh
for f in .gpu/ab/*.xz; do xz -dkf "$f"; done; chmod +x .gpu/ab/*
OUT=$OUT/ce27 A=.gpu/ab/bench_train_ce27 B=.gpu/ab/bench_train_head ROUNDS=2 bash tools/gpu/ab.sh \
  none_m2 "--micro-batch 2 --accum 4 --recompute none" \
  off_m2 "--micro-batch 2 --accum 4 --recompute all --offload-checkpoints"
OUT=$OUT/ce28 A=.gpu/ab/bench_train_ce28 B=.gpu/ab/bench_train_head ROUNDS=1 bash tools/gpu/ab.sh \
  none_m2 "--micro-batch 2 --accum 4 --recompute none"
cd $OUT && tar czf logs.tgz --remove-files ce27 ce28 2>/dev/null; ls -la $OUT
