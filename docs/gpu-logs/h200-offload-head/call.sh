#!/usr/bin/env bash
# A/B of the offload changes: base (HEAD), p1 (prefetch before the head), p2 (p1 + two layers in flight).
set -uo pipefail
source tools/gpu/machine_setup.sh
for f in .gpu/ab/*.xz; do xz -dkf "$f"; done; chmod +x .gpu/ab/*
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv
S="--micro-batch 2 --accum 4 --recompute all --offload-checkpoints"
OUT=$OUT/p1 A=.gpu/ab/bench_train_p1 B=.gpu/ab/bench_train_base ROUNDS=2 bash tools/gpu/ab.sh off_m2 "$S"
OUT=$OUT/p2 A=.gpu/ab/bench_train_p2 B=.gpu/ab/bench_train_p1 ROUNDS=2 bash tools/gpu/ab.sh off_m2 "$S"
cd $OUT && tar czf logs.tgz --remove-files p1 p2 2>/dev/null; ls -la $OUT
