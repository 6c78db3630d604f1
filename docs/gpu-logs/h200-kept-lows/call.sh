#!/usr/bin/env bash
# Kept adapter down products (lows) in the recompute: layer-wise tests on CUDA (every keep mask and
# parked level, same bits), then A/B against the build before (bench_train_base) at micro-batch 2
# with offloaded checkpoints and at micro-batch 1 without, alternating.
set -uo pipefail
t0=$(date +%s)
(cd .gpu && for f in *.xz; do xz -dkf "$f"; done && chmod +x ./*)
source tools/cuda/device_env.sh
src=$(cat .gpu/source_dir); mkdir -p "$(dirname "$src")"; ln -sfn "$PWD" "$src"
pack() { (cd "$OUT" && tar czf logs.tgz *.log); }
G4FT_TEST_DEVICE=cuda .gpu/gemma4_layerwise --test-threads 1 > "$OUT/layerwise.log" 2>&1; rc=$?; echo "layerwise rc=$rc"; grep -E "test result|FAIL|panicked" "$OUT/layerwise.log" | head
[ $rc = 0 ] || { pack; exit 1; }
.gpu/g4ft_ops_test gpu_lora_up_geglu --nocapture --test-threads=1 > "$OUT/ops_geglu.log" 2>&1; echo "ops rc=$?"; grep -E "test result|FAIL|panicked" "$OUT/ops_geglu.log" | head -3
echo "t=$(( $(date +%s)-t0 ))"
CFG=crates/gemma4/tests/configs/gemma-4-12B-it.json
python3 tools/gpu/matmul_ceiling.py /tmp/peak_tflops 2>&1 | tail -1; P=$(cat /tmp/peak_tflops)
run() { # <log> <binary> <args...>
  local log=$1 bin=$2; shift 2
  timeout 300 .gpu/$bin --config "$CFG" --device cuda --dtype bf16 --peak-tflops "$P" "$@" > "$OUT/$log.log" 2>&1
  echo "== $log: $(grep -E '^recompute' "$OUT/$log.log" | sed 's/.*predicted peak/predicted peak/')"; grep -E "^note|^SUMMARY|Error" "$OUT/$log.log"
}
M2="--seq 2048 --micro-batch 2 --accum 4 --steps 4 --warmup-discard 1 --recompute all --offload-checkpoints"
M1="--seq 2048 --micro-batch 1 --accum 8 --steps 4 --warmup-discard 1 --recompute all"
run lows_m2_off_a bench_train $M2
run base_m2_off_a bench_train_base $M2
run lows_m2_off_b bench_train $M2
run base_m2_off_b bench_train_base $M2
echo "t=$(( $(date +%s)-t0 ))"
run lows_m1_all bench_train $M1
run base_m1_all bench_train_base $M1
echo "t=$(( $(date +%s)-t0 ))"
mkdir -p "$OUT/kprof"
OUT="$OUT/kprof" LAYERS=6 BENCH_EXTRA="--recompute none" NCU_FLAGS="--clock-control none --cache-control none" bash tools/gpu/kernel_profile.sh 2>&1 | tail -5
python3 tools/gpu/ncu_summary.py "$OUT/kprof/kprof_ncu.csv" > "$OUT/kprof_6l_none_summary.log" 2>&1; head -45 "$OUT/kprof_6l_none_summary.log"
python3 tools/gpu/ncu_summary.py "$OUT/kprof/kprof_ncu.csv" --families > "$OUT/kprof_6l_none_families.log" 2>&1; cat "$OUT/kprof_6l_none_families.log"
echo "t=$(( $(date +%s)-t0 ))"
pack
