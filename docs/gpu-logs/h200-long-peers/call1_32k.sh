#!/usr/bin/env bash
# Long context, same call: ours at 32k (`all --offload-checkpoints`, then `all`), then Unsloth's
# offloaded checkpointing (its long-context setting) at 32k. Main 7e37734.
set -uo pipefail
t0=$(date +%s)
source tools/gpu/machine_setup.sh
xz -dkf .gpu/long/bench_train.xz && cp .gpu/long/bench_train .gpu/bench_train && chmod +x .gpu/bench_train
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv > "$OUT/gpu.txt"
SEQ=32768 STEPS=3 POLICIES=all PROFILE=x SCRIPT_CKPT="" UNSLOTH_GC="" EXTRA=--offload-checkpoints TAG=_32k_off \
  bash tools/gpu/run_speed.sh
echo "t=$(( $(date +%s)-t0 ))"
SEQ=32768 POLICIES="" SCRIPT_CKPT="" UNSLOTH_GC=unsloth TAG=_32k STEPS=6 TIME_BUDGET=380 U_TIMEOUT=420 \
  bash tools/gpu/run_speed.sh
echo "t=$(( $(date +%s)-t0 ))"
