//! Several files as one dataset: folders split as Hugging Face `datasets` splits them (layouts and
//! their splits from `datasets` itself: tools/reference/data/make_split_fixtures.py), globs, and
//! the rows of several files read in order.

mod common;

use std::path::Path;

use g4ft_data::files::{resolve_local, splits, SplitChoice};
use g4ft_data::{DataFiles, DatasetOptions, Encoder, LabelMode, TokenDataset};
use serde_json::Value;

/// One section of the fixtures `datasets` made: `layouts` (folders) or `cards` (folders with a
/// dataset card listing configs).
fn fixtures_of(section: &str) -> Vec<Value> {
    let text =
        std::fs::read_to_string(common::repo().join("tools/reference/data/split_fixtures.json"))
            .unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    v[section].as_array().unwrap().clone()
}

fn fixtures() -> Vec<Value> {
    fixtures_of("layouts")
}

/// Splits in name order (each split's files keep their order).
fn by_split(mut splits: Vec<(String, Vec<String>)>) -> Vec<(String, Vec<String>)> {
    splits.sort();
    splits
}

/// A fixture's `{split: [files]}`, in name order.
fn fixture_splits(v: &Value) -> Vec<(String, Vec<String>)> {
    let splits = v.as_object().unwrap().iter();
    by_split(splits.map(|(k, v)| (k.clone(), strings(v))).collect())
}

fn strings(v: &Value) -> Vec<String> {
    serde_json::from_value(v.clone()).unwrap()
}

#[test]
fn every_layout_splits_as_datasets_splits_it() {
    let layouts = fixtures();
    assert!(layouts.len() >= 15);
    for layout in &layouts {
        let name = layout["name"].as_str().unwrap();
        let files = strings(&layout["files"]);
        // `datasets` refused the layout (no builder), or read it with a builder of its own.
        let builder = layout["builder"].as_str();
        match splits(&files, None, SplitChoice::train(None)).map(|s| s.splits) {
            Ok(got) => {
                assert!(
                    matches!(builder, Some("json" | "parquet" | "csv")),
                    "{name}: {got:?}"
                );
                assert_eq!(by_split(got), fixture_splits(&layout["splits"]), "{name}");
            }
            Err(e) => match builder {
                None => {}
                Some(b) => assert!(e.contains(b) && e.contains("not read"), "{name}: {e}"),
            },
        }
    }
}

#[test]
fn a_dataset_card_s_configs_decide_the_splits_as_in_datasets() {
    let cases = fixtures_of("cards");
    assert!(cases.len() >= 6);
    for case in &cases {
        let name = case["name"].as_str().unwrap();
        let files = strings(&case["files"]);
        let card = format!("---\n{}---\n# a dataset\n", case["card"].as_str().unwrap());
        let choice = SplitChoice::train(None).with_config(case["config"].as_str());
        let got = splits(&files, Some(&card), choice);
        if case.get("error").is_some() {
            assert!(got.is_err(), "{name}: datasets refuses it: {got:?}");
            continue;
        }
        let got = got.unwrap();
        assert_eq!(got.config.as_deref(), case["chosen"].as_str(), "{name}");
        let want = fixture_splits(&case["splits"]);
        assert_eq!(by_split(got.splits), want, "{name} [{}]", case["config"]);
    }
    // Several configs and none the default: the error lists them and names the flag.
    let two = cases
        .iter()
        .find(|c| c["name"] == "card_two_configs")
        .unwrap();
    let card = format!("---\n{}---\n", two["card"].as_str().unwrap());
    let err = splits(
        &strings(&two["files"]),
        Some(&card),
        SplitChoice::eval(None),
    )
    .unwrap_err();
    assert!(
        err.contains("lists the configs main, socratic and marks none as the default (pick one with --eval-config)"),
        "{err}"
    );
    let err = splits(
        &strings(&two["files"]),
        None,
        SplitChoice::train(None).with_config(Some("main")),
    )
    .unwrap_err();
    assert!(err.contains("lists no configs"), "{err}");
}

