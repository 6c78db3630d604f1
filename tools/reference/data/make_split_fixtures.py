"""Which files of a folder make which split, as Hugging Face `datasets` decides it for
`load_dataset(folder)` (a Python with `datasets` and `pyarrow`):

    python tools/reference/data/make_split_fixtures.py

Builds each layout below in a temporary folder (small valid JSONL / Parquet / CSV files), asks
`datasets.load_dataset_builder(folder)` for its data files and writes `split_fixtures.json` next to
this script: per layout, the files (paths relative to the folder), the builder `datasets` picked
(json, parquet, csv, ...) and each split's files in order; then folders whose README.md lists
`configs` (subsets), each config asked for by name or left to `datasets` to choose. `crates/data/tests/files.rs` resolves
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
    "three_extensions_tie": ["x.json", "y.jsonl", "z.parquet"],
    "upper_case_extension": ["A.JSONL", "b.jsonl"],
    "ndjson": ["a.ndjson", "b.jsonl"],
    "dunder_files": ["__x.jsonl", "sub/__init__.jsonl", "a.jsonl"],
    "backup_extension": ["train.jsonl.bak", "test.jsonl"],
    "images_outnumber_rows": ["a.png", "b.png", "c.png", "rows.jsonl"],
    "splits_of_two_kinds": ["train.parquet", "test.jsonl"],
}

# Folders whose README.md front matter lists `configs`: (files, card YAML, config names to ask
# for, None being no name).
CARD_LAYOUTS = {
    "card_one_config": (
        ["data/train_sft-00000-of-00001.parquet", "data/test_sft-00000-of-00001.parquet", "extra/x.jsonl"],
        "configs:\n- config_name: default\n  data_files:\n  - split: train_sft\n    path: data/train_sft-*\n"
        "  - split: test_sft\n    path: data/test_sft-*\n",
        [None],
    ),
    "card_two_configs": (
        ["main/train-00000-of-00001.parquet", "main/test-00000-of-00001.parquet",
         "socratic/train-00000-of-00001.parquet", "socratic/test-00000-of-00001.parquet"],
        "configs:\n- config_name: main\n  data_files:\n  - split: train\n    path: main/train-*\n"
        "  - split: test\n    path: main/test-*\n- config_name: socratic\n  data_files:\n"
        "  - split: train\n    path: socratic/train-*\n  - split: test\n    path: socratic/test-*\n",
        ["main", "socratic"],
    ),
    "card_default_flag": (
        ["a/one.jsonl", "a/two.jsonl", "b/three.jsonl"],
        "configs:\n  - config_name: first\n    data_files: b/*.jsonl\n"
        "  - config_name: second\n    default: true\n    data_files:\n      - a/two.jsonl\n      - a/one.jsonl\n",
        [None, "first"],
    ),
    "card_flow_list_and_quotes": (
        ["x/0.jsonl", "x/1.jsonl", "y/0.jsonl"],
        "configs:\n- config_name: \"all\"\n  data_files:\n  - split: 'train'\n    path: [x/*.jsonl, y/*.jsonl]\n",
        [None],
    ),
    "card_data_dir": (
        ["en/a.jsonl", "en/b.jsonl", "fr/train.jsonl", "fr/test.jsonl", "x.jsonl"],
        "configs:\n- config_name: en\n  data_dir: en\n  data_files: '*.jsonl'\n"
        "- config_name: fr\n  data_dir: fr\n",
        ["en", "fr"],
    ),
    "card_comments_and_quoted_commas": (
        ["a/x, y.jsonl", "b/z.jsonl", "v.jsonl"],
        "configs: # the subsets\n- config_name: 'main' # main one\n  data_files:\n"
        "  - split: train\n    path: [\"a/x, y.jsonl\", b/*]\n"
        "  - split: validation\n    path: \"v.jsonl\"  # held out\n",
        [None],
    ),
    "card_missing_literal_file": (
        ["a.jsonl"],
        "configs:\n- config_name: default\n  data_files: [a.jsonl, b.jsonl]\n",
        [None],
    ),
}


def write(path):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    name = os.path.basename(path)
    if ".parquet" in name:
        pq.write_table(pa.table({"text": ["a", "b"]}), path)
    elif name.endswith(".png"):
        with open(path, "wb") as f:
            f.write(b"\x89PNG\r\n\x1a\n")
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
            try:
                builder = datasets.load_dataset_builder(root)
            except Exception as e:  # datasets refuses the layout: we must refuse it too
                out.append({"name": name, "files": files, "builder": None, "error": str(e)[:200]})
                print(f"{name}: error {str(e)[:100]}")
                continue
            splits = {
                str(split): [os.path.relpath(p, root).replace(os.sep, "/") for p in paths]
                for split, paths in builder.config.data_files.items()
            }
            out.append({"name": name, "files": files, "builder": builder.name, "splits": splits})
            print(f"{name}: {builder.name} {splits}")
    cards = []
    for name, (files, card, configs) in CARD_LAYOUTS.items():
        with tempfile.TemporaryDirectory() as root:
            for f in files:
                write(os.path.join(root, f))
            with open(os.path.join(root, "README.md"), "w") as f:
                f.write("---\n" + card + "---\n# a dataset\n")
            for config in configs:
                case = {"name": name, "files": files, "card": card, "config": config}
                try:
                    builder = datasets.load_dataset_builder(root, name=config)
                except Exception as e:  # datasets refuses the card: we must refuse it too
                    cards.append({**case, "error": str(e)[:200]})
                    print(f"{name} [{config}]: error {str(e)[:100]}")
                    continue
                splits = {
                    str(split): [os.path.relpath(p, root).replace(os.sep, "/") for p in paths]
                    for split, paths in builder.config.data_files.items()
                }
                cards.append({**case, "chosen": builder.config.name, "splits": splits})
                print(f"{name} [{config}]: {builder.config.name} {splits}")
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "split_fixtures.json")
    with open(path, "w") as f:
        json.dump({"datasets": datasets.__version__, "layouts": out, "cards": cards}, f, indent=1)
        f.write("\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
