"""Loads an adapter that train_ddp saved into PEFT on the base model and checks that PEFT's mean
token loss over pre-tokenized rows equals the one g4ft's `score` computed for the same adapter.

    /opt/refenv/bin/python tools/reference/trainer/check_adapter_loss.py BASE ADAPTER DATA LOSS

BASE: model directory; ADAPTER: a checkpoint directory (adapter_config.json +
adapter_model.safetensors); DATA: {"input_ids": [...], "labels": [...]?} per line; LOSS: g4ft's
value (Σ NLL / label tokens, shifted as transformers does). tests/first_hour.rs runs it when
/opt/refenv has torch, transformers and peft. Exits non-zero beyond 1e-4 relative.
"""
import json
import sys

import torch
from peft import PeftModel
from transformers import AutoModelForImageTextToText


def main(base, adapter, data, want):
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_pretrained(base, dtype=torch.float32)
    model = PeftModel.from_pretrained(model, adapter).eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for line in open(data):
            row = json.loads(line)
            ids = torch.tensor([row["input_ids"]])
            labels = torch.tensor([row.get("labels", row["input_ids"])])
            n = int((labels[0, 1:] != -100).sum())
            if n == 0:
                continue
            out = model(input_ids=ids, labels=labels)
            total += float(out.loss) * n
            count += n
    got = total / count
    rel = abs(got - want) / abs(want)
    print(f"{'PASS' if rel < 1e-4 else 'FAIL'} PEFT loss {got:.8f} vs g4ft {want:.8f} (rel {rel:.2e}, {count} tokens)")
    sys.exit(0 if rel < 1e-4 else 1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]))
