#!/usr/bin/env bash
# GPU-machine checks, run from the repository root after tools/gpu/build.sh (carry .gpu):
# parity tests on CUDA, score, train_ddp under ddprun and the real torchrun, bench_train on the 12B shape.
# Logs go to $OUT (the device tool's output folder) or ./out/gpu.
set -uo pipefail
OUT="${OUT:-out/gpu}"; mkdir -p "$OUT"
source tools/gpu/machine_setup.sh
step() { echo; echo "=== $*"; }
step gpu; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
step parity; G4FT_TEST_DEVICE=cuda .gpu/gemma4_parity --nocapture --test-threads 1 2>&1 | tee "$OUT/parity.log" | grep -E "^(==|test |  )|max|FAIL|result" | head -80
step "layer-wise explicit backward vs autograd"; G4FT_TEST_DEVICE=cuda .gpu/gemma4_layerwise --nocapture --test-threads 1 2>&1 | tee "$OUT/layerwise.log" | grep -E "^(==|test )|FAIL|result" | head -40
step "ops: CUDA vs CPU"; .gpu/g4ft_ops_test gpu_ --nocapture --test-threads=1 2>&1 | tee "$OUT/ops.log" | grep -E "^test |FAIL|result|mismatch" | head -60
for dt in f32 bf16; do step "score $dt"; .gpu/score --model assets/tiny --data assets/sample/tokens.jsonl --device cuda --dtype $dt; done
step "torchrun + ddp_test_worker collectives (CPU backend, agent store)"
torchrun --standalone --nproc_per_node=2 --no-python .gpu/ddp_test_worker collectives 2>&1 | tail -4
step "train_ddp tiny bf16 cuda under ddprun"
.gpu/ddprun --standalone --nproc-per-node 1 -- .gpu/train_ddp --config configs/tiny-cpu.toml --device cuda --dtype bf16 --output "$OUT/tiny-ddprun" 2>&1 | tail -15
step "train_ddp tiny bf16 cuda under torchrun"
torchrun --standalone --nproc_per_node=1 --no-python .gpu/train_ddp --config configs/tiny-cpu.toml --device cuda --dtype bf16 --max-steps 10 --output "$OUT/tiny-torchrun" 2>&1 | tail -6
step "train_ddp stopped by SIGINT under ddprun and torchrun, then resumed"
bash tools/gpu/stop_resume.sh 2>&1 | tee "$OUT/stop_resume.log"
step "bench_train 12B shape"
timeout 300 .gpu/bench_train --config crates/gemma4/tests/configs/gemma-4-12B-it.json --device cuda --dtype bf16 \
  --seq 2048 --micro-batch 1 --accum 8 --steps ${BENCH_STEPS:-4} --warmup-discard 1 2>&1 | tee "$OUT/bench_train.log" | tail -12
