//! The resolved training configuration: the post's constants as defaults, validation, and the
//! two-column table rank 0 prints at startup.
//!
//! Layering (lowest to highest): [`TrainConfig::default`] (the constants of the post's
//! `train_ddp.py`) < the TOML file given to `--config` < the post's environment variables
//! `MODEL_ID`, `DATA_PATH`, `OUTPUT_DIR` < command-line flags. The layers are in
//! [`crate::layer`] and [`crate::cli`]; this file holds only the final values.
//! Field names are the TOML keys; each flag is the same name with dashes (`max_len` ↔ `--max-len`).

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The post's `LORA_TARGETS`: only the text decoder's projections (PEFT treats a string
/// `target_modules` as a full-match regex over module paths).
pub const POST_LORA_TARGETS: &str =
    r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)";

/// Where the job runs. One process drives one device (`cuda` = GPU `LOCAL_RANK`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum DeviceKind {
    /// Host CPU (CI, the tiny demo).
    Cpu,
    /// NVIDIA GPU number `LOCAL_RANK` (needs the `cuda` feature).
    Cuda,
}

/// Dtype of the frozen base weights and activations. Adapters, grads and optimizer state are
/// always fp32 (PEFT upcasts adapters; the post's autocast computes matmuls in bf16).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum DTypeKind {
    /// fp32 everywhere (exact comparisons against PyTorch on CPU).
    F32,
    /// bf16 base weights and activations (the post's setting on GPU).
    Bf16,
}

/// Which tokens the loss is computed on (the data crate's `LabelMode`; docs/data.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum LabelsKind {
    /// What the format implies: every token of chat and text rows (the post's `PadCollate`), the
    /// completion of prompt/completion rows, the labels of pre-tokenized rows.
    Auto,
    /// Every non-padding token, prompts included.
    Full,
    /// Only assistant turns; everything else is -100 (the post's "what I'd add" list).
    #[value(name = "assistant_only")]
    AssistantOnly,
}

/// What to do when the loss or the gradient norm is NaN or infinite (decided identically on every
/// rank, see [`crate::nonfinite`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum OnNonFinite {
    /// Stop with an error naming the step (the default: a NaN rarely fixes itself).
    Stop,
    /// Skip the optimizer step (grads dropped, schedule not advanced), at most
    /// `max_nonfinite_skips` times in a row.
    Skip,
}

