//! Pre-tokenizes data (JSONL, Parquet, Arrow or CSV/TSV; chat, ShareGPT, prompt/completion, text
//! or token rows; a file, folder, glob or Hub dataset as `train_ddp --data` takes it) with a
//! model's tokenizer and chat template (only those files of the model directory are read) and
//! writes `{"input_ids": [...], "labels": [...]}` per row, the files' rows in order into one
//! JSONL.
//!
//! ```bash
//! cargo run --release --example prepare -- --model assets/tiny --data assets/sample/chat.jsonl \
//!     --out assets/sample/tokens.jsonl --max-len 256 --labels assistant_only
//! ```
//! Prints the dataset report (rows, skipped rows per reason, truncated rows, tokens, trainable
//! tokens, length percentiles; over every file), a warning per skipped row (past 20, one line
//! counting the rest, all of them written to OUT with the extension `.skipped.jsonl`), and
//! throughput (rows/s, tokens/s).

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Parser;
use g4ft::data::prepare::SKIPPED_SHOWN;
use g4ft::data::source::DEFAULT_MAX_LINE_BYTES;
use g4ft::data::{
    detect_files_format, skipped_row_warnings, tokenize_file, write_skipped_rows, DataFiles,
    Encoder, Format, LabelMode, PrepareOptions, PrepareReport, SplitChoice,
};
use g4ft::hub::Hub;

#[derive(Parser, Debug)]
#[command(about = "Tokenize data into pre-tokenized JSONL")]
struct Args {
    /// Model directory with tokenizer.json and chat_template.jinja (or tokenizer_config.json);
    /// not needed for token rows.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Input (JSONL, Parquet, Arrow or CSV/TSV): a file, a folder (its --data-split), a glob in
    /// quotes or a Hub dataset id, as train_ddp's --data.
    #[arg(long, value_name = "FILE|DIR|GLOB|HUB_ID")]
    data: String,
    /// The split of a folder or Hub dataset (default: train).
    #[arg(long)]
    data_split: Option<String>,
    /// The config (subset) of a dataset whose card lists several.
    #[arg(long)]
    data_config: Option<String>,
    /// Branch, tag or commit of a Hub dataset.
    #[arg(long, value_name = "REV")]
    data_revision: Option<String>,
    /// Pre-tokenized JSONL output.
    #[arg(long)]
    out: PathBuf,
    /// Truncation length in tokens.
    #[arg(long, default_value_t = 2048)]
    max_len: usize,
    /// auto | full | assistant_only
    #[arg(long, default_value = "auto")]
    labels: LabelMode,
    /// chat | sharegpt | prompt_completion | text | tokens (default: detect from the first row).
    #[arg(long)]
    data_format: Option<Format>,
    /// JSONL lines longer than this are bad rows, skipped without being parsed; a CSV record
    /// longer than this is an error.
    #[arg(long, default_value_t = DEFAULT_MAX_LINE_BYTES)]
    max_line_bytes: usize,
    /// Skip bad rows (and list them) instead of failing (a CSV file whose structure is broken
    /// still fails).
    #[arg(long)]
    skip_bad_lines: bool,
    /// enable_thinking passed to the chat template, as train_ddp's flag (rows may set their own;
    /// unset: not passed; the flag alone: true).
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    enable_thinking: Option<bool>,
}

fn main() -> std::process::ExitCode {
    g4ft::trainer::config::cli::exit_code("", run(&Args::parse()))
}

/// Whether `a` and `b` name the same file (the same inode, whatever the spelling).
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}

