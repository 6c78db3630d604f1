//! Command-line flags of `train_ddp` (clap derive) and the resolution of all layers:
//! defaults < `--config` TOML < `MODEL_ID`/`DATA_PATH`/`OUTPUT_DIR` < flags; and [`ShapeArgs`],
//! the shape flags that the `bench_train` and `memory_plan` examples share.

use std::collections::BTreeMap;
use std::path::PathBuf;

use candle_core::DType;
use clap::Parser;

use crate::config::{
    DTypeKind, DeviceKind, LabelsKind, OnNonFinite, Origin, ResolvedConfig, TrainConfig,
};
use crate::error::Result;
use crate::layer::{ConfigLayer, ENV_VARS};

/// LoRA fine-tuning of Gemma 4 with DDP: the post's `train_ddp.py`. Every flag overrides the TOML
/// key of the same name (dashes → underscores), which overrides the post's environment variables'
/// defaults. Launch one process per device with `ddprun` or `torchrun --no-python`.
#[derive(Debug, Clone, Default, Parser)]
#[command(name = "train_ddp", version)]
#[allow(missing_docs)] // clap shows the `///` of each field as its help; see TrainConfig
pub struct Cli {
    /// TOML file with any of the settings below (keys = flag names with underscores)
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Hub id or local directory of the base model [env: MODEL_ID]
    #[arg(long, value_name = "ID|DIR")]
    pub model: Option<String>,
    /// Training data: JSONL or Parquet, chat/ShareGPT/prompt-completion/text/token rows [env: DATA_PATH]
    #[arg(long, value_name = "FILE")]
    pub data: Option<PathBuf>,
    /// Evaluation data, same formats (evaluated on every rank, metrics all-reduced)
    #[arg(long, value_name = "FILE")]
    pub eval_data: Option<PathBuf>,
    /// Output directory for checkpoints, metrics and the loss plot [env: OUTPUT_DIR]
    #[arg(long, value_name = "DIR")]
    pub output: Option<PathBuf>,
    #[arg(long, value_enum)]
    pub device: Option<DeviceKind>,
    /// Dtype of the frozen base weights (adapters and optimizer are always fp32)
    #[arg(long, value_enum)]
    pub dtype: Option<DTypeKind>,
    /// Tokens per sample after truncation
    #[arg(long)]
    pub max_len: Option<usize>,
    /// Samples per rank per forward pass
    #[arg(long)]
    pub micro_batch: Option<usize>,
    /// Micro-batches per optimizer step (gradient accumulation)
    #[arg(long)]
    pub accum: Option<usize>,
    #[arg(long)]
    pub epochs: Option<usize>,
    /// Stop after this many optimizer steps
    #[arg(long)]
    pub max_steps: Option<usize>,
    /// Peak learning rate
    #[arg(long)]
    pub lr: Option<f64>,
    /// Linear warmup steps before the cosine decay
    #[arg(long)]
    pub warmup: Option<usize>,
    /// AdamW decoupled weight decay
    #[arg(long)]
    pub weight_decay: Option<f64>,
    /// Global gradient-norm clip (0 = off)
    #[arg(long)]
    pub max_grad_norm: Option<f64>,
    #[arg(long)]
    pub seed: Option<u64>,
    #[arg(long)]
    pub lora_r: Option<usize>,
    #[arg(long)]
    pub lora_alpha: Option<f64>,
    #[arg(long)]
    pub lora_dropout: Option<f64>,
    /// Regex over module paths (PEFT full-match semantics)
    #[arg(long, value_name = "REGEX")]
    pub lora_targets: Option<String>,
    /// Loss on what the format implies (auto), all tokens, or assistant turns only
    #[arg(long, value_enum)]
    pub labels: Option<LabelsKind>,
    /// Row format: chat, sharegpt, prompt_completion, text or tokens (default: detect)
    #[arg(long, value_name = "FORMAT")]
    pub data_format: Option<g4ft_data::Format>,
    /// Pass enable_thinking=true to the chat template (rows may set their own)
    #[arg(long)]
    pub enable_thinking: bool,
    /// JSONL lines longer than this are bad rows, skipped without being parsed
    #[arg(long, value_name = "BYTES")]
    pub max_line_bytes: Option<usize>,
    /// Pack several samples into each row of --max-len tokens
    #[arg(long)]
    pub packing: bool,
    /// Batch samples of similar length together
    #[arg(long)]
    pub group_by_length: bool,
    /// Keep the data order (the sampler does not shuffle)
    #[arg(long)]
    pub no_shuffle: bool,
    /// Skip malformed rows, with a warning per row, instead of stopping
    #[arg(long)]
    pub skip_bad_lines: bool,
    /// Start from this PEFT adapter directory's weights
    #[arg(long, value_name = "DIR")]
    pub init_adapter: Option<PathBuf>,
    /// Continue from this checkpoint directory
    #[arg(long, value_name = "DIR")]
    pub resume: Option<PathBuf>,
    /// Also checkpoint every N optimizer steps
    #[arg(long, value_name = "N")]
    pub save_every: Option<usize>,
    /// Evaluate every N optimizer steps (needs --eval-data)
    #[arg(long, value_name = "N")]
    pub eval_every: Option<usize>,
    /// Log every N optimizer steps
    #[arg(long, value_name = "N")]
    pub log_every: Option<usize>,
    /// Sum token losses and divide by the global token count
    #[arg(long)]
    pub token_weighted_loss: bool,
    /// DDP bucket size in MiB
    #[arg(long, value_name = "MIB")]
    pub bucket_cap_mb: Option<f64>,
    /// Seconds a collective may block before the job fails
    #[arg(long, value_name = "SECONDS")]
    pub collective_timeout_s: Option<u64>,
    /// Non-finite loss or gradient: stop, or skip the step
    #[arg(long, value_enum)]
    pub on_nonfinite: Option<OnNonFinite>,
    /// With --on-nonfinite skip: stop after this many skipped steps in a row
    #[arg(long, value_name = "N")]
    pub max_nonfinite_skips: Option<usize>,
    /// Dense bf16 peak TFLOP/s of one device, for MFU (default: GPU table)
    #[arg(long, value_name = "TFLOPS")]
    pub peak_tflops: Option<f64>,
    /// Benchmark: random token ids of exactly --max-len instead of the JSONL
    #[arg(long)]
    pub synthetic: bool,
    /// Benchmark: random base weights from the model's config.json
    #[arg(long)]
    pub random_init: bool,
}

