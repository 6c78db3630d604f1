#!/usr/bin/env bash
# The fused terms against the epilogue; a 6-layer kernel profile of the new build; A/B --recompute all.
set -uo pipefail
t0=$(date +%s)
cd .gpu && for f in g4ft_ops_test bench_train bench_train_base; do xz -dkf $f.xz; chmod +x $f; done; cd ..
source tools/cuda/device_env.sh; export NCCL_NVLS_ENABLE=0
.gpu/g4ft_ops_test gpu_lora_up_geglu_against --nocapture --test-threads=1 > "$OUT/against_epilogue.log" 2>&1; echo "against rc $? t=$(( $(date +%s)-t0 ))"
grep -E "B scale|test result|panick" "$OUT/against_epilogue.log"
LAYERS=6 BENCH_EXTRA="--recompute none" NCU_FLAGS="--clock-control none --cache-control none" bash tools/gpu/kernel_profile.sh > "$OUT/kprof_run.log" 2>&1; echo "kprof rc $? t=$(( $(date +%s)-t0 ))"
python3 tools/gpu/ncu_summary.py "$OUT/kprof_ncu.csv" --top 30 2>&1 | head -34
python3 - "$OUT/kprof_ncu.csv" <<'PY'
import sys; sys.path.insert(0, 'tools/gpu'); import ncu_summary as n
ks = n.kernel_times(sys.argv[1])
for i, (k, t) in enumerate(ks):
    if 'up_geglu' in k or 'geglu' in k:
        print(i, k[:60], round(t / 1000, 1), ' prev:', ks[i-1][0][:40], round(ks[i-1][1]/1000, 1))
PY
python3 tools/gpu/matmul_ceiling.py /tmp/peak_tflops 2>&1 | tail -1; P=$(cat /tmp/peak_tflops)
CFG=crates/gemma4/tests/configs/gemma-4-12B-it.json
run() { # <binary> <policy> <micro> <tag>
  local acc=$(( 8 / $3 ))
  timeout 300 .gpu/$1 --config "$CFG" --device cuda --dtype bf16 --seq 2048 --micro-batch $3 --accum $acc --steps 4 \
    --warmup-discard 1 --peak-tflops "$P" --recompute $2 > "$OUT/$4.log" 2>&1
  echo "$4 rc $? t=$(( $(date +%s)-t0 ))"; grep -E "^step=[0-9]|SUMMARY" "$OUT/$4.log" | cut -c1-150
}
for pass in 1 2; do
  run bench_train_base all 1 base_all_m1_$pass
  run bench_train all 1 fused_all_m1_$pass
done
