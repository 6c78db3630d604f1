set -u
cd .gpu/hp && for f in bench_train_hp bench_train_hp_base; do xz -dkf $f.xz && chmod +x $f; done; cd ../..
C=crates/gemma4/tests/configs
A=.gpu/hp/bench_train_hp B=.gpu/hp/bench_train_hp_base ROUNDS=2 bash tools/gpu/ab.sh \
  e2b_all "--config $C/gemma-4-E2B-it.json --micro-batch 1 --accum 8 --recompute all" \
  e4b_all "--config $C/gemma-4-E4B-it.json --micro-batch 1 --accum 8 --recompute all" \
  none_m1 "--micro-batch 1 --accum 8 --recompute none" \
  all_m1 "--micro-batch 1 --accum 8 --recompute all"
SIZES="E2B" bash tools/gpu/host_profile.sh
