"""PEFT side of the Rust → PEFT round trip (run with /opt/refenv/bin/python).

    cargo test -p g4ft-lora --test rust_adapter_export
    /opt/refenv/bin/python tools/reference/lora/check_rust_adapter.py target/tmp/g4ft_lora/rust_adapter

For every sub-directory (an adapter saved by g4ft_lora::save_adapter plus rust_output.safetensors
holding x and the Rust output y), loads the adapter into the toy base model (fixtures/base) twice —
PeftModel.from_pretrained, and get_peft_model + set_peft_model_state_dict — and compares PEFT's
output with y. Prints PASS/FAIL per case and exits non-zero on any failure.
"""
import os
import sys

import peft
import safetensors.torch
import torch
from peft import PeftConfig, PeftModel, get_peft_model, set_peft_model_state_dict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import toy  # noqa: E402

BASE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "base", "model.safetensors")
RTOL = 1e-5


def base_model():
    m = toy.Toy()
    m.load_state_dict(safetensors.torch.load_file(BASE))
    return m.eval()


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def check(case_dir):
    out = safetensors.torch.load_file(os.path.join(case_dir, "rust_output.safetensors"))
    x, y = out["x"], out["y"]
    with torch.no_grad():
        base_y = base_model()(x)
        m1 = PeftModel.from_pretrained(base_model(), case_dir).eval()
        y1 = m1(x)
        cfg = PeftConfig.from_pretrained(case_dir)
        m2 = get_peft_model(base_model(), cfg).eval()
        result = set_peft_model_state_dict(
            m2, safetensors.torch.load_file(os.path.join(case_dir, "adapter_model.safetensors"))
        )
        y2 = m2(x)
    missing = [k for k in result.missing_keys if "lora_" in k]
    ok = True
    msgs = []
    for label, got in [("from_pretrained", y1), ("set_peft_model_state_dict", y2)]:
        r = rel(got, y)
        good = r <= RTOL
        ok &= good
        msgs.append(f"{label}: rel {r:.2e}")
    if missing or result.unexpected_keys:
        ok = False
        msgs.append(f"missing lora keys {missing}, unexpected {result.unexpected_keys}")
    changed = rel(y, base_y) > 1e-4
    ok &= changed
    msgs.append(f"adapter changes output: {changed}; targeted {sorted(m1.targeted_module_names)}")
    print(("PASS " if ok else "FAIL ") + os.path.basename(case_dir) + ": " + "; ".join(msgs))
    return ok


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "target/tmp/g4ft_lora/rust_adapter"
    print(f"torch {torch.__version__}, peft {peft.__version__}")
    cases = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    if not cases:
        print(f"FAIL: no adapters under {root}")
        sys.exit(1)
    results = [check(os.path.join(root, c)) for c in cases]
    print("PASS" if all(results) else "FAIL")
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
