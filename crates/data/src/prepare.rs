//! Streaming, parallel tokenization of a data file (JSONL, Parquet, Arrow or CSV, any
//! [`Format`]).
//!
//! The file is read row by row (never slurped; JSONL lines bounded in size) in chunks of `CHUNK`
//! rows; each chunk is parsed and encoded on rayon's pool and handed to a sink in file order, so
//! memory stays bounded and the output order is the file order. Blank lines are ignored. Bad rows
//! are collected with their location and reason: with `skip_bad_lines` off, the result is an
//! error listing them. The format comes from the first row's keys unless it is given.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use g4ft_wait::Schedule;
use rayon::prelude::*;

use crate::encoder::{Encoded, Encoder};
use crate::error::{BadLine, DataError, Result, RowError, SkipReason};
use crate::labels::{self, LabelMode};
use crate::rows::{self, Format};
use crate::source::{Location, RawRow, Source, DEFAULT_MAX_LINE_BYTES};

/// Rows per parallel chunk.
const CHUNK: usize = 4096;

/// What to produce from each row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrepareOptions {
    /// Rows longer than this many tokens are truncated (the post's `MAX_LEN`, 2048).
    pub max_len: usize,
    /// Which tokens are trained (see [`LabelMode`]).
    pub label_mode: LabelMode,
    /// Skip bad rows and report them instead of failing.
    pub skip_bad_lines: bool,
    /// Reject rows with token ids `>= vocab_size`, pre-tokenized or from the tokenizer (taken from
    /// the tokenizer when not given).
    pub vocab_size: Option<usize>,
    /// The row format; `None` detects it from the first row.
    pub format: Option<Format>,
    /// JSONL lines longer than this many bytes are bad rows, skipped unparsed.
    pub max_line_bytes: usize,
}

impl Default for PrepareOptions {
    fn default() -> Self {
        PrepareOptions {
            max_len: 2048,
            label_mode: LabelMode::Auto,
            skip_bad_lines: false,
            vocab_size: None,
            format: None,
            max_line_bytes: DEFAULT_MAX_LINE_BYTES,
        }
    }
}

/// Token-count percentiles of the kept rows (after truncation).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LengthStats {
    /// Shortest row.
    pub min: u64,
    /// Median (nearest rank).
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// Longest row.
    pub max: u64,
    /// Mean.
    pub mean: f64,
}