impl Cli {
    /// The layer of settings given as flags (boolean switches only ever turn their setting on,
    /// or for `--no-shuffle` off; absent switches leave lower layers alone).
    pub fn layer(&self) -> ConfigLayer {
        let on = |b: bool| b.then_some(true);
        ConfigLayer {
            model: self.model.clone(),
            data: self.data.clone(),
            eval_data: self.eval_data.clone(),
            output: self.output.clone(),
            device: self.device,
            dtype: self.dtype,
            max_len: self.max_len,
            labels: self.labels,
            data_format: self.data_format,
            enable_thinking: on(self.enable_thinking),
            max_line_bytes: self.max_line_bytes,
            packing: on(self.packing),
            group_by_length: on(self.group_by_length),
            shuffle: self.no_shuffle.then_some(false),
            skip_bad_lines: on(self.skip_bad_lines),
            micro_batch: self.micro_batch,
            accum: self.accum,
            epochs: self.epochs,
            max_steps: self.max_steps,
            lr: self.lr,
            warmup: self.warmup,
            weight_decay: self.weight_decay,
            max_grad_norm: self.max_grad_norm,
            token_weighted_loss: on(self.token_weighted_loss),
            seed: self.seed,
            lora_r: self.lora_r,
            lora_alpha: self.lora_alpha,
            lora_dropout: self.lora_dropout,
            lora_targets: self.lora_targets.clone(),
            init_adapter: self.init_adapter.clone(),
            resume: self.resume.clone(),
            save_every: self.save_every,
            eval_every: self.eval_every,
            log_every: self.log_every,
            bucket_cap_mb: self.bucket_cap_mb,
            collective_timeout_s: self.collective_timeout_s,
            on_nonfinite: self.on_nonfinite,
            max_nonfinite_skips: self.max_nonfinite_skips,
            peak_tflops: self.peak_tflops,
            synthetic: on(self.synthetic),
            random_init: on(self.random_init),
        }
    }

