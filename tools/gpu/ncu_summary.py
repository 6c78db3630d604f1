"""Groups an `ncu --csv --metrics gpu__time_duration.sum` log by kernel name.

Usage: python3 ncu_summary.py KPROF.csv [--top N] [--families]

The log holds the kernels of one training step (bench_train --cuda-profiler-last-step under
`ncu --profile-from-start off`): total GPU ms per kernel name, launches, mean µs, share, and the sum,
the GPU busy time of the step (ncu serialises kernels, so nothing overlaps). `--families` prints
the same step grouped into kernel families instead (a markdown table, as in docs/benchmarks.md §3).
"""
import argparse
import csv
import collections
import io
import re

# Kernel families by name prefix, first match wins; cuBLAS's kernels are nvjet_* and cublasLt::*.
FAMILIES = [
    ("MoE grouped GEMMs", r"grouped_gemm"),
    ("cuBLAS GEMMs (incl. split-K reduce)", r"nvjet|.*cublas"),
    ("attention kernels", r"attn_"),
    ("MoE top-k, grouping, gathers, combine", r"moe_"),
    ("RMSNorm", r"rms_norm"),
    ("LoRA dropout", r"dropout"),
    ("LoRA adapter kernels (dropout-fused products, adapter terms)", r"lora_"),
    ("attention head transform (norm, layout, RoPE)", r"heads_norm"),
    ("casts", r"cast_"),
    ("swap12 regroups", r"swap12"),
    ("GeGLU", r"geglu"),
    ("RoPE", r"rope"),
    ("loss head cross-entropy", r"ce_"),
    ("AdamW, gradient norm, DDP accumulation", r"adamw|sumsq|norm_finish|ddp_"),
]
OTHER = "Candle element-wise ops, reductions, copies, other"


def family(name):
    """The family of a kernel name (FAMILIES, else OTHER)."""
    return next((f for f, pat in FAMILIES if re.match(pat, name)), OTHER)


def kernel_times(path):
    """(kernel name, GPU ns) of every launch in the log, in launch order."""
    text = open(path, errors="replace").read()
    start = text.find('"ID"')
    rows = list(csv.DictReader(io.StringIO(text[start:]))) if start >= 0 else []
    return [
        (r["Kernel Name"], float(r["Metric Value"].replace(",", "")))
        for r in rows
        if r.get("Metric Name") == "gpu__time_duration.sum"
    ]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--families", action="store_true")
    a = ap.parse_args()
    launches = kernel_times(a.csv)
    if not launches:
        print("no kernel rows")
        return
    if a.families:
        by = collections.defaultdict(lambda: [0.0, 0])
        for name, ns in launches:
            by[family(name)][0] += ns
            by[family(name)][1] += 1
        total = sum(v[0] for v in by.values())
        print(f"GPU busy {total / 1e6:.2f} ms, {len(launches):,} launches\n")
        print("| family | ms | launches | share |\n|---|---:|---:|---:|")
        for f, (ns, c) in sorted(by.items(), key=lambda kv: -kv[1][0]):
            print(f"| {f} | {ns / 1e6:.2f} | {c:,} | {100 * ns / total:.1f}% |")
        return
    by = collections.defaultdict(lambda: [0.0, 0])
    for name, ns in launches:
        by[name][0] += ns
        by[name][1] += 1
    total = sum(v[0] for v in by.values())
    print(f"kernel launches: {len(launches)}; GPU busy {total / 1e6:.2f} ms")
    print(f"{'kernel':60s} {'ms':>9s} {'calls':>6s} {'us/call':>9s} {'share':>6s}")
    for name, (ns, c) in sorted(by.items(), key=lambda kv: -kv[1][0])[: a.top]:
        print(f"{name[:60]:60s} {ns / 1e6:9.3f} {c:6d} {ns / c / 1e3:9.1f} {100 * ns / total:5.1f}%")


if __name__ == "__main__":
    main()
