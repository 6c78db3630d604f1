#!/usr/bin/env bash
# Unsloth's offloaded checkpointing at micro-batch 2 beside ours with offloaded checkpoints at micro-batch 2, in one call.
set -uo pipefail
t0=$(date +%s)
POLICIES=all PROFILE=x SCRIPT_CKPT="" UNSLOTH_GC="" MICRO=2 EXTRA=--offload-checkpoints TAG=_m2_off bash tools/gpu/run_speed.sh | grep -v "^$"
echo "t=$(( $(date +%s)-t0 ))"
TIME_BUDGET=400 U_TIMEOUT=450 POLICIES="" SCRIPT_CKPT="" UNSLOTH_GC=unsloth MICRO=2 TAG=_m2 bash tools/gpu/run_speed.sh 2>&1 | grep -v "^$"
echo "t=$(( $(date +%s)-t0 ))"
POLICIES=all PROFILE=x SCRIPT_CKPT="" UNSLOTH_GC="" MICRO=2 EXTRA=--offload-checkpoints TAG=_m2_off_after bash tools/gpu/run_speed.sh | grep -v "^$"
POLICIES=auto PROFILE=x SCRIPT_CKPT="" UNSLOTH_GC="" MICRO=2 EXTRA="--memory-budget-gb 26 --offload-checkpoints" TAG=_m2_off26 bash tools/gpu/run_speed.sh | grep -v "^$"
echo "t=$(( $(date +%s)-t0 ))"
(cd "$OUT" && tar czf logs.tgz *.log && rm -f *.log)
