#!/usr/bin/env python3
"""Clock and power of a GPU under load, from the nvidia-smi CSV that tools/gpu/power_clocks.sh
samples (timestamp, clocks.sm, clocks.max.sm, power.draw, power.limit, temperature.gpu,
clocks_event_reasons.active): the samples drawing more than --load-w watts, their SM clock and
power percentiles, and their most frequent throttle reasons (0x4: the software power cap).

Usage: python3 tools/gpu/clock_summary.py clocks.log [--load-w 300]
"""
import argparse
import collections


def number(field):
    """The value of a CSV field such as `1770 MHz` or `681.84 W`."""
    return float(field.split()[0])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("log")
    ap.add_argument("--load-w", type=float, default=300.0)
    args = ap.parse_args()
    rows = [line.strip().split(", ") for line in open(args.log) if line[:1].isdigit()]
    busy = [r for r in rows if number(r[3]) > args.load_w]
    print(f"samples {len(rows)}, under load (> {args.load_w:g} W) {len(busy)}")
    if not busy:
        return

    def pct(values, f):
        values = sorted(values)
        return values[int(f * (len(values) - 1))]

    clk = [number(r[1]) for r in busy]
    pw = [number(r[3]) for r in busy]
    print(
        "sm clock MHz min/p10/median/p90/max "
        f"{pct(clk, 0):g} {pct(clk, .1):g} {pct(clk, .5):g} {pct(clk, .9):g} {pct(clk, 1):g}"
        f" of max {busy[0][2]}"
    )
    print(f"power W p10/median/p90 {pct(pw, .1):g} {pct(pw, .5):g} {pct(pw, .9):g} limit {busy[0][4]}")
    print("throttle reasons", collections.Counter(r[6] for r in busy).most_common(5))


if __name__ == "__main__":
    main()
