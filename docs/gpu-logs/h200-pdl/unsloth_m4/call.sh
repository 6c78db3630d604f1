#!/usr/bin/env bash
# Same call: ours `none` at micro-batch 4, Unsloth without checkpointing at micro-batch 4, ours again.
set -uo pipefail
t0=$(date +%s)
source tools/gpu/machine_setup.sh
for f in .gpu/uns/*.xz; do xz -dkf "$f"; done; chmod +x .gpu/uns/*
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
CFG=crates/gemma4/tests/configs/gemma-4-12B-it.json
measure_peak_tflops
ours() {
  timeout 200 .gpu/uns/bench_train --config "$CFG" --device cuda --dtype bf16 --seq 2048 --steps 4 \
    --warmup-discard 1 --peak-tflops "$P" --micro-batch 4 --accum 2 --recompute none > "$OUT/ours_none_m4_$1.log" 2>&1
  echo "ours $1: exit $? $(grep -E '^SUMMARY' "$OUT/ours_none_m4_$1.log")"; echo "t=$(( $(date +%s)-t0 ))"
}
ours a
UNSLOTH_GC=false MAX_LEN=2048 MICRO_BATCH=4 ACCUM_STEPS=2 TIME_BUDGET=240 U_TIMEOUT=300 bash .gpu/bench/unsloth-reference/run_unsloth.sh \
  .gpu/unsloth_site > "$OUT/unsloth_gcfalse_m4.log" 2>&1
echo "unsloth: exit $? $(grep -E 'SUMMARY|out of memory' "$OUT/unsloth_gcfalse_m4.log" | head -3)"; echo "t=$(( $(date +%s)-t0 ))"
ours b