/// Every setting of a training run, after all layers were applied. Units: lengths in tokens,
/// steps are optimizer steps, `lr` absolute, sizes in MiB, times in seconds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TrainConfig {
    /// Hub id or local directory of the base model (post: `MODEL_ID`).
    pub model: String,
    /// Training JSONL (post: `DATA_PATH`).
    pub data: PathBuf,
    /// Optional evaluation JSONL, evaluated on every rank over a DistributedSampler.
    pub eval_data: Option<PathBuf>,
    /// Checkpoints, metrics and the loss plot go here (post: `OUTPUT_DIR`).
    pub output: PathBuf,
    /// `cpu` or `cuda`.
    pub device: DeviceKind,
    /// `f32` or `bf16` for the frozen base.
    pub dtype: DTypeKind,
    /// Tokens per sample after truncation (post: `MAX_LEN`).
    pub max_len: usize,
    /// `auto`, `full` or `assistant_only`.
    pub labels: LabelsKind,
    /// Row format of the data files; `None` detects it from the first row.
    pub data_format: Option<g4ft_data::Format>,
    /// `enable_thinking` passed to the chat template (rows may set their own); `None` = not passed.
    pub enable_thinking: Option<bool>,
    /// JSONL lines longer than this many bytes are bad rows, skipped unparsed.
    pub max_line_bytes: usize,
    /// Pack several samples into each row of `max_len` tokens (positions restart per sample).
    pub packing: bool,
    /// Batch samples of similar length together (transformers' `group_by_length`).
    pub group_by_length: bool,
    /// Shuffle with `seed + epoch` in the DistributedSampler (post: `shuffle=True`).
    pub shuffle: bool,
    /// Skip malformed rows with a warning per row instead of stopping.
    pub skip_bad_lines: bool,
    /// Samples per rank per forward pass (post: `MICRO_BATCH`).
    pub micro_batch: usize,
    /// Micro-batches per optimizer step (post: `ACCUM_STEPS`).
    pub accum: usize,
    /// Passes over the data (post: `EPOCHS`).
    pub epochs: usize,
    /// Stop after this many optimizer steps in total (the schedule still spans all epochs).
    pub max_steps: Option<usize>,
    /// Peak learning rate (post: `LR`).
    pub lr: f64,
    /// Linear warmup steps of the cosine schedule (post: `WARMUP_STEPS`).
    pub warmup: usize,
    /// AdamW decoupled weight decay (post: 0.0).
    pub weight_decay: f64,
    /// Clip the global grad L2 norm to this; 0 disables clipping (post: `MAX_GRAD_NORM`).
    pub max_grad_norm: f64,
    /// Sum the per-token loss and divide by the global token count instead of averaging
    /// per-micro-batch means (the post's variant for variable-length samples).
    pub token_weighted_loss: bool,
    /// Seed for LoRA init (same on all ranks), dropout (`seed + rank`) and sampler shuffling.
    pub seed: u64,
    /// LoRA rank.
    pub lora_r: usize,
    /// LoRA alpha (scale = alpha / r).
    pub lora_alpha: f64,
    /// LoRA dropout probability on the adapter input.
    pub lora_dropout: f64,
    /// Regex over module paths selecting the adapted projections (PEFT full-match semantics).
    pub lora_targets: String,
    /// Start from this PEFT adapter's weights instead of a fresh init.
    pub init_adapter: Option<PathBuf>,
    /// Continue from this checkpoint directory (adapter + trainer state).
    pub resume: Option<PathBuf>,
    /// Also checkpoint every N optimizer steps (`OUTPUT/step-{n}`).
    pub save_every: Option<usize>,
    /// Evaluate `eval_data` every N optimizer steps (and always at the end).
    pub eval_every: Option<usize>,
    /// Print and record metrics every N optimizer steps (post: `LOG_EVERY`).
    pub log_every: usize,
    /// DDP bucket size in MiB (PyTorch's default 25).
    pub bucket_cap_mb: f64,
    /// Seconds a collective may block before the job fails with a per-rank error.
    pub collective_timeout_s: u64,
    /// Non-finite loss or gradient: `stop` or `skip`.
    pub on_nonfinite: OnNonFinite,
    /// With `on_nonfinite = skip`: stop after this many skipped steps in a row.
    pub max_nonfinite_skips: usize,
    /// Dense bf16 peak of one device in TFLOP/s for MFU; unset = look the GPU up in the table.
    pub peak_tflops: Option<f64>,
    /// Benchmark: random token ids of exactly `max_len` instead of the JSONL.
    pub synthetic: bool,
    /// Benchmark: random base weights from the model config instead of the checkpoint.
    pub random_init: bool,
}

impl Default for TrainConfig {
    /// The constants of the post's `train_ddp.py`, plus PyTorch's defaults for what it leaves
    /// implicit (25 MiB buckets, 10-minute NCCL timeout).
    fn default() -> Self {
        Self {
            model: "google/gemma-4-12B-it".into(),
            data: "train.jsonl".into(),
            eval_data: None,
            output: "checkpoints".into(),
            device: DeviceKind::Cuda,
            dtype: DTypeKind::Bf16,
            max_len: 2048,
            labels: LabelsKind::Auto,
            data_format: None,
            enable_thinking: None,
            max_line_bytes: g4ft_data::source::DEFAULT_MAX_LINE_BYTES,
            packing: false,
            group_by_length: false,
            shuffle: true,
            skip_bad_lines: false,
            micro_batch: 1,
            accum: 8,
            epochs: 1,
            max_steps: None,
            lr: 1e-4,
            warmup: 20,
            weight_decay: 0.0,
            max_grad_norm: 1.0,
            token_weighted_loss: false,
            seed: 42,
            lora_r: 16,
            lora_alpha: 32.0,
            lora_dropout: 0.05,
            lora_targets: POST_LORA_TARGETS.into(),
            init_adapter: None,
            resume: None,
            save_every: None,
            eval_every: None,
            log_every: 10,
            bucket_cap_mb: 25.0,
            collective_timeout_s: 600,
            on_nonfinite: OnNonFinite::Stop,
            max_nonfinite_skips: 10,
            peak_tflops: None,
            synthetic: false,
            random_init: false,
        }
    }
}

