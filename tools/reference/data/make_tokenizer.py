"""Builds the tiny Gemma-4-style tokenizers from the bundled sample conversations:
  assets/tiny/                              the tiny model's (tokenizer.json, tokenizer_config.json,
                                            special_tokens_map.json)
  tools/reference/data/gemma4-tools/        the same plus Gemma 4's tool tokens, for the tool-use
                                            fixtures (tokenizer.json, tokenizer_config.json)

    /opt/refenv/bin/python tools/reference/data/make_tokenizer.py

Layout (vocab 512, the tiny model's vocab_size):
  * Gemma 4's special-token ids: <pad>=0 <eos>=1 <bos>=2 <unk>=3 <mask>=4 <|think|>=98 <|channel>=100
    <channel|>=101 <|turn>=105 <turn|>=106; the tool tokenizer adds <|tool>=46 <tool|>=47
    <|tool_call>=48 <tool_call|>=49 <|tool_response>=50 <tool_response|>=51 <|"|>=52.
  * byte-fallback tokens <0x00>..<0xFF> at ids 256..511, so any UTF-8 text encodes;
  * the remaining 246 ids (5..255 less the specials) hold a BPE vocabulary trained on the sample data.
The pipeline is transformers' GemmaTokenizer's: Replace(' ' -> '\u2581') normalizer, Split(' ',
merged_with_previous) pre-tokenizer, BPE with byte_fallback and fuse_unk, ByteFallback decoder.
Deterministic: the trainer is fed the same text in the same order.
"""

import json
import os

import tokenizers
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
TINY = os.path.join(ROOT, "assets", "tiny")
SAMPLE = os.path.join(ROOT, "assets", "sample", "chat.jsonl")
VOCAB = 512
SPECIALS = {
    "<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<mask>": 4,
    "<|think|>": 98, "<|channel>": 100, "<channel|>": 101, "<|turn>": 105, "<turn|>": 106,
}
TOOL_SPECIALS = {
    **SPECIALS,
    "<|tool>": 46, "<tool|>": 47, "<|tool_call>": 48, "<tool_call|>": 49,
    "<|tool_response>": 50, "<tool_response|>": 51, '<|"|>': 52,
}
TOOLS_DIR = os.path.join(ROOT, "tools", "reference", "data", "gemma4-tools")
TOOL_WORDS = ["call:", "response:", "declaration:", "description:", "parameters:", "properties:",
              "type:", "required:", "value:", "STRING", "NUMBER", "OBJECT", "INTEGER", "BOOLEAN"]
BYTE_BASE = 256


def corpus(extra=()):
    """Message contents plus the role words and newlines the template writes (and `extra`)."""
    lines = []
    with open(SAMPLE, encoding="utf-8") as f:
        for line in f:
            for m in json.loads(line)["messages"]:
                lines.append(m["content"].strip())
    lines += ["user\n", "model\n", "system\n", "thought\n"] * 50
    return lines + list(extra) * 50


def train_ordinary(n_ordinary, extra):
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    trainer = trainers.BpeTrainer(vocab_size=n_ordinary, show_progress=False, special_tokens=[])
    tok.train_from_iterator(corpus(extra), trainer=trainer)
    return json.loads(tok.to_str())


def build(specials, out, extra=(), special_map=True):
    free_ids = [i for i in range(BYTE_BASE) if i not in specials.values()]
    trained = train_ordinary(len(free_ids), extra)
    ordinary = sorted(trained["model"]["vocab"].items(), key=lambda kv: kv[1])
    assert len(ordinary) <= len(free_ids), (len(ordinary), len(free_ids))
    vocab = dict(specials)
    for (token, _), new_id in zip(ordinary, free_ids):
        vocab[token] = new_id
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = BYTE_BASE + b
    ids = sorted(vocab.values())
    assert len(ids) == len(set(ids)) and max(ids) < VOCAB, "ids must be unique and < vocab"

    spec = trained
    spec["model"]["vocab"] = dict(sorted(vocab.items(), key=lambda kv: kv[1]))
    spec["added_tokens"] = [
        {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for t, i in sorted(specials.items(), key=lambda kv: kv[1])
    ]
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.save(os.path.join(out, "tokenizer.json"), pretty=True)

    config = {
        "tokenizer_class": "GemmaTokenizer",
        "bos_token": "<bos>", "eos_token": "<turn|>", "pad_token": "<pad>", "unk_token": "<unk>",
        "mask_token": "<mask>", "add_bos_token": False, "add_eos_token": False,
        "padding_side": "right", "model_max_length": 1000000000000000019884624838656,
        "added_tokens_decoder": {
            str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                     "single_word": False, "special": True}
            for t, i in sorted(specials.items(), key=lambda kv: kv[1])
        },
    }
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    if special_map:
        write_special_map(out)
    check = Tokenizer.from_file(os.path.join(out, "tokenizer.json"))
    for t, i in specials.items():
        assert check.token_to_id(t) == i, (t, check.token_to_id(t), i)
    print(f"tokenizers {tokenizers.__version__}: vocab {check.get_vocab_size()} "
          f"({len(ordinary)} trained, 256 bytes, {len(specials)} special) -> {out}")
    print(check.encode("<bos><|turn>user\nWhat is 2 + 2?<turn|>\n", add_special_tokens=False).tokens)


def write_special_map(out):
    special_map = {"bos_token": "<bos>", "eos_token": "<turn|>", "pad_token": "<pad>",
                   "unk_token": "<unk>", "mask_token": "<mask>"}
    with open(os.path.join(out, "special_tokens_map.json"), "w") as f:
        json.dump(special_map, f, indent=2)
        f.write("\n")


def main():
    build(SPECIALS, TINY)
    os.makedirs(TOOLS_DIR, exist_ok=True)
    build(TOOL_SPECIALS, TOOLS_DIR, extra=TOOL_WORDS, special_map=False)


if __name__ == "__main__":
    main()
