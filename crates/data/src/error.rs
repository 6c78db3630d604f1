//! Errors of the data crate, grouped by area (files, lines, tokenizer/template, cache, sampler).
//!
//! Every message names the file (and the 1-based line for a bad row) and what was expected;
//! where a common cause is known a hint follows.

use std::path::PathBuf;

/// Why a row was rejected (the dataset report counts rows per reason).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum SkipReason {
    /// A JSONL line longer than the line-size limit (not parsed).
    LineTooLong,
    /// Not UTF-8.
    InvalidUtf8,
    /// Not JSON, or not a JSON object.
    InvalidJson,
    /// A field is missing or has the wrong type or value.
    BadField,
    /// The chat template raised or failed to render.
    Template,
    /// The rendering's model turns do not match the assistant messages (assistant-only labels).
    LabelSpans,
    /// Nothing left to train after masking and truncation.
    NoTrainableToken,
    /// The tokenizer failed.
    Tokenizer,
}

impl SkipReason {
    /// The snake_case name used in reports and `metrics.jsonl`.
    pub fn as_str(self) -> &'static str {
        match self {
            SkipReason::LineTooLong => "line_too_long",
            SkipReason::InvalidUtf8 => "invalid_utf8",
            SkipReason::InvalidJson => "invalid_json",
            SkipReason::BadField => "bad_field",
            SkipReason::Template => "template",
            SkipReason::LabelSpans => "label_spans",
            SkipReason::NoTrainableToken => "no_trainable_token",
            SkipReason::Tokenizer => "tokenizer",
        }
    }
}

/// A row-level failure: its reason class and the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowError {
    /// The class counted in the report.
    pub kind: SkipReason,
    /// What is wrong, e.g. `messages[1].role: unknown role "bot" (expected ...)`.
    pub reason: String,
}

impl RowError {
    /// A row error of `kind`.
    pub fn new(kind: SkipReason, reason: impl Into<String>) -> Self {
        RowError {
            kind,
            reason: reason.into(),
        }
    }

    /// A missing or mistyped field.
    pub fn field(reason: impl Into<String>) -> Self {
        Self::new(SkipReason::BadField, reason)
    }
}

/// One rejected row: where it is, why, and the message.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BadLine {
    /// 1-based line number of a JSONL file (of a CSV file: where the record starts), or 1-based
    /// row number of a Parquet or Arrow file.
    pub line: u64,
    /// The Parquet row group or Arrow record batch holding the row (0-based); `None` for JSON and
    /// CSV.
    pub row_group: Option<u64>,
    /// The reason class.
    pub kind: SkipReason,
    /// What is wrong with it, e.g. `messages[1].role: unknown role "bot" (expected system, developer, user, assistant or tool)`.
    pub reason: String,
}

impl BadLine {
    /// Where the row is: `file:LINE` for JSONL and CSV, `file: row N (row group G)` for Parquet,
    /// `file: row N (record batch G)` for Arrow (a file named `*.arrow`).
    pub fn location(&self, path: &std::path::Path) -> String {
        let group = match path.extension().and_then(|e| e.to_str()) {
            Some("arrow") => "record batch",
            _ => "row group",
        };
        match self.row_group {
            None => format!("{}:{}", path.display(), self.line),
            Some(g) => format!("{}: row {} ({group} {g})", path.display(), self.line),
        }
    }
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
    /// Bad rows in a data file (reported when `skip_bad_lines` is off).
    #[error("{path}: {} bad row(s):{}{}\n  hint: fix the data or set skip_bad_lines (--skip-bad-lines) to skip and report them",
        lines.len(), format_bad_lines(path, lines), if lines.len() > 10 { "\n  ..." } else { "" })]
    BadLines {
        /// The data file.
        path: PathBuf,
        /// Every bad line, in file order.
        lines: Vec<BadLine>,
    },
    /// The file's format could not be detected from its first row.
    #[error("{path}:{line}: cannot detect the data format: {reason}\n  hint: rows must have `messages` (chat), `conversations` (ShareGPT), `prompt` and `completion`, `text`, or `input_ids` (pre-tokenized); or pass --data-format")]
    Format {
        /// The data file.
        path: PathBuf,
        /// 1-based line (or Parquet row) of the first row (0 when the file is empty).
        line: u64,
        /// What was found.
        reason: String,
    },
    /// A data file that is not readable as a whole (a JSON array that does not parse).
    #[error("{path}{}: {reason}", at_line(*line))]
    BadFile {
        /// The data file.
        path: PathBuf,
        /// 1-based line where reading stopped (0: the file as a whole).
        line: u64,
        /// What is wrong.
        reason: String,
    },
    /// A Parquet file could not be read (its footer, schema, a page or its compression).
    #[error("{path}: parquet: {msg}")]
    Parquet {
        /// The data file.
        path: PathBuf,
        /// What went wrong, with the row group when known.
        msg: String,
    },
    /// An Arrow IPC file could not be read (its schema, a record batch, its compression), or has
    /// a column `datasets` does not read.
    #[error("{path}: arrow: {msg}")]
    Arrow {
        /// The data file.
        path: PathBuf,
        /// What went wrong, with the record batch when known.
        msg: String,
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
    /// What `--data` names cannot be resolved to data files, or its files do not go together.
    #[error("{spec}: {msg}")]
    DataFiles {
        /// The file, folder, glob or Hub id given.
        spec: String,
        /// What is wrong.
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

/// `:LINE`, or nothing for line 0 (the file as a whole).
fn at_line(line: u64) -> String {
    match line {
        0 => String::new(),
        n => format!(":{n}"),
    }
}

fn format_bad_lines(path: &std::path::Path, lines: &[BadLine]) -> String {
    lines
        .iter()
        .take(10)
        .map(|b| format!("\n  {}: {}", b.location(path), b.reason))
        .collect()
}
