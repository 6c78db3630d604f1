#!/usr/bin/env python3
"""Sums the folded host stacks of `bench_train --host-profile FILE` per function.

Prints the functions with the most samples at the top of the stack (self) and the most samples
anywhere in the stack (inclusive, each function counted once per stack), as shares of all
samples; `--under NAME` keeps only the stacks through a function whose name contains NAME,
`--threads` prints the samples per thread first, and `--callers NAME` prints instead which of
our functions (the nearest frame of a g4ft crate or of the binary above it) the samples in a
function containing NAME come from.

Usage: python3 tools/gpu/host_profile_table.py host.folded [--top 40] [--under forward_backward]
       python3 tools/gpu/host_profile_table.py host.folded --callers cuMemcpyHtoDAsync
"""
import argparse
import collections
import re

# Our frames: the g4ft crates (also as `<g4ft_… as Trait>`) and the binaries' own functions.
OURS = re.compile(r"^<?(g4ft_|bench_train::|train_ddp::)")


def read_folded(path):
    """(frames outermost first, count) per line; the first field is the thread."""
    stacks = []
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                continue
            stack, _, count = line.rpartition(" ")
            stacks.append((stack.split(";"), int(count)))
    return stacks


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folded")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--under", help="keep the stacks through a function containing this")
    ap.add_argument("--threads", action="store_true", help="print the samples per thread")
    ap.add_argument("--callers", help="which of our functions the samples in NAME come from")
    a = ap.parse_args()

    stacks = read_folded(a.folded)
    if a.under:
        stacks = [(fr, c) for fr, c in stacks if any(a.under in f for f in fr[1:])]
    total = sum(c for _, c in stacks)
    if total == 0:
        raise SystemExit(f"{a.folded}: no samples" + (f" under {a.under!r}" if a.under else ""))
    threads = collections.Counter()
    own = collections.Counter()
    incl = collections.Counter()
    for frames, count in stacks:
        threads[frames[0]] += count
        own[frames[-1]] += count
        for name in set(frames[1:]):
            incl[name] += count

    scope = f" under {a.under!r}" if a.under else ""
    if a.callers:
        callers = collections.Counter()
        for frames, count in stacks:
            hit = next((i for i, f in enumerate(frames) if i > 0 and a.callers in f), None)
            if hit is None:
                continue
            ours = next((frames[j] for j in range(hit - 1, 0, -1) if OURS.match(frames[j])), "(none)")
            callers[ours] += count
        inside = sum(callers.values())
        print(f"{inside} of {total} samples{scope} in a function containing {a.callers!r}, by caller")
        print("\n| our caller | samples | share of those |\n|---|---:|---:|")
        for name, c in callers.most_common(a.top):
            print(f"| `{name[:150]}` | {c} | {100 * c / max(inside, 1):.1f}% |")
        return
    print(f"{total} samples{scope} ({a.folded})")
    if a.threads:
        print("\n| thread | samples | share |\n|---|---:|---:|")
        for name, c in threads.most_common():
            print(f"| {name} | {c} | {100 * c / total:.1f}% |")
    for title, counter in (("self", own), ("inclusive", incl)):
        print(f"\n| function ({title}) | samples | share |\n|---|---:|---:|")
        for name, c in counter.most_common(a.top):
            print(f"| `{name[:150]}` | {c} | {100 * c / total:.1f}% |")


if __name__ == "__main__":
    main()
