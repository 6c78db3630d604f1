#!/usr/bin/env bash
# Where the host's time goes during the LoRA step: bench_train built with the `host-profile`
# feature samples every thread's stack at 1 kHz of CPU time over the steady steps
# (`--host-profile`), and tools/gpu/host_profile_table.py sums the samples per function. The
# binary keeps its symbol table (not stripped) so that the frames have names:
# `HOST_PROFILE=1 bash tools/gpu/build.sh` writes it as .gpu/hp/bench_train_hp.xz (carry .gpu/hp).
# Run on the GPU machine from the repository root. Settings: SIZES ("E2B 12B"), BIN
# (.gpu/hp/bench_train_hp), EXTRA (more bench_train options, e.g. "--recompute none"), TAG (a
# suffix of the output names). Each size's log, folded stacks and table go to $OUT.
set -uo pipefail
source tools/gpu/machine_setup.sh
OUT="${OUT:-out/gpu}"; mkdir -p "$OUT"
BIN="${BIN:-.gpu/hp/bench_train_hp}"
[ -f "$BIN" ] || { [ -f "$BIN.xz" ] && xz -dk "$BIN.xz" && chmod +x "$BIN"; }
declare -A CFG=([E2B]=gemma-4-E2B-it [E4B]=gemma-4-E4B-it [12B]=gemma-4-12B-it [26B-A4B]=gemma-4-26B-A4B-it [31B]=gemma-4-31B-it)
for size in ${SIZES:-E2B 12B}; do
  tag="${size}${TAG:+_$TAG}"
  echo "=== $tag"
  # shellcheck disable=SC2086
  timeout 400 "$BIN" --config "crates/gemma4/tests/configs/${CFG[$size]}.json" --device cuda \
    --dtype bf16 --seq 2048 --micro-batch 1 --accum 8 --steps "${STEPS:-5}" --warmup-discard 2 \
    --host-profile "$OUT/host_$tag.folded" ${EXTRA:-} > "$OUT/host_$tag.log" 2>&1
  grep -E "^(SUMMARY|host profile)" "$OUT/host_$tag.log"
  python3 tools/gpu/host_profile_table.py "$OUT/host_$tag.folded" --threads --top 60 \
    > "$OUT/host_$tag.md" && head -30 "$OUT/host_$tag.md"
done
