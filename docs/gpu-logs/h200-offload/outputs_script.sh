#!/usr/bin/env bash
# Ours with offloaded checkpoints at micro-batch 2 beside the checkpointed script at micro-batch 2, in one call.
set -uo pipefail
t0=$(date +%s)
POLICIES=all PROFILE=x SCRIPT_CKPT="" UNSLOTH_GC="" MICRO=2 EXTRA=--offload-checkpoints TAG=_m2_off bash tools/gpu/run_speed.sh | grep -v "^$"
echo "t=$(( $(date +%s)-t0 ))"
POLICIES="" SCRIPT_CKPT=1 UNSLOTH_GC="" ANCHOR_STEPS=5 MICRO=2 TAG=_m2 bash tools/gpu/run_speed.sh 2>&1 | grep -v "^$"
echo "t=$(( $(date +%s)-t0 ))"
