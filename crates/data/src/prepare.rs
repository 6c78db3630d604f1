//! Streaming, parallel tokenization of a JSONL file (chat or pre-tokenized).
//!
//! The file is read line by line (never slurped) in chunks of `CHUNK` rows; each chunk is
//! encoded on rayon's pool and handed to a sink in file order, so memory stays bounded and the
//! output order is the file order. Blank lines are ignored. Bad lines are collected with their
//! 1-based line numbers: with `skip_bad_lines` off, the result is an error listing all of them.

use std::io::BufRead;
use std::path::Path;
use std::time::Instant;

use rayon::prelude::*;

use crate::encoder::{check_trainable, Encoded, Encoder};
use crate::error::{BadLine, DataError, Result};
use crate::labels::{self, LabelMode};
use crate::rows::{self, Format};

/// Rows per parallel chunk.
const CHUNK: usize = 4096;

/// What to produce from each row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrepareOptions {
    /// Rows longer than this many tokens are truncated (the post's `MAX_LEN`, 2048).
    pub max_len: usize,
    /// Labels of chat rows (pre-tokenized rows keep theirs, or train every token).
    pub label_mode: LabelMode,
    /// Skip bad lines and report them instead of failing.
    pub skip_bad_lines: bool,
    /// Reject pre-tokenized ids `>= vocab_size` (taken from the tokenizer when there is one).
    pub vocab_size: Option<usize>,
}

impl Default for PrepareOptions {
    fn default() -> Self {
        PrepareOptions {
            max_len: 2048,
            label_mode: LabelMode::Full,
            skip_bad_lines: false,
            vocab_size: None,
        }
    }
}

/// Counts of one tokenization pass (stored in the token cache and printed by `prepare`).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PrepareReport {
    /// Detected format.
    pub format: Option<Format>,
    /// Rows kept.
    pub rows: u64,
    /// Tokens in kept rows (after truncation).
    pub tokens: u64,
    /// Trainable targets (labels after position 0 that are not -100).
    pub trainable_tokens: u64,
    /// Kept rows that `max_len` cut.
    pub truncated_rows: u64,
    /// Skipped lines (only non-empty with `skip_bad_lines`).
    pub bad_lines: Vec<BadLine>,
    /// Wall time of the pass in seconds.
    pub seconds: f64,
}

/// Reads the first non-blank line: `(line number, text)`, or `None` for an empty file.
pub fn first_row(path: &Path) -> Result<Option<(u64, String)>> {
    let file = std::fs::File::open(path).map_err(|e| DataError::io(path, e))?;
    let mut reader = std::io::BufReader::new(file);
    let mut buf = Vec::new();
    let mut line_no = 0;
    loop {
        buf.clear();
        let n = reader
            .read_until(b'\n', &mut buf)
            .map_err(|e| DataError::io(path, e))?;
        if n == 0 {
            return Ok(None);
        }
        line_no += 1;
        let text = String::from_utf8_lossy(&buf);
        if !text.trim().is_empty() {
            return Ok(Some((line_no, text.into_owned())));
        }
    }
}

/// Detects the format of a file from its first non-blank line.
pub fn detect_format(path: &Path) -> Result<Format> {
    let (line, text) = first_row(path)?.ok_or_else(|| DataError::Format {
        path: path.to_path_buf(),
        line: 0,
        reason: "the file has no rows".into(),
    })?;
    rows::detect(&text).map_err(|reason| DataError::Format {
        path: path.to_path_buf(),
        line,
        reason,
    })
}

