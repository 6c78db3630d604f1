#!/usr/bin/env bash
# The `dx +=` adapter kernel with its dx chunks loaded before the product and 288-byte staging rows
# (also the staging of lora_up_add / lora_up_geglu): the adapter ops against the projection on CUDA,
# the layer-wise tests, then A/B against the build before at `--recompute none` and `all`,
# micro-batch 1, alternating (the same losses and gradient norms: the kernels' values are unchanged).
set -uo pipefail
t0=$(date +%s)
(cd .gpu && for f in *.xz; do xz -dkf "$f"; done && chmod +x ./*)
source tools/cuda/device_env.sh
src=$(cat .gpu/source_dir); mkdir -p "$(dirname "$src")"; ln -sfn "$PWD" "$src"
.gpu/g4ft_ops_test gpu_lora_up_geglu --test-threads=1 > "$OUT/ops_geglu.log" 2>&1; echo "ops rc=$?"; grep -E "test result" "$OUT/ops_geglu.log"
G4FT_TEST_DEVICE=cuda .gpu/gemma4_layerwise --test-threads 1 > "$OUT/layerwise.log" 2>&1; echo "layerwise rc=$?"; grep -E "test result" "$OUT/layerwise.log"
python3 tools/gpu/matmul_ceiling.py /tmp/peak_tflops 2>&1 | tail -1; P=$(cat /tmp/peak_tflops)
CFG=crates/gemma4/tests/configs/gemma-4-12B-it.json
run() { # <log> <binary> <args...>
  local log=$1 bin=$2; shift 2
  timeout 300 .gpu/$bin --config "$CFG" --device cuda --dtype bf16 --peak-tflops "$P" --seq 2048 --micro-batch 1 --accum 8 --steps 4 --warmup-discard 1 "$@" > "$OUT/$log.log" 2>&1
  echo "== $log: $(grep -E '^SUMMARY' "$OUT/$log.log" | cut -c1-120)"; grep -E "^step=3" "$OUT/$log.log" | cut -c1-80
}
run stage_none_a bench_train --recompute none
run base_none_a bench_train_base --recompute none
run stage_none_b bench_train --recompute none
run base_none_b bench_train_base --recompute none
echo "t=$(( $(date +%s)-t0 ))"
(cd "$OUT" && tar czf logs.tgz *.log)
