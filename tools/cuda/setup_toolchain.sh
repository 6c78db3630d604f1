#!/usr/bin/env bash
# A CUDA 13.0 build toolchain for machines without a system CUDA (a CI box, a container, a laptop
# that builds for a remote GPU): nvcc, the runtime, cuBLAS, cuRAND, NVRTC and NCCL 2.28 from
# NVIDIA's PyPI wheels, installed into one folder, plus what the Rust build needs around them.
# No GPU is needed. See docs/cuda.md.
#
#   bash tools/cuda/setup_toolchain.sh               # install (once; later runs only check)
#   eval "$(bash tools/cuda/setup_toolchain.sh)"     # install if needed, then export the variables
#
# Settings: G4FT_CUDA_PREFIX (install folder, default ~/.local/share/g4ft/cuda-13.0; an existing
# installation of the same wheels is reused as it is), CUDA_COMPUTE_CAP (default 90: H100/H200;
# 80 for A100, 89 for L40/L40S). Needs python3 with pip and gcc. Messages go to stderr, only the
# export lines to stdout.
set -euo pipefail

prefix="${G4FT_CUDA_PREFIX:-$HOME/.local/share/g4ft/cuda-13.0}"
cuda="$prefix/nvidia/cu13"                  # where the CUDA 13 wheels put bin/, include/, lib/
nccl_lib="$prefix/nvidia/nccl/lib"
# The toolkit 13.0.2 component set (the versions PyTorch's cu130 builds install) and NCCL 2.28.9,
# the version crates/ddp binds (cudarc feature nccl-02028).
wheels=(
  "cuda-toolkit[nvcc,cudart,crt,nvvm,cccl,cublas,curand,nvrtc]==13.0.2"
  "nvidia-nccl-cu13==2.28.9"
)
say() { printf 'setup_toolchain: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

nvcc_release() { "$cuda/bin/nvcc" --version 2>/dev/null | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p'; }

# 1. The wheels, unless an installation with nvcc 13.0 and every library is already there.
have_all() {
  [[ "$(nvcc_release)" == 13.0 ]] || return 1
  local lib
  for lib in "$cuda/lib/libcudart.so.13" "$cuda/lib/libcublas.so.13" "$cuda/lib/libcublasLt.so.13" \
             "$cuda/lib/libcurand.so.10" "$cuda/lib/libnvrtc.so.13" "$nccl_lib/libnccl.so.2"; do
    [[ -e "$lib" ]] || return 1
  done
}
if have_all; then
  say "found the toolchain in $prefix"
else
  command -v python3 >/dev/null || die "python3 (with pip) is needed to install the wheels"
  say "installing ${wheels[*]} into $prefix (about 0.9 GB to download, 1.4 GB on disk)"
  mkdir -p "$prefix"
  PIP_DISABLE_PIP_VERSION_CHECK=1 python3 -m pip install --quiet --no-cache-dir --only-binary=:all: \
    --upgrade --target "$prefix" "${wheels[@]}" >&2
  have_all || die "the wheels installed, but nvcc 13.0 or a library is missing under $prefix"
fi

# 2. The linker looks for unversioned names (-lcudart, -lnccl, ...); the wheels ship only the
#    versioned sonames. cudarc adds $CUDA_HOME/lib and $CUDA_HOME/lib/stubs to the search path.
link() { [[ "$(readlink "$cuda/lib/$2" 2>/dev/null)" == "$1" ]] || ln -sfn "$1" "$cuda/lib/$2"; }
link libcudart.so.13 libcudart.so
link libcublas.so.13 libcublas.so
link libcublasLt.so.13 libcublasLt.so
link libcurand.so.10 libcurand.so
link libnvrtc.so.13 libnvrtc.so
link ../../nccl/lib/libnccl.so.2 libnccl.so

# 3. libcuda.so belongs to the GPU driver, which no wheel contains. The binary only needs it to
#    link; at run time the driver's own libcuda.so.1 is loaded. So build a stub with the same
#    soname that defines every driver entry point cuda.h declares (the plain, _v2 and per-thread
#    stream variants come from preprocessing the header under each of its API macro settings).
stub="$cuda/lib/stubs/libcuda.so"
if [[ ! -s "$stub" ]]; then
  command -v gcc >/dev/null || die "gcc is needed to build the libcuda link stub"
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  for macros in "" "-D__CUDA_API_VERSION_INTERNAL" "-DCUDA_API_PER_THREAD_DEFAULT_STREAM=1"; do
    # shellcheck disable=SC2086 # $macros is zero or one word
    gcc -E -P -x c $macros -I "$cuda/include" "$cuda/include/cuda.h"
  done | grep -oE '\bcu[A-Z][A-Za-z0-9_]*[[:space:]]*\(' | tr -d ' \t(' | sort -u > "$work/symbols"
  [[ -s "$work/symbols" ]] || die "found no driver functions in $cuda/include/cuda.h"
  awk '{ printf "void %s(void) {}\n", $1 }' "$work/symbols" > "$work/stub.c"
  mkdir -p "$(dirname "$stub")"
  gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$stub" "$work/stub.c"
  say "built the libcuda link stub ($(wc -l < "$work/symbols") entry points)"
fi

say "nvcc $(nvcc_release), compute capability ${CUDA_COMPUTE_CAP:-90}"
# 4. The environment of the build: nvcc first on PATH (for candle's kernels, our kernels and
#    cudarc's CUDA-version probe), CUDA_HOME for the link search, the target GPU generation.
cat <<EOF
export CUDA_HOME="$cuda"
export PATH="$cuda/bin:\$PATH"
export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"
EOF
