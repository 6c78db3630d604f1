#!/usr/bin/env bash
# CUDA-vs-CPU table of the head, then Unsloth without checkpointing at micro-batch 4 beside ours.
set -uo pipefail
t0=$(date +%s)
(cd .gpu && xz -dkf g4ft_ops_test.xz && chmod +x g4ft_ops_test)
source tools/cuda/device_env.sh; export NCCL_NVLS_ENABLE=0
.gpu/g4ft_ops_test gpu_kernels_table --nocapture --test-threads=1 > "$OUT/ops.log" 2>&1; echo "ops rc $? in $(( $(date +%s)-t0 )) s"
grep -c "| ok |" "$OUT/ops.log"; grep -E "FAIL|panick|test result" "$OUT/ops.log" | head -5
for m in 4 2; do POLICIES=none PROFILE=x SCRIPT_CKPT="" UNSLOTH_GC="" MICRO=$m TAG=_m$m bash tools/gpu/run_speed.sh | grep -v "^$"; echo "t=$(( $(date +%s)-t0 ))"; done
POLICIES=none PROFILE=x SCRIPT_CKPT="" UNSLOTH_GC=false MICRO=4 TAG=_m4u bash tools/gpu/run_speed.sh
echo "t=$(( $(date +%s)-t0 ))"
