#!/usr/bin/env python3
"""Greedy-generation parity fixtures: transformers 5.23 `generate` (+ PEFT 0.21) on the tiny Gemma 4
models of tests/golden/gemma4-<variant>/ (made by tools/reference/gemma4/make_fixtures.py), fp32, CPU.

    /opt/refenv/bin/python tools/reference/generate/make_fixtures.py

For every variant (unified + k_eq_v; PLE + KV sharing + double-wide MLP; MoE; dense k_eq_v with a tanh-regime
softcap) and every case below, greedy decoding of 24 new tokens with EOS ignored, once on the base model and
once with the PEFT adapter of tools/reference/lora/fixtures/gemma4-<variant>/adapter (non-zero B, all seven
projections). Every prompt is longer than the sliding window (4). Cases:
  single   one prompt of 10 tokens (no padding)
  batch    three prompts of 10, 6 and 5 tokens, left padded with <pad> (transformers' positions: each row
           starts at 0)
Writes tools/reference/generate/fixtures/gemma4-<variant>.safetensors with, per case and model
(<case>.<base|adapter>.*):
  input_ids, attention_mask   (b, t) the left-padded prompt batch (shared by base and adapter)
  tokens                      (b, 24) the generated token ids
  logits                      (24, b, V) fp32 logits of every step (`output_logits`: the model output with
                              its final softcap, before any logits processor)
The script checks that generation ran the full 24 steps and that each token is the argmax of its logits.
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
VARIANTS = ["a-unified-keqv", "b-ple-kvshare", "c-moe", "d-dense-keqv"]
CASES = {"single": [10], "batch": [10, 6, 5]}
NEW_TOKENS = 24
PAD, BOS = 0, 2


def prompts(lengths, vocab, gen):
    """Left-padded random prompts starting with <bos>; ids >= 3 (no pad/eos/bos inside)."""
    t = max(lengths)
    ids = torch.full((len(lengths), t), PAD, dtype=torch.long)
    mask = torch.zeros((len(lengths), t), dtype=torch.long)
    for r, n in enumerate(lengths):
        row = torch.randint(3, vocab, (n,), generator=gen)
        row[0] = BOS
        ids[r, t - n :] = row
        mask[r, t - n :] = 1
    return ids, mask


def run(model, ids, mask):
    # EOS ignored: without an EOS id in the model's generation config nothing stops early (passing
    # eos_token_id=None to generate() falls back to the model's value).
    inner = model.get_base_model() if isinstance(model, PeftModel) else model
    inner.generation_config.eos_token_id = None
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=False,
            max_new_tokens=NEW_TOKENS,
            pad_token_id=PAD,
            output_logits=True,
            return_dict_in_generate=True,
        )
    tokens = out.sequences[:, ids.shape[1] :]
    logits = torch.stack(out.logits).float()  # (steps, b, V)
    assert tokens.shape[1] == NEW_TOKENS, f"stopped early: {tokens.shape}"
    assert torch.equal(logits.argmax(-1).T, tokens), "greedy token != argmax of its logits"
    return tokens, logits


def make(variant, seed):
    base_dir = os.path.join(ROOT, "tests", "golden", f"gemma4-{variant}")
    adapter_dir = os.path.join(ROOT, "tools", "reference", "lora", "fixtures", f"gemma4-{variant}", "adapter")
    gen = torch.Generator().manual_seed(seed)

    def load_base():
        return AutoModelForImageTextToText.from_pretrained(base_dir, dtype=torch.float32).eval()

    models = {"base": load_base(), "adapter": PeftModel.from_pretrained(load_base(), adapter_dir).eval()}
    vocab = models["base"].config.get_text_config().vocab_size
    window = models["base"].config.get_text_config().sliding_window
    out = {}
    for case, lengths in CASES.items():
        assert min(lengths) > window, "every prompt must be longer than the sliding window"
        ids, mask = prompts(lengths, vocab, gen)
        out[f"{case}.input_ids"] = ids
        out[f"{case}.attention_mask"] = mask
        for name, model in models.items():
            tokens, logits = run(model, ids, mask)
            out[f"{case}.{name}.tokens"] = tokens
            out[f"{case}.{name}.logits"] = logits
        differ = (out[f"{case}.base.tokens"] != out[f"{case}.adapter.tokens"]).sum().item()
        print(f"{variant} {case}: b={ids.shape[0]} t={ids.shape[1]}; adapter changes {differ} of {tokens.numel()} tokens")
    path = os.path.join(HERE, "fixtures", f"gemma4-{variant}.safetensors")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    safetensors.torch.save_file({k: v.contiguous() for k, v in out.items()}, path)


def main():
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, peft {peft.__version__}")
    torch.set_num_threads(2)
    transformers.logging.set_verbosity_error()
    for i, v in enumerate(VARIANTS):
        make(v, seed=3000 + i)


if __name__ == "__main__":
    sys.exit(main())
