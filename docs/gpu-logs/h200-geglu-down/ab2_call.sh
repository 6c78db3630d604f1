#!/usr/bin/env bash
# The GeGLU-mode kernel at four blocks per SM (launch bounds (128, 4)), the row splits sized to one
# wave of 528 blocks for every lora_dx_da mode, one tanh per element in the GeGLU backward: the
# layer-wise tests and the ops' CUDA-vs-CPU table on CUDA, A/B against the build before the GeGLU
# mode (bench_train_base, 760c75f), alternating, then the 6-layer kernel profile.
set -uo pipefail
t0=$(date +%s)
(cd .gpu && for f in *.xz; do xz -dkf "$f"; done && chmod +x ./*)
source tools/cuda/device_env.sh
src=$(cat .gpu/source_dir); mkdir -p "$(dirname "$src")"; ln -sfn "$PWD" "$src"
pack() { (cd "$OUT" && tar czf logs.tgz *.log && rm -f *.log); }
G4FT_TEST_DEVICE=cuda .gpu/gemma4_layerwise --test-threads 1 > "$OUT/layerwise.log" 2>&1; rc=$?; echo "layerwise rc=$rc"; grep -E "test result|FAIL|panicked" "$OUT/layerwise.log" | head
[ $rc = 0 ] || { pack; exit 1; }
.gpu/g4ft_ops_test gpu_ --nocapture --test-threads=1 > "$OUT/ops.log" 2>&1; rc=$?; echo "ops rc=$rc"; grep -E "test result|FAIL|panicked" "$OUT/ops.log" | head
[ $rc = 0 ] || { pack; exit 1; }
echo "t=$(( $(date +%s)-t0 ))"
CFG=crates/gemma4/tests/configs/gemma-4-12B-it.json
python3 tools/gpu/matmul_ceiling.py /tmp/peak_tflops 2>&1 | tail -1; P=$(cat /tmp/peak_tflops)
run() { # <log> <binary> <args...>
  local log=$1 bin=$2; shift 2
  timeout 300 .gpu/$bin --config "$CFG" --device cuda --dtype bf16 --peak-tflops "$P" "$@" > "$OUT/$log.log" 2>&1
  echo "== $log: $(grep -E '^recompute' "$OUT/$log.log" | sed 's/.*predicted peak/predicted peak/')"; grep -E "^note|^SUMMARY|Error" "$OUT/$log.log"
}
N1="--seq 2048 --micro-batch 1 --accum 8 --steps 4 --warmup-discard 1 --recompute none"
N2="--seq 2048 --micro-batch 2 --accum 4 --steps 4 --warmup-discard 1 --recompute none"
O2="--seq 2048 --micro-batch 2 --accum 4 --steps 4 --warmup-discard 1 --recompute all --offload-checkpoints"
run new_none_m1_a bench_train $N1
run base_none_m1_a bench_train_base $N1
run new_none_m1_b bench_train $N1
run base_none_m1_b bench_train_base $N1
run new_none_m2_a bench_train $N2
run base_none_m2_a bench_train_base $N2
run new_m2_off_a bench_train $O2
run base_m2_off_a bench_train_base $O2
echo "t=$(( $(date +%s)-t0 ))"
mkdir -p /tmp/kprof
OUT=/tmp/kprof LAYERS=6 BENCH_EXTRA="--recompute none" NCU_FLAGS="--clock-control none --cache-control none" \
  bash tools/gpu/kernel_profile.sh > /tmp/kprof/run.txt 2>&1
python3 tools/gpu/ncu_summary.py /tmp/kprof/kprof_ncu.csv > "$OUT/kprof_6l_none_summary.log" 2>&1; grep -E "GPU busy|lora|geglu" "$OUT/kprof_6l_none_summary.log"
python3 tools/gpu/ncu_summary.py /tmp/kprof/kprof_ncu.csv --families > "$OUT/kprof_6l_none_families.log" 2>&1; cat "$OUT/kprof_6l_none_families.log"
echo "t=$(( $(date +%s)-t0 ))"
pack
