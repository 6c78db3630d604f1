#!/usr/bin/env bash
# Per-kernel GPU time of one training step under Nsight Compute (the GPU machine has ncu, not nsys),
# from the repository root after tools/gpu/build.sh (carry .gpu). The model is the real text config
# CONFIG (default the 12B's) cut to LAYERS layers (default 6 = 5 sliding + 1 full, the 5:1 pattern; "all"
# keeps every layer), one
# micro-batch of SEQ tokens; ncu records gpu__time_duration of every kernel after the first SKIP
# launches (model init), and tools/gpu/ncu_summary.py groups them. DETAIL_KERNELS (a regex of kernel
# names, e.g. attn_flash_bwd) adds ncu's speed-of-light, warp-stall, memory and occupancy sections
# for the first DETAIL_COUNT (6) launches of those kernels in that step (kprof_detail.txt). Logs go
# to $OUT.
set -uo pipefail
OUT="${OUT:-out/gpu}"; mkdir -p "$OUT"
LAYERS="${LAYERS:-6}"; SEQ="${SEQ:-2048}"
CONFIG="${CONFIG:-crates/gemma4/tests/configs/gemma-4-12B-it.json}"
source tools/gpu/machine_setup.sh
NCU="${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}"
cfg="$OUT/config_${LAYERS}_layers.json"
python3 - "$cfg" "$LAYERS" "$CONFIG" <<'PY'
import json, sys
c = json.load(open(sys.argv[3]))
t = c.get("text_config", c)
if sys.argv[2] != "all":
    n = int(sys.argv[2])
    t["num_hidden_layers"] = n
    t["layer_types"] = t["layer_types"][:n]
json.dump(c, open(sys.argv[1], "w"))
PY
# 3 steps of 1 micro-batch; ncu records only the last (bench_train --cuda-profiler-last-step).
# BENCH_EXTRA: more bench_train arguments (e.g. "--attention-backward fused").
# shellcheck disable=SC2206
bench=(.gpu/bench_train --config "$cfg" --device cuda --dtype bf16 --seq "$SEQ" --micro-batch 1 --accum 1 --steps 3 --warmup-discard 1 ${BENCH_EXTRA:-})
"${bench[@]}" > "$OUT/kprof_plain.log" 2>&1; grep -E "SUMMARY|step=" "$OUT/kprof_plain.log" | tail -3
# NCU_FLAGS: by default ncu locks clocks to base and flushes caches before every kernel, which
# slows the GEMMs ~25%; "--clock-control none --cache-control none" times them as in the real run.
# shellcheck disable=SC2086
timeout "${NCU_TIMEOUT_S:-300}" "$NCU" ${NCU_FLAGS:-} --profile-from-start off --metrics gpu__time_duration.sum --csv \
  --print-units base --kernel-name-base function "${bench[@]}" --cuda-profiler-last-step \
  > "$OUT/kprof_ncu.csv" 2> "$OUT/kprof_ncu.err"
echo "ncu exit $?"
tail -3 "$OUT/kprof_ncu.err"
python3 tools/gpu/ncu_summary.py "$OUT/kprof_ncu.csv" | tee "$OUT/kprof_summary.txt"
if [ -n "${DETAIL_KERNELS:-}" ]; then
  # shellcheck disable=SC2086
  timeout "${NCU_TIMEOUT_S:-300}" "$NCU" ${NCU_FLAGS:-} --profile-from-start off --kernel-name-base function \
    --kernel-name "regex:$DETAIL_KERNELS" --launch-count "${DETAIL_COUNT:-6}" --section SpeedOfLight \
    --section WarpStateStats --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
    --page details "${bench[@]}" --cuda-profiler-last-step > "$OUT/kprof_detail.txt" 2> "$OUT/kprof_detail.err"
  echo "ncu detail exit $?"
  grep -E "^  [a-z_]+.*\(|Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Stall|Registers" "$OUT/kprof_detail.txt" | head -80
fi
