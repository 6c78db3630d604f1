//! Shared helpers for the data crate's integration tests: repo paths and scratch directories.
#![allow(dead_code)] // each test binary uses a subset of the helpers

use std::path::{Path, PathBuf};

use g4ft_data::TokenDataset;

/// Repository root (two levels above this crate).
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The tiny model directory with the Gemma-4-format tokenizer and template.
pub fn tiny() -> PathBuf {
    repo().join("assets/tiny")
}

/// A fresh scratch directory for one test.
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("g4ft-data-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Writes `lines` as a JSONL file in `dir`.
pub fn write_jsonl(dir: &Path, name: &str, lines: &[&str]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}

/// Options with a token cache under `dir`, `max_len` 4096 and the label mode `mode`.
pub fn options(dir: &Path, mode: g4ft_data::LabelMode) -> g4ft_data::DatasetOptions {
    g4ft_data::DatasetOptions {
        prepare: g4ft_data::PrepareOptions {
            max_len: 4096,
            label_mode: mode,
            ..Default::default()
        },
        cache_dir: Some(dir.join("cache")),
        ..Default::default()
    }
}

/// The error opening the first half of `file` (copied into `dir`) gives, and the copy's path.
pub fn open_cut_copy(file: &Path, dir: &Path) -> (g4ft_data::DataError, PathBuf) {
    let cut = dir.join(format!(
        "cut-{}",
        file.file_name().unwrap().to_str().unwrap()
    ));
    let bytes = std::fs::read(file).unwrap();
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let opts = options(dir, g4ft_data::LabelMode::Auto);
    match g4ft_data::TokenDataset::open(&cut, None, &opts) {
        Err(e) => (e, cut),
        Ok(_) => panic!("{} opened", cut.display()),
    }
}

/// Every sample of `ds` (ids and labels).
pub fn samples(ds: &TokenDataset) -> Vec<(Vec<u32>, Vec<i32>)> {
    (0..ds.len())
        .map(|i| {
            let s = ds.sample(i).unwrap();
            (s.input_ids, s.labels)
        })
        .collect()
}

/// The tool-use chat rows of parquet/chat.parquet with the ids and assistant-only labels
/// transformers gave them (parquet_fixtures.json).
pub fn parquet_chat_cases() -> Vec<serde_json::Value> {
    let path = repo().join("tools/reference/data/parquet_fixtures.json");
    let fixtures: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    fixtures["chat"].as_array().unwrap().clone()
}

/// Asserts that sample `i` of `ds` has the ids and assistant-only labels of `case`.
pub fn assert_sample_is(ds: &g4ft_data::TokenDataset, i: usize, case: &serde_json::Value) {
    let want_ids: Vec<u32> = serde_json::from_value(case["input_ids"].clone()).unwrap();
    let want_labels: Vec<i32> =
        serde_json::from_value(case["labels_assistant_only"].clone()).unwrap();
    let s = ds.sample(i).unwrap();
    assert_eq!(s.input_ids, want_ids, "{}", case["name"]);
    assert_eq!(s.labels, want_labels, "{}", case["name"]);
}
