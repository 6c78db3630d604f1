#!/usr/bin/env bash
# Detail profile of the hash-applying LoRA kernels (12B cut to 2 layers, 2k tokens).
set -uo pipefail
(cd .gpu && xz -dkf bench_train.xz && chmod +x bench_train)
source tools/cuda/device_env.sh
NCU="$(command -v ncu || echo /usr/local/cuda/bin/ncu)"
python3 - "$OUT/cfg2.json" <<'PY'
import json, sys
c = json.load(open("crates/gemma4/tests/configs/gemma-4-12B-it.json"))
t = c.get("text_config", c); t["num_hidden_layers"] = 2; t["layer_types"] = t["layer_types"][:2]
json.dump(c, open(sys.argv[1], "w"))
PY
bench=(.gpu/bench_train --config "$OUT/cfg2.json" --device cuda --dtype bf16 --seq 2048 --micro-batch 1 --accum 1 --steps 3 --warmup-discard 1)
timeout 300 "$NCU" --clock-control none --profile-from-start off --kernel-name-base function \
  --kernel-name "regex:${KREGEX}" --launch-count ${KCOUNT:-16} --section SpeedOfLight \
  --section WarpStateStats --section ComputeWorkloadAnalysis --section InstructionStats --section Occupancy --section MemoryWorkloadAnalysis \
  --page details "${bench[@]}" --cuda-profiler-last-step > "$OUT/detail.txt" 2> "$OUT/detail.err"
echo "ncu rc $?"; tail -2 "$OUT/detail.err"
grep -E "^  lora|Duration|Issue Slots Busy|Executed Ipc A|SM Busy|Memory Throughput|DRAM Throughput|Achieved Occupancy|Warp Cycles Per Issued|No Eligible" "$OUT/detail.txt" | head -120
