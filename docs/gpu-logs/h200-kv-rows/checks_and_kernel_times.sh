#!/usr/bin/env bash
# One-off: check + time the kv-kernel changes (loader, interior tiles, wgmma descriptors): ops rows,
# 2k none/all, 32k all, per-kernel attention times at 2k (2 layers) and 32k (6 layers).
set -uo pipefail
(cd .gpu && for f in g4ft_ops_test.xz bench_train.xz; do xz -dkf "$f"; done && chmod +x g4ft_ops_test bench_train)
source tools/cuda/device_env.sh
t0=$(date +%s)
.gpu/g4ft_ops_test gpu_kernels_table --nocapture --test-threads=1 > "$OUT/ops.log" 2>&1; echo "ops rc $? in $(( $(date +%s)-t0 )) s"
grep -c "| ok |" "$OUT/ops.log"; grep -E "FAIL|panick|result" "$OUT/ops.log" | head -5
B=(.gpu/bench_train --config crates/gemma4/tests/configs/gemma-4-12B-it.json --device cuda --dtype bf16 --micro-batch 1 --peak-tflops 755.3)
for p in none all; do "${B[@]}" --recompute $p --seq 2048 --accum 8 --steps 4 --warmup-discard 1 > "$OUT/bench_$p.log" 2>&1; grep SUMMARY "$OUT/bench_$p.log"; done
"${B[@]}" --recompute all --seq 32768 --accum 1 --steps 3 --warmup-discard 1 > "$OUT/bench_32k_all.log" 2>&1; grep SUMMARY "$OUT/bench_32k_all.log"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for L in 2 6; do python3 - $L <<'PY'
import json,sys
n=int(sys.argv[1]); c=json.load(open("crates/gemma4/tests/configs/gemma-4-12B-it.json")); t=c.get("text_config",c)
t["num_hidden_layers"]=n; t["layer_types"]=t["layer_types"][:n]; json.dump(c,open(f"/tmp/cfg{n}.json","w"))
PY
done
k() { timeout 150 "$NCU" --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv --print-units base --kernel-name-base function --kernel-name regex:attn_ .gpu/bench_train --config $1 --device cuda --dtype bf16 --micro-batch 1 --accum 1 --steps 3 --warmup-discard 1 --recompute none --seq $2 --cuda-profiler-last-step > "$OUT/k_$2.csv" 2>/dev/null; echo "== $2"; grep -E "attn_" "$OUT/k_$2.csv" | awk -F'","' '{gsub(",","",$NF); gsub("\"","",$NF); print $5, $NF}' | sort | awk '{s[$1]+=$2; n[$1]++} END{for(k in s) printf "%-34s %3d %10.1f us\n", k, n[k], s[k]/1000}'; }
k /tmp/cfg2.json 2048
k /tmp/cfg6.json 32768
