//! Exports a trained LoRA adapter for llama.cpp: a GGUF LoRA adapter that
//! `llama-cli -m BASE.gguf --lora ADAPTER.gguf` (or `llama-export-lora`) applies on top of the
//! base model's GGUF.
//!
//! ```text
//! cargo run --release --example export -- --adapter DIR --gguf FILE.gguf [--dtype f32|f16|bf16]
//! ```
//! Tensor names are llama.cpp's for Gemma 4 (`blk.{i}.attn_q.weight.lora_a`, ...), metadata
//! `general.type = adapter`, `general.architecture = gemma4`, `adapter.type = lora`,
//! `adapter.lora.alpha`; see `g4ft_lora::write_gguf_adapter` for how rsLoRA / alpha patterns are
//! kept exact. Prints one JSON line `{"gguf", "tensors", "alpha", "folded"}`.

use std::path::PathBuf;

use anyhow::{Context, Result};
use candle_core::quantized::GgmlDType;
use clap::Parser;
use g4ft::gemma4::gguf_names::{gguf_tensor_name, LLAMA_CPP_ARCH};
use g4ft::lora::{read_adapter, write_gguf_adapter, GgufReport};

#[derive(Parser, Debug)]
#[command(about = "Export a Gemma 4 LoRA adapter as a llama.cpp GGUF adapter")]
pub struct Args {
    /// PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors).
    #[arg(long)]
    pub adapter: PathBuf,
    /// Output GGUF file.
    #[arg(long)]
    pub gguf: PathBuf,
    /// Tensor type in the file.
    #[arg(long, default_value = "f32", value_parser = ["f32", "f16", "bf16"])]
    pub dtype: String,
}

/// Exports as `args` say.
pub fn run(args: &Args) -> Result<GgufReport> {
    let adapter = read_adapter(&args.adapter)
        .with_context(|| format!("--adapter {}", args.adapter.display()))?;
    let dtype = match args.dtype.as_str() {
        "f16" => GgmlDType::F16,
        "bf16" => GgmlDType::BF16,
        _ => GgmlDType::F32,
    };
    Ok(write_gguf_adapter(
        &adapter,
        &args.gguf,
        LLAMA_CPP_ARCH,
        dtype,
        gguf_tensor_name,
    )?)
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let result = run(&args).map(|report| {
        let line = serde_json::json!({
            "gguf": args.gguf.display().to_string(),
            "tensors": report.tensors,
            "alpha": report.alpha,
            "folded": report.folded,
        });
        println!("{line}");
    });
    g4ft::trainer::config::cli::exit_code("", result)
}
