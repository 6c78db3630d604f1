#!/usr/bin/env bash
set -uo pipefail
t0=$(date +%s)
source tools/gpu/machine_setup.sh
for f in .gpu/ab2/*.xz; do xz -dkf "$f"; done; chmod +x .gpu/ab2/*
for r in 1 2; do for v in bench_attention_base pipe2_bench_attention; do echo "--- $v"; .gpu/ab2/$v --seqs 2048 --batches 1,2,4 --iters 20 | tail -6 | tee -a $OUT/battn_${v}.log; done; done
for v in bench_attention_base pipe2_bench_attention; do echo "--- $v 32k"; .gpu/ab2/$v --seqs 32768 --batches 1 --iters 3 | tail -2 | tee -a $OUT/battn_${v}.log; done
echo "t=$(( $(date +%s)-t0 ))"
cfg=$OUT/cfg6.json
python3 - "$cfg" <<'PY'
import json, sys
c = json.load(open("crates/gemma4/tests/configs/gemma-4-12B-it.json"))
t = c.get("text_config", c)
t["num_hidden_layers"] = 6; t["layer_types"] = t["layer_types"][:6]
json.dump(c, open(sys.argv[1], "w"))
PY
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
timeout 300 $NCU --clock-control none --profile-from-start off --kernel-name-base function \
  --kernel-name "regex:attn_wgmma_(fwd|bwd_q|bwd_kv)_d256" --launch-count 15 --set full --import-source no \
  -o $OUT/attn .gpu/ab2/pipe2_bench_train --config $cfg --device cuda --dtype bf16 --seq 2048 --micro-batch 2 --accum 1 --steps 3 --warmup-discard 1 --recompute none --cuda-profiler-last-step > $OUT/ncu_run.log 2>&1
echo "ncu exit $? t=$(( $(date +%s)-t0 ))"
$NCU -i $OUT/attn.ncu-rep --page details > $OUT/attn_details.txt 2>&1
for kn in fwd bwd_q bwd_kv; do $NCU -i $OUT/attn.ncu-rep --kernel-name attn_wgmma_${kn}_d256_bf16 --launch-skip 1 --launch-count 1 --page source --print-source sass --csv > $OUT/sass_$kn.csv 2>&1; done
gzip $OUT/sass_*.csv
rm -f $OUT/attn.ncu-rep
grep -E "attn_wgmma|Duration|SM Active Cycles|Elapsed Cycles|Registers Per" $OUT/attn_details.txt | head -40
echo "t=$(( $(date +%s)-t0 ))"