/// Writes the fixture layout `name` as JSONL text rows (`"<file> <i>"`) into a scratch folder.
fn write_layout(name: &str) -> std::path::PathBuf {
    let layout = fixtures().into_iter().find(|l| l["name"] == name).unwrap();
    let dir = common::scratch(&format!("files-{name}"));
    for f in strings(&layout["files"]) {
        let path = dir.join(&f);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let rows: Vec<String> = (0..2)
            .map(|i| serde_json::json!({ "text": format!("{f} {i}") }).to_string())
            .collect();
        std::fs::write(&path, rows.join("\n") + "\n").unwrap();
    }
    dir
}

fn rel(dir: &Path, files: &DataFiles) -> Vec<String> {
    files
        .files
        .iter()
        .map(|f| f.strip_prefix(dir).unwrap().to_string_lossy().into_owned())
        .collect()
}

#[test]
fn a_folder_gives_its_train_split_or_the_split_asked_for() {
    let dir = write_layout("split_folders");
    let spec = dir.to_str().unwrap();
    let train = resolve_local(spec, SplitChoice::train(None))
        .unwrap()
        .unwrap();
    assert_eq!(train.split.as_deref(), Some("train"));
    assert_eq!(rel(&dir, &train), ["train/a.jsonl", "train/b.jsonl"]);
    let test = resolve_local(spec, SplitChoice::train(Some("test")))
        .unwrap()
        .unwrap();
    assert_eq!(rel(&dir, &test), ["test/c.jsonl"]);
    assert!(
        test.describe().ends_with("(split test, 1 file)"),
        "{}",
        test.describe()
    );
    let err = resolve_local(spec, SplitChoice::train(Some("validation")))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("no split `validation` here: the files make the splits train, test"),
        "{err}"
    );
    // Evaluation takes `validation`, else `test`.
    let eval = resolve_local(spec, SplitChoice::eval(None))
        .unwrap()
        .unwrap();
    assert_eq!(eval.split.as_deref(), Some("test"));
    let dir3 = write_layout("split_file_names");
    let eval = resolve_local(dir3.to_str().unwrap(), SplitChoice::eval(None));
    assert_eq!(rel(&dir3, &eval.unwrap().unwrap()), ["validation.jsonl"]);
    // A folder without a train split names the ones it has and the flag that picks one.
    let dir = write_layout("keyword_as_prefix_only");
    let err = resolve_local(dir.to_str().unwrap(), SplitChoice::train(None))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(
            "no split `train` here: the files make the split test (pick one with --data-split)"
        ),
        "{err}"
    );
}

#[test]
fn a_glob_gives_the_files_it_matches_in_path_order() {
    let dir = write_layout("nested_names");
    let spec = format!("{}/data/*/train.jsonl", dir.display());
    let got = resolve_local(&spec, SplitChoice::train(None))
        .unwrap()
        .unwrap();
    assert_eq!(
        rel(&dir, &got),
        ["data/en/train.jsonl", "data/fr/train.jsonl"]
    );
    assert_eq!(got.describe(), format!("{spec} (2 files)"));
    let spec = format!("{}/**/*.jsonl", dir.display());
    assert_eq!(
        resolve_local(&spec, SplitChoice::train(None))
            .unwrap()
            .unwrap()
            .files
            .len(),
        3
    );
    let none = format!("{}/*.parquet", dir.display());
    let err = resolve_local(&none, SplitChoice::train(None))
        .unwrap_err()
        .to_string();
    assert!(err.ends_with("no file matches this pattern"), "{err}");
    let err = resolve_local(&spec, SplitChoice::train(Some("test")))
        .unwrap_err()
        .to_string();
    assert!(err.contains("not of a glob's files"), "{err}");
    // Hidden folders (the token cache beside the data) are not matched unless named.
    let dir = write_layout("hidden_and_special");
    let all = format!("{}/**/*.jsonl", dir.display());
    assert_eq!(
        rel(
            &dir,
            &resolve_local(&all, SplitChoice::train(None))
                .unwrap()
                .unwrap()
        ),
        ["data.jsonl"]
    );
    let hidden = format!("{}/.g4ft-cache/*.jsonl", dir.display());
    assert_eq!(
        rel(
            &dir,
            &resolve_local(&hidden, SplitChoice::train(None))
                .unwrap()
                .unwrap()
        ),
        [".g4ft-cache/x.jsonl"]
    );
}

