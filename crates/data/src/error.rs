//! Errors of the data crate, grouped by area (files, lines, tokenizer/template, cache, sampler).
//!
//! Every message names the file (and the 1-based line for a bad row) and what was expected;
//! where a common cause is known a hint follows.

use std::path::PathBuf;

/// One rejected JSONL line: its 1-based line number and why it was rejected.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BadLine {
    /// 1-based line number in the data file.
    pub line: u64,
    /// What is wrong with it, e.g. `unknown role "bot" in messages[1] (expected system, developer, user or assistant)`.
    pub reason: String,
}

/// Errors raised while reading, tokenizing, caching, sampling or batching data.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// An I/O error on a named file.
    #[error("{path}: {source}")]
    Io {
        /// The file being read or written.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// Bad lines in a data file (reported when `skip_bad_lines` is off).
    #[error("{path}: {} bad line(s): {}{}\n  hint: fix the data or set skip_bad_lines (--skip-bad-lines) to skip and report them",
        lines.len(), format_bad_lines(path, lines), if lines.len() > 10 { "\n  ..." } else { "" })]
    BadLines {
        /// The data file.
        path: PathBuf,
        /// Every bad line, in file order.
        lines: Vec<BadLine>,
    },
    /// The file's format could not be detected from its first non-blank line.
    #[error("{path}:{line}: cannot detect the data format: {reason}\n  hint: expected chat JSONL ({{\"messages\": [...]}}) or pre-tokenized JSONL ({{\"input_ids\": [...]}})")]
    Format {
        /// The data file.
        path: PathBuf,
        /// 1-based line number of the first non-blank line (0 when the file is empty).
        line: u64,
        /// What was found.
        reason: String,
    },
    /// The tokenizer could not be loaded or failed.
    #[error("{path}: tokenizer: {msg}")]
    Tokenizer {
        /// tokenizer.json or the model directory.
        path: PathBuf,
        /// The tokenizers library's message.
        msg: String,
    },
    /// The chat template is missing, does not compile or failed to render.
    #[error("{path}: chat template: {msg}")]
    Template {
        /// chat_template.jinja, tokenizer_config.json or the model directory.
        path: PathBuf,
        /// What went wrong.
        msg: String,
    },
    /// A config value is out of range or inconsistent.
    #[error("{field}: {msg}")]
    Config {
        /// The option, e.g. `max_len` or `batch_size`.
        field: &'static str,
        /// Expected vs got.
        msg: String,
    },
    /// A token cache file is unreadable or inconsistent (it is rebuilt when its key differs).
    #[error("{path}: token cache: {msg}\n  hint: delete the file to rebuild it")]
    Cache {
        /// The cache file.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
}

/// Result alias of this crate.
pub type Result<T, E = DataError> = std::result::Result<T, E>;

impl DataError {
    /// Wraps an I/O error with the file it happened on.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        DataError::Io {
            path: path.into(),
            source,
        }
    }
}

fn format_bad_lines(path: &std::path::Path, lines: &[BadLine]) -> String {
    lines
        .iter()
        .take(10)
        .map(|b| format!("\n  {}:{}: {}", path.display(), b.line, b.reason))
        .collect()
}
