"""Arrow fixtures for g4ft-data: folders written by Hugging Face `datasets`' `save_to_disk` and
loose Arrow IPC files, with the rows `datasets` reads back from each (a Python with `datasets`
and `pyarrow`; transformers is not needed):

    python tools/reference/data/make_arrow_fixtures.py

Writes, under arrow/ next to this script:
  saved_chat/      `Dataset.save_to_disk(num_shards=2)` of parquet/chat.parquet's rows (the tool-use
                   conversations whose token ids parquet_fixtures.json holds)
  saved_dict/      `DatasetDict.save_to_disk` of token rows: splits train, validation and test
  saved_split/     one split saved on its own (`load_dataset(..., split="train")`, so `_split` is set)
  tokens_stream.arrow, tokens_file.arrow, tokens_lz4.arrow, tokens_zstd.arrow
                   the token rows as an IPC stream (what `datasets` writes) in batches of 2, in
                   the IPC file format, and as streams with LZ4 and Zstandard buffers
  types.arrow      one column per Arrow type a dataset may hold (large and view strings,
                   dictionary-encoded strings, 8- to 64-bit integers, 16- to 64-bit floats, nulls,
                   fixed-size and nested lists, structs with null fields, binary text), in
                   batches of 2
  map.arrow, union.arrow, list_view.arrow, run_end.arrow, same_name.arrow
                   columns `datasets` refuses (no feature type; two columns of one name)
  two_schemas/     two files of one split whose column types differ (`datasets` casts the second
                   to the first's types; refused here)
  two_widths/      two files of one split with other integer widths and string offsets (the cast
                   changes no value; read here)
and arrow_fixtures.json: each dataset's rows as `datasets` returns them (`load_from_disk`, or
`load_dataset("arrow", data_files=...)` for the loose files), and the refusals.
`crates/data/tests/arrow.rs` reads the same files and must give the same rows.
"""

import json
import os
import shutil

import datasets
import pyarrow as pa

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "arrow")

TOKEN_ROWS = [
    {"input_ids": [2, 105, 20, 106], "labels": [-100, -100, 20, 106]},
    {"input_ids": [2, 30, 31], "labels": None},
    {"input_ids": [2, 40, 41, 42, 43], "labels": [-100, 40, 41, 42, 43]},
]


def types_table():
    return pa.table({
        "text": pa.array(["a", None, "c", "d"], pa.large_string()),
        "view": pa.array(["p", "q", None, "s"], pa.string_view()),
        "category": pa.array(["x", "y", "x", None]).dictionary_encode(),
        "i8": pa.array([1, -2, None, 127], pa.int8()),
        "i64": pa.array([2**62, -1, 0, None], pa.int64()),
        "u64": pa.array([2**63, 0, 1, None], pa.uint64()),
        "f16": pa.array([0.5, None, 1.25, -2.0], pa.float16()),
        "f32": pa.array([0.1, 2.0, None, 1e-3], pa.float32()),
        "f64": pa.array([0.1, None, 1e300, -0.0], pa.float64()),
        "flag": pa.array([True, False, None, True]),
        "nothing": pa.array([None, None, None, None], pa.null()),
        "pair": pa.array([[1, 2], [3, 4], None, [5, 6]], pa.list_(pa.int32(), 2)),
        "nested": pa.array([[[1], [2, 3]], [], None, [[]]], pa.large_list(pa.list_(pa.int64()))),
        "record": pa.array(
            [{"a": 1, "b": "x"}, {"a": None, "b": "y"}, None, {"a": 4, "b": None}],
            pa.struct([("a", pa.int64()), ("b", pa.string())]),
        ),
        "bytes": pa.array([b"hi", b"", None, b"\xc3\xa9"], pa.binary()),
    })


def write_ipc(name, table, file_format=False, compression=None):
    path = os.path.join(OUT, name)
    opener = pa.ipc.new_file if file_format else pa.ipc.new_stream
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with opener(path, table.schema, options=options) as w:
        w.write_table(table, max_chunksize=2)
    return path


def loaded_rows(path):
    ds = datasets.load_dataset("arrow", data_files=path, split="train", keep_in_memory=True)
    return jsonable(ds.to_list())


def jsonable(rows):
    # bytes come back as bytes: the tests compare them as the UTF-8 text they hold
    def conv(v):
        if isinstance(v, bytes):
            return v.decode("utf-8")
        if isinstance(v, list):
            return [conv(x) for x in v]
        if isinstance(v, dict):
            return {k: conv(x) for k, x in v.items()}
        return v
    return [conv(r) for r in rows]


