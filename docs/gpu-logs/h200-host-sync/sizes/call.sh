#!/usr/bin/env bash
# The same A/B as read_after_window/call.sh (the loss read after the window) on the E2B, the E4B and the 26B-A4B,
# each at micro-batch 1 with every layer recomputed, as in benchmarks §1b.
set -uo pipefail
for size in E2B-it E4B-it 26B-A4B-it; do
  OUT="$OUT/$size" CFG=crates/gemma4/tests/configs/gemma-4-$size.json ROUNDS=2 TIMEOUT_S=150 \
    bash tools/gpu/ab.sh "${size%-it}_all" "--micro-batch 1 --accum 8 --recompute all" 2>&1 | tail -3
done
(cd "$OUT" && tar czf logs.tgz ./*/*.log && rm -rf ./*-it)
