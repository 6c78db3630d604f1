#!/usr/bin/env bash
# SM clock, power and throttle reasons sampled every 50 ms by nvidia-smi while bench_train runs
# --recompute none at micro-batch 1 (4 steps + the --profile step).
set -uo pipefail
(cd .gpu && xz -dkf bench_train.xz && chmod +x bench_train)
source tools/cuda/device_env.sh
CFG=crates/gemma4/tests/configs/gemma-4-12B-it.json
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu,clocks_event_reasons.active \
  --format=csv -lms 50 > "$OUT/clocks.log" 2>&1 &
smi=$!
sleep 1
.gpu/bench_train --config "$CFG" --device cuda --dtype bf16 --peak-tflops 714.6 --profile --seq 2048 --micro-batch 1 \
  --accum 8 --steps 4 --warmup-discard 1 --recompute none > "$OUT/clocks_bench.log" 2>&1
sleep 1; kill $smi
grep -E "^SUMMARY|^forward|^backward sliding" "$OUT/clocks_bench.log"
python3 - "$OUT/clocks.log" <<'PY'
import sys, collections
rows = [l.strip().split(", ") for l in open(sys.argv[1]) if l[0].isdigit()]
busy = [r for r in rows if float(r[3].split()[0]) > 300]
print(f"samples {len(rows)}, under load (>300 W) {len(busy)}")
if busy:
    clk = sorted(int(r[1].split()[0]) for r in busy)
    pw = sorted(float(r[3].split()[0]) for r in busy)
    q = lambda v, f: v[int(f * (len(v) - 1))]
    print("sm clock MHz min/p10/median/p90/max", q(clk, 0), q(clk, .1), q(clk, .5), q(clk, .9), q(clk, 1), "of max", busy[0][2])
    print("power W p10/median/p90", q(pw, .1), q(pw, .5), q(pw, .9), "limit", busy[0][4])
    print("throttle reasons", collections.Counter(r[6] for r in busy).most_common(5))
PY