    /// Applies all layers (defaults < `--config` file < environment < flags) and validates the
    /// result. `env` looks up environment variables (`|k| std::env::var(k).ok()` in `main`).
    pub fn resolve(&self, env: impl Fn(&str) -> Option<String>) -> Result<ResolvedConfig> {
        let mut config = TrainConfig::default();
        let mut origins = BTreeMap::new();
        if let Some(path) = &self.config {
            ConfigLayer::from_toml_file(path)?
                .apply_to(&mut config, &mut origins, |_| Origin::File(path.clone()));
        }
        ConfigLayer::from_env(env).apply_to(&mut config, &mut origins, |field| {
            let var = ENV_VARS.iter().find(|(_, f)| *f == field).map(|(v, _)| *v);
            Origin::Env(var.expect("the env layer sets only the fields listed in ENV_VARS"))
        });
        self.layer()
            .apply_to(&mut config, &mut origins, |_| Origin::Flag);
        let resolved = ResolvedConfig { config, origins };
        resolved.validate()?;
        Ok(resolved)
    }
}

/// The flags `bench_train` and `memory_plan` share (`#[command(flatten)]` in both): the model
/// config and the shape of one training micro-batch. Names and defaults are the ones
/// `tools/gpu/*.sh` pass.
#[derive(Debug, Clone, clap::Args)]
pub struct ShapeArgs {
    /// Gemma 4 config.json (text or multimodal).
    #[arg(long)]
    pub config: PathBuf,
    /// Tokens per sample.
    #[arg(long, default_value_t = 2048)]
    pub seq: usize,
    /// Samples per micro-batch.
    #[arg(long, default_value_t = 1)]
    pub micro_batch: usize,
    /// LoRA rank.
    #[arg(long, default_value_t = 16)]
    pub lora_r: usize,
    /// Frozen weight / activation dtype: bf16 or f32.
    #[arg(long, default_value = "bf16")]
    pub dtype: String,
}

