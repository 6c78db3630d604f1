"""Splits each system's micro-batch time into a fixed cost per micro-batch and a cost per sequence
(docs/benchmarks.md §1a), from run_speed.sh logs made with different MICRO values.

A micro-batch of m sequences takes T(m) = s_per_step / accum; the least-squares line
T(m) = F + m·c over a system's logs gives F (ms per micro-batch) and c (ms per sequence). A system
is ours under one recompute policy (bench_train's RESULT_JSON names it), the PyTorch + PEFT script
under one GRAD_CKPT (`anchor_ckpt<N>` in the log's name) or Unsloth under one UNSLOTH_GC
(`unsloth_gc<mode>_` or `unsloth_gc<mode>.log`). Logs from different calls mix the calls' speeds.
Usage: python3 tools/gpu/micro_batch_fit.py LOG [LOG ...]"""
import collections
import pathlib
import re
import sys

from result_json import result_json


def system(path, res):
    """Which system and setting ran the log."""
    if "recompute" in res:
        return f"ours, --recompute {res['recompute'].split()[1].rstrip(':')}"
    m = re.search(r"anchor_ckpt(\d)", path.name)
    if m:
        return f"script, GRAD_CKPT={m[1]}"
    m = re.search(r"unsloth_gc([a-z]+?)(_|\.log)", path.name)
    if m:
        return f"Unsloth, UNSLOTH_GC={m[1]}"
    sys.exit(f"{path}: neither bench_train's JSON nor a script / Unsloth log name")


def fit(points):
    """(F, c, largest residual) of the least-squares line through (m, T) points."""
    n = len(points)
    mx = sum(m for m, _ in points) / n
    my = sum(t for _, t in points) / n
    sxx = sum((m - mx) ** 2 for m, _ in points)
    c = sum((m - mx) * (t - my) for m, t in points) / sxx
    f = my - c * mx
    return f, c, max(abs(t - (f + c * m)) for m, t in points)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    runs = collections.defaultdict(list)
    seqs = set()
    for arg in sys.argv[1:]:
        path = pathlib.Path(arg)
        res = result_json(path)
        if res is None:
            print(f"{path}: no RESULT_JSON (failed run?), left out", file=sys.stderr)
            continue
        seqs.add(res["seq"])
        runs[system(path, res)].append((res["micro_batch"], 1e3 * res["s_per_step"] / res["accum"]))
    if not runs:
        sys.exit("no log with a RESULT_JSON line")
    if len(seqs) > 1:
        sys.exit(f"the logs mix sequence lengths {sorted(seqs)}")
    seq = seqs.pop()
    print(f"| system | micro-batches (runs) | c, ms per sequence of {seq} tokens | F, ms per micro-batch | "
          "largest residual, ms |")
    print("|---|---|---:|---:|---:|")
    for name, points in sorted(runs.items()):
        sizes = sorted({m for m, _ in points})
        if len(sizes) < 2:
            print(f"| {name} | {sizes[0]} ({len(points)}) | needs two micro-batch sizes | | |")
            continue
        f, c, worst = fit(points)
        print(f"| {name} | {', '.join(map(str, sizes))} ({len(points)}) | {c:.0f} | {f:.0f} | {worst:.1f} |")


if __name__ == "__main__":
    main()
