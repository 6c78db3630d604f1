"""Builds the tiny Gemma-4-style tokenizer in assets/tiny/ (tokenizer.json, tokenizer_config.json,
special_tokens_map.json) from the bundled sample conversations.

    /opt/refenv/bin/python tools/reference/data/make_tokenizer.py

Layout (vocab 512, the tiny model's vocab_size):
  * Gemma 4's special-token ids: <pad>=0 <eos>=1 <bos>=2 <unk>=3 <mask>=4 <|channel>=100 <channel|>=101
    <|turn>=105 <turn|>=106, plus <|think|>=98 (its real id is not in our spec; 98 is arbitrary).
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
BYTE_BASE = 256


def corpus():
    """Message contents plus the role words and newlines the template writes."""
    lines = []
    with open(SAMPLE, encoding="utf-8") as f:
        for line in f:
            for m in json.loads(line)["messages"]:
                lines.append(m["content"].strip())
    lines += ["user\n", "model\n", "system\n", "thought\n"] * 50
    return lines


def train_ordinary(n_ordinary):
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    trainer = trainers.BpeTrainer(vocab_size=n_ordinary, show_progress=False, special_tokens=[])
    tok.train_from_iterator(corpus(), trainer=trainer)
    return json.loads(tok.to_str())


def main():
    free_ids = [i for i in range(BYTE_BASE) if i not in SPECIALS.values()]
    trained = train_ordinary(len(free_ids))
    ordinary = sorted(trained["model"]["vocab"].items(), key=lambda kv: kv[1])
    assert len(ordinary) <= len(free_ids), (len(ordinary), len(free_ids))
    vocab = dict(SPECIALS)
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
        for t, i in sorted(SPECIALS.items(), key=lambda kv: kv[1])
    ]
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.save(os.path.join(TINY, "tokenizer.json"), pretty=True)

    config = {
        "tokenizer_class": "GemmaTokenizer",
        "bos_token": "<bos>", "eos_token": "<turn|>", "pad_token": "<pad>", "unk_token": "<unk>",
        "mask_token": "<mask>", "add_bos_token": False, "add_eos_token": False,
        "padding_side": "right", "model_max_length": 1000000000000000019884624838656,
        "added_tokens_decoder": {
            str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                     "single_word": False, "special": True}
            for t, i in sorted(SPECIALS.items(), key=lambda kv: kv[1])
        },
    }
    with open(os.path.join(TINY, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    special_map = {"bos_token": "<bos>", "eos_token": "<turn|>", "pad_token": "<pad>",
                   "unk_token": "<unk>", "mask_token": "<mask>"}
    with open(os.path.join(TINY, "special_tokens_map.json"), "w") as f:
        json.dump(special_map, f, indent=2)
        f.write("\n")

    check = Tokenizer.from_file(os.path.join(TINY, "tokenizer.json"))
    for t, i in SPECIALS.items():
        assert check.token_to_id(t) == i, (t, check.token_to_id(t), i)
    print(f"tokenizers {tokenizers.__version__}: vocab {check.get_vocab_size()} "
          f"({len(ordinary)} trained, 256 bytes, {len(SPECIALS)} special) -> {TINY}")
    print(check.encode("<bos><|turn>user\nWhat is 2 + 2?<turn|>\n", add_special_tokens=False).tokens)


if __name__ == "__main__":
    main()
