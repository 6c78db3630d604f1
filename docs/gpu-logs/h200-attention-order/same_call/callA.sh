#!/usr/bin/env bash
# 24f2433: the layer-wise tests and the CUDA-vs-CPU table on CUDA, then ours `none` at micro-batch 4
# beside Unsloth without checkpointing at 4 (its fastest), ours again after it.
set -uo pipefail
t0=$(date +%s)
source tools/gpu/machine_setup.sh
echo "=== layer-wise tests on CUDA"; G4FT_TEST_DEVICE=cuda .gpu/gemma4_layerwise --test-threads 1 > "$OUT/layerwise.log" 2>&1; echo "exit $?"; grep -E "^test result" "$OUT/layerwise.log"
echo "t=$(( $(date +%s)-t0 ))"
echo "=== ops"; .gpu/g4ft_ops_test gpu_ --test-threads 1 --nocapture > "$OUT/ops.log" 2>&1; echo "exit $?"; grep -E "FAIL|^test result" "$OUT/ops.log"; grep -c "| ok |" "$OUT/ops.log"
echo "t=$(( $(date +%s)-t0 ))"
POLICIES=none PROFILE=x SCRIPT_CKPT="" UNSLOTH_GC=false TIME_BUDGET=200 U_TIMEOUT=260 MICRO=4 TAG=_m4 bash tools/gpu/run_speed.sh | grep -E "SUMMARY|MATMUL|memory"
echo "t=$(( $(date +%s)-t0 ))"
POLICIES=none PROFILE=x SCRIPT_CKPT="" UNSLOTH_GC="" MICRO=4 TAG=_m4_after bash tools/gpu/run_speed.sh | grep -E "SUMMARY|MATMUL"
echo "t=$(( $(date +%s)-t0 ))"
(cd "$OUT" && tar czf logs_a.tgz --remove-files *.log)