fn run(args: &Args) -> anyhow::Result<()> {
    if args.max_len == 0 {
        anyhow::bail!("--max-len must be at least 1");
    }
    let choice =
        SplitChoice::train(args.data_split.as_deref()).with_config(args.data_config.as_deref());
    let files = DataFiles::resolve(
        &args.data,
        choice,
        &Hub::from_env(args.data_revision.as_deref()),
    )?;
    if let Some(input) = files.files.iter().find(|f| same_file(f, &args.out)) {
        anyhow::bail!(
            "--out {} is the data file {}: writing it would replace the data with token rows; choose another --out",
            args.out.display(),
            input.display()
        );
    }
    let encoder = match &args.model {
        Some(dir) => {
            let encoder = Encoder::from_model_dir(dir)?;
            Some(match args.enable_thinking {
                Some(on) => encoder.with_enable_thinking(on),
                None => encoder,
            })
        }
        None => None,
    };
    let mut opts = PrepareOptions {
        max_len: args.max_len,
        label_mode: args.labels,
        skip_bad_lines: args.skip_bad_lines,
        vocab_size: None,
        format: args.data_format,
        max_line_bytes: args.max_line_bytes,
    };
    // Every file is read as the format of the first (two formats are an error naming one of each).
    opts.format = Some(detect_files_format(&files, &opts)?);
    let tmp = args.out.with_extension("jsonl.tmp");
    let (reports, lengths) = match write_token_rows(&files, encoder.as_ref(), &opts, &tmp) {
        Ok(done) => done,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    };
    if let Err(e) = std::fs::rename(&tmp, &args.out) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("renaming to {}", args.out.display()));
    }
    let by_file: Vec<(&Path, &PrepareReport)> = files
        .files
        .iter()
        .map(PathBuf::as_path)
        .zip(&reports)
        .collect();
    let report = match reports.as_slice() {
        [one] => one.clone(),
        _ => PrepareReport::combine(&reports.iter().collect::<Vec<_>>(), &lengths),
    };
    let listed_in =
        (report.bad_lines.len() > SKIPPED_SHOWN).then(|| args.out.with_extension("skipped.jsonl"));
    if let Some(path) = &listed_in {
        write_skipped_rows(&by_file, path)?;
    }
    for line in skipped_row_warnings(&by_file, listed_in.as_deref()) {
        eprintln!("{line}");
    }
    if report.mostly_truncated() {
        eprintln!(
            "warning: {} of {} rows are longer than --max-len {} and were truncated",
            report.truncated_rows, report.rows, args.max_len
        );
    }
    let secs = report.seconds.max(1e-9);
    println!("{:<18} {}", "data", files.describe());
    println!("{:<18} {}", "out", args.out.display());
    println!("{:<18} {}", "labels", args.labels.as_str());
    println!("{:<18} {}", "max_len", args.max_len);
    for line in report.lines() {
        println!("{line}");
    }
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("{:<18} {:.3} s ({threads} threads)", "time", report.seconds);
    println!("{:<18} {:.0}", "rows/s", report.rows as f64 / secs);
    println!("{:<18} {:.0}", "tokens/s", report.tokens as f64 / secs);
    Ok(())
}

/// Writes the token rows of every file, in order, to `tmp`; each file's report and every kept
/// row's length.
fn write_token_rows(
    files: &DataFiles,
    encoder: Option<&Encoder>,
    opts: &PrepareOptions,
    tmp: &Path,
) -> anyhow::Result<(Vec<PrepareReport>, Vec<u64>)> {
    let file = std::fs::File::create(tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let mut out = std::io::BufWriter::new(file);
    let mut lengths = Vec::new();
    let mut reports = Vec::with_capacity(files.files.len());
    for path in &files.files {
        let report = tokenize_file(path, encoder, opts, |_, row| {
            lengths.push(row.input_ids.len() as u64);
            serde_json::to_writer(
                &mut out,
                &serde_json::json!({"input_ids": row.input_ids, "labels": row.labels}),
            )
            .and_then(|()| out.write_all(b"\n").map_err(serde_json::Error::io))
            .map_err(|e| g4ft::data::DataError::io(tmp, std::io::Error::other(e)))
        })?;
        reports.push(report);
    }
    out.flush()
        .with_context(|| format!("writing {}", tmp.display()))?;
    Ok((reports, lengths))
}
