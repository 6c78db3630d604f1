"""Golden fixtures for g4ft-data, made with transformers and torch (the references we must match).

    /opt/refenv/bin/python tools/reference/data/make_fixtures.py

Writes, next to this script:
  chat_fixtures.json     for each conversation: the string transformers' apply_chat_template(...,
                         tokenize=False) renders with assets/tiny's chat_template.jinja, the ids of
                         tokenizer(text, add_special_tokens=False), and the assistant_only labels.
  sampler_fixtures.json  torch.randperm(n, generator=manual_seed(seed + epoch)) and the indices that
                         torch.utils.data.DistributedSampler gives each rank, for several settings.

The assistant_only labels here are computed independently of the Rust code's marker scan: by
rendering message prefixes (the span assistant message k adds to the rendering is
render(messages[:k+1])[len(render(messages[:k])):]), dropping its `<|turn>model\\n` header and the
newline after `<turn|>`, and marking every token whose character span overlaps what is left.
"""

import json
import os
import sys

import tokenizers
import torch
import transformers
from torch.utils.data.distributed import DistributedSampler
from transformers import AutoTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
TINY = os.path.abspath(os.path.join(HERE, "..", "..", "..", "assets", "tiny"))
HEADER = "<|turn>model\n"

CONVERSATIONS = [
    ("single_turn", {}, [
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "2 + 2 = 4."}]),
    ("system_prompt", {}, [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "Paris."}]),
    ("multi_turn", {}, [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Reverse the word 'stone'."},
        {"role": "assistant", "content": "'enots'."},
        {"role": "user", "content": "And 'river'?"},
        {"role": "assistant", "content": "'revir'."},
        {"role": "user", "content": "Thanks!"},
        {"role": "assistant", "content": "You are welcome."}]),
    ("consecutive_assistant", {}, [
        {"role": "user", "content": "How many meters are in 2 kilometers?"},
        {"role": "assistant", "content": "2000 meters."},
        {"role": "assistant", "content": "Anything else?"},
        {"role": "user", "content": "No."},
        {"role": "assistant", "content": "Bye."}]),
    ("unicode", {}, [
        {"role": "user", "content": "Ça va? Écris «bonjour» en 日本語 😀"},
        {"role": "assistant", "content": "こんにちは — naïve café, 123 °C ✓"}]),
    ("whitespace_trim", {}, [
        {"role": "system", "content": "  \n Be exact.\t \n"},
        {"role": "user", "content": "   What is 7 * 6?  \n\n"},
        {"role": "assistant", "content": "\n\n  7 * 6 = 42.   \n"}]),
    ("thinking_channel", {}, [
        {"role": "user", "content": "What is 12 - 5?"},
        {"role": "assistant", "content": "<|channel>thought\n12 minus 5 is 7.<channel|>12 - 5 = 7."},
        {"role": "user", "content": "And 3 * 3?"},
        {"role": "assistant",
         "content": "  <|channel>thought\nnine<channel|>It is <|channel>x<channel|>9.  "}]),
    ("developer_role", {}, [
        {"role": "developer", "content": "Use metric units."},
        {"role": "user", "content": "How many grams in 3 kilograms?"},
        {"role": "assistant", "content": "3000 grams."}]),
    ("empty_assistant", {}, [
        {"role": "user", "content": "Say nothing."},
        {"role": "assistant", "content": ""}]),
    ("assistant_first", {}, [
        {"role": "assistant", "content": "Hello, how can I help?"},
        {"role": "user", "content": "Count: apple river."},
        {"role": "assistant", "content": "There are 2 words."}]),
    ("mid_system", {}, [
        {"role": "user", "content": "Hi"},
        {"role": "system", "content": "Be kind."},
        {"role": "assistant", "content": "Hello!"}]),
    ("enable_thinking", {"enable_thinking": True}, [
        {"role": "system", "content": "Think first."},
        {"role": "user", "content": "What is 9 + 10?"},
        {"role": "assistant", "content": "<|channel>thought\n19<channel|>19."}]),
    ("generation_prompt", {"add_generation_prompt": True}, [
        {"role": "user", "content": "What is 5 + 5?"}]),
    ("generation_prompt_thinking", {"add_generation_prompt": True, "enable_thinking": True}, [
        {"role": "user", "content": "What is 5 + 5?"}]),
]

