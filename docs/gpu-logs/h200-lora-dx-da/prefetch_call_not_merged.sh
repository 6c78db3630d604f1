#!/usr/bin/env bash
# lora_dx_da fetching each stage's x and dlow chunks one stage ahead (and dlow·A's A fragments
# from the staged dlow rows): the layer-wise tests and the ops' CUDA-vs-CPU table on CUDA, then
# A/B against the first version (bench_train_dxda) with --recompute none at micro-batch 1 and 2.
set -uo pipefail
t0=$(date +%s)
(cd .gpu && for f in *.xz; do xz -dkf "$f"; done && chmod +x ./*)
source tools/cuda/device_env.sh
src=$(cat .gpu/source_dir); mkdir -p "$(dirname "$src")"; ln -sfn "$PWD" "$src"
G4FT_TEST_DEVICE=cuda .gpu/gemma4_layerwise --test-threads 1 > "$OUT/tests.log" 2>&1; rc=$?; echo "layerwise rc=$rc"; grep -E "test result|FAIL|panicked" "$OUT/tests.log" | head
[ $rc = 0 ] || exit 1
.gpu/g4ft_ops_test gpu_kernels_table --nocapture --test-threads=1 >> "$OUT/tests.log" 2>&1; rc=$?; echo "ops rc=$rc"; grep -c "| ok |" "$OUT/tests.log"; grep -E "test result|FAIL|panicked|lora_linear_saved" "$OUT/tests.log" | head
[ $rc = 0 ] || exit 1
echo "t=$(( $(date +%s)-t0 ))"
CFG=crates/gemma4/tests/configs/gemma-4-12B-it.json
python3 tools/gpu/matmul_ceiling.py /tmp/peak_tflops 2>&1 | tail -1; P=$(cat /tmp/peak_tflops)
run() { # <log> <binary> <args...>
  local log=$1 bin=$2; shift 2
  timeout 300 .gpu/$bin --config "$CFG" --device cuda --dtype bf16 --peak-tflops "$P" "$@" > "/tmp/$log.log" 2>&1
  echo "== $log"; grep -E "^note|^SUMMARY|Error" "/tmp/$log.log"; cat "/tmp/$log.log" >> "$OUT/ab.log"
}
N1="--seq 2048 --micro-batch 1 --accum 8 --steps 4 --warmup-discard 1 --recompute none"
N2="--seq 2048 --micro-batch 2 --accum 4 --steps 4 --warmup-discard 1 --recompute none"
run prefetch_none_m1_a bench_train $N1
run first_none_m1_a bench_train_dxda $N1
run prefetch_none_m1_b bench_train $N1
run first_none_m1_b bench_train_dxda $N1
run prefetch_none_m2_a bench_train $N2
run first_none_m2_a bench_train_dxda $N2
echo "t=$(( $(date +%s)-t0 ))"
