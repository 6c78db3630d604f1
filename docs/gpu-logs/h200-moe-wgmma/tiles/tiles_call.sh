#!/usr/bin/env bash
# The wgmma grouped GEMM's block shape: 128 rows × 256 columns (mt1) against 256 rows × 128
# columns (mt2), each warpgroup 128 accumulators a thread: layer-wise tests of both, then the
# 26B-A4B step alternating.
set -uo pipefail
t0=$(date +%s)
source tools/gpu/machine_setup.sh
for f in .gpu/v2/*.xz; do xz -dkf "$f"; done; chmod +x .gpu/v2/*
for v in mt1 mt2; do
  echo "=== layer-wise $v"; G4FT_TEST_DEVICE=cuda .gpu/v2/${v}_layerwise --test-threads 1 > "$OUT/layerwise_$v.log" 2>&1; echo "exit $?"; grep -E "^test result|FAILED|panicked" "$OUT/layerwise_$v.log"
done
echo "t=$(( $(date +%s)-t0 ))"
OUT=$OUT/ab CFG=crates/gemma4/tests/configs/gemma-4-26B-A4B-it.json A=.gpu/v2/mt2_bench_train B=.gpu/v2/mt1_bench_train ROUNDS=2 bash tools/gpu/ab.sh \
  moe26b_all_m1 "--micro-batch 1 --accum 8 --recompute all"
echo "t=$(( $(date +%s)-t0 ))"
(cd $OUT && tar czf logs.tgz *.log ab/*.log && rm -f *.log ab/*.log)
