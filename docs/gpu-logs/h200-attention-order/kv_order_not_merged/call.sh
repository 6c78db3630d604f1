#!/usr/bin/env bash
# dK/dV kernel: warpgroup 1 issues dPᵀ after warpgroup 0 has issued Sᵀ (kvord) against 24f2433 (pipe3).
set -uo pipefail
t0=$(date +%s)
source tools/gpu/machine_setup.sh
for f in .gpu/ab2/*.xz; do xz -dkf "$f"; done; chmod +x .gpu/ab2/*
for r in 1 2; do for v in pipe3 kvord; do echo "--- $v"; .gpu/ab2/${v}_bench_attention --seqs 2048 --batches 1,2,4 --iters 20 | grep sliding | tee -a $OUT/battn_${v}.log; .gpu/ab2/${v}_bench_attention --seqs 32768 --batches 1 --iters 3 | grep sliding | tee -a $OUT/battn_${v}.log; done; done
echo "t=$(( $(date +%s)-t0 ))"
OUT=$OUT/ab A=.gpu/ab2/kvord_bench_train B=.gpu/ab2/pipe3_bench_train ROUNDS=2 bash tools/gpu/ab.sh \
  none_m2 "--micro-batch 2 --accum 4 --recompute none" \
  off_m2 "--micro-batch 2 --accum 4 --recompute all --offload-checkpoints"
echo "t=$(( $(date +%s)-t0 ))"
cd $OUT && tar czf ab.tgz ab && rm -rf ab; ls -la $OUT
