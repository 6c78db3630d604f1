#!/usr/bin/env bash
# The PyTorch + PEFT script at micro-batch 2 (with and without checkpointing) beside ours (per-layer adapter copies).
set -uo pipefail
t0=$(date +%s)
POLICIES=all PROFILE=x SCRIPT_CKPT="" UNSLOTH_GC="" MICRO=1 TAG=_m1 bash tools/gpu/run_speed.sh | grep -v "^$"
echo "t=$(( $(date +%s)-t0 ))"
POLICIES="" SCRIPT_CKPT="1 0" UNSLOTH_GC="" ANCHOR_STEPS=5 MICRO=2 TAG=_m2 bash tools/gpu/run_speed.sh | grep -v "^$"
echo "t=$(( $(date +%s)-t0 ))"
POLICIES=none PROFILE=x SCRIPT_CKPT="" UNSLOTH_GC="" MICRO=2 TAG=_m2 bash tools/gpu/run_speed.sh | grep -v "^$"
echo "t=$(( $(date +%s)-t0 ))"
