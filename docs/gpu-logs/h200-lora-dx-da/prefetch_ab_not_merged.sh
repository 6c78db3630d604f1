#!/usr/bin/env bash
# A/B/C, alternating: lora_dx_da with the stage-ahead fetch (bench_train), its first version
# (bench_train_dxda) and the build before lora_dx_da (bench_train_base), --recompute none at micro-batch 1.
set -uo pipefail
t0=$(date +%s)
(cd .gpu && for f in *.xz; do xz -dkf "$f"; done && chmod +x ./*)
source tools/cuda/device_env.sh
CFG=crates/gemma4/tests/configs/gemma-4-12B-it.json
python3 tools/gpu/matmul_ceiling.py /tmp/peak_tflops 2>&1 | tail -1; P=$(cat /tmp/peak_tflops)
run() { # <log> <binary> <args...>
  local log=$1 bin=$2; shift 2
  timeout 300 .gpu/$bin --config "$CFG" --device cuda --dtype bf16 --peak-tflops "$P" "$@" > "/tmp/$log.log" 2>&1
  echo "== $log"; grep -E "^note|^SUMMARY|Error" "/tmp/$log.log"; { echo "== $log"; cat "/tmp/$log.log"; } >> "$OUT/ab.log"
}
N1="--seq 2048 --micro-batch 1 --accum 8 --steps 4 --warmup-discard 1 --recompute none"
for k in a b; do
  run prefetch_none_m1_$k bench_train $N1
  run first_none_m1_$k bench_train_dxda $N1
  run base_none_m1_$k bench_train_base $N1
done
echo "t=$(( $(date +%s)-t0 ))"
