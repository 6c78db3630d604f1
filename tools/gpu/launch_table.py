"""Launches and GPU busy time per micro-batch of each size, from tools/gpu/launches_per_size.sh.

Usage: python3 launch_table.py OUT_DIR

OUT_DIR/<size>/ holds kernel_profile.sh's logs of one step of one micro-batch with the whole
model: kprof_ncu.csv (every kernel of the step, in launch order) and kprof_plain.log (the same
step without the profiler). The optimizer's part of the step starts at its first gradient-norm
kernel (sumsq_partial_f32); what comes before is the micro-batch. "busy / wall" is the share of
the step's wall time the GPU spends in kernels: below 1 the GPU waits for the host (or for a
device-to-host copy) that long.
"""
import os
import re
import sys

from ncu_summary import kernel_times

SIZES = ["E2B", "E4B", "12B", "26B-A4B", "31B"]


def steady_step_s(log):
    """Mean wall seconds per step of the log's SUMMARY line."""
    m = re.search(r"SUMMARY .*?s_per_step=([0-9.]+)", open(log, errors="replace").read())
    return float(m.group(1)) if m else None


def layer_count(log):
    m = re.search(r"kept_layers=\d+/(\d+)", open(log, errors="replace").read())
    return int(m.group(1)) if m else None


def main():
    out = sys.argv[1]
    print("| size | layers | launches per micro-batch | per layer | optimizer launches "
          "| GPU busy ms per step | wall ms per step | busy / wall |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for size in SIZES:
        d = os.path.join(out, size)
        csv_path, log = os.path.join(d, "kprof_ncu.csv"), os.path.join(d, "kprof_plain.log")
        if not (os.path.exists(csv_path) and os.path.exists(log)):
            continue
        launches = kernel_times(csv_path)
        if not launches:
            print(f"| {size} | no kernel rows in {csv_path} |")
            continue
        first_optim = next((i for i, (n, _) in enumerate(launches) if n.startswith("sumsq_partial")),
                           len(launches))
        busy_ms = sum(ns for _, ns in launches) / 1e6
        layers, step_s = layer_count(log), steady_step_s(log)
        per_layer = f"{first_optim / layers:.0f}" if layers else "?"
        wall = f"{step_s * 1e3:.1f}" if step_s else "?"
        share = f"{busy_ms / (step_s * 1e3):.2f}" if step_s else "?"
        print(f"| {size} | {layers} | {first_optim:,} | {per_layer} | {len(launches) - first_optim} "
              f"| {busy_ms:.1f} | {wall} | {share} |")


if __name__ == "__main__":
    main()
