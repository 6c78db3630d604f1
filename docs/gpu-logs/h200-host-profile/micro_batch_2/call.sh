#!/usr/bin/env bash
# Host profiles of the 12B at micro-batch 2: all --offload-checkpoints and none (whole tapes).
set -uo pipefail
source tools/gpu/machine_setup.sh
for f in .gpu/ab/*.xz; do xz -dkf "$f"; done; chmod +x .gpu/ab/*
export BIN=.gpu/ab/bench_train_hp SIZES=12B
EXTRA="--micro-batch 2 --accum 4 --recompute all --offload-checkpoints" TAG=off_m2 bash tools/gpu/host_profile.sh
EXTRA="--micro-batch 2 --accum 4 --recompute none" TAG=none_m2 bash tools/gpu/host_profile.sh
cd $OUT && tar czf logs.tgz --remove-files host_* 2>/dev/null; ls -la $OUT
