# 2026-12-05, one H200, GPU binaries of main 0b3be54 (kernels of 85252ab): the 12B cut to 6 layers,
# one micro-batch of 2,048 tokens, --recompute none, every kernel timed by Nsight Compute at real clocks.
OUT=$OUT LAYERS=6 BENCH_EXTRA="--recompute none" NCU_FLAGS="--clock-control none --cache-control none" bash tools/gpu/kernel_profile.sh
python3 tools/gpu/ncu_summary.py $OUT/kprof_ncu.csv --families > $OUT/kprof_6l_none_families.txt
