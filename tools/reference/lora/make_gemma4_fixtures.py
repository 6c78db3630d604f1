"""Model-level LoRA fixtures: PEFT 0.21 adapters on the tiny Gemma 4 models of
tests/golden/gemma4-<variant>/ (made by tools/reference/gemma4/make_fixtures.py).

    /opt/refenv/bin/python tools/reference/lora/make_gemma4_fixtures.py

For each variant, loads the tiny model in fp32 (real multimodal layout), wraps it with PEFT
(task_type CAUSAL_LM, the blog post's regex on all seven projections, r = 4, alpha = 8,
init_lora_weights=False so B is non-zero, dropout 0), and writes
tools/reference/lora/fixtures/gemma4-<variant>/:
  adapter/              PeftModel.save_pretrained (no keys for v_proj on k_eq_v full layers, nor for
                        k_proj/v_proj on KV-shared layers: those modules do not exist)
  golden.safetensors    logits (2, 12, V) and loss (transformers mean) of the adapted model on the
                        gemma4 golden batch; grad.<peft key> for every lora_A/lora_B
  targets.json          PEFT's targeted module names and print_trainable_parameters line
"""
import contextlib
import io
import json
import os
import shutil
import sys

import peft
import safetensors.torch
import torch
import transformers
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForImageTextToText

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
VARIANTS = ["a-unified-keqv", "b-ple-kvshare", "c-moe", "d-dense-keqv"]
POST_REGEX = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"


def make(variant, seed):
    base_dir = os.path.join(ROOT, "tests", "golden", f"gemma4-{variant}")
    batch = safetensors.torch.load_file(os.path.join(base_dir, "golden.safetensors"))
    model = AutoModelForImageTextToText.from_pretrained(base_dir, dtype=torch.float32).eval()
    torch.manual_seed(seed)
    cfg = LoraConfig(
        r=4,
        lora_alpha=8,
        lora_dropout=0.0,
        target_modules=POST_REGEX,
        init_lora_weights=False,
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(model, cfg)
    # Relative path: the Rust tests resolve it against the repository root.
    model.peft_config["default"].base_model_name_or_path = f"tests/golden/gemma4-{variant}"
    out_dir = os.path.join(HERE, "fixtures", f"gemma4-{variant}")
    shutil.rmtree(out_dir, ignore_errors=True)
    model.save_pretrained(os.path.join(out_dir, "adapter"))
    os.remove(os.path.join(out_dir, "adapter", "README.md"))

    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"])
    out.loss.backward()
    golden = {"logits": out.logits.detach().float(), "loss": out.loss.detach().reshape(1).float()}
    for name, p in model.named_parameters():
        if p.requires_grad:
            golden["grad." + name.replace(".default", "")] = p.grad.detach().clone()
    safetensors.torch.save_file(
        {k: v.contiguous() for k, v in golden.items()}, os.path.join(out_dir, "golden.safetensors")
    )
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        model.print_trainable_parameters()
    targets = sorted(model.targeted_module_names)
    with open(os.path.join(out_dir, "targets.json"), "w") as f:
        json.dump(
            {"targeted_module_names": targets, "print_trainable_parameters": printed.getvalue().strip()},
            f,
            indent=2,
        )
    print(f"{variant}: {len(targets)} adapted modules, loss {out.loss.item():.6f}; {printed.getvalue().strip()}")


def main():
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, peft {peft.__version__}")
    torch.set_num_threads(2)
    for i, v in enumerate(VARIANTS):
        make(v, seed=2000 + i)


if __name__ == "__main__":
    main()
