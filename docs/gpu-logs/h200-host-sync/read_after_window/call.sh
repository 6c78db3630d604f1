#!/usr/bin/env bash
# The loss read after the step's window instead of between each micro-batch's forward and backward,
# and the offloaded copies settled before the backward walk: the layer-wise tests and the offload
# test on CUDA, then A/B against 1c296b2 (bench_train_base). The E2B setting failed on the B side,
# which refused a repeated --config (sizes/call.sh runs it with CFG). The call ended with a stack
# sampler that attached cuda-gdb to a running E2B job; the attach crashed the job after one sample,
# and the sampler was dropped.
set -uo pipefail
source tools/gpu/machine_setup.sh
G4FT_TEST_DEVICE=cuda .gpu/gemma4_layerwise --test-threads 1 > "$OUT/layerwise.log" 2>&1; echo "layerwise rc=$?"; grep -E "test result|FAIL|panicked" "$OUT/layerwise.log" | head
.gpu/g4ft_ops_test gpu_host_offload --test-threads=1 > "$OUT/ops_offload.log" 2>&1; echo "ops offload rc=$?"; grep -E "test result|FAIL|panicked" "$OUT/ops_offload.log" | head
E2B=crates/gemma4/tests/configs/gemma-4-E2B-it.json
ROUNDS=2 TIMEOUT_S=120 bash tools/gpu/ab.sh \
  offload_m2 "--micro-batch 2 --accum 4 --recompute all --offload-checkpoints" \
  none_m1 "--micro-batch 1 --accum 8 --recompute none" \
  e2b_all "--config $E2B --micro-batch 1 --accum 8 --recompute all" 2>&1 | tail -12
(cd "$OUT" && tar czf logs.tgz *.log && rm -f ./*.log)
