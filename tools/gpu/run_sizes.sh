#!/usr/bin/env bash
# Every Gemma 4 size on one H200: our LoRA step (bench_train) and the PyTorch + PEFT script
# (the post's train_ddp.py with random weights, .gpu/bench/pytorch-reference, not part of this repository; see
# docs/benchmarks.md) back to back per size,
# then the table (tools/gpu/sizes_table.py). Run on the GPU machine from the repository root after
# tools/gpu/build.sh. Settings: SIZES ("E2B E4B 12B 26B-A4B 31B"), STEPS (4), ANCHOR_STEPS (5),
# OURS_ONLY=1 skips the script. The table goes to $OUT, the per-size logs into $OUT/sizes_logs.tgz (the
# GPU machine hands back a limited number of files; KEEP_LOGS=1 leaves them unpacked beside it).
set -uo pipefail
OUT="${OUT:-out/gpu}"; mkdir -p "$OUT"
source tools/gpu/machine_setup.sh
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
measure_peak_tflops
declare -A OURS=([E2B]=gemma-4-E2B-it [E4B]=gemma-4-E4B-it [12B]=gemma-4-12B-it [26B-A4B]=gemma-4-26B-A4B-it [31B]=gemma-4-31B-it)
declare -A REF=([E2B]=e2b_text [E4B]=e4b_text [12B]=12b_text [26B-A4B]=26b_a4b_text [31B]=31b_text)
for size in ${SIZES:-E2B E4B 12B 26B-A4B 31B}; do
  echo "=== $size: ours"
  timeout 420 .gpu/bench_train --config "crates/gemma4/tests/configs/${OURS[$size]}.json" --device cuda \
    --dtype bf16 --seq 2048 --micro-batch 1 --accum 8 --steps "${STEPS:-4}" --warmup-discard 1 \
    --peak-tflops "$P" --profile > "$OUT/ours_$size.log" 2>&1
  grep -E "^(model|lora|SUMMARY)" "$OUT/ours_$size.log" | head -8
  [ "${OURS_ONLY:-0}" = 1 ] && continue
  echo "=== $size: PyTorch script"
  (cd .gpu/bench/pytorch-reference && CONFIG_PATH="configs/${REF[$size]}.json" PEAK_TFLOPS=$P STEPS="${ANCHOR_STEPS:-5}" \
    ACCUM_STEPS=8 WARMUP_DISCARD=2 timeout 420 torchrun --standalone --nproc_per_node=1 train_ddp_anchor.py) \
    > "$OUT/script_$size.log" 2>&1
  grep -E "SUMMARY" "$OUT/script_$size.log"
done
python3 tools/gpu/sizes_table.py "$OUT" | tee "$OUT/sizes_table.md"
if [ "${KEEP_LOGS:-0}" != 1 ]; then
  (cd "$OUT" && shopt -s nullglob && logs=(ours_*.log script_*.log) && tar czf sizes_logs.tgz -- "${logs[@]}" && rm -- "${logs[@]}")
fi
