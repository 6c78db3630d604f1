//! Scores pre-tokenized JSONL with a Gemma 4 checkpoint: the mean token NLL exactly as
//! transformers' causal-LM loss computes it, summed over the whole file.
//!
//! ```text
//! cargo run --release --example score -- --model assets/tiny --data FILE.jsonl \
//!     [--adapter DIR] [--dtype auto|f32|bf16] [--device auto|cpu|cuda] [--batch-size N]
//! ```
//! `--adapter DIR` applies a PEFT LoRA adapter (`adapter_config.json` + `adapter_model.safetensors`,
//! ours or PEFT's) on top of the base model before scoring.
//! Each line is `{"input_ids": [...]}` with optional `"labels": [...]` (same length, -100 =
//! ignore; default: the input ids). Rows are right padded per batch with the pad id. Prints one
//! JSON line `{"loss": L, "tokens": N, "sequences": M}`: `L` = Σ NLL / N over every label token of
//! the file (shifted: the label of position t+1 is predicted at t), `N` = those tokens.

use anyhow::{bail, Context, Result};
use clap::Parser;
use g4ft::gemma4::{Gemma4Model, TokenBatch};
use g4ft::lora::LoraContext;
use g4ft::wait::Schedule;

#[derive(Parser, Debug)]
#[command(about = "Mean token NLL of pre-tokenized JSONL under a Gemma 4 checkpoint")]
struct Args {
    /// Model directory (config.json + safetensors) or Hugging Face Hub id.
    #[arg(long)]
    model: String,
    /// Pre-tokenized JSONL: {"input_ids": [...], "labels": [...]?} per line.
    #[arg(long)]
    data: String,
    #[command(flatten)]
    run_on: g4ft::InferenceSettings,
    /// Sequences per forward.
    #[arg(long, default_value_t = 8)]
    batch_size: usize,
    /// PEFT LoRA adapter directory to apply before scoring.
    #[arg(long)]
    adapter: Option<std::path::PathBuf>,
}

/// One JSONL row.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Row {
    input_ids: Vec<u32>,
    labels: Option<Vec<i64>>,
}

/// Reads and validates every row; errors name the 1-based line number.
pub(crate) fn read_rows(path: &str, vocab: usize) -> Result<Vec<(Vec<u32>, Vec<i64>)>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        if line.trim().is_empty() {
            continue;
        }
        let row: Row = serde_json::from_str(line).with_context(|| {
            let text_row = [
                "\"messages\"",
                "\"conversations\"",
                "\"prompt\"",
                "\"text\"",
            ]
            .iter()
            .any(|k| line.contains(k));
            let hint = if text_row {
                " (score reads token rows: tokenize chat or text rows with the `prepare` example \
                 first)"
            } else {
                ""
            };
            format!("{path}:{n}: invalid row{hint}")
        })?;
        if row.input_ids.is_empty() {
            bail!("{path}:{n}: input_ids is empty");
        }
        if let Some(&bad) = row.input_ids.iter().find(|&&id| id as usize >= vocab) {
            bail!("{path}:{n}: token id {bad} is outside the vocabulary (size {vocab})");
        }
        let labels = match row.labels {
            Some(l) if l.len() != row.input_ids.len() => bail!(
                "{path}:{n}: labels has {} values, input_ids has {}",
                l.len(),
                row.input_ids.len()
            ),
            Some(l) => {
                if let Some(&bad) = l
                    .iter()
                    .find(|&&x| x != -100 && (x < 0 || x as usize >= vocab))
                {
                    bail!("{path}:{n}: label {bad} is neither -100 nor a token id < {vocab}");
                }
                l
            }
            None => row.input_ids.iter().map(|&x| x as i64).collect(),
        };
        rows.push((row.input_ids, labels));
    }
    if rows.is_empty() {
        bail!("{path}: no rows");
    }
    // Position t predicts the label of t + 1: a row's first label is never scored.
    if rows
        .iter()
        .all(|(_, l)| l.iter().skip(1).all(|&x| x == -100))
    {
        bail!(
            "{path}: no token to score: every row has one token, or -100 for every label after \
             its first"
        );
    }
    Ok(rows)
}

/// Σ NLL and the number of label tokens over `rows`, `batch_size` rows per forward (right padded
/// with the pad id, attention mask 0 and label -100 on padding).
pub(crate) fn score(
    model: &Gemma4Model,
    rows: &[(Vec<u32>, Vec<i64>)],
    batch_size: usize,
) -> Result<(f64, usize)> {
    let pad = model.config().pad_token_id;
    let (mut loss_sum, mut tokens) = (0f64, 0usize);
    let mut notes = Schedule::progress();
    for (i, chunk) in rows.chunks(batch_size.max(1)).enumerate() {
        if notes.due_now() {
            eprintln!(
                "score: {} of {} rows in {} s",
                i * batch_size.max(1),
                rows.len(),
                notes.elapsed_s()
            );
        }
        let t = chunk.iter().map(|(ids, _)| ids.len()).max().unwrap_or(0);
        let b = chunk.len();
        let (mut ids, mut mask, mut labels) =
            (vec![pad; b * t], vec![0u32; b * t], vec![-100i64; b * t]);
        for (r, (row_ids, row_labels)) in chunk.iter().enumerate() {
            ids[r * t..r * t + row_ids.len()].copy_from_slice(row_ids);
            mask[r * t..r * t + row_ids.len()].fill(1);
            labels[r * t..r * t + row_labels.len()].copy_from_slice(row_labels);
        }
        let batch = TokenBatch {
            input_ids: &ids,
            attention_mask: Some(&mask),
            position_ids: None,
            batch: b,
            seq_len: t,
        };
        let out = model.loss(&batch, &labels, &LoraContext::EVAL)?;
        loss_sum += out.sum.to_scalar::<f32>()? as f64;
        tokens += out.n_tokens;
    }
    Ok((loss_sum, tokens))
}

fn main() -> std::process::ExitCode {
    g4ft::trainer::config::cli::exit_code("", run(&Args::parse()))
}

fn run(args: &Args) -> Result<()> {
    if args.batch_size == 0 {
        bail!("--batch-size must be at least 1");
    }
    let (device, dtype, note) = args.run_on.resolve()?;
    if let Some(note) = note {
        eprintln!("{note}");
    }
    let model = g4ft::load_inference_model(&args.model, args.adapter.as_deref(), &device, dtype)?;
    let rows = read_rows(&args.data, model.config().vocab_size)?;

    let (loss_sum, tokens) = score(&model, &rows, args.batch_size)?;
    let loss = loss_sum / tokens as f64;
    println!(
        "{}",
        serde_json::json!({"loss": loss, "tokens": tokens, "sequences": rows.len()})
    );
    Ok(())
}