SAMPLER_CASES = [  # (n, world, seed, epoch, shuffle, drop_last)
    (10, 1, 0, 0, True, False), (10, 3, 42, 0, True, False), (10, 3, 42, 1, True, False),
    (10, 3, 42, 1, True, True), (7, 4, 7, 2, True, False), (7, 4, 7, 2, True, True),
    (2, 5, 0, 0, True, False), (13, 2, 3, 5, False, False), (13, 4, 3, 5, False, True),
    (100, 8, 1234, 3, True, False), (1000, 3, 2**31 + 5, 1, True, True),
]


def render(tok, messages, kwargs):
    return tok.apply_chat_template(messages, tokenize=False, **kwargs)


def assistant_char_spans(tok, messages, kwargs):
    """Character spans of trained text, from prefix renderings (see the module doc)."""
    spans = []
    for k, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        after = render(tok, messages[: k + 1], kwargs)
        # An empty message list cannot be rendered (the template reads messages[0]); the first
        # message's span then starts at its header, the only one in `after`.
        before_len = len(render(tok, messages[:k], kwargs)) if k > 0 else after.index(HEADER)
        start, end = before_len, len(after)
        if after.startswith(HEADER, start):
            start += len(HEADER)
        assert after.endswith("<turn|>\n"), after
        spans.append((start, end - 1))
    return spans


def labels_for(tok, text, ids, messages, kwargs):
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    assert enc["input_ids"] == ids
    spans = assistant_char_spans(tok, messages, kwargs)
    labels = []
    for tid, (a, b) in zip(ids, enc["offset_mapping"]):
        trained = any(a < e and b > s for s, e in spans)
        labels.append(tid if trained else -100)
    return labels, spans


def chat_fixtures():
    tok = AutoTokenizer.from_pretrained(TINY)
    raw = tokenizers.Tokenizer.from_file(os.path.join(TINY, "tokenizer.json"))
    cases = []
    for name, kwargs, messages in CONVERSATIONS:
        text = render(tok, messages, kwargs)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert ids == raw.encode(text, add_special_tokens=False).ids, name
        case = {"name": name, "kwargs": kwargs, "messages": messages, "text": text, "input_ids": ids}
        if not kwargs.get("add_generation_prompt"):
            case["labels_assistant_only"], spans = labels_for(tok, text, ids, messages, kwargs)
            case["assistant_text"] = [text[s:e] for s, e in spans]
        cases.append(case)
        print(f"{name:28s} {len(ids):3d} ids  {text!r}")
    return cases


def sampler_fixtures():
    cases = []
    for n, world, seed, epoch, shuffle, drop_last in SAMPLER_CASES:
        g = torch.Generator()
        g.manual_seed(seed + epoch)
        perm = torch.randperm(n, generator=g).tolist()
        ranks = []
        for rank in range(world):
            s = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=shuffle,
                                   seed=seed, drop_last=drop_last)
            s.set_epoch(epoch)
            ranks.append(list(iter(s)))
        cases.append({"n": n, "world": world, "seed": seed, "epoch": epoch, "shuffle": shuffle,
                      "drop_last": drop_last, "randperm": perm, "ranks": ranks})
    return cases


def main():
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, "
          f"transformers {transformers.__version__}, tokenizers {tokenizers.__version__}")
    versions = {"torch": torch.__version__, "transformers": transformers.__version__,
                "tokenizers": tokenizers.__version__}
    for name, cases in (("chat_fixtures.json", chat_fixtures()), ("sampler_fixtures.json", sampler_fixtures())):
        with open(os.path.join(HERE, name), "w", encoding="utf-8") as f:
            json.dump({"versions": versions, "cases": cases}, f, ensure_ascii=False, indent=1)
            f.write("\n")
        print(f"wrote {name}: {len(cases)} cases")


if __name__ == "__main__":
    main()
