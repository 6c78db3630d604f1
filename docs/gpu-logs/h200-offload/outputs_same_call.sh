#!/usr/bin/env bash
# Offloaded checkpoints with the block outputs parked too: the layer-wise tests on CUDA (stop on a
# failure), then ours and Unsloth's offloaded checkpointing at micro-batch 2 in one call.
set -uo pipefail
t0=$(date +%s)
(cd .gpu && for f in *.xz; do xz -dkf "$f"; done && chmod +x ./*)
source tools/cuda/device_env.sh
src=$(cat .gpu/source_dir); mkdir -p "$(dirname "$src")"; ln -sfn "$PWD" "$src"
pack() { (cd "$OUT" && tar czf logs.tgz *.log); }
G4FT_TEST_DEVICE=cuda .gpu/gemma4_layerwise --test-threads 1 > "$OUT/layerwise.log" 2>&1; rc=$?; echo "layerwise rc=$rc"; grep -E "test result|FAIL|panicked" "$OUT/layerwise.log" | head
[ $rc = 0 ] || { pack; exit 1; }
.gpu/g4ft_ops_test gpu_host_offload --nocapture --test-threads=1 > "$OUT/ops_offload.log" 2>&1; echo "ops rc=$?"; grep -E "test result|FAIL|panicked" "$OUT/ops_offload.log" | head
echo "t=$(( $(date +%s)-t0 ))"
POLICIES=all PROFILE=x SCRIPT_CKPT="" UNSLOTH_GC="" MICRO=2 EXTRA=--offload-checkpoints TAG=_m2_off bash tools/gpu/run_speed.sh | grep -v "^$"
POLICIES=all PROFILE=x SCRIPT_CKPT="" UNSLOTH_GC="" MICRO=3 EXTRA=--offload-checkpoints TAG=_m3_off bash tools/gpu/run_speed.sh | grep -v "^$"
POLICIES=auto PROFILE=x SCRIPT_CKPT="" UNSLOTH_GC="" MICRO=2 EXTRA="--memory-budget-gb 26 --offload-checkpoints" TAG=_m2_off26 bash tools/gpu/run_speed.sh | grep -v "^$"
echo "t=$(( $(date +%s)-t0 ))"
TIME_BUDGET=400 U_TIMEOUT=440 POLICIES="" SCRIPT_CKPT="" UNSLOTH_GC=unsloth MICRO=2 TAG=_m2 bash tools/gpu/run_speed.sh 2>&1 | grep -v "^$"
echo "t=$(( $(date +%s)-t0 ))"
POLICIES=all PROFILE=x SCRIPT_CKPT="" UNSLOTH_GC="" MICRO=2 EXTRA=--offload-checkpoints TAG=_m2_off_after bash tools/gpu/run_speed.sh | grep -v "^$"
echo "t=$(( $(date +%s)-t0 ))"
pack
