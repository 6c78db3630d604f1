#!/usr/bin/env bash
# The 6-layer kernel profile of the build with lora_dx_da (and Nsight Compute's detail of that
# kernel), then A/B against the build before with all --offload-checkpoints at micro-batch 2,
# alternating, the build before first.
set -uo pipefail
t0=$(date +%s)
(cd .gpu && for f in *.xz; do xz -dkf "$f"; done && chmod +x ./*)
source tools/cuda/device_env.sh
mkdir -p /tmp/kprof
OUT=/tmp/kprof LAYERS=6 BENCH_EXTRA="--recompute none" NCU_FLAGS="--clock-control none --cache-control none" \
  DETAIL_KERNELS="lora_dx_da|lora_down" bash tools/gpu/kernel_profile.sh > /tmp/kprof/run.txt 2>&1
python3 tools/gpu/ncu_summary.py /tmp/kprof/kprof_ncu.csv > "$OUT/kprof_6l_none_summary.log" 2>&1; head -45 "$OUT/kprof_6l_none_summary.log"
python3 tools/gpu/ncu_summary.py /tmp/kprof/kprof_ncu.csv --families > "$OUT/kprof_6l_none_families.log" 2>&1; cat "$OUT/kprof_6l_none_families.log"
cp /tmp/kprof/kprof_detail.txt "$OUT/lora_kernels_detail.log"
grep -E "^  [a-z_]+.*\(|Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Registers|Theoretical Occ|Waves" "$OUT/lora_kernels_detail.log" | head -40
echo "t=$(( $(date +%s)-t0 ))"
CFG=crates/gemma4/tests/configs/gemma-4-12B-it.json
python3 tools/gpu/matmul_ceiling.py /tmp/peak_tflops 2>&1 | tail -1; P=$(cat /tmp/peak_tflops)
run() { # <log> <binary> <args...>
  local log=$1 bin=$2; shift 2
  timeout 300 .gpu/$bin --config "$CFG" --device cuda --dtype bf16 --peak-tflops "$P" "$@" > "/tmp/$log.log" 2>&1
  echo "== $log"; grep -E "^note|^SUMMARY|Error" "/tmp/$log.log"; cat "/tmp/$log.log" >> "$OUT/offload_ab.log"
}
O2="--seq 2048 --micro-batch 2 --accum 4 --steps 4 --warmup-discard 1 --recompute all --offload-checkpoints"
run base_m2_off_b bench_train_base $O2
run dxda_m2_off_b bench_train $O2
run base_m2_off_c bench_train_base $O2
run dxda_m2_off_c bench_train $O2
echo "t=$(( $(date +%s)-t0 ))"
