#!/usr/bin/env python3
"""Golden fixtures for the g4ft-gemma4 parity tests, and the tiny demo model in assets/tiny/.

Builds tiny random Gemma 4 models with transformers (one per code path), perturbs every norm weight,
router scale and layer_scalar away from their init values (init values hide "+1" and scalar bugs),
saves them with save_pretrained (real multimodal layout: text tensors under model.language_model.,
plus a tiny vision tower the Rust loader must ignore), and writes golden.safetensors:

  input_ids, attention_mask, labels   (2, 12) right-padded batch, labels -100 on padding and a prompt
  logits                              fp32 logits (2, 12, V)
  loss                                fp32 loss (transformers mean)
  loss_bf16, loss_bf16_eager          the saved model loaded in bf16, HF sdpa (default) / eager attention
  grad.<module path>                  fp32 d(loss)/d(weight) of a few projection weights made trainable
  packed_input_ids, packed_position_ids, packed_logits   (variant a only) packed rows, no attention mask

Variants (sliding_window 4 < S = 12 everywhere):
  a_unified_keqv   gemma4_unified, attention_k_eq_v, 1 global kv head
  b_ple_kvshare    gemma4, per-layer embeddings, 3 KV-shared layers, double-wide MLP
  c_moe            gemma4, MoE (4 experts, top-2) + dense MLP, attention_k_eq_v, 2 global kv heads
  d_dense_keqv     gemma4, attention_k_eq_v with 2 global kv heads, final softcap 2.0 (tanh regime)

Run: /opt/refenv/bin/python tools/reference/gemma4/make_fixtures.py   (from the repository root;
CPU, a few seconds). Writes tests/golden/gemma4-<variant>/ and assets/tiny/{config.json,model.safetensors}.
"""
import json
import os
import shutil
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import (
    AutoModelForImageTextToText,
    Gemma4Config,
    Gemma4ForConditionalGeneration,
    Gemma4TextConfig,
    Gemma4UnifiedConfig,
    Gemma4UnifiedForConditionalGeneration,
    Gemma4UnifiedTextConfig,
)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
LAYER_TYPES = ["sliding_attention", "sliding_attention", "full_attention"] * 2

COMMON = dict(
    vocab_size=128,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    global_head_dim=16,
    sliding_window=4,
    final_logit_softcapping=30.0,
    layer_types=LAYER_TYPES,
    initializer_range=0.15,
)

TINY_VISION = dict(
    hidden_size=16,
    intermediate_size=16,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=2,
    head_dim=8,
    patch_size=4,
    position_embedding_size=16,
)


def build(variant):
    if variant == "a_unified_keqv":
        text = Gemma4UnifiedTextConfig(**COMMON, attention_k_eq_v=True, num_global_key_value_heads=1)
        cfg = Gemma4UnifiedConfig(text_config=text.to_dict(), vision_config=None, audio_config=None)
        model = Gemma4UnifiedForConditionalGeneration(cfg)
        grads = [
            "layers.0.self_attn.q_proj",
            "layers.1.self_attn.v_proj",
            "layers.2.self_attn.k_proj",  # k_eq_v: K and V both come from it
            "layers.5.mlp.down_proj",
        ]
    elif variant == "b_ple_kvshare":
        text = Gemma4TextConfig(
            **COMMON,
            hidden_size_per_layer_input=8,
            vocab_size_per_layer_input=128,
            num_kv_shared_layers=3,
            use_double_wide_mlp=True,
        )
        cfg = Gemma4Config(text_config=text.to_dict(), vision_config=TINY_VISION, audio_config=None)
        model = Gemma4ForConditionalGeneration(cfg)
        # Producers: 1 (sliding), 2 (full); consumers 3, 4 (sliding), 5 (full).
        grads = [
            "layers.1.self_attn.k_proj",
            "layers.1.self_attn.v_proj",
            "layers.2.self_attn.k_proj",
            "layers.4.self_attn.q_proj",
            "layers.5.mlp.up_proj",
        ]
    elif variant == "c_moe":
        text = Gemma4TextConfig(
            **COMMON,
            hidden_size_per_layer_input=0,
            attention_k_eq_v=True,
            num_global_key_value_heads=2,
            enable_moe_block=True,
            num_experts=4,
            top_k_experts=2,
            moe_intermediate_size=16,
        )
        cfg = Gemma4Config(text_config=text.to_dict(), vision_config=None, audio_config=None)
        model = Gemma4ForConditionalGeneration(cfg)
        grads = ["layers.0.self_attn.q_proj", "layers.3.mlp.gate_proj", "layers.5.self_attn.o_proj"]
    elif variant == "d_dense_keqv":
        common = dict(COMMON, num_key_value_heads=4, final_logit_softcapping=2.0)
        text = Gemma4TextConfig(
            **common, hidden_size_per_layer_input=0, attention_k_eq_v=True, num_global_key_value_heads=2
        )
        cfg = Gemma4Config(text_config=text.to_dict(), vision_config=None, audio_config=None)
        model = Gemma4ForConditionalGeneration(cfg)
        grads = ["layers.2.self_attn.k_proj", "layers.3.self_attn.v_proj", "layers.4.mlp.down_proj"]
    else:
        raise ValueError(variant)
    return model, grads


