#!/usr/bin/env bash
# Same call: ours --recompute none at micro-batch 4 and Unsloth without checkpointing at 4 (its
# fastest), then ours at micro-batch 2 (the code with the RoPE cache, 2ab6d5e).
set -uo pipefail
t0=$(date +%s)
POLICIES=none PROFILE=x SCRIPT_CKPT="" UNSLOTH_GC=false MICRO=4 TAG=_m4 bash tools/gpu/run_speed.sh

POLICIES=none PROFILE=x SCRIPT_CKPT="" UNSLOTH_GC="" MICRO=2 TAG=_m2 bash tools/gpu/run_speed.sh | grep -E "SUMMARY|MATMUL"

(cd "$OUT" && tar czf logs.tgz --remove-files *.log)
