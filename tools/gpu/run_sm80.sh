#!/usr/bin/env bash
# The code paths of a GPU before Hopper (A100, L40, RTX 30xx / 40xx), run on an H100 / H200: a
# build for CUDA_COMPUTE_CAP=80 holds only sm_80 PTX, which the driver compiles for the GPU it
# runs on, and leaves out what the Hopper build adds (the wgmma attention and MoE kernels,
# programmatic dependent launch; docs/cuda.md). Build it on any machine (no GPU needed):
#   VARIANT=sm80 CUDA_COMPUTE_CAP=80 CARGO_TARGET_DIR=$PWD/target/cuda80 bash tools/gpu/build.sh
# then carry .gpu/variants/sm80_* (and .gpu/source_dir) and run this from the repository root.
# Runs the ops' CUDA-vs-CPU table, the layer-wise backward against autograd and the 12B step
# (`--recompute all`, micro-batch 1, the post's job); logs in $OUT (default out/gpu).
set -uo pipefail
OUT="${OUT:-out/gpu}"; mkdir -p "$OUT"
source tools/gpu/machine_setup.sh
for f in .gpu/variants/sm80_*.xz; do xz -dkf "$f"; done
chmod +x .gpu/variants/sm80_*
step() { echo; echo "=== $*"; }
step "ops: CUDA vs CPU (sm_80 build)"
.gpu/variants/sm80_ops_test gpu_ --nocapture --test-threads=1 2>&1 | tee "$OUT/sm80_ops.log" \
  | grep -E "^test |FAIL|result|mismatch" | head -60
step "layer-wise explicit backward vs autograd (sm_80 build)"
G4FT_TEST_DEVICE=cuda .gpu/variants/sm80_layerwise --nocapture --test-threads 1 2>&1 \
  | tee "$OUT/sm80_layerwise.log" | grep -E "^(==|test )|FAIL|result" | head -40
step "bench_train 12B shape (sm_80 build)"
timeout 300 .gpu/variants/sm80_bench_train --config crates/gemma4/tests/configs/gemma-4-12B-it.json --device cuda \
  --dtype bf16 --seq 2048 --micro-batch 1 --accum 8 --steps "${BENCH_STEPS:-4}" --warmup-discard 1 2>&1 \
  | tee "$OUT/sm80_bench_train.log" | grep -E "^(model|plan|recompute|SUMMARY)"