def perturb(model, gen):
    """Norm weights, router scales and layer scalars away from 1 (as trained checkpoints are)."""
    with torch.no_grad():
        for name, p in list(model.named_parameters()) + list(model.named_buffers()):
            if "language_model" not in name:
                continue
            if name.endswith("norm.weight") or name.endswith("layer_scalar") or ".router." in name and "proj" not in name:
                p.copy_(torch.empty_like(p).uniform_(0.5, 1.5, generator=gen))


def batch(vocab, gen):
    b, s = 2, 12
    ids = torch.randint(3, vocab, (b, s), generator=gen)
    ids[:, 0] = 2  # <bos>
    mask = torch.ones(b, s, dtype=torch.long)
    mask[1, 9:] = 0  # right padding
    ids[1, 9:] = 0  # <pad>
    labels = ids.clone()
    labels[mask == 0] = -100
    labels[0, :3] = -100  # a masked prompt
    return ids, mask, labels


def make_variant(variant, seed):
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model, grad_names = build(variant)
    model.eval()
    perturb(model, gen)
    out_dir = os.path.join(ROOT, "tests", "golden", f"gemma4-{variant.replace('_', '-')}")
    shutil.rmtree(out_dir, ignore_errors=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    vocab = model.config.get_text_config().vocab_size
    ids, mask, labels = batch(vocab, gen)

    prefix = "model.language_model."
    params = dict(model.named_parameters())
    model.requires_grad_(False)
    tracked = {}
    for g in grad_names:
        p = params[prefix + g + ".weight"]
        p.requires_grad_(True)
        tracked[prefix + g] = p
    out = model(input_ids=ids, attention_mask=mask, labels=labels)
    out.loss.backward()
    golden = {
        "input_ids": ids,
        "attention_mask": mask,
        "labels": labels,
        "logits": out.logits.detach().float().contiguous(),
        "loss": out.loss.detach().reshape(1).float(),
    }
    for path, p in tracked.items():
        golden["grad." + path] = p.grad.detach().clone().contiguous()
    model.requires_grad_(False)

    if variant == "a_unified_keqv":
        # Packed rows: positions restart, no attention mask -> block-diagonal masks.
        pids = torch.randint(3, vocab, (1, 12), generator=gen)
        pos = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6]])
        with torch.no_grad():
            packed = model(input_ids=pids, position_ids=pos).logits
        golden["packed_input_ids"] = pids
        golden["packed_position_ids"] = pos
        golden["packed_logits"] = packed.float().contiguous()

    # bf16 as users load it (from_pretrained in bf16: RoPE buffers stay fp32), HF default attention
    # (sdpa) for the acceptance bar, and eager (same rounding points as our composite attention).
    for key, impl in (("loss_bf16", "sdpa"), ("loss_bf16_eager", "eager")):
        bf = AutoModelForImageTextToText.from_pretrained(out_dir, dtype=torch.bfloat16, attn_implementation=impl)
        with torch.no_grad():
            golden[key] = bf(input_ids=ids, attention_mask=mask, labels=labels).loss.float().reshape(1)
    save_file({k: v.contiguous() for k, v in golden.items()}, os.path.join(out_dir, "golden.safetensors"))
    print(
        f"{variant}: loss {golden['loss'].item():.6f} bf16 sdpa {golden['loss_bf16'].item():.6f} "
        f"eager {golden['loss_bf16_eager'].item():.6f} "
        f"max|logit| {golden['logits'].abs().max().item():.3f} -> {out_dir}"
    )


def make_tiny(seed):
    """assets/tiny: vocab 512, hidden 64, 4 layers (3 sliding + 1 full, k_eq_v), random, seeded."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    text = Gemma4UnifiedTextConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        global_head_dim=32,
        num_global_key_value_heads=1,
        attention_k_eq_v=True,
        sliding_window=16,
        final_logit_softcapping=30.0,
        layer_types=["sliding_attention"] * 3 + ["full_attention"],
        max_position_embeddings=4096,
        initializer_range=0.05,
    )
    cfg = Gemma4UnifiedConfig(text_config=text.to_dict(), vision_config=None, audio_config=None)
    model = Gemma4UnifiedForConditionalGeneration(cfg)
    perturb(model, gen)
    out_dir = os.path.join(ROOT, "assets", "tiny")
    tmp = out_dir + ".tmp-model"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    os.makedirs(out_dir, exist_ok=True)
    for f in ("config.json", "model.safetensors"):
        shutil.move(os.path.join(tmp, f), os.path.join(out_dir, f))
    shutil.rmtree(tmp)
    print(f"tiny: {sum(p.numel() for p in model.parameters())} parameters -> {out_dir}")


def main():
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, transformers {transformers.__version__}")
    torch.set_num_threads(2)
    for i, v in enumerate(["a_unified_keqv", "b_ple_kvshare", "c_moe", "d_dense_keqv"]):
        make_variant(v, seed=1000 + i)
    make_tiny(seed=7)


if __name__ == "__main__":
    main()
