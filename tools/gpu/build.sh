#!/usr/bin/env bash
# Builds the CUDA binaries for a GPU machine into .gpu/ (git-ignored), stripped and xz-compressed,
# on a machine without a GPU: the CUDA 13.0 toolchain comes from tools/cuda/setup_toolchain.sh
# (installed on first use; docs/cuda.md). CUDA_COMPUTE_CAP picks the GPU generation (default 90,
# H100/H200); CARGO_TARGET_DIR the build folder (default target/cuda, kept apart from the CPU
# build because the feature set differs; one per checkout: another worktree's build in the same
# folder can leave its kernels in this one's binaries, docs/cuda.md, so the folder records the
# checkout that uses it and a build from another one stops with an error).
# Usage: bash tools/gpu/build.sh            (from the repository root; HOST_PROFILE=1 below)
#        VARIANT=NAME bash tools/gpu/build.sh  (only bench_train and the CUDA test binaries of the
#        working tree, as .gpu/variants/NAME_{bench_train,ops_test,layerwise}.xz: several
#        uncommitted versions side by side for tools/gpu/ab.sh, e.g. A=.gpu/variants/x_bench_train;
#        an incremental build takes about 4 minutes)
set -euo pipefail
cd "$(dirname "$0")/../.."
eval "$(bash tools/cuda/setup_toolchain.sh)"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target/cuda}"
owner="$CARGO_TARGET_DIR/.g4ft-checkout"
if [ -f "$owner" ] && [ "$(cat "$owner")" != "$PWD" ]; then
  echo "build.sh: $CARGO_TARGET_DIR holds the build of the checkout $(cat "$owner"); cargo could" >&2
  echo "reuse its kernels here. Set CARGO_TARGET_DIR to a folder of this checkout's own (docs/cuda.md)," >&2
  echo "or remove $owner if that checkout is gone." >&2
  exit 1
fi
mkdir -p "$CARGO_TARGET_DIR" && echo "$PWD" > "$owner"
mkdir -p .gpu
# Test binaries run there: gemma4 parity + layer-wise backward (with G4FT_TEST_DEVICE=cuda; they read
# the golden fixtures through the build-time path, so the run links the checkout to this repository's
# path) and the ops' CUDA-vs-CPU checks.
test_bin() { # <output path under .gpu> <cargo test args...>
  local out=$1; shift
  local exe; exe=$(cargo test --release --features cuda "$@" --no-run --message-format=json \
    | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1)
  strip -o ".gpu/$out" "$exe" && xz -6 -f ".gpu/$out"
}
if [ -n "${VARIANT:-}" ]; then
  cargo build --release --features cuda -p g4ft --example bench_train
  mkdir -p .gpu/variants
  strip -o ".gpu/variants/${VARIANT}_bench_train" "$CARGO_TARGET_DIR/release/examples/bench_train"
  xz -6 -f ".gpu/variants/${VARIANT}_bench_train"
  test_bin "variants/${VARIANT}_ops_test" -p g4ft-ops --lib
  test_bin "variants/${VARIANT}_layerwise" -p g4ft -p g4ft-gemma4 --test layerwise
  pwd > .gpu/source_dir
  ls -la .gpu/variants
  exit 0
fi
cargo build --release --features cuda -p g4ft -p g4ft-ddp --examples --bins
test_bin gemma4_parity -p g4ft -p g4ft-gemma4 --test parity
test_bin gemma4_layerwise -p g4ft -p g4ft-gemma4 --test layerwise
test_bin g4ft_ops_test -p g4ft-ops --lib
test_bin generate_parity -p g4ft-generate --test parity
rel="$CARGO_TARGET_DIR/release"
for bin in examples/score examples/train_ddp examples/bench_train examples/bench_attention examples/bench_batching examples/memory_plan examples/generate examples/bench_generate ddprun ddp_test_worker; do
  src="$rel/$bin"; [ -f "$src" ] || { echo "missing $src" >&2; continue; }
  name=$(basename "$bin")
  strip -o ".gpu/$name" "$src" && xz -6 -f ".gpu/$name"
done
# The NCCL all-reduce overlap bench (criterion; run it with --bench) for tools/gpu/run_nccl.sh.
bench=$(cargo bench --features cuda -p g4ft -p g4ft-ddp --bench allreduce_overlap --no-run --message-format=json \
  | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1)
strip -o .gpu/allreduce_overlap "$bench" && xz -6 -f .gpu/allreduce_overlap
# HOST_PROFILE=1: also bench_train with the host sampler (feature host-profile), its symbol table
# kept so that the sampled frames have names, for tools/gpu/host_profile.sh.
if [ "${HOST_PROFILE:-0}" = 1 ]; then
  cargo build --release --features cuda,host-profile -p g4ft --example bench_train
  mkdir -p .gpu/hp && cp "$rel/examples/bench_train" .gpu/hp/bench_train_hp && xz -6 -f .gpu/hp/bench_train_hp
fi
# The test binaries find their fixtures under this checkout's path (run_checks.sh links it).
pwd > .gpu/source_dir
ls -la .gpu
