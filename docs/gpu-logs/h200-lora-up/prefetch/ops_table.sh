#!/usr/bin/env bash
# CUDA-vs-CPU table of fd0b2be (the adapter-term kernels with their loads first).
set -uo pipefail
cd .gpu && xz -dkf g4ft_ops_test.xz && chmod +x g4ft_ops_test && cd ..
source tools/cuda/device_env.sh
.gpu/g4ft_ops_test gpu_kernels_table --nocapture --test-threads=1 > "$OUT/ops.log" 2>&1; echo "ops rc $?"
grep -c "| ok |" "$OUT/ops.log"; grep -E "FAIL|panick|test result|lora_up" "$OUT/ops.log" | head -10
