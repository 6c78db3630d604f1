#!/usr/bin/env bash
# Same call, the code with the RoPE cache (2ab6d5e): ours `all --offload-checkpoints` at micro-batch 2
# beside the checkpointed script at micro-batch 4 (its fastest measured), ours `none` at micro-batch 2
# beside the script without checkpointing at micro-batch 2 (its fastest that fits).
set -uo pipefail
t0=$(date +%s)
POLICIES=all PROFILE=x SCRIPT_CKPT="" UNSLOTH_GC="" MICRO=2 EXTRA=--offload-checkpoints TAG=_m2_off bash tools/gpu/run_speed.sh | grep -v "^$"
echo "t=$(( $(date +%s)-t0 ))"
POLICIES="" SCRIPT_CKPT=1 UNSLOTH_GC="" ANCHOR_STEPS=5 MICRO=4 TAG=_m4 bash tools/gpu/run_speed.sh 2>&1 | grep -v "^$"
echo "t=$(( $(date +%s)-t0 ))"
POLICIES=none PROFILE=x SCRIPT_CKPT=0 UNSLOTH_GC="" ANCHOR_STEPS=5 MICRO=2 TAG=_m2 bash tools/gpu/run_speed.sh 2>&1 | grep -v "^$"
echo "t=$(( $(date +%s)-t0 ))"
(cd "$OUT" && tar czf logs.tgz --remove-files *.log)
