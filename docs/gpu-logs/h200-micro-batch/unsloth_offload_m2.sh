#!/usr/bin/env bash
# Unsloth's offloaded checkpointing at micro-batch 2 beside ours with every layer recomputed.
set -uo pipefail
t0=$(date +%s)
POLICIES=all PROFILE=x SCRIPT_CKPT="" UNSLOTH_GC="" MICRO=1 TAG=_m1 bash tools/gpu/run_speed.sh | grep -v "^$"
echo "t=$(( $(date +%s)-t0 ))"
TIME_BUDGET=400 U_TIMEOUT=450 POLICIES="" SCRIPT_CKPT="" UNSLOTH_GC=unsloth MICRO=2 TAG=_m2 bash tools/gpu/run_speed.sh 2>&1 | grep -v "^$"
echo "t=$(( $(date +%s)-t0 ))"
