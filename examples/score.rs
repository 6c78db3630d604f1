//! Scores data with a Gemma 4 checkpoint: the mean token NLL exactly as transformers' causal-LM
//! loss computes it, summed over the whole dataset.
//!
//! ```text
//! cargo run --release --example score -- --model assets/tiny --data FILE|DIR|GLOB|HUB_ID \
//!     [--adapter DIR] [--labels auto|full|assistant_only] [--data-split S] [--max-len N] \
//!     [--dtype auto|f32|bf16] [--device auto|cpu|cuda] [--batch-size N]
//! ```
//! The data is read and tokenized as `train_ddp` reads it (`docs/data.md`): any format (chat,
//! ShareGPT, prompt/completion, text, token rows), a folder's or Hub dataset's split (default:
//! validation, else test, else train), the trained tokens of `--labels` scored. Token rows
//! `{"input_ids": [...], "labels": [...]?}` are scored as given (labels default to the input ids).
//! `--adapter DIR` applies a PEFT LoRA adapter (`adapter_config.json` +
//! `adapter_model.safetensors`, ours or PEFT's) on top of the base model before scoring. Rows are
//! right padded per batch with the pad id. Prints one JSON line `{"loss": L, "tokens": N,
//! "sequences": M}`: `L` = Σ NLL / N over every label token (shifted: the label of position t+1
//! is predicted at t), `N` = those tokens.

use std::path::Path;

use anyhow::{bail, Result};
use clap::Parser;
use g4ft::data::{
    detect_files_format, skipped_row_warnings, DataFiles, DatasetOptions, Encoder, Format,
    PrepareOptions, SplitChoice, TokenDataset,
};
use g4ft::gemma4::{Gemma4Model, Hub, ModelFiles, TokenBatch};
use g4ft::lora::LoraContext;
use g4ft::trainer::config::LabelsKind;
use g4ft::wait::Schedule;

#[derive(Parser, Debug)]
#[command(about = "Mean token NLL of a dataset under a Gemma 4 checkpoint")]
struct Args {
    /// Model directory (config.json + safetensors) or Hugging Face Hub id.
    #[arg(long)]
    model: String,
    #[command(flatten)]
    data: DataArgs,
    #[command(flatten)]
    run_on: g4ft::InferenceSettings,
    /// Sequences per forward.
    #[arg(long, default_value_t = 8)]
    batch_size: usize,
    /// PEFT LoRA adapter directory to apply before scoring.
    #[arg(long)]
    adapter: Option<std::path::PathBuf>,
}

/// What to score and which of its tokens (`train_ddp`'s flags of the same names).
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct DataArgs {
    /// A data file, folder, glob (quoted) or Hub dataset id.
    #[arg(long)]
    pub data: String,
    /// The split of a folder or Hub dataset (default: validation, else test, else train).
    #[arg(long)]
    pub data_split: Option<String>,
    /// The config (subset) of a dataset whose card lists several.
    #[arg(long)]
    pub data_config: Option<String>,
    /// Branch, tag or commit of a Hub dataset.
    #[arg(long, value_name = "REV")]
    pub data_revision: Option<String>,
    /// Which tokens are scored: what the format implies (auto), all, or assistant turns only.
    #[arg(long, value_enum, default_value_t = LabelsKind::Auto)]
    pub labels: LabelsKind,
    /// Row format (unset: detected from each file's first row).
    #[arg(long)]
    pub data_format: Option<Format>,
    /// Rows longer than this many tokens are cut (default: the model's context length).
    #[arg(long)]
    pub max_len: Option<usize>,
    /// Skip bad rows (each reported) instead of failing.
    #[arg(long)]
    pub skip_bad_lines: bool,
}

/// Every row of the data `args` names, tokenized as `train_ddp` tokenizes it with the model in
/// `model_dir` (its tokenizer and chat template; none for token rows): input ids and labels
/// (-100 = not scored). Rows whose scored tokens are all cut, or bad, are errors naming them.
pub(crate) fn read_rows(
    args: &DataArgs,
    model_dir: &Path,
    model: &g4ft::gemma4::Config,
) -> Result<Vec<(Vec<u32>, Vec<i64>)>> {
    let choice = SplitChoice {
        asked: args.data_split.as_deref(),
        defaults: &["validation", "test", "train"],
        flag: "--data-split",
        config: args.data_config.as_deref(),
        config_flag: "--data-config",
    };
    let files = DataFiles::resolve(
        &args.data,
        choice,
        &Hub::from_env(args.data_revision.as_deref()),
    )?;
    let prepare = PrepareOptions {
        max_len: args.max_len.unwrap_or(model.max_position_embeddings),
        label_mode: args.labels.into(),
        skip_bad_lines: args.skip_bad_lines,
        vocab_size: Some(model.vocab_size),
        format: args.data_format,
        ..Default::default()
    };
    let encoder = match detect_files_format(&files, &prepare)? {
        Format::Tokens => None,
        _ => Some(Encoder::from_model_dir(model_dir)?),
    };
    let opts = DatasetOptions {
        prepare,
        cache_dir: Some(std::env::temp_dir().join("g4ft-score-token-cache")),
        pad_id: Some(model.pad_token_id),
        ..Default::default()
    };
    let ds = TokenDataset::open_files(&files, encoder.as_ref(), &opts)?;
    let reports: Vec<_> = ds.file_reports().collect();
    for line in skipped_row_warnings(&reports, None) {
        eprintln!("{line}");
    }
    if files.files.len() > 1 || files.split.is_some() {
        eprintln!("score: {}", files.describe());
    }
    (0..ds.len())
        .map(|i| {
            let s = ds.sample(i)?;
            Ok((s.input_ids, s.labels.into_iter().map(i64::from).collect()))
        })
        .collect()
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
    let files = ModelFiles::resolve(&args.model)?;
    let model_dir = files.config.parent().unwrap_or(Path::new("."));
    let rows = read_rows(&args.data, model_dir, model.config())?;

    let (loss_sum, tokens) = score(&model, &rows, args.batch_size)?;
    let loss = loss_sum / tokens as f64;
    println!(
        "{}",
        serde_json::json!({"loss": loss, "tokens": tokens, "sequences": rows.len()})
    );
    Ok(())
}
