# Source on the machine that runs a CUDA build of g4ft when its CUDA libraries are not on the
# loader's default path, e.g. a GPU machine whose only CUDA 13 runtime is the one PyTorch's cu130
# wheels brought:   source tools/cuda/device_env.sh && target/release/examples/train_ddp ...
#
# The binaries load libcudart.so.13, libcublas.so.13 + libcublasLt.so.13, libcurand.so.10,
# libnvrtc.so.13, libnccl.so.2 and the driver's libcuda.so.1. This finds the lib/ folders of the
# `nvidia` wheels that Python can import (G4FT_CUDA_PYTHON, default python3), or takes
# G4FT_CUDA_LIB_DIRS (colon-separated) when set, and puts them first on LD_LIBRARY_PATH. It also
# keeps NCCL's NVLink multicast (NVLS) off unless NCCL_NVLS_ENABLE is already set.
# Sets G4FT_CUDA_LIB_DIRS to what it used.

if [ -z "${G4FT_CUDA_LIB_DIRS:-}" ]; then
  G4FT_CUDA_LIB_DIRS="$("${G4FT_CUDA_PYTHON:-python3}" -c '
import os, nvidia
dirs = set()
for root in nvidia.__path__:
    for name in sorted(os.listdir(root)):
        lib = os.path.join(root, name, "lib")
        if os.path.isdir(lib) and any(".so" in f for f in os.listdir(lib)):
            dirs.add(lib)
print(":".join(sorted(dirs)))
' 2>/dev/null)"
fi
if [ -n "$G4FT_CUDA_LIB_DIRS" ]; then
  export LD_LIBRARY_PATH="$G4FT_CUDA_LIB_DIRS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export G4FT_CUDA_LIB_DIRS
else
  echo "device_env.sh: no CUDA library folders found (no importable nvidia wheels and no G4FT_CUDA_LIB_DIRS); using the system's libraries" >&2
fi
export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}"
