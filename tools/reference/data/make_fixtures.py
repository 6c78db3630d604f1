"""Golden fixtures for g4ft-data, made with transformers and torch (the references we must match).

    /opt/refenv/bin/python tools/reference/data/make_fixtures.py

Writes, next to this script:
  chat_fixtures.json     for each conversation: the string transformers' apply_chat_template(...,
                         tokenize=False) renders with assets/tiny's chat_template.jinja, the ids of
                         tokenizer(text, add_special_tokens=False), and the assistant_only labels.
  sampler_fixtures.json  torch.randperm(n, generator=manual_seed(seed + epoch)) and the indices that
                         torch.utils.data.DistributedSampler gives each rank, for several settings.
  tool_fixtures.json     rows of every message shape agent and reasoning datasets have (tool role
                         messages, tool calls without content, Gemma's tool_responses, reasoning
                         fields, content parts, row-level tools, per-row enable_thinking, numbers
                         and nested arguments), rendered with gemma4-tools/chat_template.jinja (the
                         12B/26B/31B generation prompt) and chat_template_e2b.jinja (E2B/E4B), with
                         the ids and the assistant_only labels.

The tool fixtures' labels come from transformers itself: the template marks what the model writes
with {# gen #} ... {# /gen #} comments, which this script turns into {% generation %} blocks, and
apply_chat_template(return_assistant_tokens_mask=True) gives the mask (the rendered text must be
identical with and without the blocks).

The chat fixtures' assistant_only labels are computed independently of the Rust code's marker scan: by
rendering message prefixes (the span assistant message k adds to the rendering is
render(messages[:k+1])[len(render(messages[:k])):]), dropping its `<|turn>model\\n` header and the
newline after `<turn|>`, and marking every token whose character span overlaps what is left.
"""

import json
import os
import sys

import tokenizers
import transformers
from transformers import AutoTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
TINY = os.path.abspath(os.path.join(HERE, "..", "..", "..", "assets", "tiny"))
HEADER = "<|turn>model\n"
TOOLS = os.path.join(HERE, "gemma4-tools")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city.",
    "parameters": {"type": "object", "title": "weather", "additionalProperties": False,
                   "properties": {
                       "city": {"type": "string", "description": "City name"},
                       "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                       "days": {"type": ["integer", "null"], "default": -3},
                       "radius": {"type": "number", "default": 420.5},
                       "tags": {"type": "array", "items": {"type": "string"}},
                   },
                   "required": ["city"]}}}
CONVERT = {"type": "function", "function": {
    "name": "convert", "description": "",
    "parameters": {"type": "object", "properties": {"amount": {"type": "number"},
                                                    "to": {"type": "string"}}}}}
CLOCK = {"type": "function", "function": {"name": "clock"}}


def call(name, arguments, id=None):
    c = {"type": "function", "function": {"name": name, "arguments": arguments}}
    return {"id": id, **c} if id else c


