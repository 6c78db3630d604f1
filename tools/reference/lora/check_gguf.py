"""llama.cpp side of the GGUF adapter export (run with /opt/refenv/bin/python; needs `pip install gguf`).

    cargo test --test export_gguf
    /opt/refenv/bin/python tools/reference/lora/check_gguf.py target/tmp/g4ft_gguf

For every case directory written by tests/export_gguf.rs (adapter/ + adapter.gguf), reads the GGUF with the
`gguf` package (llama.cpp's gguf-py) and checks it against what llama.cpp's converter and loader expect:
  - metadata general.type = adapter, general.architecture = gemma4, adapter.type = lora, adapter.lora.alpha =
    the adapter's lora_alpha;
  - tensor names: for every module PEFT adapts (PeftModel.from_pretrained on the tiny base model), the name
    llama.cpp's converter gives it (convert_lora_to_gguf.py: "model.language_model." -> "model.", then
    gguf.get_tensor_name_map(MODEL_ARCH.GEMMA4) + ".weight"), suffixed .lora_a / .lora_b, and nothing else;
  - ggml shapes: lora_a ne = [in, r], lora_b ne = [r, out] (the loader's shape checks against the base tensor);
  - values: lora_a = A, and alpha / r * lora_b = PEFT's scaling * B (llama.cpp's scale is alpha / rank).
Prints PASS/FAIL per case and exits non-zero on any failure.
"""
import importlib.metadata
import json
import os
import sys

import gguf
import numpy as np
import peft
import torch
import transformers
from peft import PeftModel
from peft.tuners.lora import LoraLayer
from transformers import AutoModelForImageTextToText

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))


def tensor_values(t):
    """A ReaderTensor as float32 in numpy (row-major) shape, i.e. reversed ggml ne."""
    shape = [int(x) for x in reversed(list(t.shape))]
    data = np.asarray(t.data)
    if t.tensor_type == gguf.GGMLQuantizationType.BF16:
        data = (data.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return data.astype(np.float32).reshape(shape)


def check_case(case_dir):
    adapter_dir = os.path.join(case_dir, "adapter")
    with open(os.path.join(adapter_dir, "adapter_config.json")) as f:
        cfg = json.load(f)
    base = os.path.join(ROOT, cfg["base_model_name_or_path"])
    model = AutoModelForImageTextToText.from_pretrained(base, dtype=torch.float32)
    model = PeftModel.from_pretrained(model, adapter_dir).eval()
    n_layers = model.config.get_text_config().num_hidden_layers
    name_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA4, n_layers)
    reader = gguf.GGUFReader(os.path.join(case_dir, "adapter.gguf"))
    problems = []

    def field(key):
        return reader.fields[key].contents()

    for key, want in [("general.type", "adapter"), ("general.architecture", "gemma4"), ("adapter.type", "lora")]:
        if field(key) != want:
            problems.append(f"{key} = {field(key)!r}, want {want!r}")
    alpha = float(field("adapter.lora.alpha"))
    if alpha != float(cfg["lora_alpha"]):
        problems.append(f"adapter.lora.alpha {alpha} != lora_alpha {cfg['lora_alpha']}")
    tensors = {t.name: t for t in reader.tensors}
    expected = set()
    worst = 0.0
    for name, module in model.named_modules():
        if not isinstance(module, LoraLayer) or "default" not in module.lora_A:
            continue
        hf = name.replace("base_model.model.", "", 1).replace("model.language_model.", "model.", 1)
        base_name = name_map.get_name(hf)
        if base_name is None:
            problems.append(f"{name}: llama.cpp has no GEMMA4 tensor for {hf}")
            continue
        a = module.lora_A["default"].weight.detach().numpy()
        b = module.lora_B["default"].weight.detach().numpy()
        scaling, r = module.scaling["default"], module.r["default"]
        for suffix, want_ne in [("lora_a", [a.shape[1], r]), ("lora_b", [r, b.shape[0]])]:
            key = f"{base_name}.weight.{suffix}"
            expected.add(key)
            if key not in tensors:
                problems.append(f"missing {key}")
                continue
            ne = [int(x) for x in tensors[key].shape]
            if ne != want_ne:
                problems.append(f"{key}: ne {ne}, want {want_ne}")
        if any(f"{base_name}.weight.{s}" not in tensors for s in ("lora_a", "lora_b")):
            continue
        ga = tensor_values(tensors[f"{base_name}.weight.lora_a"])
        gb = tensor_values(tensors[f"{base_name}.weight.lora_b"])
        llama_scale = alpha / r if alpha else 1.0
        rel_a = np.abs(ga - a).max() / np.abs(a).max()
        rel_b = np.abs(llama_scale * gb - scaling * b).max() / np.abs(scaling * b).max()
        worst = max(worst, rel_a, rel_b)
    extra = set(tensors) - expected
    if extra:
        problems.append(f"unexpected tensors {sorted(extra)[:4]}")
    types = {gguf.GGMLQuantizationType(t.tensor_type).name for t in reader.tensors}
    tol = 1e-6 if types == {"F32"} else 8e-3
    if worst > tol:
        problems.append(f"values: max rel diff {worst:.2e} > {tol}")
    ok = not problems
    label = os.path.basename(case_dir)
    print(("PASS " if ok else "FAIL ") + f"{label}: {len(tensors)} tensors {sorted(types)}, alpha {alpha}, "
          f"max rel diff {worst:.2e}" + ("" if ok else "; " + "; ".join(problems)))
    return ok


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target", "tmp", "g4ft_gguf")
    print(f"gguf {importlib.metadata.version('gguf')}, torch {torch.__version__}, transformers {transformers.__version__}, peft {peft.__version__}")
    transformers.logging.set_verbosity_error()
    cases = sorted(d for d in os.listdir(root) if os.path.isfile(os.path.join(root, d, "adapter.gguf"))) if os.path.isdir(root) else []
    if not cases:
        print(f"FAIL: no case under {root}")
        sys.exit(1)
    results = [check_case(os.path.join(root, c)) for c in cases]
    print("PASS" if all(results) else "FAIL")
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
