#!/usr/bin/env bash
# Kernel launches and GPU busy time per micro-batch of every Gemma 4 size on one GPU: for each size,
# tools/gpu/kernel_profile.sh on the whole model (LAYERS=all; one step of one micro-batch of SEQ
# tokens, every kernel timed by Nsight Compute), then the table (tools/gpu/launch_table.py). Run on
# the GPU machine from the repository root after tools/gpu/build.sh (carry .gpu). SIZES picks the
# sizes ("E2B E4B 12B 26B-A4B 31B"), RECOMPUTE the policy (all, as in docs/benchmarks.md §1b); the
# table goes to $OUT, each size's logs (and its kernel families) into $OUT/kprof_logs.tgz.
set -uo pipefail
OUT="${OUT:-out/gpu}"; mkdir -p "$OUT"
declare -A CFG=([E2B]=gemma-4-E2B-it [E4B]=gemma-4-E4B-it [12B]=gemma-4-12B-it [26B-A4B]=gemma-4-26B-A4B-it [31B]=gemma-4-31B-it)
read -r -a sizes <<< "${SIZES:-E2B E4B 12B 26B-A4B 31B}"
for size in "${sizes[@]}"; do
  echo "=== $(date +%T) $size"
  OUT="$OUT/$size" LAYERS=all BENCH_EXTRA="--recompute ${RECOMPUTE:-all}" CONFIG="crates/gemma4/tests/configs/${CFG[$size]}.json" \
    NCU_FLAGS="--clock-control none --cache-control none" NCU_TIMEOUT_S="${NCU_TIMEOUT_S:-420}" \
    bash tools/gpu/kernel_profile.sh | sed -n 1,4p
done
python3 tools/gpu/launch_table.py "$OUT" | tee "$OUT/launch_table.md"
# Each size's kernel families, then the per-kernel logs in one archive (the GPU machine hands back
# a limited number of files).
for size in "${sizes[@]}"; do
  csv="$OUT/$size/kprof_ncu.csv"
  [ -f "$csv" ] && python3 tools/gpu/ncu_summary.py "$csv" --families > "$OUT/$size/families.md"
done
(cd "$OUT" && tar czf kprof_logs.tgz -- "${sizes[@]}" && rm -r -- "${sizes[@]}")
