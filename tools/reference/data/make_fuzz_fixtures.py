"""Randomized differential fixtures for g4ft-data: seeded random conversations rendered by transformers.

    /tmp/hfenv/bin/python tools/reference/data/make_fuzz_fixtures.py

(FUZZ_SEED=N draws another set, to explore; the committed file is drawn from the default seed.)

Writes fuzz_fixtures.json next to this script: a few hundred conversations drawn from a fixed seed
(deterministic: the same file on every run with the same libraries), each rendered by transformers'
apply_chat_template with one of three templates, fed as crates/data/tests/fidelity.rs feeds them:

  tiny  assets/tiny/chat_template.jinja: the messages only, with the add_generation_prompt and
        enable_thinking kwargs. Assistant-only labels from prefix renderings (as make_fixtures.py
        computes the chat fixtures' labels).
  big   gemma4-tools/chat_template.jinja (12B/26B/31B generation prompt) and
  e2b   gemma4-tools/chat_template_e2b.jinja (E2B/E4B): the row (messages, tools, enable_thinking)
        with the kwargs. Assistant-only labels from transformers' {% generation %} mask (the
        template's gen comments turned into generation blocks, as make_fixtures.py does).

A case holds name, template, row, kwargs, and either text, input_ids and (without a generation
prompt, when something is trained) labels_assistant_only, or error: the exception transformers
raised (type and message). The shapes drawn: a system or developer first message or none, short
and long alternations, consecutive same-role messages, system messages mid-conversation, assistant
tool calls (ids or not, object or JSON-string arguments with nested, number, boolean, null and
unicode values), tool-role messages (matched by id, by name or not at all), Gemma's
tool_responses, reasoning fields (reasoning, reasoning_content, thinking), content as a list of
text parts, empty strings, unicode and whitespace edge cases, text that looks like special tokens
or Jinja syntax, row-level tools and enable_thinking, generation prompts, and shapes a template
rejects (content parts for tiny, calls to undeclared tools, non-text parts), and null-valued keys.

Only shapes g4ft-data's row checks accept are drawn (every non-assistant message has content,
reasoning is a string, tool calls have a name and object or string arguments), except the
non-text content parts, which both sides must reject. Known differences are not drawn (each is
explained where it is left out): turn and tool-response markers inside message text, integers
outside 64 bits, tool messages after an assistant message with the tiny template.
"""

import json
import os
import random
import sys

import jinja2
import tokenizers
import transformers
from transformers import AutoTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
TINY = os.path.abspath(os.path.join(HERE, "..", "..", "..", "assets", "tiny"))
TOOLS = os.path.join(HERE, "gemma4-tools")
OUT = os.path.join(HERE, "fuzz_fixtures.json")
SEED = int(os.environ.get("FUZZ_SEED", "20240611"))
CASES = 400
MAX_IDS = 3000  # the test encodes with max_len 4096; longer draws are redrawn
MODEL_HEADER = "<|turn>model\n"

WORDS = ["the", "weather", "Paris", "is", "sunny", "what", "time", "42", "ok", "yes", "no", "please",
         "convert", "3.5", "euros", "call", "tool", "answer", "think", "x", "-1", "done"]
UNICODE = ["Ça va?", "日本語のテキスト", "😀👍🏽", "naïve café", "Ελληνικά ΣΑΣ", "עברית", "العربية",
           "e\u0301", "Straße", "İstanbul", "ﬁ", "👨\u200d👩\u200d👧", "\u200bzero\u200bwidth",
           "a\u00a0b", "\ufeffbom", "x\u2028y", "\U0001f600\U0001f600", "ǅ", "Ⅻ", "㎏", "ÅÄÖ åäö"]
# \x1c-\x1f are whitespace to Python's str.strip() and not to Rust's str::trim().
SPACES = [" ", "  ", "\n", "\n\n", "\t", "\r\n", " \n ", "\x0b", "\x0c", "\x1c", "\x1f", "\x85",
          "\u00a0", "\u2003", "\u2028", "\u3000", "\u200b"]
