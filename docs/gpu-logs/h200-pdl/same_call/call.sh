#!/usr/bin/env bash
# Same call: ours `all --offload-checkpoints` at micro-batch 2 (26 GB), then the checkpointed
# PyTorch + PEFT script at micro-batch 8 and 4 (16,384 tokens per step), then ours again.
set -uo pipefail
t0=$(date +%s)
source tools/gpu/machine_setup.sh
for f in .gpu/peers/*.xz; do xz -dkf "$f"; done; chmod +x .gpu/peers/*
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
CFG=crates/gemma4/tests/configs/gemma-4-12B-it.json
measure_peak_tflops
ours() { # TAG ARGS...
  local tag=$1; shift
  timeout 300 .gpu/peers/bench_train --config "$CFG" --device cuda --dtype bf16 --seq 2048 --steps 4 \
    --warmup-discard 1 --peak-tflops "$P" "$@" > "$OUT/ours_$tag.log" 2>&1
  echo "ours $tag: exit $? $(grep -E '^SUMMARY' "$OUT/ours_$tag.log")"
  echo "t=$(( $(date +%s)-t0 ))"
}
script() { # MICRO ACCUM
  (cd .gpu/bench/pytorch-reference && MAX_LEN=2048 MICRO_BATCH=$1 GRAD_CKPT=1 PEAK_TFLOPS=$P STEPS=6 ACCUM_STEPS=$2 \
    WARMUP_DISCARD=2 timeout 300 torchrun --standalone --nproc_per_node=1 train_ddp_anchor.py) > "$OUT/script_ckpt_m$1.log" 2>&1
  echo "script m$1: exit $? $(grep -E 'SUMMARY|out of memory' "$OUT/script_ckpt_m$1.log" | head -2)"
  echo "t=$(( $(date +%s)-t0 ))"
}
ours off_m2_a --micro-batch 2 --accum 4 --recompute all --offload-checkpoints
script 8 1
script 4 2
ours off_m2_b --micro-batch 2 --accum 4 --recompute all --offload-checkpoints
