set -u
source tools/gpu/machine_setup.sh
cd .gpu/hp && for f in bench_train_hp bench_train_hp_base gemma4_layerwise; do xz -dkf $f.xz && chmod +x $f; done; cd ../..
G4FT_TEST_DEVICE=cuda .gpu/hp/gemma4_layerwise --test-threads 1 > "$OUT/layerwise.log" 2>&1; echo "layerwise exit $?"; grep -E "test result|FAILED|panicked" "$OUT/layerwise.log" | head
C=crates/gemma4/tests/configs
A=.gpu/hp/bench_train_hp B=.gpu/hp/bench_train_hp_base ROUNDS=2 bash tools/gpu/ab.sh \
  moe_all "--config $C/gemma-4-26B-A4B-it.json --micro-batch 1 --accum 8 --recompute all" \
  e2b_all "--config $C/gemma-4-E2B-it.json --micro-batch 1 --accum 8 --recompute all" \
  none_m1 "--micro-batch 1 --accum 8 --recompute none" \
  offload_m2 "--micro-batch 2 --accum 4 --recompute all --offload-checkpoints"
SIZES="26B-A4B" bash tools/gpu/host_profile.sh > /dev/null 2>&1
cd "$OUT" && tar czf all.tgz --remove-files ab_* host_* *.log 2>/dev/null; ls "$OUT"
