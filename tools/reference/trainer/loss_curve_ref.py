"""PyTorch + PEFT reference loss curve on the tiny model, for the bf16 loss-curve check of issue 7
("on a tiny model in bf16, our per-step losses match the PyTorch script's within bf16 noise from
the same initial adapter"). Driven by tools/gpu/loss_curve.sh; compare with compare_loss_curves.py.

    # 1. the shared initial adapter (PEFT, B non-zero so the adapter matters from step 1)
    python3 tools/reference/trainer/loss_curve_ref.py --make-init OUT/init_adapter
    # 2. the post's loop from that adapter, in f32 and in bf16 (frozen base in bf16, adapter fp32)
    python3 tools/reference/trainer/loss_curve_ref.py --init-adapter OUT/init_adapter \
        --dtype bf16 --device cuda --out OUT/ref_bf16.json

The loop is the post's train_ddp.py on one rank, matched to `train_ddp --no-shuffle`: the
pre-tokenized rows of --data in file order (labels from the file, -100 = ignored), right-padded
micro-batches (pad id 0, labels -100 on padding, drop_last), `out.loss / ACCUM` per micro-batch,
clip_grad_norm_(1.0), AdamW(lr, weight_decay 0), get_cosine_schedule_with_warmup(warmup,
len(batches) // ACCUM * epochs) stepped after the optimizer, stopped after --max-steps. LoRA
dropout is 0 (the masks of two implementations cannot agree). Writes per step: loss (as the post
logs it), pre-clip grad norm, learning rate.
"""
import argparse
import json
import os
import shutil

import peft
import torch
import transformers
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForImageTextToText, get_cosine_schedule_with_warmup

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
POST_REGEX = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=os.path.join(ROOT, "assets", "tiny"))
    p.add_argument("--data", default=os.path.join(ROOT, "assets", "sample", "tokens.jsonl"))
    p.add_argument("--make-init", metavar="DIR", help="write the initial adapter to DIR and exit")
    p.add_argument("--init-adapter", metavar="DIR", help="start from this PEFT adapter")
    p.add_argument("--out", help="per-step JSON output")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="f32")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--lora-alpha", type=float, default=32.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-len", type=int, default=128)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--accum", type=int, default=2)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=30)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--max-grad-norm", type=float, default=1.0)
    return p.parse_args()


def make_init(args):
    torch.manual_seed(args.seed)
    model = AutoModelForImageTextToText.from_pretrained(args.model, dtype=torch.float32)
    cfg = LoraConfig(r=args.lora_r, lora_alpha=args.lora_alpha, lora_dropout=0.0,
                     target_modules=POST_REGEX, init_lora_weights=False, task_type="CAUSAL_LM")
    model = get_peft_model(model, cfg)
    model.peft_config["default"].base_model_name_or_path = "assets/tiny"
    shutil.rmtree(args.make_init, ignore_errors=True)
    model.save_pretrained(args.make_init)
    readme = os.path.join(args.make_init, "README.md")
    if os.path.exists(readme):
        os.remove(readme)
    print(f"wrote {args.make_init} (r={args.lora_r}, alpha={args.lora_alpha}, seed={args.seed})")


def read_rows(path, max_len):
    rows = []
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            row = json.loads(line)
            ids = row["input_ids"][:max_len]
            labels = row.get("labels", row["input_ids"])[:max_len]
            rows.append((ids, labels))
    return rows


def pad_collate(rows, device):
    longest = max(len(ids) for ids, _ in rows)
    input_ids = torch.zeros((len(rows), longest), dtype=torch.long)
    attention_mask = torch.zeros((len(rows), longest), dtype=torch.long)
    labels = torch.full((len(rows), longest), -100, dtype=torch.long)
    for i, (ids, lab) in enumerate(rows):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        attention_mask[i, : len(ids)] = 1
        labels[i, : len(lab)] = torch.tensor(lab)
    return {"input_ids": input_ids.to(device), "attention_mask": attention_mask.to(device),
            "labels": labels.to(device)}


def train(args):
    torch.manual_seed(args.seed)
    dtype = DTYPES[args.dtype]
    model = AutoModelForImageTextToText.from_pretrained(args.model, dtype=dtype).to(args.device)
    model = PeftModel.from_pretrained(model, args.init_adapter, is_trainable=True)
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    adapter_dtypes = sorted({str(p.dtype) for p in trainable})

    rows = read_rows(args.data, args.max_len)
    mb = args.micro_batch
    batches = [rows[i : i + mb] for i in range(0, len(rows) - mb + 1, mb)]  # drop_last
    steps_per_epoch = len(batches) // args.accum
    total = steps_per_epoch * args.epochs
    run = min(args.max_steps, total)
    optimizer = torch.optim.AdamW(trainable, lr=args.lr, weight_decay=0.0)
    scheduler = get_cosine_schedule_with_warmup(optimizer, args.warmup, total)
    log = []
    step = 0
    for _epoch in range(args.epochs):
        for s in range(steps_per_epoch):
            if step >= run:
                break
            loss_sum = 0.0
            for k in range(args.accum):
                batch = pad_collate(batches[s * args.accum + k], args.device)
                out = model(**batch, use_cache=False)
                loss = out.loss / args.accum
                loss.backward()
                loss_sum += loss.item()
            lr = scheduler.get_last_lr()[0]
            norm = torch.nn.utils.clip_grad_norm_(trainable, args.max_grad_norm).item()
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            log.append({"step": step, "loss": loss_sum, "grad_norm": norm, "lr": lr})
            print(f"step={step} loss={loss_sum:.6f} grad_norm={norm:.6f} lr={lr:.2e}", flush=True)
    result = {
        "impl": f"torch {torch.__version__} transformers {transformers.__version__} peft {peft.__version__}",
        "dtype": args.dtype, "device": args.device, "adapter_dtypes": adapter_dtypes,
        "attn_implementation": getattr(model.config, "_attn_implementation", None),
        "micro_batch": mb, "accum": args.accum, "lr": args.lr, "warmup": args.warmup,
        "total_steps": total, "steps": log,
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {args.out}")


def main():
    args = parse_args()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, peft {peft.__version__}")
    if args.make_init:
        make_init(args)
    elif args.init_adapter:
        train(args)
    else:
        raise SystemExit("give --make-init DIR or --init-adapter DIR")


if __name__ == "__main__":
    main()