/// Where a resolved value came from, shown in the config table and in validation errors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// The built-in default (the post's constant).
    Default,
    /// The TOML file given to `--config`.
    File(PathBuf),
    /// An environment variable (`MODEL_ID`, `DATA_PATH`, `OUTPUT_DIR`).
    Env(&'static str),
    /// A command-line flag.
    Flag,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Default => write!(f, "default"),
            Origin::File(p) => write!(f, "{}", p.display()),
            Origin::Env(v) => write!(f, "${v}"),
            Origin::Flag => write!(f, "flag"),
        }
    }
}

/// A [`TrainConfig`] together with the origin of every value that is not the default.
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedConfig {
    /// The final values.
    pub config: TrainConfig,
    /// Field name → origin, for fields some layer set.
    pub origins: BTreeMap<&'static str, Origin>,
}

impl ResolvedConfig {
    /// Origin of `field` (`Default` when no layer set it).
    pub fn origin(&self, field: &str) -> Origin {
        self.origins.get(field).cloned().unwrap_or(Origin::Default)
    }

    /// The config table with a third note per row saying which layer set the value, e.g.
    /// `lr                    0.0002   (flag)`. Rank 0 prints this at startup.
    pub fn table(&self) -> String {
        let rows: Vec<(&str, String)> = self
            .config
            .rows()
            .into_iter()
            .map(|(k, v)| match self.origins.get(k) {
                Some(o) => (k, format!("{v}   ({o})")),
                None => (k, v),
            })
            .collect();
        format_table(&rows)
    }

    /// Checks ranges and cross-field rules; the error names the field, its value and its origin.
    pub fn validate(&self) -> Result<()> {
        self.config.check(|field| self.origin(field))
    }
}

fn show<T: fmt::Display>(v: &Option<T>) -> String {
    v.as_ref()
        .map_or_else(|| "-".to_string(), |v| v.to_string())
}

fn enum_name<T: clap::ValueEnum>(v: &T) -> String {
    v.to_possible_value()
        .map_or_else(String::new, |p| p.get_name().to_string())
}

impl TrainConfig {
    /// `(field, value)` for every field, in declaration order, formatted for humans (paths as
    /// given, floats in Rust's shortest round-trip form, unset options as `-`). Used by the table,
    /// by the checkpoint's config record and by the resume comparison.
    pub fn rows(&self) -> Vec<(&'static str, String)> {
        vec![
            ("model", self.model.clone()),
            ("data", self.data.display().to_string()),
            (
                "eval_data",
                show(&self.eval_data.as_ref().map(|p| p.display())),
            ),
            ("output", self.output.display().to_string()),
            ("device", enum_name(&self.device)),
            ("dtype", enum_name(&self.dtype)),
            ("max_len", self.max_len.to_string()),
            ("labels", enum_name(&self.labels)),
            ("data_format", show(&self.data_format)),
            ("enable_thinking", show(&self.enable_thinking)),
            ("max_line_bytes", self.max_line_bytes.to_string()),
            ("packing", self.packing.to_string()),
            ("group_by_length", self.group_by_length.to_string()),
            ("shuffle", self.shuffle.to_string()),
            ("skip_bad_lines", self.skip_bad_lines.to_string()),
            ("micro_batch", self.micro_batch.to_string()),
            ("accum", self.accum.to_string()),
            ("epochs", self.epochs.to_string()),
            ("max_steps", show(&self.max_steps)),
            ("lr", self.lr.to_string()),
            ("warmup", self.warmup.to_string()),
            ("weight_decay", self.weight_decay.to_string()),
            ("max_grad_norm", self.max_grad_norm.to_string()),
            ("token_weighted_loss", self.token_weighted_loss.to_string()),
            ("seed", self.seed.to_string()),
            ("lora_r", self.lora_r.to_string()),
            ("lora_alpha", self.lora_alpha.to_string()),
            ("lora_dropout", self.lora_dropout.to_string()),
            ("lora_targets", self.lora_targets.clone()),
            (
                "init_adapter",
                show(&self.init_adapter.as_ref().map(|p| p.display())),
            ),
            ("resume", show(&self.resume.as_ref().map(|p| p.display()))),
            ("save_every", show(&self.save_every)),
            ("eval_every", show(&self.eval_every)),
            ("log_every", self.log_every.to_string()),
            ("bucket_cap_mb", self.bucket_cap_mb.to_string()),
            (
                "collective_timeout_s",
                self.collective_timeout_s.to_string(),
            ),
            ("on_nonfinite", enum_name(&self.on_nonfinite)),
            ("max_nonfinite_skips", self.max_nonfinite_skips.to_string()),
            ("peak_tflops", show(&self.peak_tflops)),
            ("synthetic", self.synthetic.to_string()),
            ("random_init", self.random_init.to_string()),
        ]
    }

