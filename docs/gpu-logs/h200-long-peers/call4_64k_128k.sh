#!/usr/bin/env bash
# Ours `--recompute all` at 64k (2 steps, the second measured) and 128k (one step, its warm-up
# included). Main 7e37734.
source tools/gpu/machine_setup.sh
xz -dkf .gpu/long/bench_train.xz
measure_peak_tflops
C=crates/gemma4/tests/configs/gemma-4-12B-it.json
timeout 200 .gpu/long/bench_train --config $C --device cuda --dtype bf16 --seq 65536 --micro-batch 1 --accum 1 \
  --recompute all --steps 2 --warmup-discard 1 --peak-tflops $P > $OUT/long_plain_64k.log 2>&1
timeout 250 .gpu/long/bench_train --config $C --device cuda --dtype bf16 --seq 131072 --micro-batch 1 --accum 1 \
  --recompute all --steps 1 --warmup-discard 0 --peak-tflops $P > $OUT/long_plain_128k.log 2>&1
