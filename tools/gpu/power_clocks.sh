#!/usr/bin/env bash
# The GPU's SM clock, power draw and throttle reasons while a command runs: nvidia-smi samples
# every PERIOD_MS (50) into $OUT/clocks.log, the command's output goes to $OUT/clocks_cmd.log, and
# tools/gpu/clock_summary.py prints the clock and power percentiles of the samples under load.
# Usage (GPU machine, repository root): bash tools/gpu/power_clocks.sh <command> [args...]
#   e.g. bash tools/gpu/power_clocks.sh .gpu/bench_train --config crates/gemma4/tests/configs/gemma-4-12B-it.json \
#          --device cuda --dtype bf16 --recompute none
set -uo pipefail
OUT="${OUT:-out/gpu}"; mkdir -p "$OUT"
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu,clocks_event_reasons.active \
  --format=csv -lms "${PERIOD_MS:-50}" > "$OUT/clocks.log" 2>&1 &
smi=$!
sleep 1
"$@" > "$OUT/clocks_cmd.log" 2>&1
rc=$?
sleep 1; kill "$smi"
python3 "$(dirname "$0")/clock_summary.py" "$OUT/clocks.log"
exit $rc
