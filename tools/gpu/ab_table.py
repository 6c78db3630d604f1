#!/usr/bin/env python3
"""The table of an A/B call (tools/gpu/ab.sh) from its logs, OUT/ab_<setting>_<a|b>_<round>.log.

    python3 tools/gpu/ab_table.py OUT

One row per setting, from each run's RESULT_JSON and its `step=` lines: tokens/s in round order, the ratio of the two builds' mean tokens/s,
peak GB with the memory model's prediction in brackets, and whether the runs logged the same loss
at every step: else whether a build's own runs differ (it does not repeat itself) or only the two
builds do, with the largest difference and its step. A run without a RESULT_JSON line reads
"failed" (its log says why). Exits 1 when a run failed or no log was found.
"""
import pathlib
import re
import statistics
import sys

from result_json import result_json

LOG = re.compile(r"^ab_(?P<setting>.+)_(?P<side>[ab])_(?P<round>\d+)\.log$")
STEP = re.compile(r"^step=(\d+) loss=(\S+)")


def read_run(path):
    """(RESULT_JSON object or None, {step: loss}) of one bench_train log."""
    losses = {}
    for line in path.read_text(errors="replace").splitlines():
        if m := STEP.match(line):
            losses[int(m[1])] = float(m[2])
    return result_json(path), losses


def largest_gap(pairs):
    """The largest loss difference over `pairs` of runs ({step: loss}) and its step, or None when
    they agree at every step both logged."""
    gaps = [(abs(x[s] - y[s]), s) for x, y in pairs for s in x.keys() & y.keys() if x[s] != y[s]]
    return max(gaps) if gaps else None


def loss_verdict(a_runs, b_runs):
    """Whether every run of both builds logged the same losses; else whether a build's own runs
    differ among themselves (it does not repeat itself), or only the two builds differ."""
    a = [losses for _, losses in a_runs if losses]
    b = [losses for _, losses in b_runs if losses]
    if not a or not b:
        return "no losses logged"
    own = []
    for name, runs in (("A", a), ("B", b)):
        if gap := largest_gap((x, y) for i, x in enumerate(runs) for y in runs[i + 1:]):
            own.append(f"{name}'s own runs differ: up to {gap[0]:.4g} (step {gap[1]})")
    if own:
        return "; ".join(own)
    if gap := largest_gap([(a[0], b[0])]):
        return f"A and B differ: up to {gap[0]:.4g} (step {gap[1]}); each repeats itself"
    return "the same at every step"


def side_cells(runs):
    """(tokens/s of each run, their mean or None, peak GB (predicted) of the last good run)."""
    rates = [s["tokens_per_s"] if s else None for s, _ in runs]
    good = [s for s, _ in runs if s]
    text = ", ".join("failed" if r is None else f"{r:,.0f}" for r in rates)
    mean = statistics.mean(r for r in rates if r is not None) if good else None
    peak = f"{good[-1]['peak_GB']:.2f} ({good[-1]['predicted_peak_GB']:.2f})" if good else "-"
    return text, mean, peak


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    runs = {}
    for path in sorted(pathlib.Path(sys.argv[1]).glob("ab_*.log")):
        if m := LOG.match(path.name):
            side = runs.setdefault(m["setting"], {"a": {}, "b": {}})[m["side"]]
            side[int(m["round"])] = read_run(path)
    if not runs:
        sys.exit(f"no ab_<setting>_<a|b>_<round>.log in {sys.argv[1]}")
    print("| setting | A tokens/s | B tokens/s | A / B | A peak GB (predicted) | B peak GB (predicted) | losses |")
    print("|---|---|---|---|---|---|---|")
    failed = False
    for setting, sides in runs.items():
        a_runs = [sides["a"][r] for r in sorted(sides["a"])]
        b_runs = [sides["b"][r] for r in sorted(sides["b"])]
        a_text, a_mean, a_peak = side_cells(a_runs)
        b_text, b_mean, b_peak = side_cells(b_runs)
        ratio = f"{a_mean / b_mean:.3f}" if a_mean and b_mean else "-"
        failed |= "failed" in a_text + b_text or not a_runs or not b_runs
        print(f"| {setting} | {a_text} | {b_text} | {ratio} | {a_peak} | {b_peak} | {loss_verdict(a_runs, b_runs)} |")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
