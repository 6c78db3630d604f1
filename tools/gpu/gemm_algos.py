#!/usr/bin/env python3
"""How much faster than cuBLAS's default pick a 12B projection GEMM can run on this GPU.

For each of the 12B's frozen-projection shapes (forward `y = x·Wᵀ` and backward `dx = g·W`, bf16 in
and out, fp32 accumulation, row-major as `linear_frozen` calls them) it times torch's `@` (cuBLAS's
default algorithm) and every algorithm cuBLASLt's heuristic offers (up to 32), with CUDA events,
back to back after a warm-up, and prints a table: TFLOP/s of the default, of the heuristic's first
pick and of the fastest, and the fastest's index in the heuristic's list.

Usage: python3 tools/gpu/gemm_algos.py [TOKENS ...]   (default 2048 4096)
"""
import ctypes
import glob
import os
import sys

import torch

ITERS, WARMUP, ALGOS, ROUNDS = 20, 5, 32, 3
# (name, out features N, in features K) of the 12B's sliding layers.
PROJECTIONS = [("q", 4096, 3840), ("k/v", 2048, 3840), ("o", 3840, 4096), ("gate/up", 15360, 3840),
               ("down", 3840, 15360)]
COMPUTE_32F, R_32F, R_16BF = 68, 0, 14
DESC_TRANSA, DESC_TRANSB, PREF_MAX_WORKSPACE = 3, 4, 1
WORKSPACE = 32 << 20


def load_lt():
    root = os.path.dirname(torch.__file__)
    candidates = glob.glob(os.path.join(root, "..", "nvidia", "cu*", "lib", "libcublasLt.so*"))
    candidates += glob.glob(os.path.join(root, "..", "nvidia", "cublas", "lib", "libcublasLt.so*"))
    candidates += glob.glob(os.path.join(root, "lib", "libcublasLt.so*"))
    candidates += ["libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"]
    for c in candidates:
        try:
            return ctypes.CDLL(c)
        except OSError:
            continue
    sys.exit("libcublasLt not found")


