#!/usr/bin/env bash
# Where a micro-batch's time goes in the current code: bench_train --profile (one more step with the
# device synchronised at every phase boundary) for --recompute none and all --offload-checkpoints
# at micro-batch 2, and none at micro-batch 1.
set -uo pipefail
t0=$(date +%s)
(cd .gpu && for f in *.xz; do xz -dkf "$f"; done && chmod +x ./*)
source tools/cuda/device_env.sh
CFG=crates/gemma4/tests/configs/gemma-4-12B-it.json
python3 tools/gpu/matmul_ceiling.py /tmp/peak_tflops 2>&1 | tail -1; P=$(cat /tmp/peak_tflops)
run() { # <log> <args...>
  local log=$1; shift
  timeout 300 .gpu/bench_train --config "$CFG" --device cuda --dtype bf16 --peak-tflops "$P" --profile "$@" > "$OUT/$log.log" 2>&1
  echo "== $log"; grep -E "^SUMMARY|^forward|^loss head|^backward|^host enqueue|^step wall|Error" "$OUT/$log.log"
}
run phases_none_m2 --seq 2048 --micro-batch 2 --accum 4 --steps 4 --warmup-discard 1 --recompute none
run phases_off_m2 --seq 2048 --micro-batch 2 --accum 4 --steps 4 --warmup-discard 1 --recompute all --offload-checkpoints
run phases_none_m1 --seq 2048 --micro-batch 1 --accum 8 --steps 4 --warmup-discard 1 --recompute none
echo "t=$(( $(date +%s)-t0 ))"
