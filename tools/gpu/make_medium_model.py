"""A medium random-weight Gemma-4-shaped model for the GPU training check of issue 6.

Builds Gemma4UnifiedForConditionalGeneration (transformers >= 5.23) with hidden 1024, 12 layers
(5 sliding : 1 full, the last full, attention_k_eq_v with 1 global kv head, head_dim 128 / 512-style
global head_dim 256), vocab 512 so the tiny tokenizer and the bundled sample data of assets/tiny fit,
random init (seeded), bf16, saved with save_pretrained (real layout), plus assets/tiny's tokenizer and
chat template. Too large to commit (~0.4 GB); made on the GPU machine, whose python has transformers:

    python3 tools/gpu/make_medium_model.py /tmp/medium
"""
import os
import shutil
import sys

import torch
import transformers
from transformers import Gemma4UnifiedConfig, Gemma4UnifiedForConditionalGeneration, Gemma4UnifiedTextConfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(out_dir):
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    torch.manual_seed(1234)
    layers = 12
    text = Gemma4UnifiedTextConfig(
        vocab_size=512,
        hidden_size=1024,
        intermediate_size=4096,
        num_hidden_layers=layers,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=128,
        global_head_dim=256,
        num_global_key_value_heads=1,
        attention_k_eq_v=True,
        sliding_window=128,
        final_logit_softcapping=30.0,
        layer_types=[("full_attention" if (i + 1) % 6 == 0 else "sliding_attention") for i in range(layers)],
        max_position_embeddings=8192,
    )
    cfg = Gemma4UnifiedConfig(text_config=text.to_dict(), vision_config=None, audio_config=None)
    model = Gemma4UnifiedForConditionalGeneration(cfg).to(torch.bfloat16)
    model.save_pretrained(out_dir, safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"):
        shutil.copy(os.path.join(ROOT, "assets", "tiny", f), os.path.join(out_dir, f))
    n = sum(p.numel() for p in model.parameters())
    print(f"medium: {n:,} parameters -> {out_dir}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/medium")