impl ShapeArgs {
    /// `--dtype` as a Candle dtype; anything but `bf16` or `f32` is an error naming the value.
    pub fn dtype(&self) -> anyhow::Result<DType> {
        match self.dtype.as_str() {
            "bf16" => Ok(DType::BF16),
            "f32" => Ok(DType::F32),
            other => anyhow::bail!("--dtype: expected bf16 or f32, got {other:?}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn repo_config(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../configs")
            .join(name)
    }

    #[test]
    fn flags_parse_like_the_issue_lists_them() {
        let cli = Cli::try_parse_from([
            "train_ddp",
            "--model",
            "assets/tiny",
            "--labels",
            "assistant_only",
            "--no-shuffle",
            "--token-weighted-loss",
            "--dtype",
            "f32",
            "--device",
            "cpu",
            "--max-steps",
            "3",
            "--lr",
            "2e-4",
            "--lora-targets",
            ".*q_proj",
        ])
        .unwrap();
        let r = cli.resolve(no_env).unwrap();
        let c = &r.config;
        assert_eq!(c.model, "assets/tiny");
        assert_eq!(c.labels, LabelsKind::AssistantOnly);
        assert!(!c.shuffle && c.token_weighted_loss);
        assert_eq!(
            (c.dtype, c.device, c.max_steps, c.lr),
            (DTypeKind::F32, DeviceKind::Cpu, Some(3), 2e-4)
        );
        assert_eq!(r.origin("lr"), Origin::Flag);
        assert_eq!(r.origin("accum"), Origin::Default);
    }

    #[test]
    fn layering_order_is_default_file_env_flag() {
        let path = repo_config("tiny-cpu.toml");
        let env = |k: &str| match k {
            "MODEL_ID" => Some("env-model".to_string()),
            "OUTPUT_DIR" => Some("env-out".to_string()),
            _ => None,
        };
        let cli = Cli::try_parse_from([
            "t",
            "--config",
            path.to_str().unwrap(),
            "--output",
            "flag-out",
        ])
        .unwrap();
        let r = cli.resolve(env).unwrap();
        assert_eq!(r.config.model, "env-model", "env beats file");
        assert_eq!(r.origin("model"), Origin::Env("MODEL_ID"));
        assert_eq!(r.config.output, PathBuf::from("flag-out"), "flag beats env");
        assert_eq!(r.config.max_len, 128, "file beats default");
        assert_eq!(r.origin("max_len"), Origin::File(path.clone()));
        assert_eq!(r.config.seed, 42, "default where nobody sets it");
    }

    #[test]
    fn shipped_configs_resolve() {
        let big = Cli {
            config: Some(repo_config("gemma4-12b-lora.toml")),
            ..Cli::default()
        };
        let big = big.resolve(no_env).unwrap().config;
        assert_eq!(
            big,
            TrainConfig::default(),
            "the 12B config restates the post's values"
        );

        let tiny = Cli {
            config: Some(repo_config("tiny-cpu.toml")),
            ..Cli::default()
        };
        let tiny = tiny.resolve(no_env).unwrap().config;
        assert_eq!((tiny.device, tiny.dtype), (DeviceKind::Cpu, DTypeKind::F32));
        assert_eq!(
            (tiny.micro_batch, tiny.accum, tiny.log_every, tiny.warmup),
            (2, 2, 1, 2)
        );
        assert_eq!(tiny.lr, 1e-3);
    }

    #[test]
    fn invalid_flag_value_is_reported_with_its_origin() {
        let cli = Cli::try_parse_from(["t", "--accum", "0"]).unwrap();
        let msg = cli.resolve(no_env).unwrap_err().to_string();
        assert!(msg.contains("`accum` = 0 (set by flag)"), "{msg}");
    }

    /// A command line with only the shared shape flags, as the examples flatten them.
    #[derive(Debug, Parser)]
    struct ShapeOnly {
        #[command(flatten)]
        shape: ShapeArgs,
    }

    #[test]
    fn shape_flags_keep_the_scripts_names_and_defaults() {
        let d = ShapeOnly::try_parse_from(["t", "--config", "c.json"])
            .unwrap()
            .shape;
        assert_eq!(d.config, PathBuf::from("c.json"));
        assert_eq!((d.seq, d.micro_batch, d.lora_r), (2048, 1, 16));
        assert_eq!(d.dtype().unwrap(), DType::BF16);
        let s = ShapeOnly::try_parse_from([
            "t",
            "--config",
            "c.json",
            "--seq",
            "64",
            "--micro-batch",
            "2",
            "--lora-r",
            "8",
            "--dtype",
            "f32",
        ])
        .unwrap()
        .shape;
        assert_eq!((s.seq, s.micro_batch, s.lora_r), (64, 2, 8));
        assert_eq!(s.dtype().unwrap(), DType::F32);
        assert!(
            ShapeOnly::try_parse_from(["t"]).is_err(),
            "--config is required"
        );
    }

    #[test]
    fn shape_dtype_names_the_rejected_value() {
        let s = ShapeOnly::try_parse_from(["t", "--config", "c.json", "--dtype", "f16"])
            .unwrap()
            .shape;
        let msg = s.dtype().unwrap_err().to_string();
        assert_eq!(msg, "--dtype: expected bf16 or f32, got \"f16\"");
    }

    #[test]
    fn missing_config_file_names_the_path() {
        let cli = Cli::try_parse_from(["t", "--config", "/nonexistent/x.toml"]).unwrap();
        let msg = cli.resolve(no_env).unwrap_err().to_string();
        assert!(msg.contains("/nonexistent/x.toml"), "{msg}");
    }
}
