# First GPU call after stop 48 (main f9d5354: its kernels are 85252ab's; the ops table and bench_train refactored, host code only). Carry:
#   .gpu/bench_train.xz .gpu/g4ft_ops_test.xz .gpu/gemma4_layerwise.xz .gpu/source_dir
#   .gpu/variants/grp_bench_train.xz
# Order: most important first (calls get taken back).
set -x
source tools/gpu/machine_setup.sh
xz -dkf .gpu/variants/grp_bench_train.xz; chmod +x .gpu/variants/*
mkdir -p $OUT
G4FT_TEST_DEVICE=cuda timeout 120 .gpu/gemma4_layerwise --test-threads 1 > $OUT/layerwise.log 2>&1; echo "layerwise rc=$?"
tail -3 $OUT/layerwise.log
OUT=$OUT/ab CFG=crates/gemma4/tests/configs/gemma-4-26B-A4B-it.json A=.gpu/bench_train B=.gpu/variants/grp_bench_train ROUNDS=2 \
  bash tools/gpu/ab.sh moe26b_all_m1 "--micro-batch 1 --accum 8 --recompute all" > $OUT/ab.txt 2>&1; tail -12 $OUT/ab.txt
timeout 200 .gpu/g4ft_ops_test gpu_kernels_table --test-threads 1 --nocapture > $OUT/ops.log 2>&1; echo "ops rc=$?"
grep -c " ok" $OUT/ops.log; grep -i "fail\|test result" $OUT/ops.log | tail -3
(cd $OUT && tar czf logs.tgz *.log ab) 