impl LengthStats {
    /// Nearest-rank percentiles of `lengths` (zeros when empty).
    pub fn of(lengths: &[u64]) -> Self {
        if lengths.is_empty() {
            return Self::default();
        }
        let mut v = lengths.to_vec();
        v.sort_unstable();
        let rank = |p: f64| v[((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
        LengthStats {
            min: v[0],
            p50: rank(0.50),
            p90: rank(0.90),
            p99: rank(0.99),
            max: v[v.len() - 1],
            mean: v.iter().sum::<u64>() as f64 / v.len() as f64,
        }
    }
}

/// What one tokenization pass found (stored in the token cache, printed at the start of a run
/// and written to `metrics.jsonl`).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PrepareReport {
    /// Detected or given format.
    pub format: Option<Format>,
    /// Rows read (kept and skipped; blank lines are not rows).
    pub rows_read: u64,
    /// Rows kept.
    pub rows: u64,
    /// Tokens in kept rows (after truncation).
    pub tokens: u64,
    /// Trainable targets (labels after position 0 that are not -100).
    pub trainable_tokens: u64,
    /// Kept rows that `max_len` cut.
    pub truncated_rows: u64,
    /// Token counts of the kept rows.
    pub lengths: LengthStats,
    /// Every rejected row, in file order.
    pub bad_lines: Vec<BadLine>,
    /// Wall time of the pass in seconds.
    pub seconds: f64,
}

impl PrepareReport {
    /// Rejected rows per reason.
    pub fn skipped(&self) -> BTreeMap<SkipReason, u64> {
        let mut m = BTreeMap::new();
        for b in &self.bad_lines {
            *m.entry(b.kind).or_default() += 1;
        }
        m
    }

    /// Whether most kept rows were truncated (worth a warning: `max_len` is probably too small).
    pub fn mostly_truncated(&self) -> bool {
        self.rows > 0 && 2 * self.truncated_rows > self.rows
    }

    /// The report as lines of `key  value` for a terminal.
    pub fn lines(&self) -> Vec<String> {
        let l = &self.lengths;
        let skipped: Vec<String> = self
            .skipped()
            .iter()
            .map(|(k, n)| format!("{} {n}", k.as_str()))
            .collect();
        let pct = |n: u64, of: u64| 100.0 * n as f64 / of.max(1) as f64;
        vec![
            format!(
                "format             {}",
                self.format.map_or("-", Format::as_str)
            ),
            format!("rows read          {}", self.rows_read),
            format!("rows kept          {}", self.rows),
            format!(
                "rows skipped       {}{}",
                self.bad_lines.len(),
                if skipped.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", skipped.join(", "))
                }
            ),
            format!(
                "rows truncated     {} ({:.1}%)",
                self.truncated_rows,
                pct(self.truncated_rows, self.rows)
            ),
            format!("tokens             {}", self.tokens),
            format!(
                "trainable tokens   {} ({:.1}%)",
                self.trainable_tokens,
                pct(self.trainable_tokens, self.tokens)
            ),
            format!(
                "row length         min {} p50 {} p90 {} p99 {} max {} mean {:.1}",
                l.min, l.p50, l.p90, l.p99, l.max, l.mean
            ),
        ]
    }

    /// The reports of several files read as one dataset (`lengths`: every kept row's token
    /// count, for the combined percentiles).
    pub fn combine(reports: &[&PrepareReport], lengths: &[u64]) -> PrepareReport {
        let sum = |f: fn(&PrepareReport) -> u64| reports.iter().map(|r| f(r)).sum();
        PrepareReport {
            format: reports.first().and_then(|r| r.format),
            rows_read: sum(|r| r.rows_read),
            rows: sum(|r| r.rows),
            tokens: sum(|r| r.tokens),
            trainable_tokens: sum(|r| r.trainable_tokens),
            truncated_rows: sum(|r| r.truncated_rows),
            lengths: LengthStats::of(lengths),
            bad_lines: reports
                .iter()
                .flat_map(|r| r.bad_lines.iter().cloned())
                .collect(),
            seconds: reports.iter().map(|r| r.seconds).sum(),
        }
    }

    /// The report as one JSON object (the `dataset` record of `metrics.jsonl`).
    pub fn to_json(&self) -> serde_json::Value {
        let skipped: serde_json::Map<String, serde_json::Value> = self
            .skipped()
            .into_iter()
            .map(|(k, n)| (k.as_str().to_string(), n.into()))
            .collect();
        serde_json::json!({
            "format": self.format.map(Format::as_str),
            "rows_read": self.rows_read,
            "rows": self.rows,
            "rows_skipped": self.bad_lines.len(),
            "skipped": skipped,
            "truncated_rows": self.truncated_rows,
            "tokens": self.tokens,
            "trainable_tokens": self.trainable_tokens,
            "length": self.lengths,
        })
    }
}

/// How many rows `--skip-bad-lines` lets format detection look through for one it can read.
const DETECT_ROWS: usize = 100;

/// The format of a file: `opts.format`, else detected from its first row (with
/// `opts.skip_bad_lines`, the first of its first `DETECT_ROWS` (100) rows that reads as a row of a
/// known format: the bad ones before it are skipped and reported with the others).
pub fn detect_format(path: &Path, opts: &PrepareOptions) -> Result<Format> {
    if let Some(f) = opts.format {
        return Ok(f);
    }
    let bad = |line, reason| DataError::Format {
        path: path.to_path_buf(),
        line,
        reason,
    };
    let mut source = Source::open(path, opts.max_line_bytes)?;
    let mut first_failure = None;
    for _ in 0..if opts.skip_bad_lines { DETECT_ROWS } else { 1 } {
        let Some((loc, raw)) = source.next_row()? else {
            break;
        };
        let detected = match raw {
            RawRow::Json(text) => rows::parse_json(&text)
                .map_err(|e| e.reason)
                .and_then(|v| rows::detect(&v)),
            RawRow::Value(v) => rows::detect(&v),
            RawRow::Bad(e) => Err(e.reason),
        };
        match detected {
            Ok(format) => return Ok(format),
            Err(reason) => {
                first_failure.get_or_insert((loc.line, reason));
            }
        }
    }
    Err(match first_failure {
        Some((line, reason)) => bad(line, reason),
        None => bad(0, "the file has no rows".into()),
    })
}

/// Encodes every row of `path` and passes `(line, row)` to `sink` in file order, saying every
/// 10 s (on stderr) how many rows it has read.
/// Conversations and text need `encoder`; pre-tokenized files use it only for `vocab_size`.
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
    let format = detect_format(path, opts)?;
    check_format(path, format, encoder, opts.label_mode)?;
    let vocab_size = opts.vocab_size.or(encoder.map(Encoder::vocab_size));
    let encode = |raw: &RawRow| -> Result<Encoded, RowError> {
        let parsed;
        let value = match raw {
            RawRow::Json(text) => {
                parsed = rows::parse_json(text)?;
                &parsed
            }
            RawRow::Value(v) => v,
            RawRow::Bad(e) => return Err(e.clone()),
        };
        let row = rows::parse(value, format, vocab_size).map_err(|mut e| {
            // A row of another format than the file's (detected from its first readable row).
            if let Some(other) = rows::detect(value).ok().filter(|&f| f != format) {
                e.reason = format!(
                    "{}; this row is a `{other}` row, but the file was read as `{format}` (from \
                     its first row): keep one format per file, or pass --data-format",
                    e.reason
                );
            }
            e
        })?;
        let Some(enc) = encoder else {
            return crate::encoder::encode_tokens(&row, opts.max_len, opts.label_mode);
        };
        let encoded = enc.encode(&row, opts.max_len, opts.label_mode)?;
        // A tokenizer with tokens the model has no embedding for (added tokens past its vocab).
        match (vocab_size, encoded.input_ids.iter().max()) {
            (Some(limit), Some(&id)) if id as usize >= limit => Err(RowError::new(
                SkipReason::Tokenizer,
                format!("the tokenizer gave token id {id}, past the model's vocab_size {limit}"),
            )),
            _ => Ok(encoded),
        }
    };
    let mut source = Source::open(path, opts.max_line_bytes)?;
    let mut report = PrepareReport {
        format: Some(format),
        ..Default::default()
    };
    let mut lengths = Vec::new();
    let mut chunk: Vec<(Location, RawRow)> = Vec::with_capacity(CHUNK);
    let mut notes = Schedule::progress();
    loop {
        if notes.due_now() {
            eprintln!(
                "data: tokenizing {}: {} rows in {} s",
                path.display(),
                report.rows_read,
                notes.elapsed_s()
            );
        }
        chunk.clear();
        while chunk.len() < CHUNK {
            match source.next_row()? {
                Some(row) => chunk.push(row),
                None => break,
            }
        }
        if chunk.is_empty() {
            break;
        }
        let encoded: Vec<(Location, Result<Encoded, RowError>)> = chunk
            .par_iter()
            .map(|(loc, raw)| (*loc, encode(raw)))
            .collect();
        for (loc, row) in encoded {
            report.rows_read += 1;
            match row {
                Ok(enc) => {
                    report.rows += 1;
                    report.tokens += enc.input_ids.len() as u64;
                    report.trainable_tokens += labels::count_targets(&enc.labels) as u64;
                    report.truncated_rows += u64::from(enc.truncated);
                    lengths.push(enc.input_ids.len() as u64);
                    sink(loc.line, enc)?;
                }
                Err(e) => report.bad_lines.push(BadLine {
                    line: loc.line,
                    row_group: loc.row_group,
                    kind: e.kind,
                    reason: e.reason,
                }),
            }
        }
    }
    // With every row bad there is nothing to skip to: list them even with skip_bad_lines.
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
    report.lengths = LengthStats::of(&lengths);
    report.seconds = start.elapsed().as_secs_f64();
    Ok(report)
}

