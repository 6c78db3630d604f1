#!/usr/bin/env bash
# Per-kernel times of the 6-layer cut, micro-batch 1, --recompute none: the dlow/dB build, then main's.
set -uo pipefail
t0=$(date +%s)
for f in .gpu/ab2/*.xz; do xz -dkf "$f"; done; chmod +x .gpu/ab2/*
for v in dlowdb pipe3; do
  cp .gpu/ab2/${v}_bench_train .gpu/bench_train
  OUT=$OUT/$v LAYERS=6 BENCH_EXTRA="--recompute none" NCU_FLAGS="--clock-control none --cache-control none" NCU_TIMEOUT_S=240 bash tools/gpu/kernel_profile.sh > $OUT/kprof_$v.out 2>&1
  python3 tools/gpu/ncu_summary.py $OUT/$v/kprof_ncu.csv > $OUT/${v}_summary.log 2>&1
  python3 tools/gpu/ncu_summary.py $OUT/$v/kprof_ncu.csv --families > $OUT/${v}_families.log 2>&1
  head -45 $OUT/${v}_summary.log | grep -E "launches|lora|nvjet_sm90_t.._(32|64)x|splitK|sum_splits|da_finish"
  echo "t=$(( $(date +%s)-t0 ))"
done
