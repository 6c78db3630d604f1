set -u
cd .gpu/hp && for f in bench_train_hp bench_train_hp_base; do xz -dkf $f.xz && chmod +x $f; done; cd ../..
C=crates/gemma4/tests/configs
A=.gpu/hp/bench_train_hp B=.gpu/hp/bench_train_hp_base ROUNDS=2 bash tools/gpu/ab.sh \
  offload_m2 "--micro-batch 2 --accum 4 --recompute all --offload-checkpoints"
A=.gpu/hp/bench_train_hp B=.gpu/hp/bench_train_hp_base ROUNDS=1 bash tools/gpu/ab.sh \
  moe_all "--config $C/gemma-4-26B-A4B-it.json --micro-batch 1 --accum 8 --recompute all"
SIZES="E2B 26B-A4B" bash tools/gpu/host_profile.sh
SIZES=12B TAG=none EXTRA="--recompute none" bash tools/gpu/host_profile.sh
cd "$OUT" && tar czf all.tgz --remove-files ab_* host_* *.log 2>/dev/null; ls "$OUT"
