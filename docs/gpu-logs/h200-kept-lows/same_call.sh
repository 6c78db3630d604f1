#!/usr/bin/env bash
# Same call, the current code (kept down products): ours `all --offload-checkpoints` at micro-batch 2
# beside the checkpointed script at micro-batch 4 (its fastest measured), then the 12B at 32k tokens
# with `--recompute all`, with and without offloaded checkpoints.
set -uo pipefail
t0=$(date +%s)
POLICIES=all PROFILE=x SCRIPT_CKPT="" UNSLOTH_GC="" MICRO=2 EXTRA=--offload-checkpoints TAG=_m2_off bash tools/gpu/run_speed.sh | grep -v "^$"
echo "t=$(( $(date +%s)-t0 ))"
POLICIES="" SCRIPT_CKPT=1 UNSLOTH_GC="" ANCHOR_STEPS=5 MICRO=4 TAG=_m4 bash tools/gpu/run_speed.sh 2>&1 | grep -v "^$"
echo "t=$(( $(date +%s)-t0 ))"
CFG=crates/gemma4/tests/configs/gemma-4-12B-it.json; P=$(cat /tmp/peak_tflops)
L32="--seq 32768 --micro-batch 1 --accum 1 --steps 3 --warmup-discard 1 --recompute all"
for run in "plain_32k:" "offload_32k:--offload-checkpoints"; do
  log=${run%%:*}; extra=${run#*:}
  # shellcheck disable=SC2086
  timeout 300 .gpu/bench_train --config "$CFG" --device cuda --dtype bf16 --peak-tflops "$P" $L32 $extra > "$OUT/$log.log" 2>&1
  echo "== $log"; grep -E "^recompute|^SUMMARY|Error|step=" "$OUT/$log.log" | cut -c1-220
done
echo "t=$(( $(date +%s)-t0 ))"
(cd "$OUT" && tar czf logs.tgz *.log)
