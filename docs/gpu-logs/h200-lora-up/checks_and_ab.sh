#!/usr/bin/env bash
# Checks of the adapter-term kernels (lora_up_add in every projection, lora_up_geglu in the MLP),
# the parity tests on CUDA, a 6-layer kernel profile, then the 12B step A/B at micro-batch 1, --recompute none.
set -uo pipefail
t0=$(date +%s)
cd .gpu && for f in g4ft_ops_test gemma4_layerwise gemma4_parity generate_parity bench_train bench_train_base; do xz -dkf $f.xz; chmod +x $f; done; cd ..
source tools/cuda/device_env.sh; export NCCL_NVLS_ENABLE=0
if [ -f .gpu/source_dir ]; then src=$(cat .gpu/source_dir); [ -e "$src" ] || { mkdir -p "$(dirname "$src")" && ln -sfn "$PWD" "$src"; }; fi
.gpu/g4ft_ops_test gpu_lora_up_geglu_against --nocapture --test-threads=1 > "$OUT/against_projection.log" 2>&1; echo "against rc $? t=$(( $(date +%s)-t0 ))"
grep -E "B scale|test result|panick" "$OUT/against_projection.log"
G4FT_TEST_DEVICE=cuda .gpu/gemma4_layerwise --nocapture --test-threads 1 > "$OUT/layerwise.log" 2>&1; echo "layerwise rc $? t=$(( $(date +%s)-t0 ))"
grep -E "^test |result" "$OUT/layerwise.log" | head -12
G4FT_TEST_DEVICE=cuda .gpu/gemma4_parity --nocapture --test-threads 1 > "$OUT/parity.log" 2>&1; echo "parity rc $? t=$(( $(date +%s)-t0 ))"; grep -E "test result|FAIL" "$OUT/parity.log" | head -5
G4FT_TEST_DEVICE=cuda .gpu/generate_parity --nocapture --test-threads 1 > "$OUT/generate_parity.log" 2>&1; echo "generate_parity rc $? t=$(( $(date +%s)-t0 ))"; grep -E "test result|FAIL" "$OUT/generate_parity.log" | head -5
.gpu/g4ft_ops_test gpu_kernels_table --nocapture --test-threads=1 > "$OUT/ops.log" 2>&1; echo "ops rc $? t=$(( $(date +%s)-t0 ))"
grep -c "| ok |" "$OUT/ops.log"; grep -E "FAIL|panick|test result" "$OUT/ops.log" | head -5
.gpu/g4ft_ops_test gpu_dropout_launchers --nocapture --test-threads=1 > "$OUT/dropout_launchers.log" 2>&1; echo "dropout rc $?"
LAYERS=6 BENCH_EXTRA="--recompute none" NCU_FLAGS="--clock-control none --cache-control none" bash tools/gpu/kernel_profile.sh > "$OUT/kprof_run.log" 2>&1; echo "kprof rc $? t=$(( $(date +%s)-t0 ))"
python3 tools/gpu/ncu_summary.py "$OUT/kprof_ncu.csv" --families > "$OUT/kprof_families.txt" 2>&1; head -3 "$OUT/kprof_families.txt"
grep -E "lora_up|geglu|badd" "$OUT/kprof_summary.txt" | head
python3 tools/gpu/matmul_ceiling.py /tmp/peak_tflops 2>&1 | tail -1; P=$(cat /tmp/peak_tflops)
CFG=crates/gemma4/tests/configs/gemma-4-12B-it.json
run() { # <binary> <policy> <micro> <tag>
  local acc=$(( 8 / $3 ))
  timeout 300 .gpu/$1 --config "$CFG" --device cuda --dtype bf16 --seq 2048 --micro-batch $3 --accum $acc --steps 4 \
    --warmup-discard 1 --peak-tflops "$P" --recompute $2 > "$OUT/$4.log" 2>&1
  echo "$4 rc $? t=$(( $(date +%s)-t0 ))"; grep -E "^step=[0-9]|SUMMARY" "$OUT/$4.log" | cut -c1-150
}
for pass in 1 2; do
  run bench_train_base none 1 base_none_m1_$pass
  run bench_train none 1 fused_none_m1_$pass
done
