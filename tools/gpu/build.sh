#!/usr/bin/env bash
# Builds the CUDA binaries for the GPU machine into .gpu/ (git-ignored), stripped and xz-compressed.
# Needs the CUDA 13.0 toolchain of ../shared/cuda/setup-cuda-build.sh (nvcc from PyPI wheels).
# Usage: bash tools/gpu/build.sh            (from the repository root)
set -euo pipefail
cd "$(dirname "$0")/../.."
eval "$(bash ../shared/cuda/setup-cuda-build.sh)"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/work/target-cuda}"
cargo build --release --features cuda --examples --bins -p g4ft -p g4ft-ddp
mkdir -p .gpu
rel="$CARGO_TARGET_DIR/release"
for bin in examples/score examples/train_ddp ddprun ddp_test_worker; do
  src="$rel/$bin"; [ -f "$src" ] || { echo "missing $src" >&2; continue; }
  name=$(basename "$bin")
  strip -o ".gpu/$name" "$src" && xz -6 -f ".gpu/$name"
done
cp ../shared/cuda/device-env.sh .gpu/
cp -r assets .gpu/ 2>/dev/null || true
ls -la .gpu
