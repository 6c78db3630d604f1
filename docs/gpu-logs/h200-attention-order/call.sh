#!/usr/bin/env bash
# pipe3: the dQ kernel's head-dim-512 path as before, the dK/dV launch order longest first across
# slabs within each split. Kernel times against the base, then bench_train A/B against 8cb2b50.
set -uo pipefail
t0=$(date +%s)
source tools/gpu/machine_setup.sh
for f in .gpu/ab2/*.xz .gpu/ab/bench_train_lazy.xz; do xz -dkf "$f"; done; chmod +x .gpu/ab2/* .gpu/ab/*
for r in 1 2; do for v in bench_attention_base pipe3_bench_attention; do echo "--- $v"; .gpu/ab2/$v --seqs 2048 --batches 1,2,4 --iters 20 | tail -6 | tee -a $OUT/battn_${v}.log; done; done
for r in 1 2; do for v in bench_attention_base pipe3_bench_attention; do echo "--- $v 32k"; .gpu/ab2/$v --seqs 32768 --batches 1 --iters 3 | tail -2 | tee -a $OUT/battn_${v}.log; done; done
echo "t=$(( $(date +%s)-t0 ))"
OUT=$OUT/ab A=.gpu/ab2/pipe3_bench_train B=.gpu/ab/bench_train_lazy ROUNDS=2 bash tools/gpu/ab.sh \
  none_m2 "--micro-batch 2 --accum 4 --recompute none" \
  off_m2 "--micro-batch 2 --accum 4 --recompute all --offload-checkpoints" \
  none_m4 "--micro-batch 4 --accum 2 --recompute none"
echo "t=$(( $(date +%s)-t0 ))"
cd $OUT && tar czf ab.tgz ab && rm -rf ab; ls -la $OUT
