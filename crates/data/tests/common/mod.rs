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
