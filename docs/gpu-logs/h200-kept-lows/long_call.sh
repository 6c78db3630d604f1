#!/usr/bin/env bash
# Long sequences with the current code: the 12B at 64k tokens with `--recompute all`, without and with
# offloaded checkpoints, and at 128k without; then Nsight Compute's detail sections of the LoRA
# adapter kernels (one sliding layer of the 12B, --recompute none).
set -uo pipefail
t0=$(date +%s)
(cd .gpu && for f in *.xz; do xz -dkf "$f"; done && chmod +x ./*)
source tools/cuda/device_env.sh
grep -E "MemTotal|MemAvailable" /proc/meminfo
python3 tools/gpu/matmul_ceiling.py /tmp/peak_tflops 2>&1 | tail -1; P=$(cat /tmp/peak_tflops)
CFG=crates/gemma4/tests/configs/gemma-4-12B-it.json
for run in "plain_64k:--seq 65536 --steps 2 --warmup-discard 1" "offload_64k:--seq 65536 --steps 2 --warmup-discard 1 --offload-checkpoints" "plain_128k:--seq 131072 --steps 1 --warmup-discard 0"; do
  log=${run%%:*}; args=${run#*:}
  # shellcheck disable=SC2086
  timeout 300 .gpu/bench_train --config "$CFG" --device cuda --dtype bf16 --peak-tflops "$P" --micro-batch 1 --accum 1 --recompute all $args > "$OUT/$log.log" 2>&1
  echo "== $log"; grep -E "^note|^recompute|^SUMMARY|Error|step=" "$OUT/$log.log" | cut -c1-260
  echo "t=$(( $(date +%s)-t0 ))"
done
mkdir -p "$OUT/kd"
OUT="$OUT/kd" LAYERS=1 DETAIL_KERNELS="lora_dx_acc|lora_da_part|lora_down" DETAIL_COUNT=24 BENCH_EXTRA="--recompute none" NCU_FLAGS="--clock-control none --cache-control none" bash tools/gpu/kernel_profile.sh > "$OUT/kd_console.log" 2>&1
cp "$OUT/kd/kprof_detail.txt" "$OUT/lora_detail.log"; grep -cE "lora_" "$OUT/lora_detail.log"
echo "t=$(( $(date +%s)-t0 ))"
(cd "$OUT" && tar czf logs.tgz *.log)