#[test]
fn one_file_is_itself_and_takes_no_split() {
    let dir = write_layout("no_split_names");
    let file = dir.join("a.jsonl");
    let got = resolve_local(file.to_str().unwrap(), SplitChoice::train(None))
        .unwrap()
        .unwrap();
    assert_eq!(got, DataFiles::one(&file));
    assert_eq!(got.describe(), file.display().to_string());
    let err = resolve_local(file.to_str().unwrap(), SplitChoice::train(Some("train"))).unwrap_err();
    assert!(err.to_string().contains("this is one file"), "{err}");
    assert!(
        resolve_local(dir.join("nope").to_str().unwrap(), SplitChoice::train(None))
            .unwrap()
            .is_none()
    );
}

#[test]
fn several_files_are_one_dataset_in_file_order() {
    let dir = write_layout("no_split_names");
    let enc = Encoder::from_model_dir(&common::tiny()).unwrap();
    let opts = common::options(&dir, LabelMode::Auto);
    let files = resolve_local(dir.to_str().unwrap(), SplitChoice::train(None))
        .unwrap()
        .unwrap();
    let ds = TokenDataset::open_files(&files, Some(&enc), &opts).unwrap();
    assert_eq!(ds.len(), 6);
    let texts: Vec<String> = (0..6)
        .map(|i| {
            let ids = ds.sample(i).unwrap().input_ids;
            enc.tokenizer().decode(&ids, true).unwrap()
        })
        .collect();
    assert_eq!(
        texts,
        [
            "a.jsonl 0",
            "a.jsonl 1",
            "b.jsonl 0",
            "b.jsonl 1",
            "sub/c.jsonl 0",
            "sub/c.jsonl 1"
        ]
    );
    assert_eq!(
        (ds.file_of(3), ds.line_of(3)),
        (dir.join("b.jsonl").as_path(), 2)
    );
    let report = ds.report();
    assert_eq!((report.rows_read, report.rows), (6, 6));
    let per_file: u64 = ds.file_reports().map(|(_, r)| r.tokens).sum();
    assert_eq!(report.tokens, per_file);
    assert_eq!(ds.cache_paths().len(), 3);
    // Reopening reuses every file's cache; a changed file is the only one tokenized again.
    assert!(TokenDataset::open_files(&files, Some(&enc), &opts)
        .unwrap()
        .from_cache());
    std::fs::write(dir.join("b.jsonl"), "{\"text\": \"new\"}\n").unwrap();
    let again = TokenDataset::open_files(&files, Some(&enc), &opts).unwrap();
    assert!(!again.from_cache());
    assert_eq!(again.len(), 5);
}

#[test]
fn files_of_two_formats_are_an_error_naming_one_of_each() {
    let dir = common::scratch("files-two-formats");
    common::write_jsonl(&dir, "a.jsonl", &[r#"{"text": "hi"}"#]);
    common::write_jsonl(&dir, "b.jsonl", &[r#"{"input_ids": [1, 2]}"#]);
    let files = resolve_local(dir.to_str().unwrap(), SplitChoice::train(None))
        .unwrap()
        .unwrap();
    let err = TokenDataset::open_files(&files, None, &DatasetOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("a.jsonl holds text rows but")
            && err.contains("b.jsonl holds tokens rows")
            && err.contains("keep one format, or pass --data-format"),
        "{err}"
    );
}
