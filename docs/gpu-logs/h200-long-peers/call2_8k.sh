#!/usr/bin/env bash
# Invoked as: U_GC=false U_BUDGET=300 U_TIMEOUT_8K=340 bash .gpu/long/call_8k.sh
# Long context, same call: ours at 8k (2 sequences of 8,192 a step) under `auto`, `all
# --offload-checkpoints` and `all`, then Unsloth's offloaded checkpointing at 8k. Main 7e37734.
set -uo pipefail
t0=$(date +%s)
source tools/gpu/machine_setup.sh
xz -dkf .gpu/long/bench_train.xz && cp .gpu/long/bench_train .gpu/bench_train && chmod +x .gpu/bench_train
SEQ=8192 STEPS=4 POLICIES="auto" PROFILE=x SCRIPT_CKPT="" UNSLOTH_GC="" TAG=_8k bash tools/gpu/run_speed.sh
echo "t=$(( $(date +%s)-t0 ))"
SEQ=8192 STEPS=4 POLICIES="all" PROFILE=x SCRIPT_CKPT="" UNSLOTH_GC="" EXTRA=--offload-checkpoints TAG=_8k_off \
  bash tools/gpu/run_speed.sh | grep -v "^$"
echo "t=$(( $(date +%s)-t0 ))"
SEQ=8192 POLICIES="" SCRIPT_CKPT="" UNSLOTH_GC="${U_GC:-unsloth}" TAG=_8k TIME_BUDGET=${U_BUDGET:-330} U_TIMEOUT=${U_TIMEOUT_8K:-370} \
  bash tools/gpu/run_speed.sh
echo "t=$(( $(date +%s)-t0 ))"
