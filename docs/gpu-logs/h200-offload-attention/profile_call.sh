#!/usr/bin/env bash
# Where the time of `all --offload-checkpoints` goes with the attention state parked (micro-batch 2,
# --profile), and micro-batch 1 with `all` and with `auto` within 26 GB.
set -uo pipefail
t0=$(date +%s)
POLICIES=all PROFILE=all SCRIPT_CKPT="" UNSLOTH_GC="" MICRO=2 EXTRA=--offload-checkpoints TAG=_m2_off_prof bash tools/gpu/run_speed.sh | grep -v "^$"
grep -A12 "^PROFILE one" "$OUT/bench_train_all_m2_off_prof.log" | head -14
POLICIES=all PROFILE=x SCRIPT_CKPT="" UNSLOTH_GC="" MICRO=1 EXTRA=--offload-checkpoints TAG=_m1_off bash tools/gpu/run_speed.sh | grep -v "^$"
POLICIES=auto PROFILE=x SCRIPT_CKPT="" UNSLOTH_GC="" MICRO=1 EXTRA="--memory-budget-gb 26 --offload-checkpoints" TAG=_m1_off26 bash tools/gpu/run_speed.sh | grep -v "^$"
echo "t=$(( $(date +%s)-t0 ))"