    /// Samples per optimizer step over all ranks: `micro_batch × world_size × accum`
    /// (the post's `global_batch`, computed from the micro-batch, never from a request).
    pub fn global_batch(&self, world_size: usize) -> usize {
        self.micro_batch * world_size * self.accum
    }

    fn check(&self, origin: impl Fn(&'static str) -> Origin) -> Result<()> {
        let bad = |field: &'static str, value: String, reason: &str| Error::ConfigInvalid {
            field,
            value,
            origin: origin(field).to_string(),
            reason: reason.to_string(),
        };
        let at_least_1 = [
            ("max_len", self.max_len),
            ("max_line_bytes", self.max_line_bytes),
            ("micro_batch", self.micro_batch),
            ("accum", self.accum),
            ("epochs", self.epochs),
            ("lora_r", self.lora_r),
            ("log_every", self.log_every),
        ];
        for (field, v) in at_least_1 {
            if v == 0 {
                return Err(bad(field, v.to_string(), "must be at least 1"));
            }
        }
        let optional_at_least_1 = [
            ("max_steps", self.max_steps),
            ("save_every", self.save_every),
            ("eval_every", self.eval_every),
        ];
        for (field, v) in optional_at_least_1 {
            if v == Some(0) {
                return Err(bad(
                    field,
                    "0".into(),
                    "must be at least 1 (leave unset to disable)",
                ));
            }
        }
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return Err(bad(
                "lr",
                self.lr.to_string(),
                "must be a finite number > 0",
            ));
        }
        let non_negative = [
            ("weight_decay", self.weight_decay),
            ("max_grad_norm", self.max_grad_norm),
            ("lora_alpha", self.lora_alpha),
        ];
        for (field, v) in non_negative {
            if !(v.is_finite() && v >= 0.0) {
                return Err(bad(field, v.to_string(), "must be a finite number >= 0"));
            }
        }
        if !(0.0..1.0).contains(&self.lora_dropout) {
            return Err(bad(
                "lora_dropout",
                self.lora_dropout.to_string(),
                "must be in [0, 1)",
            ));
        }
        if !(self.bucket_cap_mb.is_finite() && self.bucket_cap_mb > 0.0) {
            return Err(bad(
                "bucket_cap_mb",
                self.bucket_cap_mb.to_string(),
                "must be > 0",
            ));
        }
        if self.collective_timeout_s == 0 {
            return Err(bad(
                "collective_timeout_s",
                "0".into(),
                "must be at least 1 second",
            ));
        }
        if let Some(p) = self.peak_tflops {
            if !(p.is_finite() && p > 0.0) {
                return Err(bad("peak_tflops", p.to_string(), "must be > 0"));
            }
        }
        if let Err(e) = regex::Regex::new(&self.lora_targets) {
            return Err(bad(
                "lora_targets",
                self.lora_targets.clone(),
                &format!("not a valid regex: {e}"),
            ));
        }
        if self.packing && self.group_by_length {
            return Err(bad(
                "group_by_length",
                "true".into(),
                "has no effect with packing (packed rows are all about max_len long); set one",
            ));
        }
        if self.eval_every.is_some() && self.eval_data.is_none() {
            return Err(bad(
                "eval_every",
                show(&self.eval_every),
                "needs eval_data (--eval-data) to evaluate anything",
            ));
        }
        Ok(())
    }
}

