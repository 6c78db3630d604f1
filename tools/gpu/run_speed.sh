#!/usr/bin/env bash
# The one-GPU speed benchmark (docs/benchmarks.md), from the repository root after tools/gpu/build.sh
# (carry .gpu): the bf16 matmul ceiling, our 12B LoRA step (bench_train) under each recompute
# policy, then the peers in the same call: the PyTorch + PEFT script (.gpu/bench/pytorch-reference,
# not part of this repository; see docs/benchmarks.md) with and without checkpointing, and Unsloth
# (.gpu/bench/unsloth-reference with its packages in .gpu/unsloth_site) when present.
# Logs go to $OUT. Settings: SEQ (2048), MICRO (sequences per micro-batch, 1: every system gets the
# same and accumulates 16384 / (SEQ * MICRO) micro-batches, at least 1: 16,384 tokens per step
# where SEQ * MICRO divides it),
# POLICIES ("all none auto"; empty skips ours), PROFILE (the policy that gets --profile, default
# all), STEPS (4), SCRIPT_CKPT ("1 0": GRAD_CKPT values of the script), UNSLOTH_GC ("false": values
# of Unsloth's UNSLOTH_GC; empty skips it), ANCHOR_STEPS (6), EXTRA (more bench_train arguments,
# e.g. "--attention-backward blocked") and TAG (appended to every log name).
# Unsloth's runner reads TIME_BUDGET / U_TIMEOUT (s, defaults 330 / 380) from the environment: its
# offloaded checkpointing (UNSLOTH_GC=unsloth) compiles for ~250 s on an H200, which leaves the
# default budget two steady steps (345 s for 4 steps in docs/gpu-logs/h200-heads-norm/); 450 / 500
# leaves room for its ten.
set -uo pipefail
OUT="${OUT:-out/gpu}"; mkdir -p "$OUT"
source tools/gpu/machine_setup.sh
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
CFG=crates/gemma4/tests/configs/gemma-4-12B-it.json
REF=.gpu/bench/pytorch-reference
SEQ=${SEQ:-2048}; MICRO=${MICRO:-1}; ACCUM=$(( 16384 / (SEQ * MICRO) > 0 ? 16384 / (SEQ * MICRO) : 1 ))
step() { echo; echo "=== $*"; }
step "bf16 matmul ceiling"
measure_peak_tflops
for policy in ${POLICIES-all none auto}; do
  step "ours: bench_train, 12B shape, seq $SEQ, micro-batch $MICRO, accum $ACCUM, --recompute $policy"
  prof=(); [ "$policy" = "${PROFILE:-all}" ] && prof=(--profile)
  timeout 400 .gpu/bench_train --config "$CFG" --device cuda --dtype bf16 --seq "$SEQ" --micro-batch "$MICRO" \
    --accum "$ACCUM" --steps "${STEPS:-4}" --warmup-discard 1 --peak-tflops "$P" --recompute "$policy" "${prof[@]}" \
    ${EXTRA:-} > "$OUT/bench_train_$policy${TAG:-}.log" 2>&1
  grep -E "^(model|lora|plan|recompute|SUMMARY)|%$" "$OUT/bench_train_$policy${TAG:-}.log"
done
for ckpt in ${SCRIPT_CKPT-1 0}; do
  step "PyTorch + PEFT script, same settings, GRAD_CKPT=$ckpt"
  (cd "$REF" && MAX_LEN=$SEQ MICRO_BATCH=$MICRO GRAD_CKPT=$ckpt PEAK_TFLOPS=$P STEPS="${ANCHOR_STEPS:-6}" ACCUM_STEPS=$ACCUM \
    WARMUP_DISCARD=2 timeout 400 torchrun --standalone --nproc_per_node=1 train_ddp_anchor.py) \
    > "$OUT/anchor_ckpt$ckpt${TAG:-}.log" 2>&1
  grep -E "SUMMARY|out of memory" "$OUT/anchor_ckpt$ckpt${TAG:-}.log" | head -3
done
if [ -d .gpu/unsloth_site ]; then
  for gc in ${UNSLOTH_GC-false}; do
    step "Unsloth, same settings, UNSLOTH_GC=$gc"
    UNSLOTH_GC=$gc MAX_LEN=$SEQ MICRO_BATCH=$MICRO ACCUM_STEPS=$ACCUM bash .gpu/bench/unsloth-reference/run_unsloth.sh \
      .gpu/unsloth_site > "$OUT/unsloth_gc$gc${TAG:-}.log" 2>&1
    grep -E "SUMMARY|out of memory" "$OUT/unsloth_gc$gc${TAG:-}.log" | head -3
  done
fi
