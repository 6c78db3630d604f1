#!/usr/bin/env python3
"""transformers' `generate` timed like examples/bench_generate.rs, for the same-call comparison on the GPU.

    python3 tools/reference/generate/bench_hf.py --config crates/gemma4/tests/configs/gemma-4-12B-it.json \
        --dtype bf16 --prompt-len 512 --new-tokens 128 --batch-sizes 1,8

Builds the model from the config with random weights on the GPU (--device cpu for a smoke run) (default sdpa attention, DynamicCache), random
prompt ids in [3, vocab), greedy, EOS disabled. Per batch size: a 4-token warm-up, then --iters generations;
a logits processor synchronises the device and takes the time at every step, so prefill = call -> first step
(prefill forward + first token) and decode = first -> last step over new_tokens - 1 steps, as the Rust
benchmark. Cache memory: the DynamicCache after the last generation (prompt + new - 1 positions), and bytes per
token of its full-attention layers. Prints the same Markdown table.
"""
import argparse
import json
import statistics
import time

import torch
import transformers
from transformers import AutoModelForImageTextToText, LogitsProcessor, LogitsProcessorList
from transformers.models.auto.configuration_auto import CONFIG_MAPPING


class StepClock(LogitsProcessor):
    def __init__(self):
        self.times = []

    def __call__(self, input_ids, scores):
        if scores.is_cuda:
            torch.cuda.synchronize()
        self.times.append(time.perf_counter())
        return scores


def cache_stats(cache, layer_types):
    total, per_token = 0, 0
    for layer, kind in zip(cache.layers, layer_types):
        if getattr(layer, "keys", None) is None or layer.keys.numel() == 0:
            continue
        total += layer.keys.numel() * layer.keys.element_size() + layer.values.numel() * layer.values.element_size()
        if kind == "full_attention":
            _, kv, _, d = layer.keys.shape
            per_token += 2 * kv * d * layer.keys.element_size()
    return total, per_token


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f32"])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--batch-sizes", default="1,8")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    with open(args.config) as f:
        raw = json.load(f)
    cfg = CONFIG_MAPPING[raw["model_type"]].from_dict(raw)
    torch.manual_seed(args.seed)
    with torch.device(args.device):
        model = AutoModelForImageTextToText.from_config(cfg, dtype=dtype).eval()
    model.generation_config.eos_token_id = None
    text = cfg.get_text_config()
    print(f"transformers {transformers.__version__}, torch {torch.__version__}: {text.num_hidden_layers} layers, "
          f"hidden {text.hidden_size}, vocab {text.vocab_size}, sliding window {text.sliding_window}; {dtype}, "
          f"attention {model.config._attn_implementation}")
    print("| batch | prompt | new | prefill ms | prefill tok/s | decode ms/step | decode tok/s | cache MiB | cache bytes/token |")
    print("|---|---|---|---|---|---|---|---|---|")
    gen = torch.Generator().manual_seed(args.seed)
    for b in [int(x) for x in args.batch_sizes.split(",")]:
        ids = torch.randint(3, text.vocab_size, (b, args.prompt_len), generator=gen).to(args.device)
        mask = torch.ones_like(ids)

        def run(n, clock=None):
            with torch.no_grad():
                return model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=n,
                                      min_new_tokens=0, pad_token_id=text.pad_token_id, return_dict_in_generate=True,
                                      logits_processor=LogitsProcessorList([clock] if clock else []))

        run(4)
        prefill, decode = [], []
        for _ in range(args.iters):
            clock = StepClock()
            if args.device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            out = run(args.new_tokens, clock)
            assert len(clock.times) == args.new_tokens, len(clock.times)
            prefill.append(clock.times[0] - start)
            decode.append((clock.times[-1] - clock.times[0]) / (args.new_tokens - 1))
        total, per_token = cache_stats(out.past_key_values, text.layer_types)
        p, d = statistics.median(prefill), statistics.median(decode)
        print(f"| {b} | {args.prompt_len} | {args.new_tokens} | {p * 1e3:.1f} | {b * args.prompt_len / p:.0f} | "
              f"{d * 1e3:.2f} | {b / d:.1f} | {total / 2**20:.1f} | {per_token} |")


if __name__ == "__main__":
    main()