/// File-level checks before any row: what the format needs, and label modes it cannot have.
fn check_format(
    path: &Path,
    format: Format,
    encoder: Option<&Encoder>,
    mode: LabelMode,
) -> Result<()> {
    let config = |field, msg: String| Err(DataError::Config { field, msg });
    match (format, encoder) {
        (Format::Tokens, _) => {}
        (_, None) => {
            return config(
                "model",
                format!(
                "{} is {format} data: it needs a tokenizer (a model directory with tokenizer.json)",
                path.display()
            ),
            )
        }
        (Format::Chat | Format::ShareGpt, Some(enc)) => {
            enc.template()?;
        }
        _ => {}
    }
    if format == Format::Text && mode == LabelMode::AssistantOnly {
        return config(
            "labels",
            format!(
                "{} is plain text: it has no assistant turns for --labels assistant_only (use auto or full)",
                path.display()
            ),
        );
    }
    Ok(())
}

/// Skipped rows warned about one by one; the others are counted in one line.
pub const SKIPPED_SHOWN: usize = 20;

/// The warnings about the skipped rows of `files` (each data file with its report): one line per
/// row for the first [`SKIPPED_SHOWN`], then one counting the others and naming `listed_in`
/// (where [`write_skipped_rows`] put them all), then one when most rows read were skipped.
pub fn skipped_row_warnings(
    files: &[(&Path, &PrepareReport)],
    listed_in: Option<&Path>,
) -> Vec<String> {
    let rows = files
        .iter()
        .flat_map(|(path, r)| r.bad_lines.iter().map(move |b| (*path, b)));
    let total = files.iter().map(|(_, r)| r.bad_lines.len()).sum::<usize>();
    let mut out: Vec<String> = rows
        .take(SKIPPED_SHOWN)
        .map(|(path, bad)| {
            format!(
                "warning: {}: skipped ({}): {}",
                bad.location(path),
                bad.kind.as_str(),
                bad.reason
            )
        })
        .collect();
    if total > SKIPPED_SHOWN {
        out.push(format!(
            "warning: {} more rows skipped{}",
            total - SKIPPED_SHOWN,
            listed_in.map_or(String::new(), |p| format!(
                "; every skipped row is listed in {}",
                p.display()
            ))
        ));
    }
    let read: u64 = files.iter().map(|(_, r)| r.rows_read).sum();
    if read > 0 && 2 * total as u64 > read {
        out.push(format!(
            "warning: {total} of {read} rows were skipped: check --data-format, --labels and the \
             data itself"
        ));
    }
    out
}

/// Writes every skipped row of `files` to `path` as JSON lines (`file`, `line`, `row_group`,
/// `kind`, `reason`), replacing it whole.
pub fn write_skipped_rows(files: &[(&Path, &PrepareReport)], path: &Path) -> Result<()> {
    let mut text = String::new();
    for (file, report) in files {
        for bad in &report.bad_lines {
            let row = serde_json::json!({
                "file": file,
                "line": bad.line,
                "row_group": bad.row_group,
                "kind": bad.kind.as_str(),
                "reason": bad.reason,
            });
            text.push_str(&row.to_string());
            text.push('\n');
        }
    }
    let tmp = path.with_extension(format!("jsonl.{}", std::process::id()));
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| DataError::io(path, e))
}
