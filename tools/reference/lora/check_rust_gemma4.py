"""PEFT / transformers side of the model-level round trips (run with /opt/refenv/bin/python).

    cargo test --test lora_gemma4
    /opt/refenv/bin/python tools/reference/lora/check_rust_gemma4.py target/tmp/g4ft_lora/gemma4

For every variant directory written by tests/lora_gemma4.rs:
  rust_adapter/   adapter saved by g4ft_lora::save_adapter (post regex, rsLoRA, rank_pattern, random B)
                  + rust_logits.safetensors: loaded with PeftModel.from_pretrained on the tiny base
                  model (tests/golden/gemma4-<v>), PEFT's logits must equal Rust's;
  merged/         checkpoint written by examples/merge.rs (g4ft_lora::merge_adapter_dir) from the PEFT fixture adapter:
                  loaded with AutoModelForImageTextToText.from_pretrained, logits must equal PEFT's
                  adapted logits (fixtures/gemma4-<v>/golden.safetensors).
Prints PASS/FAIL per check and exits non-zero on any failure.
"""
import os
import sys

import peft
import safetensors.torch
import torch
import transformers
from peft import PeftModel
from transformers import AutoModelForImageTextToText

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
RTOL = 1e-4  # max|diff| / max|want|, the f32 bar


def rel(a, b):
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


def batch(variant):
    g = safetensors.torch.load_file(os.path.join(ROOT, "tests", "golden", f"gemma4-{variant}", "golden.safetensors"))
    return dict(input_ids=g["input_ids"], attention_mask=g["attention_mask"])


def base(variant):
    d = os.path.join(ROOT, "tests", "golden", f"gemma4-{variant}")
    return AutoModelForImageTextToText.from_pretrained(d, dtype=torch.float32).eval()


def report(ok, label, msg):
    print(("PASS " if ok else "FAIL ") + f"{label}: {msg}")
    return ok


def check_adapter(variant, d):
    want = safetensors.torch.load_file(os.path.join(d, "rust_logits.safetensors"))["logits"]
    with torch.no_grad():
        base_logits = base(variant)(**batch(variant)).logits
        m = PeftModel.from_pretrained(base(variant), d).eval()
        got = m(**batch(variant)).logits
    r, changed = rel(got, want), rel(want, base_logits)
    return report(
        r <= RTOL and changed > 1e-3,
        f"{variant} rust adapter -> PeftModel.from_pretrained",
        f"rel {r:.2e}; adapter changes logits by rel {changed:.2e}; {len(m.targeted_module_names)} modules",
    )


def check_merged(variant, d):
    want = safetensors.torch.load_file(os.path.join(HERE, "fixtures", f"gemma4-{variant}", "golden.safetensors"))["logits"]
    with torch.no_grad():
        got = AutoModelForImageTextToText.from_pretrained(d, dtype=torch.float32).eval()(**batch(variant)).logits
        base_logits = base(variant)(**batch(variant)).logits
    r = rel(got, want)
    return report(
        r <= RTOL and rel(base_logits, want) > 1e-3,
        f"{variant} rust merge -> transformers from_pretrained",
        f"rel {r:.2e} vs PEFT adapted logits (base differs by rel {rel(base_logits, want):.2e})",
    )


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target", "tmp", "g4ft_lora", "gemma4")
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, peft {peft.__version__}")
    transformers.logging.set_verbosity_error()
    variants = sorted(os.listdir(root)) if os.path.isdir(root) else []
    results = []
    for v in variants:
        if os.path.isdir(os.path.join(root, v, "rust_adapter")):
            results.append(check_adapter(v, os.path.join(root, v, "rust_adapter")))
        if os.path.isdir(os.path.join(root, v, "merged")):
            results.append(check_merged(v, os.path.join(root, v, "merged")))
    if not results:
        print(f"FAIL: nothing to check under {root}")
        sys.exit(1)
    print("PASS" if all(results) else "FAIL")
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
