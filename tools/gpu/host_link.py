#!/usr/bin/env python3
"""Host link bandwidth of this GPU machine: pinned host <-> device copies, one direction at a
time and both at once (on two streams), in chunks the size of a parked tensor of the 12B
(`--offload-checkpoints`: one (micro-batch, 2048, 3840) bf16 tensor). Prints a table.

Usage: python3 tools/gpu/host_link.py [--mib 31.5] [--repeats 40]
"""

import argparse
import time

import torch


def timed(fn, repeats):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=float, default=31.5)
    ap.add_argument("--repeats", type=int, default=40)
    args = ap.parse_args()
    n = int(args.mib * 2**20)
    dev_out = torch.empty(n, dtype=torch.uint8, device="cuda").fill_(1)
    dev_in = torch.empty(n, dtype=torch.uint8, device="cuda")
    host_out = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    host_in = torch.empty(n, dtype=torch.uint8, pin_memory=True).fill_(2)
    s_out, s_in = torch.cuda.Stream(), torch.cuda.Stream()

    def d2h():
        with torch.cuda.stream(s_out):
            host_out.copy_(dev_out, non_blocking=True)

    def h2d():
        with torch.cuda.stream(s_in):
            dev_in.copy_(host_in, non_blocking=True)

    def both():
        d2h()
        h2d()

    for fn in (d2h, h2d, both):
        timed(fn, 3)
    rows = [
        ("device -> host", timed(d2h, args.repeats)),
        ("host -> device", timed(h2d, args.repeats)),
        ("both at once (each way)", timed(both, args.repeats)),
    ]
    print(f"{torch.cuda.get_device_name()}, chunks of {args.mib} MiB, {args.repeats} copies each")
    print(f"{'direction':<26} {'GB/s':>8}")
    for name, secs in rows:
        print(f"{name:<26} {n * args.repeats / secs / 1e9:>8.1f}")


if __name__ == "__main__":
    main()
