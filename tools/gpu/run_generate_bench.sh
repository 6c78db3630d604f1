#!/usr/bin/env bash
# Generation speed on one GPU, from the repository root after tools/gpu/build.sh (carry .gpu): greedy
# parity on CUDA, then prefill / decode tokens/s and KV-cache memory of ours (examples/bench_generate)
# and of transformers' generate (tools/reference/generate/bench_hf.py) in the same call, 12B shape with
# random weights. Logs go to $OUT. Settings: PROMPT (512), NEW (128), BATCHES ("1,8"),
# LORA (0: no adapter; e.g. 16 for an unmerged rank-16 adapter on the seven projections).
set -uo pipefail
OUT="${OUT:-out/gpu}"; mkdir -p "$OUT"
source tools/gpu/machine_setup.sh
export PYTHONUNBUFFERED=1
CFG=crates/gemma4/tests/configs/gemma-4-12B-it.json
step() { echo; echo "=== $*"; }
step "greedy parity with transformers on CUDA (tiny models, fp32)"
G4FT_TEST_DEVICE=cuda timeout 300 .gpu/generate_parity --nocapture --test-threads 1 > "$OUT/generate_parity.log" 2>&1
grep -E "tokens|test result" "$OUT/generate_parity.log"
step "ours: bench_generate, 12B shape, bf16"
timeout 600 .gpu/bench_generate --config "$CFG" --dtype bf16 --device cuda --prompt-len "${PROMPT:-512}" \
  --new-tokens "${NEW:-128}" --batch-sizes "${BATCHES:-1,8}" --lora-rank "${LORA:-0}" > "$OUT/bench_generate.log" 2>&1
cat "$OUT/bench_generate.log"
step "transformers generate, same shapes"
timeout 600 python3 tools/reference/generate/bench_hf.py --config "$CFG" --dtype bf16 --prompt-len "${PROMPT:-512}" \
  --new-tokens "${NEW:-128}" --batch-sizes "${BATCHES:-1,8}" > "$OUT/bench_hf_generate.log" 2>&1
cat "$OUT/bench_hf_generate.log"