def main():
    print(f"datasets {datasets.__version__}, pyarrow {pa.__version__}")
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    fixtures = {"versions": {"datasets": datasets.__version__, "pyarrow": pa.__version__}}

    chat = datasets.Dataset.from_parquet(os.path.join(HERE, "parquet", "chat.parquet"), keep_in_memory=True)
    chat.save_to_disk(os.path.join(OUT, "saved_chat"), num_shards=2)
    fixtures["saved_chat"] = jsonable(datasets.load_from_disk(os.path.join(OUT, "saved_chat")).to_list())

    tokens = datasets.Dataset.from_list(TOKEN_ROWS)
    dd = datasets.DatasetDict({
        "train": tokens,
        "validation": tokens.select([1]),
        "test": tokens.select([2, 0]),
    })
    dd.save_to_disk(os.path.join(OUT, "saved_dict"))
    back = datasets.load_from_disk(os.path.join(OUT, "saved_dict"))
    fixtures["saved_dict"] = {split: jsonable(back[split].to_list()) for split in back}

    # A split loaded on its own remembers its name (`_split` in state.json).
    split_src = os.path.join(OUT, "tokens.jsonl")
    with open(split_src, "w", encoding="utf-8") as f:
        for r in TOKEN_ROWS:
            f.write(json.dumps(r) + "\n")
    one = datasets.load_dataset("json", data_files={"train": split_src}, split="train", keep_in_memory=True)
    one.save_to_disk(os.path.join(OUT, "saved_split"))
    os.remove(split_src)
    with open(os.path.join(OUT, "saved_split", "state.json"), encoding="utf-8") as f:
        fixtures["saved_split_name"] = json.load(f)["_split"]
    fixtures["saved_split"] = jsonable(datasets.load_from_disk(os.path.join(OUT, "saved_split")).to_list())

    table = pa.Table.from_pylist(TOKEN_ROWS)
    fixtures["tokens_stream"] = loaded_rows(write_ipc("tokens_stream.arrow", table))
    fixtures["tokens_file"] = loaded_rows(write_ipc("tokens_file.arrow", table, file_format=True))
    for codec in ("lz4", "zstd"):
        fixtures[f"tokens_{codec}"] = loaded_rows(write_ipc(f"tokens_{codec}.arrow", table, compression=codec))
    fixtures["types"] = loaded_rows(write_ipc("types.arrow", types_table()))

    refused = {
        "map.arrow": pa.table({"m": pa.array([[("k", 1)]], pa.map_(pa.string(), pa.int64()))}),
        "union.arrow": pa.table({"u": pa.UnionArray.from_sparse(
            pa.array([0], pa.int8()), [pa.array([1]), pa.array(["x"])])}),
        "list_view.arrow": pa.table({"l": pa.array([[1, 2]], pa.list_view(pa.int64()))}),
        "run_end.arrow": pa.table({"r": pa.RunEndEncodedArray.from_arrays([2], ["x"])}),
        "same_name.arrow": pa.Table.from_arrays([pa.array([1]), pa.array([2])], names=["a", "a"]),
    }
    fixtures["refused"] = {}
    for name, table in refused.items():
        try:
            loaded_rows(write_ipc(name, table))
            raise SystemExit(f"datasets read {name}; the tests expect it refused")
        except (ValueError, datasets.exceptions.DatasetGenerationError) as e:
            fixtures["refused"][name] = f"{type(e).__name__}: {e}"

    # Two files of one split with other column types: datasets casts the second to the first's.
    os.makedirs(os.path.join(OUT, "two_schemas"))
    write_ipc("two_schemas/a.arrow", pa.table({"x": pa.array(["a"])}))
    write_ipc("two_schemas/b.arrow", pa.table({"x": pa.array([5])}))
    two = datasets.load_dataset(os.path.join(OUT, "two_schemas"), split="train", keep_in_memory=True)
    fixtures["two_schemas"] = jsonable(two.to_list())
    # Other integer widths and string offsets: the cast changes no value, read here too.
    os.makedirs(os.path.join(OUT, "two_widths"))
    write_ipc("two_widths/a.arrow", pa.table({
        "input_ids": pa.array([[2, 5]], pa.list_(pa.int32())), "source": pa.array(["a"])}))
    write_ipc("two_widths/b.arrow", pa.table({
        "input_ids": pa.array([[2, 7, 9]], pa.large_list(pa.int64())),
        "source": pa.array(["b"], pa.large_string())}))
    widths = datasets.load_dataset(os.path.join(OUT, "two_widths"), split="train", keep_in_memory=True)
    fixtures["two_widths"] = jsonable(widths.to_list())

    with open(os.path.join(HERE, "arrow_fixtures.json"), "w", encoding="utf-8") as f:
        json.dump(fixtures, f, ensure_ascii=False, indent=1)
        f.write("\n")
    for root, _, files in sorted(os.walk(OUT)):
        for name in sorted(files):
            print("wrote", os.path.relpath(os.path.join(root, name), HERE))


if __name__ == "__main__":
    main()
