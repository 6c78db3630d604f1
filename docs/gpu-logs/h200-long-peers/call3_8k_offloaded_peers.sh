#!/usr/bin/env bash
# Same call: Unsloth's offloaded checkpointing at 8k, then ours `all --offload-checkpoints` and the
# PyTorch + PEFT script with checkpointing at 8k (2 sequences of 8,192 a step). Main 7e37734.
set -o pipefail
source tools/gpu/machine_setup.sh
xz -dkf .gpu/long/bench_train.xz && cp .gpu/long/bench_train .gpu/bench_train
SEQ=8192 POLICIES="" SCRIPT_CKPT="" UNSLOTH_GC=unsloth TAG=_8k TIME_BUDGET=300 U_TIMEOUT=340 bash tools/gpu/run_speed.sh
SEQ=8192 POLICIES="all" PROFILE=x SCRIPT_CKPT="1" ANCHOR_STEPS=5 UNSLOTH_GC="" EXTRA=--offload-checkpoints TAG=_8k_c \
  bash tools/gpu/run_speed.sh
