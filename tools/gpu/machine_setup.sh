# Sourced by the tools/gpu scripts on the GPU machine, from the repository root after
# tools/gpu/build.sh (carry .gpu): unpacks the carried binaries (.gpu/*.xz), puts the CUDA
# libraries on the loader's path (tools/cuda/device_env.sh) and links the checkout the test
# binaries were built in (.gpu/source_dir; they read their fixtures through that path) to this one.
# Defines measure_peak_tflops: the bf16 matmul ceiling (tools/gpu/matmul_ceiling.py), printed and
# set as P for --peak-tflops and the PyTorch script's PEAK_TFLOPS.
for f in .gpu/*.xz; do [ -e "$f" ] && xz -dkf "$f"; done
chmod +x .gpu/* 2>/dev/null
source tools/cuda/device_env.sh
if [ -f .gpu/source_dir ]; then
  src=$(cat .gpu/source_dir)
  [ -e "$src" ] || { mkdir -p "$(dirname "$src")" && ln -sfn "$PWD" "$src"; }
  unset src
fi
measure_peak_tflops() {
  python3 tools/gpu/matmul_ceiling.py /tmp/peak_tflops 2>&1 | tail -1
  P=$(cat /tmp/peak_tflops)
}