/// Encodes every row of `path` and passes `(line, row)` to `sink` in file order.
/// Chat files need `encoder`; pre-tokenized files use it only for `vocab_size` when set.
pub fn tokenize_file(
    path: &Path,
    encoder: Option<&Encoder>,
    opts: &PrepareOptions,
    mut sink: impl FnMut(u64, Encoded) -> Result<()>,
) -> Result<PrepareReport> {
    if opts.max_len < 2 {
        return Err(DataError::Config {
            field: "max_len",
            msg: format!(
                "expected >= 2 (a target needs a previous token), got {}",
                opts.max_len
            ),
        });
    }
    let start = Instant::now();
    let format = detect_format(path)?;
    if format == Format::Chat && encoder.is_none() {
        return Err(DataError::Config {
            field: "model",
            msg: format!(
                "{} is chat JSONL: it needs a tokenizer and chat template (a model directory)",
                path.display()
            ),
        });
    }
    let vocab_size = opts.vocab_size.or(encoder.map(Encoder::vocab_size));
    let encode = |text: &str| -> Result<Encoded, String> {
        match format {
            Format::Chat => {
                let enc = encoder.expect("checked above: chat files have an encoder");
                enc.encode_chat(&rows::parse_chat(text)?, opts.max_len, opts.label_mode)
            }
            Format::Tokens => encode_tokens(rows::parse_tokens(text, vocab_size)?, opts.max_len),
        }
    };
    let file = std::fs::File::open(path).map_err(|e| DataError::io(path, e))?;
    let mut reader = std::io::BufReader::with_capacity(1 << 20, file);
    let mut report = PrepareReport {
        format: Some(format),
        ..Default::default()
    };
    let mut line_no = 0u64;
    let mut chunk: Vec<(u64, Result<String, String>)> = Vec::with_capacity(CHUNK);
    let mut done = false;
    while !done {
        chunk.clear();
        while chunk.len() < CHUNK {
            let mut buf = Vec::new();
            if reader
                .read_until(b'\n', &mut buf)
                .map_err(|e| DataError::io(path, e))?
                == 0
            {
                done = true;
                break;
            }
            line_no += 1;
            match String::from_utf8(buf) {
                Ok(s) if s.trim().is_empty() => {}
                Ok(s) => chunk.push((line_no, Ok(s))),
                Err(e) => chunk.push((line_no, Err(format!("invalid UTF-8: {}", e.utf8_error())))),
            }
        }
        let encoded: Vec<(u64, Result<Encoded, String>)> = chunk
            .par_iter()
            .map(|(line, text)| {
                let row = match text {
                    Ok(t) => encode(t),
                    Err(e) => Err(e.clone()),
                };
                (*line, row)
            })
            .collect();
        for (line, row) in encoded {
            match row {
                Ok(enc) => {
                    report.rows += 1;
                    report.tokens += enc.input_ids.len() as u64;
                    report.trainable_tokens += labels::count_targets(&enc.labels) as u64;
                    report.truncated_rows += u64::from(enc.truncated);
                    sink(line, enc)?;
                }
                Err(reason) => report.bad_lines.push(BadLine { line, reason }),
            }
        }
    }
    // With every line bad there is nothing to skip to: list them even with skip_bad_lines.
    if (!opts.skip_bad_lines || report.rows == 0) && !report.bad_lines.is_empty() {
        return Err(DataError::BadLines {
            path: path.to_path_buf(),
            lines: report.bad_lines,
        });
    }
    if report.rows == 0 {
        return Err(DataError::Format {
            path: path.to_path_buf(),
            line: 0,
            reason: "the file has no rows".into(),
        });
    }
    report.seconds = start.elapsed().as_secs_f64();
    Ok(report)
}

fn encode_tokens(row: rows::TokenRow, max_len: usize) -> Result<Encoded, String> {
    let mut labels = row
        .labels
        .unwrap_or_else(|| row.input_ids.iter().map(|&i| i as i32).collect());
    let mut input_ids = row.input_ids;
    let truncated = input_ids.len() > max_len;
    input_ids.truncate(max_len);
    labels.truncate(max_len);
    check_trainable(&labels, max_len, truncated)?;
    Ok(Encoded {
        input_ids,
        labels,
        truncated,
    })
}
