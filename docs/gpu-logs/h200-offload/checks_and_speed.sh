#!/usr/bin/env bash
# Offloaded checkpoints on CUDA: the layer-wise tests, the ops' round trip, then the 12B step.
set -uo pipefail
t0=$(date +%s)
(cd .gpu && for f in *.xz; do xz -dkf "$f"; done && chmod +x ./*)
source tools/cuda/device_env.sh
src=$(cat .gpu/source_dir); mkdir -p "$(dirname "$src")"; ln -sfn "$PWD" "$src"
G4FT_TEST_DEVICE=cuda .gpu/gemma4_layerwise --test-threads 1 > "$OUT/layerwise.log" 2>&1; echo "layerwise rc=$?"; grep -E "test result|FAIL|panicked" "$OUT/layerwise.log" | head
.gpu/g4ft_ops_test gpu_host_offload --nocapture --test-threads=1 > "$OUT/ops_offload.log" 2>&1; echo "ops rc=$?"; grep -E "test result|FAIL|panicked" "$OUT/ops_offload.log" | head
echo "t=$(( $(date +%s)-t0 ))"
POLICIES=all PROFILE=x SCRIPT_CKPT="" UNSLOTH_GC="" MICRO=1 TAG=_m1 bash tools/gpu/run_speed.sh | grep -v "^$"
POLICIES=all PROFILE=x SCRIPT_CKPT="" UNSLOTH_GC="" MICRO=2 EXTRA=--offload-checkpoints TAG=_m2_off bash tools/gpu/run_speed.sh | grep -v "^$"
POLICIES=all PROFILE=x SCRIPT_CKPT="" UNSLOTH_GC="" MICRO=4 EXTRA=--offload-checkpoints TAG=_m4_off bash tools/gpu/run_speed.sh | grep -v "^$"
POLICIES=all PROFILE=all SCRIPT_CKPT="" UNSLOTH_GC="" MICRO=2 EXTRA=--offload-checkpoints TAG=_m2_off_prof STEPS=2 bash tools/gpu/run_speed.sh | grep -v "^$"
for m in 1 2; do POLICIES=auto PROFILE=x SCRIPT_CKPT="" UNSLOTH_GC="" MICRO=$m EXTRA="--memory-budget-gb 26 --offload-checkpoints" TAG=_m${m}_off26 bash tools/gpu/run_speed.sh | grep -v "^$"; done
echo "t=$(( $(date +%s)-t0 ))"
(cd "$OUT" && tar czf logs.tgz *.log && rm -f *.log)
