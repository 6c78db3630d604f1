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

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use candle_core::quantized::GgmlDType;
use clap::Parser;
use g4ft::gemma4::gguf_names::{gguf_tensor_name, LLAMA_CPP_ARCH};
use g4ft::lora::{read_adapter, write_gguf_adapter, GgufReport, CONFIG_NAME, WEIGHTS_NAME};

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

/// Exports as `args` say. The output's folder is created if needed; the output must not be a
/// directory or one of the adapter's own files.
pub fn run(args: &Args) -> Result<GgufReport> {
    let adapter = read_adapter(&args.adapter)
        .with_context(|| format!("--adapter {}", args.adapter.display()))?;
    let out = &args.gguf;
    if out.is_dir() {
        bail!(
            "--gguf {0} is a directory; give the file to write, e.g. {0}/adapter.gguf",
            out.display()
        );
    }
    for name in [CONFIG_NAME, WEIGHTS_NAME] {
        let input = args.adapter.join(name);
        if same_file(out, &input) {
            bail!(
                "--gguf {} is the adapter's own {name}; write the GGUF file beside it, e.g. {}",
                out.display(),
                args.adapter.join("adapter.gguf").display()
            );
        }
    }
    if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).with_context(|| format!("--gguf {}", out.display()))?;
    }
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

/// Whether `a` and `b` name the same existing file.
fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
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
