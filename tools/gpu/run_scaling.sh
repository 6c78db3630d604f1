#!/usr/bin/env bash
# The multi-GPU scaling benchmark (docs/benchmarks.md) on a machine with N GPUs, from the repository root after tools/gpu/build.sh
# (carry .gpu). Logs go to $OUT. Same 12B shape and settings as tools/gpu/run_speed.sh (seq 2048,
# micro-batch 1 per GPU, accum 8, LoRA r16 on 7 projections, dropout 0.05):
#  1. the bf16 matmul ceiling (for MFU);
#  2. ours: bench_train under ddprun for each world size in WORLDS (default "1 N"); the largest
#     world also runs --overlap (one more step: the all-reduce the backward did not hide, and the
#     buckets' all-reduce alone with algorithm / bus bandwidth);
#  3. the PyTorch + PEFT baseline (.gpu/bench/pytorch-reference/train_ddp_anchor.py, not part of this repository) under
#     torchrun for the same world sizes;
#  4. tools/gpu/scaling_table.py: tokens/s, s/step, peak GB, MFU and scaling efficiency
#     tokens_per_s(N) / (N x tokens_per_s(1)) for both.
# Settings: WORLDS, STEPS (5, first discarded), ANCHOR_STEPS (5, first two discarded), ANCHOR=0
# leaves out the PyTorch runs (the table then has ours only).
set -uo pipefail
OUT="${OUT:-out/gpu}"; mkdir -p "$OUT"
source tools/gpu/machine_setup.sh
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
NGPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
WORLDS="${WORLDS:-1 $NGPU}"
LARGEST=$(echo "$WORLDS" | tr ' ' '\n' | sort -n | tail -1)
step() { echo; echo "=== $*"; }
step "gpus and topology"; nvidia-smi -L; nvidia-smi topo -m > "$OUT/topo.txt" 2>&1
step "bf16 matmul ceiling"
measure_peak_tflops
for n in $WORLDS; do
  step "ours: bench_train, 12B shape, world $n"
  extra=(); [ "$n" = "$LARGEST" ] && extra=(--overlap)
  timeout 300 .gpu/ddprun --standalone --nproc-per-node "$n" -- .gpu/bench_train \
    --config crates/gemma4/tests/configs/gemma-4-12B-it.json --device cuda --dtype bf16 --seq 2048 \
    --micro-batch 1 --accum 8 --steps "${STEPS:-5}" --warmup-discard 1 --peak-tflops "$P" "${extra[@]}" \
    > "$OUT/ours_w$n.log" 2>&1
  echo "exit $?"; grep -E "SUMMARY|OVERLAP|all-reduce alone|first bucket|all buckets|one flat|estimate|exposed|micro-batch:" "$OUT/ours_w$n.log"
done
[ "${ANCHOR:-1}" = 0 ] && WORLDS_ANCHOR="" || WORLDS_ANCHOR=$WORLDS
for n in $WORLDS_ANCHOR; do
  step "PyTorch + PEFT script (anchor), world $n"
  (cd .gpu/bench/pytorch-reference && PEAK_TFLOPS=$P STEPS="${ANCHOR_STEPS:-5}" ACCUM_STEPS=8 WARMUP_DISCARD=2 timeout 300 \
    torchrun --standalone --nproc_per_node="$n" train_ddp_anchor.py) > "$OUT/anchor_w$n.log" 2>&1
  echo "exit $?"; grep -E "SUMMARY" "$OUT/anchor_w$n.log"
done
step "table"
python3 tools/gpu/scaling_table.py "$OUT" $WORLDS | tee "$OUT/scaling_table.md"
