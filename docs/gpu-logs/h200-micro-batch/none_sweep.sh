#!/usr/bin/env bash
# Micro-batch 1 / 2 / 4 under --recompute none, and Unsloth without checkpointing at micro-batch 2.
set -uo pipefail
t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
POLICIES=none PROFILE=none SCRIPT_CKPT="" UNSLOTH_GC="" MICRO=1 TAG=_m1 bash tools/gpu/run_speed.sh
echo "t=$(( $(date +%s)-t0 ))"
for m in 2 4; do POLICIES=none PROFILE=x SCRIPT_CKPT="" UNSLOTH_GC="" MICRO=$m TAG=_m$m bash tools/gpu/run_speed.sh | grep -v "^$"; echo "t=$(( $(date +%s)-t0 ))"; done
# run_speed.sh then read an empty POLICIES as its default "all none auto" (now it skips ours):
# this line ran ours under all three policies at micro-batch 2, then Unsloth.
POLICIES="" SCRIPT_CKPT="" UNSLOTH_GC=false MICRO=2 TAG=_m2 bash tools/gpu/run_speed.sh
echo "t=$(( $(date +%s)-t0 ))"
