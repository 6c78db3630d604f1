"""Reads a train_ddp output folder's TensorBoard events back with the tensorboard package and
checks them against metrics.jsonl: every train step's loss, grad norm and lr, every eval loss.

    /opt/refenv/bin/python tools/reference/trainer/check_tensorboard.py OUTPUT

(tests/first_hour.rs runs it when /opt/refenv has tensorboard.) Exits non-zero on a mismatch.
"""
import json
import math
import os
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def main(out):
    acc = EventAccumulator(os.path.join(out, "tensorboard"))
    acc.Reload()
    lines = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    want = {
        "train/loss": [(l["step"], l["loss"]) for l in lines if l["kind"] == "train"],
        "train/grad_norm": [(l["step"], l["grad_norm"]) for l in lines if l["kind"] == "train"],
        "train/lr": [(l["step"], l["lr"]) for l in lines if l["kind"] == "train"],
        "eval/loss": [(l["step"], l["loss"]) for l in lines if l["kind"] == "eval"],
    }
    tags = acc.Tags()["scalars"]
    bad = 0
    for tag, points in want.items():
        if not points:
            continue
        if tag not in tags:
            print(f"FAIL {tag}: missing (have {tags})")
            bad += 1
            continue
        got = [(e.step, e.value) for e in acc.Scalars(tag)]
        ok = len(got) == len(points) and all(
            gs == ws and math.isclose(gv, wv, rel_tol=1e-6, abs_tol=1e-12)
            for (gs, gv), (ws, wv) in zip(got, points)
        )
        print(("PASS" if ok else "FAIL"), tag, len(got), "points")
        if not ok:
            print("  got ", got)
            print("  want", points)
            bad += 1
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main(sys.argv[1])
