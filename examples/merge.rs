//! Merges a trained LoRA adapter into its base model and writes a full checkpoint in the base's
//! layout, which transformers (and `generate --model OUT`) load like the base.
//!
//! ```text
//! cargo run --release --example merge -- --model DIR_OR_ID --adapter DIR --out DIR \
//!     [--dtype bf16|f32] [--max-shard-bytes N]
//! ```
//! `W' = W + scale·B·A` for every adapted projection, as PEFT's `merge_and_unload` (delta in
//! fp32, added in the output dtype); every other tensor copied. Output: `model.safetensors`, or
//! shards `model-0000i-of-0000n.safetensors` + `model.safetensors.index.json` above
//! `--max-shard-bytes` (default 5 GB), and the base directory's other files (config, generation
//! config, tokenizer, chat template). `--dtype` casts every floating tensor first and sets
//! `dtype` in `config.json`; without it each tensor keeps the base's dtype. `--out` must not exist
//! or be empty, and appears whole or not at all (written beside it, then renamed), so a failed
//! merge never leaves half a checkpoint. A line on stderr per weight file written; at the end one
//! JSON line on stdout, `{"out", "shards", "merged", "bytes"}`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use candle_core::DType;
use clap::Parser;
use g4ft::gemma4::ModelFiles;
use g4ft::lora::{merge_adapter_dir, MergeOptions, MergeReport, ShardWritten};

#[derive(Parser, Debug)]
#[command(about = "Merge a LoRA adapter into its Gemma 4 base model (full checkpoint)")]
pub struct Args {
    /// Base model directory or Hugging Face Hub id.
    #[arg(long)]
    pub model: String,
    /// PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors).
    #[arg(long)]
    pub adapter: PathBuf,
    /// Output directory (must not exist, or be empty).
    #[arg(long)]
    pub out: PathBuf,
    /// Dtype of the written tensors (default: the base's).
    #[arg(long, value_parser = ["f32", "bf16"])]
    pub dtype: Option<String>,
    /// Largest shard in bytes.
    #[arg(long, default_value_t = 5_000_000_000)]
    pub max_shard_bytes: u64,
}

/// Merges as `args` say.
pub fn run(args: &Args) -> Result<MergeReport> {
    let files = ModelFiles::resolve(&args.model)?;
    let base = files
        .config
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    let dtype = args.dtype.as_deref().map(|d| match d {
        "bf16" => DType::BF16,
        _ => DType::F32,
    });
    let opts = MergeOptions {
        max_shard_bytes: args.max_shard_bytes,
        dtype,
        on_shard: Some(print_progress),
    };
    merge_adapter_dir(&base, &args.adapter, &args.out, opts)
        .with_context(|| format!("merging {} into {}", args.adapter.display(), base.display()))
}

/// One stderr line per weight file written.
fn print_progress(p: &ShardWritten) {
    eprintln!(
        "merge: {}/{} weight files written ({:.2} of {:.2} GB)",
        p.shard,
        p.shards,
        p.bytes as f64 / 1e9,
        p.total_bytes as f64 / 1e9
    );
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let result = run(&args).map(|report| {
        let line = serde_json::json!({
            "out": args.out.display().to_string(),
            "shards": report.shards.len(),
            "merged": report.merged,
            "bytes": report.total_bytes,
        });
        println!("{line}");
    });
    g4ft::trainer::config::cli::exit_code("", result)
}
