#!/usr/bin/env bash
# The one-GPU speed benchmark (docs/benchmarks.md), from the repository root after tools/gpu/build.sh
# (carry .gpu): the bf16 matmul ceiling, our 12B LoRA step (bench_train, with --profile), then the
# PyTorch + PEFT baseline (.gpu/pyref/train_ddp_anchor.py, not part of this repository; see
# docs/benchmarks.md) in the same call, so the ratio compares one card.
# Logs go to $OUT. Settings: STEPS (4), ANCHOR_STEPS (6).
set -uo pipefail
OUT="${OUT:-out/gpu}"; mkdir -p "$OUT"
(cd .gpu && for f in *.xz; do xz -dkf "$f"; done && chmod +x ./*)
source tools/cuda/device_env.sh
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
step() { echo; echo "=== $*"; }
step "bf16 matmul ceiling"
python3 tools/gpu/matmul_ceiling.py /tmp/peak_tflops 2>&1 | tail -1
P=$(cat /tmp/peak_tflops)
step "ours: bench_train, 12B shape, seq 2048, micro-batch 1, accum 8"
timeout 300 .gpu/bench_train --config crates/gemma4/tests/configs/gemma-4-12B-it.json --device cuda --dtype bf16 \
  --seq 2048 --micro-batch 1 --accum 8 --steps "${STEPS:-4}" --warmup-discard 1 --peak-tflops "$P" --profile \
  > "$OUT/bench_train.log" 2>&1
grep -E "^(model|lora|step=|SUMMARY)|%$" "$OUT/bench_train.log"
step "PyTorch + PEFT script (anchor), same settings"
(cd .gpu/pyref && PEAK_TFLOPS=$P STEPS="${ANCHOR_STEPS:-6}" ACCUM_STEPS=8 WARMUP_DISCARD=2 timeout 300 \
  torchrun --standalone --nproc_per_node=1 train_ddp_anchor.py) > "$OUT/anchor.log" 2>&1
grep -E "SUMMARY" "$OUT/anchor.log"
