//! Pre-tokenizes chat JSONL with a model's tokenizer and chat template (only those files of the
//! model directory are read) and writes `{"input_ids": [...], "labels": [...]}` per row.
//!
//! ```bash
//! cargo run --release --example prepare -- --model assets/tiny --data assets/sample/chat.jsonl \
//!     --out assets/sample/tokens.jsonl --max-len 256 --labels assistant_only
//! ```
//! Prints rows, tokens, trainable tokens, truncated rows and throughput (rows/s, tokens/s).

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use g4ft::data::{tokenize_file, Encoder, LabelMode, PrepareOptions};

#[derive(Parser, Debug)]
#[command(about = "Tokenize chat JSONL into pre-tokenized JSONL")]
struct Args {
    /// Model directory with tokenizer.json and chat_template.jinja (or tokenizer_config.json).
    #[arg(long)]
    model: PathBuf,
    /// Chat JSONL input.
    #[arg(long)]
    data: PathBuf,
    /// Pre-tokenized JSONL output.
    #[arg(long)]
    out: PathBuf,
    /// Truncation length in tokens.
    #[arg(long, default_value_t = 2048)]
    max_len: usize,
    /// full | assistant_only
    #[arg(long, default_value = "full")]
    labels: LabelMode,
    /// Skip bad lines (and list them) instead of failing.
    #[arg(long)]
    skip_bad_lines: bool,
    /// Pass enable_thinking=true to the chat template.
    #[arg(long)]
    enable_thinking: bool,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut encoder = Encoder::from_model_dir(&args.model)?;
    if args.enable_thinking {
        encoder = encoder.with_enable_thinking(true);
    }
    let opts = PrepareOptions {
        max_len: args.max_len,
        label_mode: args.labels,
        skip_bad_lines: args.skip_bad_lines,
        vocab_size: None,
    };
    let tmp = args.out.with_extension("jsonl.tmp");
    let file =
        std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let mut out = std::io::BufWriter::new(file);
    let result = tokenize_file(&args.data, Some(&encoder), &opts, |_, row| {
        serde_json::to_writer(
            &mut out,
            &serde_json::json!({"input_ids": row.input_ids, "labels": row.labels}),
        )
        .and_then(|()| out.write_all(b"\n").map_err(serde_json::Error::io))
        .map_err(|e| g4ft::data::DataError::io(&tmp, std::io::Error::other(e)))
    });
    let report = match result {
        Ok(report) => report,
        Err(e) => {
            drop(out);
            let _ = std::fs::remove_file(&tmp);
            return Err(e.into());
        }
    };
    out.flush()
        .with_context(|| format!("writing {}", tmp.display()))?;
    drop(out);
    std::fs::rename(&tmp, &args.out)
        .with_context(|| format!("renaming to {}", args.out.display()))?;
    for bad in &report.bad_lines {
        eprintln!(
            "skipped {}:{}: {}",
            args.data.display(),
            bad.line,
            bad.reason
        );
    }
    let secs = report.seconds.max(1e-9);
    println!("{:<18} {}", "data", args.data.display());
    println!("{:<18} {}", "out", args.out.display());
    println!("{:<18} {}", "labels", args.labels.as_str());
    println!("{:<18} {}", "max_len", args.max_len);
    println!("{:<18} {}", "rows", report.rows);
    println!("{:<18} {}", "skipped lines", report.bad_lines.len());
    println!("{:<18} {}", "tokens", report.tokens);
    println!("{:<18} {}", "trainable tokens", report.trainable_tokens);
    println!("{:<18} {}", "truncated rows", report.truncated_rows);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("{:<18} {:.3} s ({threads} threads)", "time", report.seconds);
    println!("{:<18} {:.0}", "rows/s", report.rows as f64 / secs);
    println!("{:<18} {:.0}", "tokens/s", report.tokens as f64 / secs);
    Ok(())
}