USER = {"role": "user", "content": "What is the weather in Paris?"}
TOOL_ROWS = [
    ("tool_call_then_answer", {"messages": [
        USER,
        {"role": "assistant", "tool_calls": [call("get_weather", {"city": "Paris"}, "c1")]},
        {"role": "tool", "tool_call_id": "c1", "content": "18 C, sunny"},
        {"role": "assistant", "content": "It is 18 C and sunny in Paris."}], "tools": [WEATHER]}),
    ("content_null_and_call", {"messages": [
        USER,
        {"role": "assistant", "content": None, "tool_calls": [call("get_weather", {"city": "Paris", "unit": "celsius"})]},
        {"role": "tool", "name": "get_weather", "content": "18"},
        {"role": "assistant", "content": "18 degrees."}], "tools": [WEATHER]}),
    ("content_and_call", {"messages": [
        USER,
        {"role": "assistant", "content": "Let me check.", "tool_calls": [call("get_weather", {"city": "Paris"})]},
        {"role": "tool", "content": "rain"},
        {"role": "assistant", "content": "It rains."}], "tools": [WEATHER]}),
    ("parallel_calls", {"messages": [
        {"role": "user", "content": "Weather in Paris and Oslo, and the time?"},
        {"role": "assistant", "tool_calls": [call("get_weather", {"city": "Paris"}, "a"),
                                             call("get_weather", {"city": "Oslo"}, "b"),
                                             call("clock", {}, "c")]},
        {"role": "tool", "tool_call_id": "b", "content": "-3 C"},
        {"role": "tool", "tool_call_id": "a", "content": "18 C"},
        {"role": "tool", "tool_call_id": "c", "content": [{"type": "text", "text": "12:00"}]},
        {"role": "assistant", "content": "Paris 18 C, Oslo -3 C, noon."}], "tools": [WEATHER, CLOCK]}),
    ("arguments_as_json_string", {"messages": [
        {"role": "user", "content": "Convert 3 euros to dollars."},
        {"role": "assistant", "tool_calls": [call("convert", "{\"amount\": 3, \"to\": \"USD\"}")]},
        {"role": "tool", "content": "3.27"},
        {"role": "assistant", "content": "3.27 dollars."}], "tools": [CONVERT]}),
    ("numbers_and_nested_arguments", {"messages": [
        {"role": "user", "content": "Numbers."},
        {"role": "assistant", "tool_calls": [call("convert", {
            "amount": 420.5, "to": "EUR", "neg": -3, "big": 1e20, "small": 0.00001, "two": 2.0,
            "flags": [True, False, None], "nested": {"b": {"x": 1}, "a": [1.5, "s"]}})]},
        {"role": "tool", "content": "ok"}], "tools": [CONVERT]}),
    ("gemma_tool_responses", {"messages": [
        USER,
        {"role": "assistant", "tool_calls": [call("get_weather", {"city": "Paris"})],
         "tool_responses": [{"name": "get_weather", "response": {"temp": 18, "sky": "clear", "wind": 2.5}}]},
        {"role": "assistant", "content": "Clear, 18 C."}], "tools": [WEATHER]}),
    ("two_step_tool_use", {"messages": [
        {"role": "user", "content": "Weather in Paris in fahrenheit?"},
        {"role": "assistant", "tool_calls": [call("get_weather", {"city": "Paris"}, "1")]},
        {"role": "tool", "tool_call_id": "1", "content": "18 C"},
        {"role": "assistant", "content": "Converting.", "tool_calls": [call("convert", {"amount": 18, "to": "F"}, "2")]},
        {"role": "tool", "tool_call_id": "2", "content": "64.4"},
        {"role": "assistant", "content": "64.4 F."}], "tools": [WEATHER, CONVERT]}),
    ("ends_with_tool_response", {"messages": [
        USER,
        {"role": "assistant", "tool_calls": [call("get_weather", {"city": "Paris"})]},
        {"role": "tool", "content": "18 C"}], "tools": [WEATHER]}),
    ("ends_with_tool_call", {"messages": [
        USER,
        {"role": "assistant", "tool_calls": [call("get_weather", {"city": "Paris"})]}], "tools": [WEATHER]}),
    ("user_after_open_turn", {"messages": [
        USER,
        {"role": "assistant", "tool_calls": [call("get_weather", {"city": "Paris"})]},
        {"role": "tool", "content": "18 C"},
        {"role": "user", "content": "Thanks."},
        {"role": "assistant", "content": "You are welcome."}], "tools": [WEATHER]}),
    ("reasoning_replayed_after_last_user", {"messages": [
        USER,
        {"role": "assistant", "reasoning": "  I need the weather tool. ", "tool_calls": [call("get_weather", {"city": "Paris"})]},
        {"role": "tool", "content": "18 C"},
        {"role": "assistant", "reasoning_content": "Now answer.", "content": "18 C."}], "tools": [WEATHER]}),
    ("reasoning_dropped_before_last_user", {"messages": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "reasoning": "greet back", "content": "Hello!"},
        {"role": "user", "content": "Bye"},
        {"role": "assistant", "thinking": "say bye", "content": "Bye!"}]}),
    ("content_parts", {"messages": [
        {"role": "system", "content": [{"type": "text", "text": " Be brief. "}]},
        {"role": "user", "content": [{"type": "text", "text": "Two "}, {"type": "text", "text": "parts"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "<|channel>thought\nhm<channel|>One"},
                                          {"type": "text", "text": " answer "}]}]}),
    ("system_with_tools_and_thinking", {"messages": [
        {"role": "developer", "content": "Use tools."},
        USER,
        {"role": "assistant", "content": "Sure.", "tool_calls": [call("default_api:get_weather", {"city": "Paris"})]},
        {"role": "tool", "content": "18 C"}], "tools": [WEATHER], "enable_thinking": True}),
    ("tools_without_system", {"messages": [
        {"role": "user", "content": "Time?"},
        {"role": "assistant", "content": "Noon."}], "tools": [CLOCK, CONVERT]}),
    ("consecutive_assistant_and_mid_system", {"messages": [
        {"role": "user", "content": "Count."},
        {"role": "assistant", "content": "One."},
        {"role": "assistant", "content": "Two."},
        {"role": "system", "content": "Stop counting."},
        {"role": "assistant", "content": "Done."}]}),
    ("plain", {"messages": [
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "4."}]}),
]
# Generation prompts: (name, row, enable_thinking kwarg); rendered with both templates.
PROMPT_ROWS = [
    ("prompt_after_user", {"messages": [USER], "tools": [WEATHER]}, None),
    ("prompt_after_user_thinking", {"messages": [USER]}, True),
    ("prompt_after_answer", {"messages": [USER, {"role": "assistant", "content": "Sunny."},
                                          {"role": "user", "content": "Sure?"}]}, False),
    ("prompt_after_tool_response", {"messages": [
        USER, {"role": "assistant", "tool_calls": [call("get_weather", {"city": "Paris"})]},
        {"role": "tool", "content": "18 C"}], "tools": [WEATHER]}, None),
]

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


