#!/usr/bin/env bash
# down_proj's backward through the GeGLU in one kernel (lora_dx_da's GeGLU mode; the tape keeps no
# act): the layer-wise tests and the ops' CUDA-vs-CPU table on CUDA, then A/B against the build
# before (bench_train_base), alternating: --recompute none at micro-batch 1, 2 and 4, all
# --offload-checkpoints at 2.
set -uo pipefail
t0=$(date +%s)
(cd .gpu && for f in *.xz; do xz -dkf "$f"; done && chmod +x ./*)
source tools/cuda/device_env.sh
src=$(cat .gpu/source_dir); mkdir -p "$(dirname "$src")"; ln -sfn "$PWD" "$src"
pack() { (cd "$OUT" && tar czf logs.tgz *.log && rm -f *.log); }
G4FT_TEST_DEVICE=cuda .gpu/gemma4_layerwise --test-threads 1 > "$OUT/layerwise.log" 2>&1; rc=$?; echo "layerwise rc=$rc"; grep -E "test result|FAIL|panicked" "$OUT/layerwise.log" | head
[ $rc = 0 ] || { pack; exit 1; }
.gpu/g4ft_ops_test gpu_ --nocapture --test-threads=1 > "$OUT/ops.log" 2>&1; rc=$?; echo "ops rc=$rc"; grep -E "test result|FAIL|panicked|geglu" "$OUT/ops.log" | head -40
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
N4="--seq 2048 --micro-batch 4 --accum 2 --steps 4 --warmup-discard 1 --recompute none"
O2="--seq 2048 --micro-batch 2 --accum 4 --steps 4 --warmup-discard 1 --recompute all --offload-checkpoints"
run new_none_m1_a bench_train $N1
run base_none_m1_a bench_train_base $N1
run new_none_m1_b bench_train $N1
run base_none_m1_b bench_train_base $N1
echo "t=$(( $(date +%s)-t0 ))"
run new_none_m2_a bench_train $N2
run base_none_m2_a bench_train_base $N2
run new_m2_off_a bench_train $O2
run base_m2_off_a bench_train_base $O2
echo "t=$(( $(date +%s)-t0 ))"
run new_none_m4_a bench_train $N4
run base_none_m4_a bench_train_base $N4
echo "t=$(( $(date +%s)-t0 ))"
pack
