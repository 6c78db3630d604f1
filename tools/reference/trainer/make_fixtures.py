"""Golden values for g4ft-trainer's optimizer, clipping and schedule.

Runs torch.optim.AdamW (CPU, single-tensor path), torch.nn.utils.clip_grad_norm_ and
transformers' schedules (get_scheduler: cosine, linear, constant, constant_with_warmup; the warmup
of a fractional warmup_steps from TrainingArguments.get_warmup_steps) for a few steps on small seeded random tensors,
exactly in the order of the post's train_ddp.py (clip, optimizer.step, scheduler.step), and writes
optim_fixtures.json next to this script. The Rust side flattens the parameters in list order into
one buffer (the layout of a DDP bucket) and must match to 1e-6 relative.

Regenerate: /opt/refenv/bin/python tools/reference/trainer/make_fixtures.py
"""

import json
import os
import sys

import torch
import transformers
from transformers import TrainingArguments, get_cosine_schedule_with_warmup, get_scheduler

HERE = os.path.dirname(os.path.abspath(__file__))
SHAPES = [(4, 3), (2, 5), (7,)]  # three "parameters", flattened in this order


def flat(tensors):
    return torch.cat([t.detach().reshape(-1) for t in tensors]).tolist()


def run_case(name, seed, lr, weight_decay, max_grad_norm, warmup, total, grad_scales):
    g = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.randn(s, generator=g)) for s in SHAPES]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, foreach=False)
    sched = get_cosine_schedule_with_warmup(opt, warmup, total)
    case = dict(name=name, lr=lr, weight_decay=weight_decay, max_grad_norm=max_grad_norm,
                warmup=warmup, total=total, betas=[0.9, 0.999], eps=1e-8,
                init_params=flat(params), steps=[])
    for scale in grad_scales:
        grads = [torch.randn(s, generator=g) * scale for s in SHAPES]
        for p, gr in zip(params, grads):
            p.grad = gr.clone()
        lr_used = sched.get_last_lr()[0]
        norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        clipped = flat([p.grad for p in params])
        opt.step()
        sched.step()
        case["steps"].append(dict(grads=flat(grads), lr=lr_used, norm=norm.item(),
                                  clipped_grads=clipped, params=flat(params)))
    st = [opt.state[p] for p in params]
    case["final_step"] = int(st[0]["step"].item())
    case["exp_avg"] = flat([s["exp_avg"] for s in st])
    case["exp_avg_sq"] = flat([s["exp_avg_sq"] for s in st])
    return case


def schedule_case(warmup, total, base_lr, n, kind="cosine"):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([p], lr=base_lr)
    sched = get_scheduler(kind, opt, num_warmup_steps=warmup, num_training_steps=total)
    lrs = []
    for _ in range(n):
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    return dict(kind=kind, warmup=warmup, total=total, base_lr=base_lr, lrs=lrs)


def warmup_ratio_case(ratio, total):
    args = TrainingArguments(output_dir=os.path.join(HERE, ".unused"), warmup_steps=ratio, report_to=[])
    return dict(ratio=ratio, total=total, warmup=args.get_warmup_steps(total))


def main():
    torch.set_num_threads(1)
    versions = dict(python=sys.version.split()[0], torch=torch.__version__,
                    transformers=transformers.__version__)
    print("versions:", versions)
    out = dict(
        versions=versions,
        optim=[
            # large grads in steps 2 and 4 exercise clipping, small ones the unclipped path
            run_case("no_weight_decay", 1, 1e-2, 0.0, 1.0, 2, 5, [0.1, 3.0, 0.05, 10.0, 0.2]),
            run_case("weight_decay", 2, 3e-3, 0.1, 0.5, 1, 6, [1.0, 0.01, 2.0, 0.3, 5.0, 0.02]),
            run_case("no_warmup", 3, 5e-4, 0.01, 2.0, 0, 4, [0.5, 0.5, 4.0, 0.001]),
        ],
        schedule=[
            schedule_case(20, 100, 1e-4, 101),
            schedule_case(0, 10, 1e-3, 12),
            schedule_case(5, 3, 2e-4, 8),  # warmup longer than training
            schedule_case(3, 10, 1e-3, 12, "linear"),
            schedule_case(0, 7, 5e-4, 9, "linear"),
            schedule_case(4, 10, 1e-3, 12, "constant"),
            schedule_case(4, 10, 1e-3, 12, "constant_with_warmup"),
        ],
        warmup_ratio=[warmup_ratio_case(0.1, 41), warmup_ratio_case(0.05, 400), warmup_ratio_case(0.5, 3)],
    )
    path = os.path.join(HERE, "optim_fixtures.json")
    with open(path, "w") as f:
        json.dump(out, f)
    print("wrote", path, os.path.getsize(path), "bytes")


if __name__ == "__main__":
    main()
