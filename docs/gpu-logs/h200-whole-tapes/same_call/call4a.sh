#!/usr/bin/env bash
# Same call (79a9137 + docs): the layer-wise tests on CUDA (whole tapes among the masks), then ours
# `all --offload-checkpoints` at micro-batch 2 beside the checkpointed script at micro-batch 4 (its
# fastest), then ours `none` at micro-batch 2.
set -uo pipefail
t0=$(date +%s)
source tools/gpu/machine_setup.sh
echo "=== layer-wise tests on CUDA"; G4FT_TEST_DEVICE=cuda .gpu/gemma4_layerwise --test-threads 1 > "$OUT/layerwise.log" 2>&1; echo "exit $?"; grep -E "^test result" "$OUT/layerwise.log"
echo "t=$(( $(date +%s)-t0 ))"
POLICIES=all PROFILE=x SCRIPT_CKPT="" UNSLOTH_GC="" MICRO=2 EXTRA=--offload-checkpoints TAG=_m2_off bash tools/gpu/run_speed.sh | grep -E "SUMMARY|MATMUL"
echo "t=$(( $(date +%s)-t0 ))"
POLICIES="" SCRIPT_CKPT=1 UNSLOTH_GC="" ANCHOR_STEPS=5 MICRO=4 TAG=_m4 bash tools/gpu/run_speed.sh 2>&1 | grep -E "SUMMARY|MATMUL|memory"
echo "t=$(( $(date +%s)-t0 ))"
POLICIES=none PROFILE=x SCRIPT_CKPT="" UNSLOTH_GC="" MICRO=2 TAG=_m2 bash tools/gpu/run_speed.sh | grep -E "SUMMARY|MATMUL"
echo "t=$(( $(date +%s)-t0 ))"
(cd "$OUT" && tar czf logs_a.tgz --remove-files *.log)
