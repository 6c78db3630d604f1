# One GPU-machine call, 2026-12-05, one H200: every size, ours and the PyTorch script back to back
# (GPU binaries of main 0b3be54, kernels of 85252ab). Carry: .gpu/bench_train.xz .gpu/bench .gpu/source_dir
OUT=$OUT bash tools/gpu/run_sizes.sh
