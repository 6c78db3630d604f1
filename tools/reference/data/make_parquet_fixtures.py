"""Parquet fixtures for g4ft-data: files written by Hugging Face `datasets` (`Dataset.to_parquet`,
as people export datasets), and what transformers renders for the rows as `datasets` reads them
back (struct fields a row lacks come back as None, and the template sees them).

    python tools/reference/data/make_parquet_fixtures.py     # a Python with datasets, transformers
                                                             # 5.23 and tokenizers 0.23 (no torch)
Writes, under parquet/ next to this script:
  chat.parquet      tool-use conversations (rows of make_fixtures.TOOL_ROWS), 2 rows per row group
  tokens.parquet    pre-tokenized rows, some without labels (null)
  bad.parquet       chat rows, the fourth with an unknown role (row 4, row group 1)
and parquet_fixtures.json: for chat.parquet, each row as `datasets` returns it, its rendering,
ids and assistant_only labels (same method as make_fixtures.py's tool fixtures); for
tokens.parquet, the rows.
"""

import json
import os
import sys

import datasets
import transformers
from transformers import AutoTokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402

OUT = os.path.join(mf.HERE, "parquet")
# Rows with one tools schema: rows declaring other tools would get each other's parameters as
# null struct fields, which the template (like Gemma's) cannot render.
CHAT_ROWS = ["tool_call_then_answer", "content_null_and_call", "gemma_tool_responses",
             "reasoning_replayed_after_last_user", "user_after_open_turn", "plain"]


def write(name, rows):
    path = os.path.join(OUT, name)
    ds = datasets.Dataset.from_list(rows)
    ds.to_parquet(path, batch_size=2)
    back = datasets.Dataset.from_parquet(path, keep_in_memory=True).to_list()
    print(f"wrote {name}: {len(rows)} rows, features {ds.features}")
    return back


def main():
    print(f"datasets {datasets.__version__}, transformers {transformers.__version__}")
    os.makedirs(OUT, exist_ok=True)
    by_name = dict(mf.TOOL_ROWS)
    # One schema for all rows: arguments as objects (string arguments would clash with them).
    chat = write("chat.parquet", [by_name[n] for n in CHAT_ROWS])
    tok = AutoTokenizer.from_pretrained(mf.TOOLS)
    big, _ = mf.tool_templates()
    cases = [mf.tool_case(tok, name, row, "big", big) for name, row in zip(CHAT_ROWS, chat)]
    tokens = write("tokens.parquet", [
        {"input_ids": [2, 105, 20, 106], "labels": [-100, -100, 20, 106]},
        {"input_ids": [2, 30, 31], "labels": None},
        {"input_ids": [2, 40, 41, 42, 43], "labels": [-100, 40, 41, 42, 43]},
    ])
    bad_rows = [by_name["plain"]] * 3 + [{"messages": [{"role": "bot", "content": "x"}]}]
    write("bad.parquet", [{"messages": r["messages"]} for r in bad_rows])
    versions = {"datasets": datasets.__version__, "transformers": transformers.__version__}
    with open(os.path.join(mf.HERE, "parquet_fixtures.json"), "w", encoding="utf-8") as f:
        json.dump({"versions": versions, "chat": cases, "tokens": tokens}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote parquet_fixtures.json: {len(cases)} chat rows, {len(tokens)} token rows")


if __name__ == "__main__":
    main()
