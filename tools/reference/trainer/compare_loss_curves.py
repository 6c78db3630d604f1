"""Compares per-step losses of train_ddp (metrics.jsonl) with the PyTorch + PEFT reference
(loss_curve_ref.py JSON) for the bf16 loss-curve check of issue 7. Standard library only.

    python3 tools/reference/trainer/compare_loss_curves.py --ref-f32 OUT/ref_f32.json \
        --ref-bf16 OUT/ref_bf16.json --ours-bf16 OUT/ours_bf16/metrics.jsonl \
        [--ours-f32 OUT/ours_f32/metrics.jsonl] [--json OUT/loss_curve_verdict.json]

Tolerance: "bf16 noise" is measured, not assumed. The reference run in bf16 and in f32 from the
same adapter on the same batches differ only by bf16 rounding (compounded through the updates);
noise(s) = |ref_bf16(s) - ref_f32(s)|. If our bf16 run is as close to the f32 curve as the
reference's bf16 run is, then by the triangle inequality
    |ours_bf16(s) - ref_bf16(s)| <= |ours_bf16(s) - ref_f32(s)| + |ref_f32(s) - ref_bf16(s)|
                                 <= 2 * noise
So the check passes when max_s |ours_bf16 - ref_bf16| <= 2 * max_s noise(s) and the mean abs
difference <= 2 * mean noise. With --ours-f32 a setup check runs too: over the first 5 steps our
f32 losses must match the reference's f32 losses to 1e-4 relative (measured on CPU: <= 1e-7 at
step 1; later steps drift apart even in f32, about x2 every two steps, because AdamW's normalised
update amplifies rounding differences, which is also why the tolerance above is measured over
the same steps instead of fixed). It rules out a data-order, schedule or adapter mismatch
masquerading as, or hiding behind, bf16 noise.
"""
import argparse
import json
import math
import sys

SETUP_REL_TOL = 1e-4
MIN_STEPS = 10  # fewer comparable steps than this is no evidence
SETUP_STEPS = 5


def ref_losses(path):
    with open(path) as f:
        doc = json.load(f)
    return {s["step"]: s["loss"] for s in doc["steps"]}, doc


def our_losses(path):
    out = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                v = json.loads(line)
                if v.get("kind") == "train":
                    out[v["step"]] = v["loss"]
    return out


def stats(a, b, steps):
    d = [abs(a[s] - b[s]) for s in steps]
    return max(d), sum(d) / len(d)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ref-f32", required=True)
    p.add_argument("--ref-bf16", required=True)
    p.add_argument("--ours-bf16", required=True)
    p.add_argument("--ours-f32")
    p.add_argument("--json", help="write the numbers and the verdict here")
    args = p.parse_args()

    rf, rf_doc = ref_losses(args.ref_f32)
    rb, rb_doc = ref_losses(args.ref_bf16)
    ob = our_losses(args.ours_bf16)
    of = our_losses(args.ours_f32) if args.ours_f32 else None
    steps = sorted(set(rf) & set(rb) & set(ob) & (set(of) if of is not None else set(rf)))
    missing = sorted((set(rf) | set(rb) | set(ob)) - set(steps))
    if not steps:
        sys.exit("no common steps between the runs")
    print(f"reference: {rb_doc['impl']} on {rb_doc['device']}, adapter {rb_doc['adapter_dtypes']}, "
          f"attention {rb_doc.get('attn_implementation')}")
    head = f"{'step':>4} {'ref f32':>10} {'ref bf16':>10} {'ours bf16':>10}"
    head += f" {'ours f32':>10}" if of is not None else ""
    head += f" {'|ref16-ref32|':>13} {'|ours16-ref16|':>14}"
    print(head)
    for s in steps:
        line = f"{s:>4} {rf[s]:>10.5f} {rb[s]:>10.5f} {ob[s]:>10.5f}"
        line += f" {of[s]:>10.5f}" if of is not None else ""
        line += f" {abs(rb[s] - rf[s]):>13.5f} {abs(ob[s] - rb[s]):>14.5f}"
        print(line)
    if missing:
        print(f"steps missing in some run (not compared): {missing}")

    # A non-finite reference loss (the post's loop has no non-finite skip, so one NaN gradient
    # poisons every later step) ends the comparison there; a non-finite loss of ours fails.
    ours_bad = [s for s in steps if not math.isfinite(ob[s]) or (of is not None and not math.isfinite(of[s]))]
    ref_bad = [s for s in steps if not (math.isfinite(rf[s]) and math.isfinite(rb[s]))]
    if ref_bad:
        print(f"reference loss not finite from step {ref_bad[0]} on; comparing steps before it")
        steps = [s for s in steps if s < ref_bad[0]]
    if ours_bad:
        print(f"ours: non-finite loss at steps {ours_bad}")
    if len(steps) < MIN_STEPS:
        sys.exit(f"VERDICT FAIL: only {len(steps)} comparable steps (need {MIN_STEPS})")
    noise_max, noise_mean = stats(rb, rf, steps)
    diff_max, diff_mean = stats(ob, rb, steps)
    vs32_max, vs32_mean = stats(ob, rf, steps)
    tol_max, tol_mean = 2 * noise_max, 2 * noise_mean
    print(f"reference bf16 noise |ref_bf16 - ref_f32|: max {noise_max:.5f} mean {noise_mean:.5f}")
    print(f"ours bf16 vs ref bf16:                     max {diff_max:.5f} mean {diff_mean:.5f} "
          f"(tolerance 2x noise: max {tol_max:.5f} mean {tol_mean:.5f})")
    print(f"ours bf16 vs ref f32:                      max {vs32_max:.5f} mean {vs32_mean:.5f}")
    ok = diff_max <= tol_max and diff_mean <= tol_mean and not ours_bad
    setup_ok = None
    if of is not None:
        rel = max(abs(of[s] - rf[s]) / abs(rf[s]) for s in steps[:SETUP_STEPS])
        setup_ok = rel <= SETUP_REL_TOL
        print(f"setup check ours f32 vs ref f32, steps {steps[0]}..{steps[:SETUP_STEPS][-1]}: "
              f"max rel {rel:.2e} (<= {SETUP_REL_TOL:g}): "
              f"{'ok' if setup_ok else 'MISMATCH'}")
    verdict = "PASS" if ok and setup_ok is not False else "FAIL"
    print(f"VERDICT {verdict}: {len(steps)} steps, bf16 losses "
          f"{'within' if ok else 'outside'} 2x the reference's own bf16 noise")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"steps": steps, "ref_f32": [rf[s] for s in steps],
                       "ref_bf16": [rb[s] for s in steps], "ours_bf16": [ob[s] for s in steps],
                       "ours_f32": [of[s] for s in steps] if of is not None else None,
                       "noise_max": noise_max, "noise_mean": noise_mean, "diff_max": diff_max,
                       "diff_mean": diff_mean, "setup_ok": setup_ok, "verdict": verdict}, f, indent=1)
    sys.exit(0 if verdict == "PASS" else 1)


if __name__ == "__main__":
    main()
