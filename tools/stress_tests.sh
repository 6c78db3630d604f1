#!/usr/bin/env bash
# Runs the multi-process test binaries N times in a row (default 50) while a CPU hog keeps every
# core busy, and stops at the first failure. A flaky multi-rank test shows up here long before it
# fails CI. Usage: tools/stress_tests.sh [N]   (from anywhere in the checkout; CPU only)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-50}
# The tests that start several processes (ranks, launchers, workers).
suite() {
  cargo test -q -p g4ft --test train_ddp --test first_hour --test hub_download "$@" &&
    cargo test -q -p g4ft-ddp --test ddp_faults --test ddp_launcher --test ddp_collectives \
      --test ddp_training "$@"
}
suite --no-run
# The train_ddp tests run the example binary; `cargo test --test X` alone does not rebuild it.
cargo build -q -p g4ft --examples

hogs=()
cleanup() { for p in "${hogs[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
for _ in $(seq "$(nproc)"); do
  (while :; do :; done) &
  hogs+=($!)
done

start=$(date +%s)
for i in $(seq "$runs"); do
  log=$(mktemp)
  if ! suite >"$log" 2>&1; then
    echo "run $i/$runs FAILED after $(( $(date +%s) - start )) s:"
    grep -E "FAILED|panicked|failures:" -A3 "$log" | head -60
    exit 1
  fi
  rm -f "$log"
  echo "run $i/$runs passed ($(( $(date +%s) - start )) s so far)"
done
echo "all $runs runs passed under a $(nproc)-core CPU hog in $(( $(date +%s) - start )) s"
