#!/usr/bin/env bash
# The LoRA dropout keep bits (lora_down stores the mask, lora_da_part / lora_dx_acc read it) and the
# per-layer adapter copies (one cast launch per layer forward, no step-long copies): the CUDA checks
# of the head, then the 12B step at micro-batch 1, alternating the build before (bench_train_base),
# the keep bits alone (bench_train_bits) and both (bench_train), --recompute none and all; last a
# 6-layer kernel profile of the head.
set -uo pipefail
t0=$(date +%s)
cd .gpu && for f in g4ft_ops_test gemma4_layerwise gemma4_parity bench_train bench_train_bits bench_train_base; do xz -dkf $f.xz; chmod +x $f; done; cd ..
source tools/cuda/device_env.sh; export NCCL_NVLS_ENABLE=0
if [ -f .gpu/source_dir ]; then src=$(cat .gpu/source_dir); [ -e "$src" ] || { mkdir -p "$(dirname "$src")" && ln -sfn "$PWD" "$src"; }; fi
.gpu/g4ft_ops_test gpu_kernels_table --nocapture --test-threads=1 > "$OUT/ops.log" 2>&1; echo "ops rc $? t=$(( $(date +%s)-t0 ))"
grep -c "| ok |" "$OUT/ops.log"; grep -E "FAIL|panick|test result" "$OUT/ops.log" | head -5
.gpu/g4ft_ops_test gpu_lora_up_geglu_against --nocapture --test-threads=1 > "$OUT/against_projection.log" 2>&1; echo "against rc $?"
.gpu/g4ft_ops_test gpu_cast_together --nocapture --test-threads=1 > "$OUT/cast_together.log" 2>&1; echo "cast_together rc $?"; grep -E "test result|panick" "$OUT/cast_together.log"
G4FT_TEST_DEVICE=cuda .gpu/gemma4_layerwise --nocapture --test-threads 1 > "$OUT/layerwise.log" 2>&1; echo "layerwise rc $? t=$(( $(date +%s)-t0 ))"
grep -E "^test |result" "$OUT/layerwise.log" | head -12
G4FT_TEST_DEVICE=cuda .gpu/gemma4_parity --nocapture --test-threads 1 > "$OUT/parity.log" 2>&1; echo "parity rc $? t=$(( $(date +%s)-t0 ))"; grep -E "test result|FAIL" "$OUT/parity.log" | head -5
python3 tools/gpu/matmul_ceiling.py /tmp/peak_tflops 2>&1 | tail -1; P=$(cat /tmp/peak_tflops)
CFG=crates/gemma4/tests/configs/gemma-4-12B-it.json
run() { # <binary> <policy> <tag>
  timeout 300 .gpu/$1 --config "$CFG" --device cuda --dtype bf16 --seq 2048 --micro-batch 1 --accum 8 --steps 4 \
    --warmup-discard 1 --peak-tflops "$P" --recompute $2 > "$OUT/$3.log" 2>&1
  echo "$3 rc $? t=$(( $(date +%s)-t0 ))"; grep -E "^step=[0-9]|SUMMARY" "$OUT/$3.log" | cut -c1-150
}
for policy in none all; do
  run bench_train_base $policy base_${policy}_1
  run bench_train_bits $policy bits_${policy}_1
  run bench_train $policy copies_${policy}_1
  run bench_train_base $policy base_${policy}_2
  run bench_train $policy copies_${policy}_2
done
LAYERS=6 BENCH_EXTRA="--recompute none" NCU_FLAGS="--clock-control none --cache-control none" bash tools/gpu/kernel_profile.sh > "$OUT/kprof_run.log" 2>&1; echo "kprof rc $? t=$(( $(date +%s)-t0 ))"
python3 tools/gpu/ncu_summary.py "$OUT/kprof_ncu.csv" --families > "$OUT/kprof_families.txt" 2>&1; head -14 "$OUT/kprof_families.txt"
grep -E "lora_" "$OUT/kprof_summary.txt" | head
(cd "$OUT" && tar czf logs.tgz *.log *.txt *.csv 2>/dev/null && rm -f *.csv)
