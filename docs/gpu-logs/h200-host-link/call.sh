#!/usr/bin/env bash
# Host link, forward timing with and without parked outputs, offload at micro-batch 1, script at micro-batch 4.
set -uo pipefail
t0=$(date +%s)
python3 tools/gpu/host_link.py | tee "$OUT/host_link.log"
python3 tools/gpu/host_link.py --mib 63 | tee -a "$OUT/host_link.log"
echo "t=$(( $(date +%s)-t0 ))"
POLICIES=all PROFILE=all SCRIPT_CKPT="" UNSLOTH_GC="" MICRO=2 EXTRA=--offload-checkpoints TAG=_m2_off_prof bash tools/gpu/run_speed.sh | grep -v "^$"
grep -A12 "^PROFILE one" "$OUT/bench_train_all_m2_off_prof.log" | head -14
POLICIES=all PROFILE=all SCRIPT_CKPT="" UNSLOTH_GC="" MICRO=2 TAG=_m2_prof bash tools/gpu/run_speed.sh | grep -v "^$"
grep -A12 "^PROFILE one" "$OUT/bench_train_all_m2_prof.log" | head -14
POLICIES=all PROFILE=x SCRIPT_CKPT="" UNSLOTH_GC="" MICRO=1 EXTRA=--offload-checkpoints TAG=_m1_off bash tools/gpu/run_speed.sh | grep -v "^$"
echo "t=$(( $(date +%s)-t0 ))"
POLICIES="" SCRIPT_CKPT=1 UNSLOTH_GC="" ANCHOR_STEPS=5 MICRO=4 TAG=_m4 bash tools/gpu/run_speed.sh 2>&1 | grep -v "^$"
echo "t=$(( $(date +%s)-t0 ))"