# Text that looks like the template's control tokens or Jinja syntax. Turn and tool-response
# markers (<|turn>, <turn|>, <|tool_response>, <tool_response|>) are not drawn: the assistant-only
# marker scan cannot tell them from the template's (docs/data.md, "The assistant-only rule").
LOOKALIKES = ["<bos>", "<eos>", "<pad>", "<|think|>", "<|channel>", "<channel|>",
              "<|channel>thought\nhidden<channel|>", "<|tool_call>", "<tool_call|>", '<|"|>',
              "<|tool>", "<tool|>", "<|turn", "turn|>", "<|image|>", "{{ messages }}",
              "{% if true %}x{% endif %}", "{# comment #}", "{%- raw -%}", "{{ raise_exception('x') }}",
              "None", "True", "null", "'single'", '"double"', "back\\slash", "%s %d", "${x}",
              "<script>&amp;</script>", "[1, 2]", "{'k': 1}"]
KEYS = ["city", "unit", "a", "B", "b", "A", "Äb", "àa", "ß", "Zeta", "_private", "x y", "", "0", "10",
        "2", "key-with-dash", "ünïcode", "CamelCase", "camelcase", "ÉTÉ", "été"]
NUMBERS = [0, 1, -3, 7, 42, 2**31, -2**31, 2**53 + 1, 2**63 - 1, -2**63, 2**63, 2**64 - 1,
           0.5, -0.0, 2.0, 420.5, 1e20, 1e16, 1e15, 1e-5, 1e-4, 1.5e-7, 3.141592653589793,
           0.1 + 0.2, 1 / 3, -1e100, 5e-324, 1.7976931348623157e308, 123456789.125]
# Integers outside -2**63 .. 2**64-1 are not drawn: g4ft-data reads JSON numbers as 64-bit
# integers or floats, so 2**64 renders as 1.8446744073709552e+19 where Python writes every digit.


def words(rng, lo=1, hi=8):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def text(rng):
    """A message text: mostly words, often with unicode, edge whitespace or look-alike tokens."""
    kind = rng.choices(["words", "unicode", "spaces", "lookalike", "empty", "blank", "multiline", "mix"],
                       weights=[30, 12, 14, 12, 4, 3, 6, 19])[0]
    if kind == "words":
        return words(rng)
    if kind == "unicode":
        return rng.choice(UNICODE) + (" " + words(rng, 0, 3) if rng.random() < 0.5 else "")
    if kind == "spaces":
        return rng.choice(SPACES) + words(rng, 1, 4) + rng.choice(SPACES) * rng.randint(0, 2)
    if kind == "lookalike":
        return words(rng, 0, 2) + " " + rng.choice(LOOKALIKES) + " " + words(rng, 0, 2)
    if kind == "empty":
        return ""
    if kind == "blank":
        return "".join(rng.choice(SPACES) for _ in range(rng.randint(1, 3)))
    if kind == "multiline":
        return "\n".join(words(rng, 1, 4) for _ in range(rng.randint(2, 4)))
    pieces = [words(rng, 1, 3), rng.choice(UNICODE), rng.choice(LOOKALIKES), rng.choice(SPACES)]
    rng.shuffle(pieces)
    return "".join(pieces[: rng.randint(2, 4)])


def assistant_text(rng):
    """An assistant text, sometimes with a thought channel the templates strip."""
    t = text(rng)
    r = rng.random()
    if r < 0.12:
        return f"<|channel>thought\n{words(rng)}<channel|>{t}"
    if r < 0.16:
        return f"{t}<|channel>{words(rng, 1, 2)}<channel|>{words(rng, 1, 2)}"
    return t


def content(rng, make=text, parts_p=0.15):
    """A string, or (with probability parts_p) a list of 0-3 text parts."""
    if rng.random() < parts_p:
        return [{"type": "text", "text": make(rng)} for _ in range(rng.choice([0, 1, 1, 2, 2, 3]))]
    return make(rng)