/// Formats `(name, value)` rows as a two-column table with aligned values and a rule above and
/// below, like llm.c's startup parameter table.
pub fn format_table(rows: &[(&str, String)]) -> String {
    let key_w = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    let val_w = rows
        .iter()
        .map(|(_, v)| v.chars().count())
        .max()
        .unwrap_or(0);
    let rule = format!("+{}+{}+\n", "-".repeat(key_w + 2), "-".repeat(val_w + 2));
    let mut out = rule.clone();
    for (k, v) in rows {
        out.push_str(&format!("| {k:<key_w$} | {v:<val_w$} |\n"));
    }
    out.push_str(&rule);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolved(config: TrainConfig) -> ResolvedConfig {
        ResolvedConfig {
            config,
            origins: BTreeMap::new(),
        }
    }

    #[test]
    fn defaults_are_the_posts_constants() {
        let c = TrainConfig::default();
        assert_eq!(c.model, "google/gemma-4-12B-it");
        assert_eq!(c.data, PathBuf::from("train.jsonl"));
        assert_eq!(c.output, PathBuf::from("checkpoints"));
        assert_eq!(
            (c.max_len, c.micro_batch, c.accum, c.epochs),
            (2048, 1, 8, 1)
        );
        assert_eq!((c.lr, c.warmup, c.max_grad_norm), (1e-4, 20, 1.0));
        assert_eq!((c.log_every, c.seed), (10, 42));
        assert_eq!((c.lora_r, c.lora_alpha, c.lora_dropout), (16, 32.0, 0.05));
        assert_eq!(c.weight_decay, 0.0);
        assert!(c.shuffle);
        assert_eq!(c.global_batch(8), 64);
        resolved(c).validate().unwrap();
    }

    #[test]
    fn post_regex_selects_decoder_projections_only() {
        let re = regex::Regex::new(&format!("^(?:{POST_LORA_TARGETS})$")).unwrap();
        assert!(re.is_match("model.language_model.layers.3.self_attn.q_proj"));
        assert!(re.is_match("model.language_model.layers.47.mlp.down_proj"));
        assert!(!re.is_match("model.vision_tower.encoder.layers.0.self_attn.q_proj"));
        assert!(!re.is_match("model.language_model.layers.3.self_attn.q_norm"));
    }

    #[test]
    fn validation_names_field_value_and_origin() {
        let mut r = resolved(TrainConfig {
            accum: 0,
            ..TrainConfig::default()
        });
        r.origins.insert("accum", Origin::File("run.toml".into()));
        let msg = r.validate().unwrap_err().to_string();
        assert!(
            msg.contains("`accum` = 0") && msg.contains("run.toml"),
            "{msg}"
        );

        let r = resolved(TrainConfig {
            lora_targets: "(".into(),
            ..TrainConfig::default()
        });
        assert!(r
            .validate()
            .unwrap_err()
            .to_string()
            .contains("lora_targets"));

        let r = resolved(TrainConfig {
            eval_every: Some(5),
            ..TrainConfig::default()
        });
        assert!(r.validate().unwrap_err().to_string().contains("eval_data"));

        let r = resolved(TrainConfig {
            lora_dropout: 1.0,
            ..TrainConfig::default()
        });
        assert!(r.validate().is_err());
    }

    #[test]
    fn table_aligns_and_marks_origins() {
        let mut r = resolved(TrainConfig::default());
        r.origins.insert("lr", Origin::Flag);
        let t = r.table();
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), TrainConfig::default().rows().len() + 2);
        let width = lines[0].len();
        assert!(lines.iter().all(|l| l.chars().count() == width), "{t}");
        assert!(t.contains("| lr ") && t.contains("0.0001   (flag)"), "{t}");
        assert!(t.contains("| eval_data ") && t.contains("| -"), "{t}");
    }
}
