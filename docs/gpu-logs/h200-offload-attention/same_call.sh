#!/usr/bin/env bash
# Same-call ratios of the current code: ours `all --offload-checkpoints` at micro-batch 2 beside the
# checkpointed script at micro-batch 4 (its fastest measured) and Unsloth's offloaded checkpointing
# at micro-batch 2.
set -uo pipefail
t0=$(date +%s)
POLICIES=all PROFILE=x SCRIPT_CKPT="" UNSLOTH_GC="" MICRO=2 EXTRA=--offload-checkpoints TAG=_m2_off bash tools/gpu/run_speed.sh | grep -v "^$"
echo "t=$(( $(date +%s)-t0 ))"
POLICIES="" SCRIPT_CKPT=1 UNSLOTH_GC="" ANCHOR_STEPS=5 MICRO=4 TAG=_m4 bash tools/gpu/run_speed.sh 2>&1 | grep -v "^$"
echo "t=$(( $(date +%s)-t0 ))"
TIME_BUDGET=400 U_TIMEOUT=440 POLICIES="" SCRIPT_CKPT="" UNSLOTH_GC=unsloth MICRO=2 TAG=_m2 bash tools/gpu/run_speed.sh 2>&1 | grep -v "^$"
echo "t=$(( $(date +%s)-t0 ))"
