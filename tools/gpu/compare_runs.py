"""Compares the per-step training losses and grad norms of two train_ddp runs (metrics.jsonl).

    python3 tools/gpu/compare_runs.py NAME_A A/metrics.jsonl NAME_B B/metrics.jsonl [--tol X]

Prints one row per step, then `MAX_ABS_LOSS_DIFF <x>`; with --tol exits 1 when x > tol (and
when the two runs logged different steps). Used by tools/gpu/run_multi.sh (issue 8: N GPUs with
micro-batch b against 1 GPU with N*b, torchrun against ddprun, two emulated nodes against one).
"""
import argparse
import json
import sys


def train_steps(path):
    out = {}
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if r.get("kind") == "train":
                out[r["step"]] = (r["loss"], r["grad_norm"])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("name_a")
    ap.add_argument("a")
    ap.add_argument("name_b")
    ap.add_argument("b")
    ap.add_argument("--tol", type=float)
    args = ap.parse_args()
    a, b = train_steps(args.a), train_steps(args.b)
    if sorted(a) != sorted(b) or not a:
        print(f"steps differ: {args.name_a} {sorted(a)} vs {args.name_b} {sorted(b)}")
        sys.exit(1)
    print(f"{'step':>5} {args.name_a + ' loss':>22} {args.name_b + ' loss':>22} {'|diff|':>10} {'norm rel diff':>14}")
    worst_loss, worst_norm = 0.0, 0.0
    for s in sorted(a):
        (la, na), (lb, nb) = a[s], b[s]
        d = abs(la - lb)
        dn = abs(na - nb) / max(abs(nb), 1e-12)
        worst_loss, worst_norm = max(worst_loss, d), max(worst_norm, dn)
        print(f"{s:>5} {la:>22.6f} {lb:>22.6f} {d:>10.2e} {dn:>14.2e}")
    print(f"MAX_ABS_LOSS_DIFF {worst_loss:.3e}  (max grad-norm relative diff {worst_norm:.2e}, {len(a)} steps)")
    if args.tol is not None:
        ok = worst_loss <= args.tol
        print(f"{'PASS' if ok else 'FAIL'}: {args.name_a} vs {args.name_b}, max |loss diff| {worst_loss:.3e} <= {args.tol:.3e}")
        sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
