"""Groups an `ncu --csv --metrics gpu__time_duration.sum` log by kernel name.

Usage: python3 ncu_summary.py KPROF.csv [--top N]

The log holds the kernels of one training step (bench_train --cuda-profiler-last-step under
`ncu --profile-from-start off`): total GPU ms per kernel name, launches, mean µs, share, and the sum,
the GPU busy time of the step (ncu serialises kernels, so nothing overlaps).
"""
import argparse
import csv
import collections
import io


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
    a = ap.parse_args()
    launches = kernel_times(a.csv)
    if not launches:
        print("no kernel rows")
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
