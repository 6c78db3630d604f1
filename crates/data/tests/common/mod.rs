//! Shared helpers for the data crate's integration tests: repo paths and scratch directories.
#![allow(dead_code)] // each test binary uses a subset of the helpers

use std::path::{Path, PathBuf};

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
