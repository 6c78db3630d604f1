#!/usr/bin/env bash
# bench_train --profile with the forward taken from the step itself (the first interval less the
# head probe and the mean backward of the last layer's kind): --recompute none and all
# --offload-checkpoints at micro-batch 2 (call1/), then --recompute none at micro-batch 1 (call2/).
set -uo pipefail
t0=$(date +%s)
(cd .gpu && xz -dkf bench_train.xz && chmod +x bench_train)
source tools/cuda/device_env.sh
CFG=crates/gemma4/tests/configs/gemma-4-12B-it.json
python3 tools/gpu/matmul_ceiling.py /tmp/peak_tflops 2>&1 | tail -1; P=$(cat /tmp/peak_tflops)
run() { # <log> <args...>
  local log=$1; shift
  timeout 300 .gpu/bench_train --config "$CFG" --device cuda --dtype bf16 --peak-tflops "$P" "$@" > "$OUT/$log.log" 2>&1
  echo "== $log"; grep -E "^SUMMARY|^forward|^loss head|^backward|^step wall|^sum of|^note|^host enqueue|Error" "$OUT/$log.log"
}
if [ "${CALL:-1}" = 1 ]; then
  run phases_none_m2 --seq 2048 --micro-batch 2 --accum 4 --steps 4 --warmup-discard 1 --recompute none --profile
  run phases_off_m2 --seq 2048 --micro-batch 2 --accum 4 --steps 4 --warmup-discard 1 --recompute all --offload-checkpoints --profile
else
  run phases_none_m1 --seq 2048 --micro-batch 1 --accum 8 --steps 4 --warmup-discard 1 --recompute none --profile
fi
echo "t=$(( $(date +%s)-t0 ))"
