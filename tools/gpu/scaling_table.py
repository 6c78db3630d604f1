"""Scaling table of tools/gpu/run_scaling.sh: ours (bench_train) and the PyTorch script side by side.

    python3 tools/gpu/scaling_table.py OUT_DIR WORLD...

Reads the RESULT_JSON line of OUT_DIR/ours_w<N>.log and OUT_DIR/anchor_w<N>.log for each world
size and prints a markdown table: tokens/s, s/step, peak GB per GPU, MFU, the scaling efficiency
tokens_per_s(N) / (N x tokens_per_s(1)) and ours / PyTorch at each N.
"""
import os
import sys

from result_json import result_json


def main():
    out, worlds = sys.argv[1], [int(w) for w in sys.argv[2:]]
    rows = {}
    for who, prefix in (("ours", "ours_w"), ("PyTorch", "anchor_w")):
        for n in worlds:
            rows[(who, n)] = result_json(os.path.join(out, f"{prefix}{n}.log"))
    print("| run | GPUs | tokens/s | s/step | peak GB/GPU | MFU | scaling efficiency | ours / PyTorch |")
    print("|---|---|---|---|---|---|---|---|")
    for who in ("ours", "PyTorch"):
        base = rows.get((who, 1))
        for n in worlds:
            r = rows[(who, n)]
            if r is None:
                print(f"| {who} | {n} | (no result) | | | | | |")
                continue
            peak = r.get("peak_GB", r.get("peak_alloc_GB"))
            mfu = r.get("MFU_brief")
            eff = r["tokens_per_s"] / (n * base["tokens_per_s"]) if base else None
            other = rows.get(("PyTorch", n))
            ratio = r["tokens_per_s"] / other["tokens_per_s"] if who == "ours" and other else None
            print(
                f"| {who} | {n} | {r['tokens_per_s']:,.0f} | {r['s_per_step']:.3f} | {peak:.2f} | "
                f"{'' if mfu is None else f'{100 * mfu:.1f}%'} | "
                f"{'' if eff is None else f'{100 * eff:.2f}%'} | {'' if ratio is None else f'{ratio:.2f}x'} |"
            )


if __name__ == "__main__":
    main()
