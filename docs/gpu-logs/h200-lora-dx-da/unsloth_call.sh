#!/usr/bin/env bash
# Same call: ours --recompute none at micro-batch 4 and Unsloth without checkpointing at 4 (its
# fastest), then ours at micro-batch 2.
set -uo pipefail
t0=$(date +%s)
POLICIES=none PROFILE=x SCRIPT_CKPT="" UNSLOTH_GC=false MICRO=4 TAG=_m4 bash tools/gpu/run_speed.sh
echo "t=$(( $(date +%s)-t0 ))"
POLICIES=none PROFILE=x SCRIPT_CKPT="" UNSLOTH_GC="" MICRO=2 TAG=_m2 bash tools/gpu/run_speed.sh | grep -E "SUMMARY|MATMUL"
echo "t=$(( $(date +%s)-t0 ))"
