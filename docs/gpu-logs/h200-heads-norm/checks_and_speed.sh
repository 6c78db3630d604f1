#!/usr/bin/env bash
# The checks and numbers of docs/benchmarks.md §1 for the fused head transform: the CUDA-vs-CPU
# table, the head-transform kernels (12B cut to 6 layers), the 12B step at 2k under both policies.
set -uo pipefail
(cd .gpu && for f in g4ft_ops_test.xz bench_train.xz; do xz -dkf "$f"; done && chmod +x g4ft_ops_test bench_train)
source tools/cuda/device_env.sh
export NCCL_NVLS_ENABLE=0
t0=$(date +%s)
.gpu/g4ft_ops_test gpu_kernels_table --nocapture --test-threads=1 > "$OUT/ops.log" 2>&1; echo "ops rc $? in $(( $(date +%s)-t0 )) s"
grep -c "| ok |" "$OUT/ops.log"; grep -E "FAIL|panick|test result" "$OUT/ops.log" | head -5; grep -E "^\| heads_norm" "$OUT/ops.log"
python3 - <<'PY'
import json
c=json.load(open("crates/gemma4/tests/configs/gemma-4-12B-it.json")); t=c.get("text_config",c)
t["num_hidden_layers"]=6; t["layer_types"]=t["layer_types"][:6]; json.dump(c,open("/tmp/cfg6.json","w"))
PY
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
timeout 100 "$NCU" --clock-control none --cache-control none --profile-from-start off --metrics gpu__time_duration.sum --csv --print-units base --kernel-name-base function --kernel-name regex:"heads_norm|rms_norm|swap12|rope" .gpu/bench_train --config /tmp/cfg6.json --device cuda --dtype bf16 --micro-batch 1 --accum 1 --steps 3 --warmup-discard 1 --recompute none --seq 2048 --cuda-profiler-last-step > "$OUT/k_heads_6l.csv" 2>/dev/null
python3 tools/gpu/ncu_summary.py "$OUT/k_heads_6l.csv" > "$OUT/k_heads_6l_summary.txt" 2>&1; head -8 "$OUT/k_heads_6l_summary.txt"
echo "checks done in $(( $(date +%s)-t0 )) s"
POLICIES="none all" PROFILE=x SCRIPT_CKPT="" UNSLOTH_GC="" bash tools/gpu/run_speed.sh
echo "all done in $(( $(date +%s)-t0 )) s"
