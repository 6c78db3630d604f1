#!/usr/bin/env bash
# Padding and tokens/s of plain, length-grouped and packed batches (docs/benchmarks.md §8) with a
# real-size model on one GPU, from the repository root after tools/gpu/build.sh (carry .gpu):
# examples/bench_batching with random bf16 weights of CONFIG (default the 12B text config) at
# --max-len 1024 and 256. Logs go to $OUT.
set -uo pipefail
OUT="${OUT:-out/gpu}"; mkdir -p "$OUT"
source tools/gpu/machine_setup.sh
CONFIG="${CONFIG:-crates/gemma4/tests/configs/gemma-4-12B-it.json}"
for len in 1024 256; do
  echo; echo "=== bench_batching, $(basename "$CONFIG"), --max-len $len"
  timeout "${TIMEOUT_S:-400}" .gpu/bench_batching --config "$CONFIG" --device cuda --dtype bf16 --max-len "$len" \
    > "$OUT/bench_batching_$len.log" 2>&1
  tail -8 "$OUT/bench_batching_$len.log"
done
