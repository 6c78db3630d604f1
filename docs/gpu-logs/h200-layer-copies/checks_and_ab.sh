#!/usr/bin/env bash
# Per-layer adapter copies (one cast launch per layer forward, no step-long copies; e656f74's
# adapter kernels): the CUDA checks, then the 12B step at micro-batch 1 alternating with the build
# before (bench_train_base), --recompute all and none. Logs in one archive (the machine returns few files).
set -uo pipefail
t0=$(date +%s)
L=$OUT/logs; mkdir -p "$L"
cd .gpu && for f in g4ft_ops_test gemma4_layerwise bench_train bench_train_base; do xz -dkf $f.xz; chmod +x $f; done; cd ..
source tools/cuda/device_env.sh; export NCCL_NVLS_ENABLE=0
if [ -f .gpu/source_dir ]; then src=$(cat .gpu/source_dir); [ -e "$src" ] || { mkdir -p "$(dirname "$src")" && ln -sfn "$PWD" "$src"; }; fi
.gpu/g4ft_ops_test gpu_cast_together --nocapture --test-threads=1 > "$L/cast_together.log" 2>&1; echo "cast_together rc $?"; grep -E "test result|panick" "$L/cast_together.log"
G4FT_TEST_DEVICE=cuda .gpu/gemma4_layerwise --nocapture --test-threads 1 > "$L/layerwise.log" 2>&1; echo "layerwise rc $? t=$(( $(date +%s)-t0 ))"
grep -E "result|held_adapter" "$L/layerwise.log" | head -4
P=731.5  # the matmul ceiling measured in the keep-bits run just before (h200-keep-bits/keep_bits_not_merged.out)
CFG=crates/gemma4/tests/configs/gemma-4-12B-it.json
run() { # <binary> <policy> <tag>
  timeout 300 .gpu/$1 --config "$CFG" --device cuda --dtype bf16 --seq 2048 --micro-batch 1 --accum 8 --steps 4 \
    --warmup-discard 1 --peak-tflops "$P" --recompute $2 > "$L/$3.log" 2>&1
  echo "$3 rc $? t=$(( $(date +%s)-t0 ))"; grep -E "^step=3|SUMMARY" "$L/$3.log" | cut -c1-170
}
run bench_train all copies_all_1
run bench_train_base all base_all_1
run bench_train all copies_all_2
run bench_train none copies_none_1
.gpu/g4ft_ops_test gpu_kernels_table --nocapture --test-threads=1 > "$L/ops.log" 2>&1; echo "ops rc $? t=$(( $(date +%s)-t0 ))"
grep -c "| ok |" "$L/ops.log"; grep -E "FAIL|panick|test result" "$L/ops.log" | head -5
(cd "$OUT" && tar czf logs.tgz logs && rm -rf logs)
