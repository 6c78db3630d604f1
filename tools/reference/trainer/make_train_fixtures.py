"""PyTorch + PEFT reference run of the post's training loop on the tiny model, for the
train_ddp parity test (tests/train_parity.rs).

    /opt/refenv/bin/python tools/reference/trainer/make_train_fixtures.py

One rank, no shuffle, dropout 0, fp32 on CPU: assets/tiny (the multimodal layout), PEFT on the
post's regex with r = 4, alpha = 8 and init_lora_weights=False (B non-zero), the first 12 rows of
assets/sample/chat.jsonl tokenized as the post's ChatJsonl does (chat template, no extra special
tokens, max_len 128), MICRO_BATCH 2, ACCUM_STEPS 2 -> K = 3 optimizer steps, AdamW(lr 1e-3,
weight_decay 0), get_cosine_schedule_with_warmup(1, 3), clip_grad_norm_(1.0). Writes
tools/reference/trainer/fixtures/train/:
  data.jsonl        the 12 rows pre-tokenized ({"input_ids": [...]}), so tokenization is not
                    part of this comparison (the data crate has its own fixtures)
  init_adapter/     the initial PEFT adapter (train_ddp --init-adapter)
  final_adapter/    the adapter after K steps
  steps.json        per step: loss (sum of out.loss / ACCUM, as the post logs it), pre-clip grad
                    norm, learning rate used
"""
import json
import os
import shutil

import peft
import torch
import transformers
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForImageTextToText, AutoTokenizer, get_cosine_schedule_with_warmup

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
OUT = os.path.join(HERE, "fixtures", "train")
MODEL = os.path.join(ROOT, "assets", "tiny")
POST_REGEX = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"
N_ROWS, MAX_LEN, MICRO_BATCH, ACCUM_STEPS, LR, WARMUP, MAX_GRAD_NORM = 12, 128, 2, 2, 1e-3, 1, 1.0


def pad_collate(rows, pad_id):
    longest = max(len(x) for x in rows)
    input_ids = torch.full((len(rows), longest), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), longest), dtype=torch.long)
    for i, ids in enumerate(rows):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        attention_mask[i, : len(ids)] = 1
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def main():
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, peft {peft.__version__}")
    torch.manual_seed(0)
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)

    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    with open(os.path.join(ROOT, "assets", "sample", "chat.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()][:N_ROWS]
    ids = []
    for row in rows:
        text = tokenizer.apply_chat_template(row["messages"], tokenize=False)
        ids.append(tokenizer(text, add_special_tokens=False, truncation=True, max_length=MAX_LEN)["input_ids"])
    with open(os.path.join(OUT, "data.jsonl"), "w") as f:
        for x in ids:
            f.write(json.dumps({"input_ids": x}) + "\n")

    model = AutoModelForImageTextToText.from_pretrained(MODEL, dtype=torch.float32)
    cfg = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=POST_REGEX,
                     init_lora_weights=False, task_type="CAUSAL_LM")
    model = get_peft_model(model, cfg)
    model.peft_config["default"].base_model_name_or_path = "assets/tiny"
    model.save_pretrained(os.path.join(OUT, "init_adapter"))
    os.remove(os.path.join(OUT, "init_adapter", "README.md"))
    model.train()

    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=LR, weight_decay=0.0)
    batches = [pad_collate(ids[i : i + MICRO_BATCH], tokenizer.pad_token_id) for i in range(0, N_ROWS, MICRO_BATCH)]
    steps = len(batches) // ACCUM_STEPS
    scheduler = get_cosine_schedule_with_warmup(optimizer, WARMUP, steps)
    it = iter(batches)
    log = []
    for step in range(steps):
        loss_sum = 0.0
        for _ in range(ACCUM_STEPS):
            out = model(**next(it), use_cache=False)
            loss = out.loss / ACCUM_STEPS
            loss.backward()
            loss_sum += loss.item()
        lr = scheduler.get_last_lr()[0]
        grad_norm = torch.nn.utils.clip_grad_norm_(trainable, MAX_GRAD_NORM)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        log.append({"step": step + 1, "loss": loss_sum, "grad_norm": grad_norm.item(), "lr": lr})
        print(f"step={step + 1} loss={loss_sum:.6f} grad_norm={grad_norm.item():.6f} lr={lr:.2e}")

    model.save_pretrained(os.path.join(OUT, "final_adapter"))
    os.remove(os.path.join(OUT, "final_adapter", "README.md"))
    with open(os.path.join(OUT, "steps.json"), "w") as f:
        json.dump({"micro_batch": MICRO_BATCH, "accum": ACCUM_STEPS, "lr": LR, "warmup": WARMUP,
                   "max_grad_norm": MAX_GRAD_NORM, "max_len": MAX_LEN, "steps": log}, f, indent=2)


if __name__ == "__main__":
    main()
