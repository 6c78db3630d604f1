"""Golden fixtures for the g4ft-lora crate, from PEFT (run with /opt/refenv/bin/python).

    /opt/refenv/bin/python tools/reference/lora/make_fixtures.py

Writes tools/reference/lora/fixtures/:
  base/model.safetensors, base/config.json     the toy base model (toy.py), fp32
  <case>/adapter/                               PeftModel.save_pretrained (non-zero B: init_lora_weights=False;
                                                no task_type: the toy is not a transformers model)
  <case>/golden.safetensors                     x, y, loss, grad.<peft key> for every lora_A/B,
                                                merged.<path>.weight (PEFT merge_and_unload) for adapted modules
  <case>/targets.json                           PEFT's targeted_module_names and print_trainable_parameters
Cases: `list` (suffix list, alpha/r) and `regex_rslora` (regex, rsLoRA, rank_pattern, alpha_pattern).
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import toy  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")

CASES = {
    "list": dict(
        r=4,
        lora_alpha=8,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    ),
    "regex_rslora": dict(
        r=2,
        lora_alpha=3,
        use_rslora=True,
        target_modules=r"model\.layers\.\d+\.(self_attn\.(q|v)_proj|mlp\.down_proj)",
        rank_pattern={"down_proj": 3},
        alpha_pattern={r"layers\.0\.self_attn\.q_proj": 5},
    ),
}


def save_base():
    base = toy.build_base()
    d = os.path.join(OUT, "base")
    os.makedirs(d, exist_ok=True)
    safetensors.torch.save_file(
        {k: v.contiguous() for k, v in base.state_dict().items()},
        os.path.join(d, "model.safetensors"),
        metadata={"format": "pt"},
    )
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"model_type": "g4ft_lora_toy", "hidden_size": toy.H}, f, indent=2)


def make_case(name, kwargs):
    base = toy.build_base()
    torch.manual_seed(123)  # adapter init
    cfg = LoraConfig(lora_dropout=0.0, init_lora_weights=False, **kwargs)
    model = get_peft_model(base, cfg)
    d = os.path.join(OUT, name)
    shutil.rmtree(d, ignore_errors=True)
    model.save_pretrained(os.path.join(d, "adapter"))
    os.remove(os.path.join(d, "adapter", "README.md"))

    x = toy.make_input()
    y = model(x)
    loss = toy.loss_fn(y)
    loss.backward()
    golden = {"x": x, "y": y.detach(), "loss": loss.detach().reshape(1)}
    for pname, p in model.named_parameters():
        if p.requires_grad:
            key = pname.replace(".default", "")
            golden["grad." + key] = p.grad.detach().clone()
    adapted = list(model.targeted_module_names)
    trainable, total = model.get_nb_trainable_parameters()
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        model.print_trainable_parameters()
    merged = model.merge_and_unload()
    sd = merged.state_dict()
    for path in adapted:
        golden[f"merged.{path}.weight"] = sd[f"{path}.weight"].detach().clone()
    safetensors.torch.save_file(
        {k: v.contiguous() for k, v in golden.items()}, os.path.join(d, "golden.safetensors")
    )
    with open(os.path.join(d, "targets.json"), "w") as f:
        json.dump(
            {
                "targeted_module_names": sorted(adapted),
                "trainable": trainable,
                "all": total,
                "print_trainable_parameters": printed.getvalue().strip(),
            },
            f,
            indent=2,
        )
    print(f"{name}: {len(adapted)} modules, trainable {trainable} / {total}, loss {loss.item():.6f}")


def main():
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, peft {peft.__version__}")
    save_base()
    for name, kwargs in CASES.items():
        make_case(name, kwargs)


if __name__ == "__main__":
    main()
