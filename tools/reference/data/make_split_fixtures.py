"""Which files of a folder make which split, as Hugging Face `datasets` decides it for
`load_dataset(folder)` (a Python with `datasets` and `pyarrow`):

    python tools/reference/data/make_split_fixtures.py

Builds each layout below in a temporary folder (small valid JSONL / Parquet / CSV files), asks
`datasets.load_dataset_builder(folder)` for its data files and writes `split_fixtures.json` next to
this script: per layout, the files (paths relative to the folder), the builder `datasets` picked
(json, parquet, csv, ...) and each split's files in order. `crates/data/tests/files.rs` resolves
the same layouts and must pick the same files for every split.
"""

import json
import os
import tempfile

import datasets
import pyarrow as pa
import pyarrow.parquet as pq

LAYOUTS = {
    "split_file_names": ["README.md", "train.jsonl", "validation.jsonl", "test.jsonl"],
    "split_folders": ["train/a.jsonl", "train/b.jsonl", "test/c.jsonl"],
    "shards": [
        "data/train-00000-of-00002.parquet",
        "data/train-00001-of-00002.parquet",
        "data/test-00000-of-00001.parquet",
    ],
    "custom_shard_splits": [
        "README.md",
        "data/train_sft-00000-of-00002-4a5b.parquet",
        "data/train_sft-00001-of-00002-9c8d.parquet",
        "data/test_sft-00000-of-00001-1e2f.parquet",
        "data/train_gen-00000-of-00001-3a4b.parquet",
    ],
    "no_split_names": ["b.jsonl", "a.jsonl", "sub/c.jsonl"],
    "mixed_kinds_majority": ["a.parquet", "b.parquet", "c.jsonl"],
    "mixed_kinds_tie": ["a.parquet", "b.jsonl"],
    "keyword_inside_names": ["my_train-1.jsonl", "my-dev.jsonl", "eval.jsonl", "contest.jsonl"],
    "hidden_and_special": [".g4ft-cache/x.jsonl", "__pycache__/y.jsonl", ".hidden.jsonl", "data.jsonl"],
    "split_folder_wins_over_names": ["training/x.jsonl", "valid.jsonl"],
    "compressed": ["train.jsonl.gz", "test.jsonl.zst", "other.txt"],
    "nested_names": ["data/en/train.jsonl", "data/fr/train.jsonl", "data/en/test.jsonl"],
    "keyword_as_prefix_only": ["trainer.jsonl", "contest.jsonl", "test.jsonl"],
    "shards_beside_other_files": ["data/train-00000-of-00001.jsonl", "extra/other.jsonl"],
    "metadata_files": ["config.json", "dataset_info.json", "rows.json"],
    "numbered_split_folders": ["train-1/a.jsonl", "dev_2/b.jsonl", "x_test/c.jsonl"],
    "csv_only": ["train.csv", "test.csv"],
}


def write(path):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    name = os.path.basename(path)
    if ".parquet" in name:
        pq.write_table(pa.table({"text": ["a", "b"]}), path)
    elif name.endswith(".csv"):
        with open(path, "w") as f:
            f.write("text\na\n")
    elif name.endswith(".gz"):
        import gzip

        with gzip.open(path, "wt") as f:
            f.write('{"text": "a"}\n')
    elif name.endswith(".zst"):
        # datasets resolves files by name only; the content is not read here.
        with open(path, "wb") as f:
            f.write(b"")
    elif name.endswith(".md"):
        with open(path, "w") as f:
            f.write("# a dataset\n")
    else:
        with open(path, "w") as f:
            f.write('{"text": "a"}\n')


def main():
    print(f"datasets {datasets.__version__}")
    out = []
    for name, files in LAYOUTS.items():
        with tempfile.TemporaryDirectory() as root:
            for f in files:
                write(os.path.join(root, f))
            builder = datasets.load_dataset_builder(root)
            splits = {
                str(split): [os.path.relpath(p, root).replace(os.sep, "/") for p in paths]
                for split, paths in builder.config.data_files.items()
            }
            out.append({"name": name, "files": files, "builder": builder.name, "splits": splits})
            print(f"{name}: {builder.name} {splits}")
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "split_fixtures.json")
    with open(path, "w") as f:
        json.dump({"datasets": datasets.__version__, "layouts": out}, f, indent=1)
        f.write("\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
