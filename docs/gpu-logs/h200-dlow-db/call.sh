#!/usr/bin/env bash
# The committed dlow / dB kernel against main's build before it (pipe3): the 12B step alternating,
# then the 6-layer kernel profile of the new build. (Its CUDA tests ran on the build before this
# one, whose code differs only by an unroll hint in lora_sum_splits: dlowdb3.)
set -uo pipefail
t0=$(date +%s)
source tools/gpu/machine_setup.sh
for f in .gpu/ab2/*.xz; do xz -dkf "$f"; done; chmod +x .gpu/ab2/*
OUT=$OUT/ab A=.gpu/ab2/dlowdb4_bench_train B=.gpu/ab2/pipe3_bench_train ROUNDS=2 bash tools/gpu/ab.sh \
  none_m2 "--micro-batch 2 --accum 4 --recompute none" \
  off_m2 "--micro-batch 2 --accum 4 --recompute all --offload-checkpoints"
echo "t=$(( $(date +%s)-t0 ))"
(cd $OUT && tar czf ab.tgz ab && rm -rf ab)
cp .gpu/ab2/dlowdb4_bench_train .gpu/bench_train
OUT=$OUT/kprof LAYERS=6 BENCH_EXTRA="--recompute none" NCU_FLAGS="--clock-control none --cache-control none" NCU_TIMEOUT_S=200 bash tools/gpu/kernel_profile.sh > $OUT/kprof.out 2>&1
python3 tools/gpu/ncu_summary.py $OUT/kprof/kprof_ncu.csv > $OUT/kprof_summary.log 2>&1
python3 tools/gpu/ncu_summary.py $OUT/kprof/kprof_ncu.csv --families > $OUT/kprof_families.log 2>&1
grep -E "lora_dlow_db|lora_sum_splits|lora_dx_da" $OUT/kprof/kprof_ncu.csv | awk -F'","' '{print $5, $9, $(NF)}' > $OUT/kprof_lora_calls.log
rm -rf $OUT/kprof
head -45 $OUT/kprof_summary.log | grep -E "launches|lora|nvjet_sm90_t.._(32|64)x|splitK|sum_splits"
echo "t=$(( $(date +%s)-t0 ))"
