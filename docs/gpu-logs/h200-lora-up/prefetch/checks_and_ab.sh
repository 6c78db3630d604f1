#!/usr/bin/env bash
# The adapter-term kernels with the outputs' loads issued first: checks, 6-layer kernel profile, A/B.
set -uo pipefail
t0=$(date +%s)
mkdir -p /tmp/logs; L=/tmp/logs
cd .gpu && for f in g4ft_ops_test bench_train bench_train_base; do xz -dkf $f.xz; chmod +x $f; done; cd ..
source tools/cuda/device_env.sh; export NCCL_NVLS_ENABLE=0
.gpu/g4ft_ops_test gpu_lora_up_geglu_against --nocapture --test-threads=1 > $L/against_projection.log 2>&1; echo "against rc $? t=$(( $(date +%s)-t0 ))"
grep -E "B scale|test result|panick" $L/against_projection.log
OUT=$L/kprof LAYERS=6 BENCH_EXTRA="--recompute none" NCU_FLAGS="--clock-control none --cache-control none" bash tools/gpu/kernel_profile.sh > $L/kprof_run.log 2>&1; echo "kprof rc $? t=$(( $(date +%s)-t0 ))"
python3 tools/gpu/ncu_summary.py $L/kprof/kprof_ncu.csv --families > $L/kprof_families.txt 2>&1; head -1 $L/kprof_families.txt
grep -E "lora_up|geglu|badd" $L/kprof/kprof_summary.txt | head
python3 - $L/kprof/kprof_ncu.csv <<'PY'
import sys; sys.path.insert(0, 'tools/gpu'); import ncu_summary as n
ks = n.kernel_times(sys.argv[1])
print([round(t / 1000, 1) for k, t in ks if 'lora_up' in k][:12])
PY
python3 tools/gpu/matmul_ceiling.py /tmp/peak_tflops 2>&1 | tail -1; P=$(cat /tmp/peak_tflops)
CFG=crates/gemma4/tests/configs/gemma-4-12B-it.json
run() { # <binary> <policy> <micro> <tag>
  local acc=$(( 8 / $3 ))
  timeout 300 .gpu/$1 --config "$CFG" --device cuda --dtype bf16 --seq 2048 --micro-batch $3 --accum $acc --steps 4 \
    --warmup-discard 1 --peak-tflops "$P" --recompute $2 > $L/$4.log 2>&1
  echo "$4 rc $? t=$(( $(date +%s)-t0 ))"; grep -E "SUMMARY" $L/$4.log | cut -c1-110
}
for pass in 1 2; do
  run bench_train_base none 1 base_none_m1_$pass
  run bench_train none 1 fused_none_m1_$pass
done
run bench_train_base all 1 base_all_m1_1
run bench_train all 1 fused_all_m1_1
grep -h "^step=2" $L/*_m1_1.log
tar -C /tmp -czf "$OUT/logs.tgz" logs
