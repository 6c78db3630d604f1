#!/usr/bin/env bash
# 24f2433: ours `all --offload-checkpoints` at micro-batch 2 beside the checkpointed script at
# micro-batch 4 (its fastest), then ours `all` at 32k.
set -uo pipefail
t0=$(date +%s)
source tools/gpu/machine_setup.sh
POLICIES=all PROFILE=x SCRIPT_CKPT="" UNSLOTH_GC="" MICRO=2 EXTRA=--offload-checkpoints TAG=_m2_off bash tools/gpu/run_speed.sh | grep -E "SUMMARY|MATMUL"
echo "t=$(( $(date +%s)-t0 ))"
POLICIES="" SCRIPT_CKPT=1 UNSLOTH_GC="" ANCHOR_STEPS=5 MICRO=4 TAG=_m4 bash tools/gpu/run_speed.sh 2>&1 | grep -E "SUMMARY|MATMUL|memory"
echo "t=$(( $(date +%s)-t0 ))"
.gpu/bench_train --config crates/gemma4/tests/configs/gemma-4-12B-it.json --device cuda --dtype bf16 --seq 32768 --micro-batch 1 --accum 1 --recompute all --steps 3 --warmup-discard 1 --peak-tflops "${P:-755.3}" > "$OUT/bench_32k_all.log" 2>&1; grep SUMMARY "$OUT/bench_32k_all.log"
echo "t=$(( $(date +%s)-t0 ))"
(cd "$OUT" && tar czf logs_b.tgz --remove-files *.log)
