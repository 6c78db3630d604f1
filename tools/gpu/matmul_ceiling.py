#!/usr/bin/env python3
"""The bf16 matmul ceiling of this GPU, the peak that MFU is measured against.

Times single n x n x n bf16 products (n = 8192, random inputs) with CUDA events after a warm-up
and reports the median, the best and the median of back-to-back runs in TFLOP/s; the median is
written to OUT_FILE (one decimal) for `bench_train --peak-tflops` and the PyTorch baseline's
PEAK_TFLOPS.

Usage: python3 tools/gpu/matmul_ceiling.py OUT_FILE
"""
import statistics
import sys

import torch

N, WARMUP, SAMPLES = 8192, 10, 50


def timed(fn):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def main(out_path):
    gen = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(N, N, device="cuda", dtype=torch.bfloat16, generator=gen)
    b = torch.randn(N, N, device="cuda", dtype=torch.bfloat16, generator=gen)
    for _ in range(WARMUP):
        a @ b
    torch.cuda.synchronize()
    singles = [timed(lambda: a @ b) for _ in range(SAMPLES)]
    burst = timed(lambda: [a @ b for _ in range(SAMPLES)]) / SAMPLES
    tflops = lambda s: 2 * N**3 / s / 1e12
    median = tflops(statistics.median(singles))
    with open(out_path, "w") as f:
        f.write(f"{median:.1f}")
    print(f"MATMUL bf16 {N}^3: median {median:.1f} TFLOP/s, best {tflops(min(singles)):.1f}, "
          f"back to back {tflops(burst):.1f}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
