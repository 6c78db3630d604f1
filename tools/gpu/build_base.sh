#!/usr/bin/env bash
# The B side of tools/gpu/ab.sh: `bench_train` of another commit, as .gpu/bench_train_base.xz (its
# commit in .gpu/bench_train_base.rev). REV is built in a worktree of its own (.gpu-base/src,
# git-ignored) with a build folder of its own (.gpu-base/target: cold the first time, incremental
# for later commits), so this checkout's sources and build are never touched and
# tools/gpu/build.sh can run beside it. The CUDA toolchain as in build.sh (CUDA_COMPUTE_CAP).
# Usage: bash tools/gpu/build_base.sh REV      (from the repository root; e.g. REV=HEAD~1)
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# = 1 ] || { echo "usage: bash tools/gpu/build_base.sh REV" >&2; exit 2; }
rev=$(git rev-parse --verify --quiet "$1^{commit}") || { echo "build_base.sh: no commit $1" >&2; exit 2; }
base=$PWD/.gpu-base
if [ -d "$base/src" ]; then
  git -C "$base/src" checkout --quiet --detach "$rev"
else
  git worktree prune
  git worktree add --quiet --detach "$base/src" "$rev"
fi
eval "$(bash tools/cuda/setup_toolchain.sh)"
(cd "$base/src" && CARGO_TARGET_DIR="$base/target" cargo build --release --features cuda -p g4ft --example bench_train)
mkdir -p .gpu
strip -o .gpu/bench_train_base "$base/target/release/examples/bench_train"
xz -6 -f .gpu/bench_train_base
echo "$rev" > .gpu/bench_train_base.rev
echo "build_base.sh: .gpu/bench_train_base.xz is bench_train of $rev"