class Heuristic(ctypes.Structure):
    _fields_ = [("algo", ctypes.c_uint64 * 8), ("workspace", ctypes.c_size_t), ("state", ctypes.c_int),
                ("waves", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


CONFIG_ATTRS = ("id", "tile", "splitk", "reduction", "swizzle", "custom", "stages", "inner", "cluster")


def algo_config(lib, algo):
    """The algorithm's configuration attributes, as name=value."""
    out = []
    for i, name in enumerate(CONFIG_ATTRS):
        size = ctypes.c_size_t()
        if lib.cublasLtMatmulAlgoConfigGetAttribute(ctypes.byref(algo), i, None, 0, ctypes.byref(size)) != 0:
            continue
        buf = ctypes.create_string_buffer(size.value)
        if lib.cublasLtMatmulAlgoConfigGetAttribute(ctypes.byref(algo), i, buf, size, ctypes.byref(size)) == 0:
            out.append(f"{name}={int.from_bytes(buf.raw[:size.value], 'little')}")
    return " ".join(out)


def check(status, what):
    if status != 0:
        raise RuntimeError(f"{what}: cublasLt status {status}")


def timed(fn):
    for _ in range(WARMUP):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(ITERS):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / ITERS


class Lt:
    def __init__(self):
        self.lib = load_lt()
        self.handle = ctypes.c_void_p()
        check(self.lib.cublasLtCreate(ctypes.byref(self.handle)), "create")
        self.workspace = torch.empty(WORKSPACE, dtype=torch.uint8, device="cuda")

    def layout(self, rows, cols, ld):
        lay = ctypes.c_void_p()
        check(self.lib.cublasLtMatrixLayoutCreate(ctypes.byref(lay), R_16BF, ctypes.c_uint64(rows),
                                                  ctypes.c_uint64(cols), ctypes.c_int64(ld)), "layout")
        return lay

    def candidates(self, a, b, c, trans_a, trans_b):
        """Column-major D (m×n) = op(A)·op(B) where the row-major product is c = a·b (so A is b)."""
        lib = self.lib
        desc = ctypes.c_void_p()
        check(lib.cublasLtMatmulDescCreate(ctypes.byref(desc), COMPUTE_32F, R_32F), "desc")
        for attr, t in ((DESC_TRANSA, trans_b), (DESC_TRANSB, trans_a)):
            op = ctypes.c_int32(1 if t else 0)
            check(lib.cublasLtMatmulDescSetAttribute(desc, attr, ctypes.byref(op), 4), "trans")
        # Row-major c (M×N) is column-major cᵀ (N×M) = op(b)ᵀ·op(a)ᵀ.
        m_rows, n_cols = c.shape
        adesc = self.layout(*(b.shape[::-1]), b.shape[1])
        bdesc = self.layout(*(a.shape[::-1]), a.shape[1])
        cdesc = self.layout(n_cols, m_rows, n_cols)
        pref = ctypes.c_void_p()
        check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "pref")
        ws = ctypes.c_uint64(WORKSPACE)
        check(lib.cublasLtMatmulPreferenceSetAttribute(pref, PREF_MAX_WORKSPACE, ctypes.byref(ws), 8), "ws")
        results = (Heuristic * ALGOS)()
        count = ctypes.c_int()
        check(lib.cublasLtMatmulAlgoGetHeuristic(self.handle, desc, adesc, bdesc, cdesc, cdesc, pref, ALGOS,
                                                 results, ctypes.byref(count)), "heuristic")
        alpha, beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        runs = []
        for i in range(count.value):
            r = results[i]
            if r.state != 0:
                continue

            def run(r=r):
                check(lib.cublasLtMatmul(self.handle, desc, ctypes.byref(alpha), ctypes.c_void_p(b.data_ptr()),
                                         adesc, ctypes.c_void_p(a.data_ptr()), bdesc, ctypes.byref(beta),
                                         ctypes.c_void_p(c.data_ptr()), cdesc, ctypes.c_void_p(c.data_ptr()),
                                         cdesc, ctypes.byref(r.algo), ctypes.c_void_p(self.workspace.data_ptr()),
                                         ctypes.c_size_t(WORKSPACE), stream), "matmul")

            run.config = algo_config(lib, r.algo)
            runs.append(run)
        return runs


def main(tokens):
    torch.manual_seed(0)
    lt = Lt()
    rows, details = [], []
    for t in tokens:
        for name, n, k in PROJECTIONS:
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
            for pas in ("forward", "backward"):
                if pas == "forward":  # y (T×N) = x (T×K) · Wᵀ
                    a = torch.randn(t, k, device="cuda", dtype=torch.bfloat16)
                    bt = w.t()
                    c = torch.empty(t, n, device="cuda", dtype=torch.bfloat16)
                    default = lambda: torch.matmul(a, bt, out=c)
                    runs = lt.candidates(a, w, c, False, True)
                else:  # dx (T×K) = g (T×N) · W
                    a = torch.randn(t, n, device="cuda", dtype=torch.bfloat16)
                    c = torch.empty(t, k, device="cuda", dtype=torch.bfloat16)
                    default = lambda: torch.matmul(a, w, out=c)
                    runs = lt.candidates(a, w, c, False, False)
                flop = 2 * t * n * k
                default()
                reference = c.clone()
                same = []
                for r in runs:
                    c.zero_()
                    r()
                    same.append(bool(torch.equal(c, reference)))
                # Interleaved rounds: every candidate once per round, the median of its rounds.
                samples = [[] for _ in range(len(runs) + 1)]
                for _ in range(ROUNDS):
                    for i, fn in enumerate([default] + runs):
                        samples[i].append(timed(fn))
                tf = [flop / sorted(s)[len(s) // 2] / 1e12 for s in samples]
                best = max(range(1, len(tf)), key=tf.__getitem__)
                same_best = max((i for i in range(1, len(tf)) if same[i - 1]), key=tf.__getitem__, default=None)
                rows.append(f"| {t} | {name} | {pas} | {tf[0]:.0f} | {tf[1]:.0f} | {tf[best]:.0f} | {best - 1} | "
                            f"{tf[same_best]:.0f} | {sum(same)} of {len(runs)} |")
                print(rows[-1], flush=True)
                for i, r in enumerate(runs):
                    details.append(f"{t} {name} {pas} #{i}: {tf[i + 1]:.0f} TFLOP/s, same bits as default: "
                                   f"{same[i]}, {r.config}")
    print()
    print("| T | projection | pass | default TFLOP/s | heuristic's first | fastest | fastest's rank | "
          "fastest with the default's bits | algos with the default's bits |")
    print("|---:|---|---|---:|---:|---:|---:|---:|---:|")
    print("\n".join(rows))
    print()
    print("\n".join(details))


if __name__ == "__main__":
    main([int(x) for x in sys.argv[1:]] or [2048, 4096])
