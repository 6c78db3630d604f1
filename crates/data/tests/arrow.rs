//! Arrow data: folders written by `save_to_disk` and loose Arrow IPC files read as `datasets` reads
//! them (tools/reference/data/make_arrow_fixtures.py wrote both and the rows `datasets` returned).

mod common;

use std::path::{Path, PathBuf};

use g4ft_data::source::{RawRow, Source};
use g4ft_data::{
    resolve_local, DataError, DataFiles, DatasetOptions, Encoder, LabelMode, SplitChoice,
    TokenDataset,
};
use serde_json::Value;

fn arrow(name: &str) -> PathBuf {
    common::repo().join("tools/reference/data/arrow").join(name)
}

fn fixtures() -> Value {
    let path = common::repo().join("tools/reference/data/arrow_fixtures.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Every row of one file as JSON, as the data pipeline reads it.
fn rows_of(path: &Path) -> Vec<Value> {
    let mut source = Source::open(path, 1 << 20).unwrap();
    let mut rows = Vec::new();
    while let Some((_, raw)) = source.next_row().unwrap() {
        match raw {
            RawRow::Value(v) => rows.push(serde_json::to_value(v).unwrap()),
            other => panic!("{}: {other:?}", path.display()),
        }
    }
    rows
}

fn rows_of_files(files: &DataFiles) -> Vec<Value> {
    files.files.iter().flat_map(|f| rows_of(f)).collect()
}

fn resolve(path: &Path, choice: SplitChoice) -> Result<DataFiles, String> {
    resolve_local(path.to_str().unwrap(), choice)
        .map(|f| f.expect("a folder"))
        .map_err(|e| e.to_string())
}

fn opts(dir: &Path, mode: LabelMode) -> DatasetOptions {
    common::options(dir, mode)
}

#[test]
fn loose_arrow_files_read_as_datasets_reads_them() {
    let want = fixtures();
    for (file, key) in [
        ("tokens_stream.arrow", "tokens_stream"),
        ("tokens_file.arrow", "tokens_file"),
        ("tokens_lz4.arrow", "tokens_lz4"),
        ("tokens_zstd.arrow", "tokens_zstd"),
        ("types.arrow", "types"),
    ] {
        assert_eq!(
            Value::from(rows_of(&arrow(file))),
            want[key],
            "{file} against datasets"
        );
    }
    // What datasets refuses is refused, naming the file and the column.
    let refused = want["refused"].as_object().unwrap();
    assert_eq!(refused.len(), 5);
    for (file, why) in refused {
        let err = Source::open(&arrow(file), 1 << 20)
            .and_then(|mut s| s.next_row())
            .unwrap_err();
        assert!(
            matches!(&err, DataError::Arrow { path, .. } if path.ends_with(file)),
            "{file}: {err:?} (datasets: {why})"
        );
        // Each file's refused column is named by its first letter; same_name.arrow's are `a`.
        let column = if file == "same_name.arrow" {
            "a"
        } else {
            &file[..1]
        };
        assert!(err.to_string().contains(&format!("`{column}`")), "{err}");
    }
}

#[test]
fn files_of_one_split_need_one_schema() {
    // datasets casts the second file's integers to the first's strings; refused here.
    assert_eq!(
        fixtures()["two_schemas"],
        serde_json::json!([{"x": "a"}, {"x": "5"}])
    );
    let dir = common::scratch("arrow-two-schemas");
    let files = resolve(&arrow("two_schemas"), SplitChoice::train(None)).unwrap();
    assert_eq!(files.files.len(), 2);
    let err = TokenDataset::open_files(&files, None, &opts(&dir, LabelMode::Auto)).unwrap_err();
    let err = err.to_string();
    assert!(
        err.contains("b.arrow: arrow: its columns (x: Int64) are not those of")
            && err.contains("a.arrow (x: Utf8)"),
        "{err}"
    );
    // Integer widths and string offsets that cast without changing a value are read.
    let files = resolve(&arrow("two_widths"), SplitChoice::train(None)).unwrap();
    assert_eq!(Value::from(rows_of_files(&files)), fixtures()["two_widths"]);
    let ds = TokenDataset::open_files(&files, None, &opts(&dir, LabelMode::Auto)).unwrap();
    assert_eq!(ds.sample(1).unwrap().input_ids, [2, 7, 9]);
}

#[test]
fn saved_folders_resolve_as_load_from_disk_reads_them() {
    let want = fixtures();
    // A saved dataset: its shards in state.json's order; from_parquet named its split train.
    let chat = resolve(&arrow("saved_chat"), SplitChoice::train(None)).unwrap();
    let names: Vec<_> = chat.files.iter().map(|f| f.file_name().unwrap()).collect();
    assert_eq!(
        names,
        ["data-00000-of-00002.arrow", "data-00001-of-00002.arrow"]
    );
    assert_eq!(chat.split.as_deref(), Some("train"));
    assert_eq!(Value::from(rows_of_files(&chat)), want["saved_chat"]);
    // As evaluation data it is the whole dataset too; a split asked of it is an error.
    assert_eq!(
        resolve(&arrow("saved_chat"), SplitChoice::eval(None)).unwrap(),
        chat
    );
    let err = resolve(&arrow("saved_chat"), SplitChoice::train(Some("test"))).unwrap_err();
    assert!(
        err.contains("(saved from split `train`), with no split `test` (--data-split)"),
        "{err}"
    );

    // A dataset dict: each split's rows; training takes train, evaluation validation.
    let dict = arrow("saved_dict");
    for split in ["train", "validation", "test"] {
        let files = resolve(&dict, SplitChoice::train(Some(split))).unwrap();
        assert_eq!(files.split.as_deref(), Some(split));
        assert_eq!(
            Value::from(rows_of_files(&files)),
            want["saved_dict"][split],
            "{split}"
        );
    }
    assert_eq!(
        resolve(&dict, SplitChoice::train(None))
            .unwrap()
            .split
            .as_deref(),
        Some("train")
    );
    let eval = resolve(&dict, SplitChoice::eval(None)).unwrap();
    assert_eq!(eval.split.as_deref(), Some("validation"));
    let err = resolve(&dict, SplitChoice::eval(Some("dev"))).unwrap_err();
    assert!(
        err.contains("no split `dev`")
            && err.contains("train, validation, test (pick one with --eval-split)"),
        "{err}"
    );
    // A split's folder on its own is a saved dataset saved from no split.
    let test = resolve(&dict.join("test"), SplitChoice::eval(None)).unwrap();
    assert_eq!((test.split, test.files.len()), (None, 1));
    let err = resolve(&dict.join("test"), SplitChoice::eval(Some("test"))).unwrap_err();
    assert!(
        err.contains("`save_to_disk`, with no split `test` (--eval-split)"),
        "{err}"
    );
    let err = resolve(&dict, SplitChoice::train(None).with_config(Some("x"))).unwrap_err();
    assert!(err.contains("`save_to_disk` has no configs"), "{err}");

    // One split saved on its own keeps its name; asking for it by name works.
    assert_eq!(want["saved_split_name"], "train");
    let one = resolve(&arrow("saved_split"), SplitChoice::train(Some("train"))).unwrap();
    assert_eq!(one.split.as_deref(), Some("train"));
    assert_eq!(Value::from(rows_of_files(&one)), want["saved_split"]);
}

#[test]
fn saved_chat_trains_the_tokens_transformers_renders() {
    // saved_chat holds parquet/chat.parquet's rows, whose ids and labels parquet_fixtures.json has.
    let enc =
        Encoder::from_model_dir(&common::repo().join("tools/reference/data/gemma4-tools")).unwrap();
    let dir = common::scratch("arrow-saved-chat");
    let files = resolve(&arrow("saved_chat"), SplitChoice::train(None)).unwrap();
    let ds = TokenDataset::open_files(&files, Some(&enc), &opts(&dir, LabelMode::AssistantOnly))
        .unwrap();
    let cases = common::parquet_chat_cases();
    assert_eq!(ds.len(), cases.len());
    for (i, case) in cases.iter().enumerate() {
        common::assert_sample_is(&ds, i, case);
    }
}

#[test]
fn bad_arrow_rows_and_files_name_the_row_batch_and_file() {
    let dir = common::scratch("arrow-bad");
    let open = |path: &Path, mode| {
        TokenDataset::open(path, None, &opts(&dir, mode)).map_err(|e| e.to_string())
    };
    let ds = open(&arrow("tokens_stream.arrow"), LabelMode::Auto).unwrap();
    assert_eq!(ds.len(), 3);
    assert_eq!(ds.sample(1).unwrap().labels, vec![2, 30, 31]);
    let err = open(&arrow("tokens_stream.arrow"), LabelMode::AssistantOnly).unwrap_err();
    assert!(
        err.contains("tokens_stream.arrow: row 2 (record batch 0): labels: missing"),
        "{err}"
    );
    // a corrupt byte the Arrow reader panics on is an Arrow error naming the file too
    let corrupt = dir.join("corrupt.arrow");
    let mut bytes = std::fs::read(arrow("tokens_file.arrow")).unwrap();
    bytes[463] = 0xcc;
    std::fs::write(&corrupt, &bytes).unwrap();
    match TokenDataset::open(&corrupt, None, &opts(&dir, LabelMode::Auto)) {
        Err(DataError::Arrow { path, msg }) => {
            assert_eq!(path, corrupt);
            assert!(msg.contains("the file is corrupt"), "{msg}");
        }
        other => panic!("expected an arrow error, got {other:?}"),
    }
    // a cut file is an Arrow error naming the file
    match common::open_cut_copy(&arrow("tokens_stream.arrow"), &dir) {
        (DataError::Arrow { path, .. }, cut) => assert_eq!(path, cut),
        other => panic!("expected an arrow error, got {other:?}"),
    }
}

#[test]
fn broken_saved_folders_are_errors_naming_the_file() {
    let dir = common::scratch("arrow-broken");
    let copy = |from: &str, to: &str| {
        let dst = dir.join(to);
        std::fs::create_dir_all(&dst).unwrap();
        for e in std::fs::read_dir(arrow(from)).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_file() {
                std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
            }
        }
        dst
    };
    let no_info = copy("saved_split", "no_info");
    std::fs::remove_file(no_info.join("dataset_info.json")).unwrap();
    let err = resolve(&no_info, SplitChoice::train(None)).unwrap_err();
    assert!(
        err.contains("state.json") && err.contains("no dataset_info.json"),
        "{err}"
    );

    let no_shard = copy("saved_chat", "no_shard");
    std::fs::remove_file(no_shard.join("data-00001-of-00002.arrow")).unwrap();
    let err = resolve(&no_shard, SplitChoice::train(None)).unwrap_err();
    assert!(
        err.contains("`_data_files[1]` names data-00001-of-00002.arrow, which is not in"),
        "{err}"
    );

    let dict = dir.join("dict");
    std::fs::create_dir_all(&dict).unwrap();
    std::fs::write(dict.join("dataset_dict.json"), r#"{"splits": ["train"]}"#).unwrap();
    let err = resolve(&dict, SplitChoice::train(None)).unwrap_err();
    assert!(
        err.contains("dataset_dict.json") && err.contains("lists the split `train`, but"),
        "{err}"
    );
    std::fs::write(dict.join("dataset_dict.json"), r#"{"splits": "train"}"#).unwrap();
    let err = resolve(&dict, SplitChoice::train(None)).unwrap_err();
    assert!(err.contains("`splits` must be a non-empty list"), "{err}");
}