def number(rng):
    return rng.choice(NUMBERS)


def value(rng, depth=0):
    """A JSON value for tool arguments and responses."""
    kinds = ["str", "num", "bool", "null"] + (["list", "dict"] if depth < 3 else [])
    kind = rng.choices(kinds, weights=[30, 25, 8, 6, 12, 12][: len(kinds)])[0]
    if kind == "str":
        return rng.choice([words(rng, 1, 3), rng.choice(UNICODE), rng.choice(LOOKALIKES), "",
                           rng.choice(SPACES) + "pad" + rng.choice(SPACES)])
    if kind == "num":
        return number(rng)
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "null":
        return None
    if kind == "list":
        return [value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return obj(rng, depth + 1)


def obj(rng, depth=0, lo=0, hi=4):
    keys = rng.sample(KEYS, rng.randint(lo, hi))
    return {k: value(rng, depth) for k in keys}


def schema(rng, depth=0):
    """A JSON schema for a tool parameter."""
    kind = rng.choice(["string", "number", "integer", "boolean", "array", "object", "union"])
    s = {}
    if kind == "union":
        s["type"] = rng.choice([["integer", "null"], ["string", "number"], ["STRING", "null"]])
    else:
        s["type"] = kind
    if rng.random() < 0.4:
        s["description"] = rng.choice([words(rng), rng.choice(UNICODE), rng.choice(LOOKALIKES), ""])
    if kind == "string" and rng.random() < 0.3:
        s["enum"] = [words(rng, 1, 1) for _ in range(rng.randint(1, 3))]
    if kind in ("number", "integer") and rng.random() < 0.4:
        s["default"] = number(rng)
    if kind == "boolean" and rng.random() < 0.4:
        s["default"] = rng.random() < 0.5
    if kind == "array" and depth < 2:
        s["items"] = schema(rng, depth + 1)
    if kind == "object" and depth < 2:
        s["properties"] = {k: schema(rng, depth + 1) for k in rng.sample(KEYS, rng.randint(0, 3))}
        if rng.random() < 0.3:
            s["additionalProperties"] = rng.random() < 0.5
    if rng.random() < 0.1:
        s["title"] = words(rng, 1, 2)
    if rng.random() < 0.1:
        s["nullable"] = True
    return s


TOOL_NAMES = ["get_weather", "convert", "clock", "search", "Calc_2", "send-mail", "lookup", "météo"]


def tool(rng, name):
    f = {"name": name}
    r = rng.random()
    if r < 0.6:
        f["description"] = rng.choice([words(rng), rng.choice(UNICODE), rng.choice(LOOKALIKES), ""])
    elif r < 0.7:
        f["description"] = None
    if rng.random() < 0.8:
        props = {k: schema(rng) for k in rng.sample(KEYS, rng.randint(0, 3))}
        params = {"type": "object", "properties": props}
        if props and rng.random() < 0.5:
            params["required"] = rng.sample(sorted(props), rng.randint(1, len(props)))
        if rng.random() < 0.2:
            params["additionalProperties"] = False
        if rng.random() < 0.1:
            params["title"] = "params"
        f["parameters"] = params
    return {"type": "function", "function": f}


class Draw:
    """One conversation being drawn."""

    def __init__(self, rng, declared, parts_p, answers):
        self.rng = rng
        self.parts_p = parts_p  # how often a content is a list of text parts
        self.answers = answers  # whether tool messages answer the tool calls
        self.declared = declared  # tool names of the row (None: no tools)
        self.msgs = []
        self.ids = 0

    def call(self):
        rng = self.rng
        names = self.declared or TOOL_NAMES
        name = rng.choice(names)
        if self.declared and rng.random() < 0.01:
            name = "undeclared_tool"
        if rng.random() < 0.1:
            name = "default_api:" + name
        if rng.random() < 0.15:
            args = json.dumps(obj(rng, 1, 0, 3), ensure_ascii=rng.random() < 0.5)
        else:
            args = obj(rng, 0, 0, 4)
        c = {"type": "function", "function": {"name": name, "arguments": args}}
        if rng.random() < 0.1:
            del c["type"]
        if rng.random() < 0.5:
            self.ids += 1
            c = {"id": f"call_{self.ids}", **c}
        return c

    def reasoning(self, m):
        rng = self.rng
        r = rng.random()
        if r < 0.25:
            key = rng.choice(["reasoning", "reasoning_content", "thinking"])
            m[key] = rng.choice([words(rng), " " + words(rng) + " \n", "", rng.choice(UNICODE),
                                 rng.choice(LOOKALIKES)])
        elif r < 0.3:
            m["reasoning"] = words(rng)
            m["reasoning_content"] = words(rng)
        return m

    def nulls(self, m, keys):
        """Sometimes adds null-valued keys (as Parquet rows have for absent fields)."""
        for key in keys:
            if key not in m and self.rng.random() < 0.04:
                m[key] = None
        return m

    def assistant(self, with_text=True):
        m = {"role": "assistant"}
        if with_text:
            m["content"] = content(self.rng, assistant_text, self.parts_p)
            self.nulls(m, ["tool_calls", "tool_responses"])
        return self.nulls(self.reasoning(m), ["thinking", "reasoning_content", "name"])

    def user(self):
        m = {"role": "user", "content": content(self.rng, text, self.parts_p)}
        return self.nulls(m, ["name", "tool_calls"])

    def system(self):
        role = self.rng.choice(["system", "system", "developer"])
        return {"role": role, "content": content(self.rng, text, self.parts_p)}

    def tool_use(self):
        """An assistant message with tool calls and the tool messages that answer it."""
        rng = self.rng
        r = rng.random()
        m = self.assistant(with_text=r < 0.35)
        if 0.35 <= r < 0.45:
            m["content"] = None
        calls = [self.call() for _ in range(rng.choice([1, 1, 1, 2, 3]))]
        m["tool_calls"] = calls if rng.random() < 0.97 else []
        self.msgs.append(m)
        answered = list(calls)
        rng.shuffle(answered)
        for c in answered[: rng.choice([0, 1, 1, 2, 3]) if self.answers else 0]:
            t = {"role": "tool", "content": content(rng, lambda g: rng.choice(
                [text(g), json.dumps(value(g)), words(g, 1, 2)]), self.parts_p)}
            how = rng.random()
            if how < 0.5 and "id" in c:
                t["tool_call_id"] = c["id"]
            elif how < 0.8:
                t["name"] = c["function"]["name"]
            elif how < 0.9:
                t["tool_call_id"] = "nope"
            self.msgs.append(self.nulls(t, ["name", "tool_call_id"]))

    def gemma_responses(self):
        rng = self.rng
        m = self.assistant(with_text=rng.random() < 0.3)
        m["tool_calls"] = [self.call() for _ in range(rng.choice([1, 1, 2]))]
        responses = []
        for _ in range(rng.choice([1, 1, 2])):
            r = {"response": rng.choice([obj(rng, 1, 0, 3), value(rng, 1)])}
            if rng.random() < 0.85:
                r = {"name": rng.choice(self.declared or TOOL_NAMES), **r}
            responses.append(r)
        m["tool_responses"] = responses
        self.msgs.append(m)

    def draw(self, tools_ok):
        rng = self.rng
        if rng.random() < 0.35:
            self.msgs.append(self.system())
        turns = rng.choice([1, 1, 1, 2, 2, 3, 4, 6])
        for _ in range(turns):
            self.msgs.append(self.user())
            r = rng.random()
            if r < 0.06:
                self.msgs.append(self.user())  # consecutive user messages
            elif r < 0.1:
                self.msgs.append(self.system())  # system mid-conversation
            elif r < 0.12:
                self.msgs.append({"role": "tool", "content": text(rng)})  # orphan tool message
            for _ in range(rng.choice([1, 1, 1, 1, 1, 2, 3]) if tools_ok else 1):
                step = rng.random() if tools_ok else 1.0
                if step < 0.3:
                    self.tool_use()
                elif step < 0.38:
                    self.gemma_responses()
                else:
                    self.msgs.append(self.assistant())
            if rng.random() < 0.07:
                self.msgs.append(self.assistant())  # consecutive assistant messages
        end = rng.random()
        if end < 0.1:
            self.msgs.append(self.user())
        elif end < 0.13 and self.msgs[-1]["role"] == "assistant":
            del self.msgs[-1]
        if end > 0.97:
            self.msgs.insert(0, {"role": "assistant", "content": assistant_text(rng)})
        if rng.random() < 0.02:
            # a non-text content part: rejected by the templates (and by the row checks)
            users = [m for m in self.msgs if m["role"] == "user"]
            rng.choice(users)["content"] = [{"type": "text", "text": "see"}, {"type": "image", "url": "x.png"}]
        return self.msgs


def draw_case(rng, template):
    """(row, kwargs) for one case."""
    tool_template = template != "tiny"
    row = {}
    declared = None
    if tool_template and rng.random() < 0.6:
        names = rng.sample(TOOL_NAMES, rng.choice([1, 1, 2, 3]))
        row["tools"] = [tool(rng, n) for n in names] if rng.random() < 0.95 else []
        declared = names if row["tools"] else None
    # tiny gets tool calls and content parts too, less often: it renders or rejects them. It gets
    # no tool messages after an assistant message: it writes them as turns of their own, which
    # splits a run of assistant messages into several model turns, and g4ft-data rejects such a
    # row for assistant-only labels (it counts one model turn per run, tool messages included).
    tools_ok = tool_template or rng.random() < 0.15
    parts_p = 0.15 if tool_template else 0.01
    row = {"messages": Draw(rng, declared, parts_p, tool_template).draw(tools_ok), **row}
    if tool_template and rng.random() < 0.15:
        row["enable_thinking"] = rng.random() < 0.5
    kwargs = {}
    if rng.random() < 0.2:
        kwargs["add_generation_prompt"] = True
    thinking = rng.random()
    if thinking < 0.25:
        kwargs["enable_thinking"] = True
    elif thinking < 0.4:
        kwargs["enable_thinking"] = False
    return row, kwargs


def generation_blocks(source):
    """The template with its gen / /gen comments turned into generation blocks."""
    tagged = source.replace("{#- gen -#}", "{%- generation -%}").replace("{#- /gen -#}", "{%- endgeneration -%}")
    assert tagged.count("{%- generation -%}") == 2, "the gen comments moved"
    return tagged


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


class Renderer:
    def __init__(self):
        self.tiny = AutoTokenizer.from_pretrained(TINY)
        self.tools = AutoTokenizer.from_pretrained(TOOLS)
        big = read(os.path.join(TOOLS, "chat_template.jinja"))
        small = read(os.path.join(TOOLS, "chat_template_e2b.jinja"))
        self.templates = {"big": (big, generation_blocks(big)), "e2b": (small, generation_blocks(small))}

    def render(self, template, row, kwargs, **extra):
        """apply_chat_template as fidelity.rs feeds each template (tiny: the messages only)."""
        kw = dict(kwargs, **extra)
        if template == "tiny":
            return self.tiny.apply_chat_template(row["messages"], **kw)
        if "enable_thinking" in row:
            kw["enable_thinking"] = row["enable_thinking"]
        return self.tools.apply_chat_template(row["messages"], tools=row.get("tools"), **kw)

    def tiny_labels(self, row, kwargs, text, ids):
        """Each assistant message's span: what it adds to the rendering of the messages before it,
        without the model header and the newline after <turn|>; tokens overlapping a span."""
        msgs = row["messages"]
        spans = []
        for k, m in enumerate(msgs):
            if m["role"] != "assistant":
                continue
            after = self.render("tiny", {"messages": msgs[: k + 1]}, kwargs, tokenize=False)
            if k > 0:
                before = self.render("tiny", {"messages": msgs[:k]}, kwargs, tokenize=False)
                assert after.startswith(before), "prefix renderings are not prefixes"
                start = len(before)
            else:
                start = after.index(MODEL_HEADER)
            if after.startswith(MODEL_HEADER, start):
                start += len(MODEL_HEADER)
            assert after.endswith("<turn|>\n") and text.startswith(after)
            spans.append((start, len(after) - 1))
        enc = self.tiny(text, add_special_tokens=False, return_offsets_mapping=True)
        assert enc["input_ids"] == ids
        return [t if any(a < e and b > s for s, e in spans) else -100
                for t, (a, b) in zip(ids, enc["offset_mapping"])]

    def case(self, name, template, row, kwargs):
        case = {"name": name, "template": template, "row": row, "kwargs": kwargs}
        try:
            text = self.render(template, row, kwargs, tokenize=False)
        except AssertionError:
            raise
        except Exception as e:  # what transformers raises is the expected outcome
            case["error"] = f"{type(e).__name__}: {e}"
            return case
        tok = self.tiny if template == "tiny" else self.tools
        ids = tok(text, add_special_tokens=False)["input_ids"]
        if len(ids) > MAX_IDS:
            return None
        case["text"] = text
        case["input_ids"] = ids
        if kwargs.get("add_generation_prompt"):
            return case
        if template == "tiny":
            labels = self.tiny_labels(row, kwargs, text, ids)
        else:
            out = self.render(template, row, dict(kwargs, chat_template=self.templates[template][1]),
                              tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
            assert out["input_ids"] == ids, f"{name}: generation blocks changed the rendering"
            labels = [t if m else -100 for t, m in zip(ids, out["assistant_masks"])]
        if any(label != -100 for label in labels[1:]):
            case["labels_assistant_only"] = labels
        return case

    def check_variants(self, row, kwargs):
        """Without a generation prompt the two tool variants render the same text."""
        texts = []
        for template in ("big", "e2b"):
            try:
                texts.append(self.render(template, row, kwargs, tokenize=False,
                                         chat_template=self.templates[template][0]))
            except jinja2.TemplateError as e:
                texts.append(str(e))
        assert texts[0] == texts[1]


def main():
    print(f"python {sys.version.split()[0]}, transformers {transformers.__version__}, "
          f"tokenizers {tokenizers.__version__}, jinja2 {jinja2.__version__}")
    renderer = Renderer()
    rng = random.Random(SEED)
    cases = []
    counts = {}
    while len(cases) < CASES:
        template = rng.choice(["tiny", "big", "e2b"])
        row, kwargs = draw_case(rng, template)
        if template != "tiny":
            kwargs_tmpl = dict(kwargs, chat_template=renderer.templates[template][0])
            if not kwargs.get("add_generation_prompt"):
                renderer.check_variants(row, kwargs)
        else:
            kwargs_tmpl = kwargs
        case = renderer.case(f"fuzz_{len(cases):03d}", template, row, kwargs_tmpl)
        if case is None:
            continue
        case["kwargs"] = kwargs
        cases.append(case)
        outcome = "error" if "error" in case else ("labels" if "labels_assistant_only" in case else "text")
        counts[(template, outcome)] = counts.get((template, outcome), 0) + 1
    for (template, outcome), n in sorted(counts.items()):
        print(f"{template:5s} {outcome:7s} {n:4d}")
    versions = {"transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
                "jinja2": jinja2.__version__}
    with open(OUT, "w", encoding="utf-8") as f:
        f.write(json.dumps({"versions": versions, "seed": SEED}, ensure_ascii=False)[:-1])
        f.write(', "cases": [\n')
        f.write(",\n".join(json.dumps(c, ensure_ascii=False, separators=(",", ":")) for c in cases))
        f.write("\n]}\n")
    print(f"wrote {os.path.basename(OUT)}: {len(cases)} cases, {os.path.getsize(OUT)} bytes")


if __name__ == "__main__":
    main()
