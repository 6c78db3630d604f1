#!/usr/bin/env bash
# Offloaded checkpoints with the attention state parked: layer-wise tests on CUDA (every level), the
# offload round trip, then A/B against the build that parks the block outputs only (bench_train_outputs),
# 32k with and without offload, and 128k with offload (the host's RAM holds only the inputs there).
set -uo pipefail
t0=$(date +%s)
(cd .gpu && for f in *.xz; do xz -dkf "$f"; done && chmod +x ./*)
source tools/cuda/device_env.sh
src=$(cat .gpu/source_dir); mkdir -p "$(dirname "$src")"; ln -sfn "$PWD" "$src"
pack() { (cd "$OUT" && tar czf logs.tgz *.log); }
grep -E "MemTotal|MemAvailable" /proc/meminfo
G4FT_TEST_DEVICE=cuda .gpu/gemma4_layerwise --test-threads 1 > "$OUT/layerwise.log" 2>&1; rc=$?; echo "layerwise rc=$rc"; grep -E "test result|FAIL|panicked" "$OUT/layerwise.log" | head
[ $rc = 0 ] || { pack; exit 1; }
.gpu/g4ft_ops_test gpu_host_offload --nocapture --test-threads=1 > "$OUT/ops_offload.log" 2>&1; echo "ops rc=$?"; grep -E "test result|FAIL|panicked" "$OUT/ops_offload.log" | head
echo "t=$(( $(date +%s)-t0 ))"
CFG=crates/gemma4/tests/configs/gemma-4-12B-it.json
python3 tools/gpu/matmul_ceiling.py /tmp/peak_tflops 2>&1 | tail -1; P=$(cat /tmp/peak_tflops)
run() { # <log> <binary> <args...>
  local log=$1 bin=$2; shift 2
  timeout 300 .gpu/$bin --config "$CFG" --device cuda --dtype bf16 --peak-tflops "$P" "$@" > "$OUT/$log.log" 2>&1
  echo "== $log: $(grep -E '^recompute' "$OUT/$log.log" | sed 's/.*predicted peak/predicted peak/')"; grep -E "^note|^SUMMARY|Error" "$OUT/$log.log"
}
M2="--seq 2048 --micro-batch 2 --accum 4 --steps 4 --warmup-discard 1 --recompute all --offload-checkpoints"
run attention_m2_a bench_train $M2
run outputs_m2_a bench_train_outputs $M2
run attention_m2_b bench_train $M2
run outputs_m2_b bench_train_outputs $M2
echo "t=$(( $(date +%s)-t0 ))"
L32="--seq 32768 --micro-batch 1 --accum 1 --steps 3 --warmup-discard 1 --recompute all"
run attention_32k bench_train $L32 --offload-checkpoints
run plain_32k bench_train $L32
echo "t=$(( $(date +%s)-t0 ))"
run attention_128k bench_train --seq 131072 --micro-batch 1 --accum 1 --steps 1 --warmup-discard 0 --recompute all --offload-checkpoints
echo "t=$(( $(date +%s)-t0 ))"
pack
