#!/usr/bin/env bash
# Same call: ours `none` at micro-batch 4 beside Unsloth without checkpointing at 4 (its fastest).
set -uo pipefail
t0=$(date +%s)
POLICIES=none PROFILE=x SCRIPT_CKPT="" UNSLOTH_GC=false TIME_BUDGET=200 U_TIMEOUT=260 MICRO=4 TAG=_m4 bash tools/gpu/run_speed.sh | grep -E "SUMMARY|MATMUL|memory"
echo "t=$(( $(date +%s)-t0 ))"
(cd "$OUT" && tar czf logs_b.tgz --remove-files *.log)