def tool_templates():
    """(12B/26B/31B, E2B/E4B) template sources; writes the E2B/E4B one (generation prompt without
    the empty thought channel) from the hand-written big-model one."""
    with open(os.path.join(TOOLS, "chat_template.jinja"), encoding="utf-8") as f:
        big = f.read()
    channel = "    {% if not thinking %}\n<|channel>thought\n<channel|>\n    {%- endif %}\n"
    assert big.count(channel) == 1, "the generation prompt block moved"
    small = big.replace(channel, "").replace("(written for g4ft's tests; the 12B/26B/31B generation prompt)",
                                             "(written for g4ft's tests; the E2B/E4B generation prompt)")
    with open(os.path.join(TOOLS, "chat_template_e2b.jinja"), "w", encoding="utf-8") as f:
        f.write(small)
    return big, small


def with_generation_blocks(source):
    tagged = source.replace("{#- gen -#}", "{%- generation -%}").replace("{#- /gen -#}", "{%- endgeneration -%}")
    assert tagged.count("{%- generation -%}") == 2 and "{#- gen" not in tagged
    return tagged


def render_row(tok, template, row, **kwargs):
    if "enable_thinking" in row:
        kwargs["enable_thinking"] = row["enable_thinking"]
    return tok.apply_chat_template(row["messages"], tools=row.get("tools"), chat_template=template,
                                   **kwargs)


def tool_case(tok, name, row, variant, template, **kwargs):
    text = render_row(tok, template, row, tokenize=False, **kwargs)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    case = {"name": name, "template": variant, "row": row, "kwargs": kwargs, "text": text, "input_ids": ids}
    if not kwargs.get("add_generation_prompt"):
        out = render_row(tok, with_generation_blocks(template), row, tokenize=True, return_dict=True,
                         return_assistant_tokens_mask=True, **kwargs)
        assert out["input_ids"] == ids, f"{name}: generation blocks changed the rendering"
        case["labels_assistant_only"] = [t if m else -100 for t, m in zip(ids, out["assistant_masks"])]
    print(f"{name:36s} {variant:5s} {len(ids):4d} ids  {text!r}")
    return case


def tool_fixtures():
    tok = AutoTokenizer.from_pretrained(TOOLS)
    big, small = tool_templates()
    cases = []
    for name, row in TOOL_ROWS:
        cases.append(tool_case(tok, name, row, "big", big))
        assert render_row(tok, small, row, tokenize=False) == cases[-1]["text"], name
    for name, row, thinking in PROMPT_ROWS:
        kwargs = {"add_generation_prompt": True}
        if thinking is not None:
            kwargs["enable_thinking"] = thinking
        for variant, template in (("big", big), ("e2b", small)):
            cases.append(tool_case(tok, name, row, variant, template, **kwargs))
    return cases


def sampler_fixtures():
    import torch
    from torch.utils.data.distributed import DistributedSampler

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
    import torch

    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, "
          f"transformers {transformers.__version__}, tokenizers {tokenizers.__version__}")
    versions = {"torch": torch.__version__, "transformers": transformers.__version__,
                "tokenizers": tokenizers.__version__}
    for name, cases in (("chat_fixtures.json", chat_fixtures()), ("sampler_fixtures.json", sampler_fixtures()),
                        ("tool_fixtures.json", tool_fixtures())):
        with open(os.path.join(HERE, name), "w", encoding="utf-8") as f:
            json.dump({"versions": versions, "cases": cases}, f, ensure_ascii=False, indent=1)
            f.write("\n")
        print(f"wrote {name}: {len(cases)} cases")


if __name__ == "__main__":
    main()
