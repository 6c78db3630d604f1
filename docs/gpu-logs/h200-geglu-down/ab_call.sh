#!/usr/bin/env bash
# A/B of down_proj's backward through the GeGLU (lora_dx_da's GeGLU mode, no act on the tape)
# against the build before (bench_train_base, 760c75f), alternating: --recompute none at
# micro-batch 1, 2 and 4, all --offload-checkpoints at 2; --recompute none at micro-batch 8 (the
# new build alone: the build before needs more than the card); then the 6-layer kernel profile of
# the new build with Nsight Compute's detail of the GeGLU-mode kernel. (call.sh ran the CUDA
# tests; its base binary was a mixed build and did not run.)
set -uo pipefail
t0=$(date +%s)
(cd .gpu && for f in bench_train*.xz; do xz -dkf "$f"; done && chmod +x ./*)
source tools/cuda/device_env.sh
pack() { (cd "$OUT" && tar czf logs.tgz *.log && rm -f *.log); }
CFG=crates/gemma4/tests/configs/gemma-4-12B-it.json
python3 tools/gpu/matmul_ceiling.py /tmp/peak_tflops 2>&1 | tail -1; P=$(cat /tmp/peak_tflops)
run() { # <log> <binary> <args...>
  local log=$1 bin=$2; shift 2
  timeout 300 .gpu/$bin --config "$CFG" --device cuda --dtype bf16 --peak-tflops "$P" "$@" > "$OUT/$log.log" 2>&1
  echo "== $log: $(grep -E '^recompute' "$OUT/$log.log" | sed 's/.*predicted peak/predicted peak/')"; grep -E "^note|^SUMMARY|Error" "$OUT/$log.log"
}
N1="--seq 2048 --micro-batch 1 --accum 8 --steps 4 --warmup-discard 1 --recompute none"
N2="--seq 2048 --micro-batch 2 --accum 4 --steps 4 --warmup-discard 1 --recompute none"
N4="--seq 2048 --micro-batch 4 --accum 2 --steps 4 --warmup-discard 1 --recompute none"
O2="--seq 2048 --micro-batch 2 --accum 4 --steps 4 --warmup-discard 1 --recompute all --offload-checkpoints"
run base_none_m1_a bench_train_base $N1
run new_none_m1_a bench_train $N1
run base_none_m1_b bench_train_base $N1
run new_none_m1_b bench_train $N1
echo "t=$(( $(date +%s)-t0 ))"
run base_none_m2_a bench_train_base $N2
run new_none_m2_a bench_train $N2
run base_none_m4_a bench_train_base $N4
run new_none_m4_a bench_train $N4
echo "t=$(( $(date +%s)-t0 ))"
run base_m2_off_a bench_train_base $O2
run new_m2_off_a bench_train $O2
run base_m2_off_b bench_train_base $O2
run new_m2_off_b bench_train $O2
echo "t=$(( $(date +%s)-t0 ))"
run new_none_m8_a bench_train --seq 2048 --micro-batch 8 --accum 1 --steps 4 --warmup-discard 1 --recompute none
echo "t=$(( $(date +%s)-t0 ))"
mkdir -p /tmp/kprof
OUT=/tmp/kprof LAYERS=6 BENCH_EXTRA="--recompute none" NCU_FLAGS="--clock-control none --cache-control none" \
  DETAIL_KERNELS="lora_dx_da_ks1_geglu" bash tools/gpu/kernel_profile.sh > /tmp/kprof/run.txt 2>&1
python3 tools/gpu/ncu_summary.py /tmp/kprof/kprof_ncu.csv > "$OUT/kprof_6l_none_summary.log" 2>&1; head -40 "$OUT/kprof_6l_none_summary.log"
python3 tools/gpu/ncu_summary.py /tmp/kprof/kprof_ncu.csv --families > "$OUT/kprof_6l_none_families.log" 2>&1; cat "$OUT/kprof_6l_none_families.log"
cp /tmp/kprof/kprof_detail.txt "$OUT/geglu_kernel_detail.log"
grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Registers|Theoretical Occ" "$OUT/geglu_kernel_detail.log" | head -12
echo "t=$(( $(date +%s)-t0 ))"
pack
