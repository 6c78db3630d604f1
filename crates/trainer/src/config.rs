//! The training settings, each defined once in [`TrainConfig`] (flag, help, default, TOML key,
//! environment override, `--help` section), their validation, and the two-column table rank 0
//! prints at startup.
//!
//! Precedence (lowest to highest): [`TrainConfig::default`] (the constants of the post's
//! `train_ddp.py`) < the TOML file given to `--config` < the post's environment variables
//! `MODEL_ID`, `DATA_PATH`, `OUTPUT_DIR` < command-line flags; [`crate::config::cli`] applies them.
//! Field names are the TOML keys; each flag is the same name with dashes (`max_len` ↔ `--max-len`).

pub mod cli;

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use clap::{Args, FromArgMatches};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::step::schedule::LrSchedulerKind;

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

impl DeviceKind {
    /// Opens the device: the CPU ([`crate::device::cpu_training_device`]), or GPU `local_rank`
    /// ([`crate::device::cuda_training_device`]).
    pub fn open(self, local_rank: usize) -> anyhow::Result<candle_core::Device> {
        match self {
            DeviceKind::Cpu => Ok(crate::device::cpu_training_device()),
            DeviceKind::Cuda => crate::device::cuda_training_device(local_rank),
        }
    }
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

impl DTypeKind {
    /// The Candle dtype.
    pub fn dtype(self) -> candle_core::DType {
        match self {
            DTypeKind::F32 => candle_core::DType::F32,
            DTypeKind::Bf16 => candle_core::DType::BF16,
        }
    }
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

impl From<LabelsKind> for g4ft_data::LabelMode {
    fn from(kind: LabelsKind) -> Self {
        match kind {
            LabelsKind::Auto => g4ft_data::LabelMode::Auto,
            LabelsKind::Full => g4ft_data::LabelMode::Full,
            LabelsKind::AssistantOnly => g4ft_data::LabelMode::AssistantOnly,
        }
    }
}

/// What to do when the loss or the gradient norm is NaN or infinite (decided identically on every
/// rank, see [`crate::step::nonfinite`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum OnNonFinite {
    /// Stop with an error naming the step (the default: a NaN rarely fixes itself).
    Stop,
    /// Skip the optimizer step (grads dropped, schedule not advanced), at most
    /// `max_nonfinite_skips` times in a row.
    Skip,
}

/// Which layers the backward recomputes (`--recompute`; `docs/layer-backward.md`). The gradients
/// are the same under every choice; memory and speed are not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum RecomputeKind {
    /// Recompute every layer from its saved input (the least memory).
    All,
    /// Keep every layer's activations from the forward, whole (no second forward, nothing
    /// rebuilt in the backward, the most memory).
    None,
    /// Keep the activations of as many of the last layers as fit --memory-budget-gb by the
    /// memory model's prediction (every layer's, whole, where that fits), recompute the others.
    Auto,
}

/// The `--help` sections. Each setting sits in one, and the section says what `--resume` does
/// with it (see [`ResumeRule`]).
pub mod section {
    /// Base model, data, precision, seed: a change on resume is used and reported.
    pub const MODEL_DATA: &str = "Model and data";
    /// The adapter's shape: taken from the checkpoint (or `--init-adapter`).
    pub const ADAPTER: &str = "LoRA adapter";
    /// What the saved data position and optimizer moments are counted in: fixed by a checkpoint.
    pub const LAYOUT: &str = "Batch and bucket layout";
    /// Optimizer and schedule: a change on resume is used and reported.
    pub const OPTIMIZATION: &str = "Optimization and schedule";
    /// Where the run starts (fresh, from an adapter, from a checkpoint): never taken from a
    /// checkpoint.
    pub const START: &str = "Starting point";
    /// Where to write and how often: free to change on resume.
    pub const RUN: &str = "Output, checkpoints and logging";
    /// Collectives and non-finite steps: free to change on resume.
    pub const FAULTS: &str = "Distributed and faults";
    /// Activation memory against recompute (the gradients do not depend on it): free to change
    /// on resume.
    pub const MEMORY: &str = "Memory and recompute";
}

/// Where metrics go besides the log lines, `metrics.jsonl` and `loss.svg` (transformers'
/// `report_to`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum ReportTo {
    /// Nothing else.
    None,
    /// TensorBoard event files in `OUTPUT/tensorboard/`.
    Tensorboard,
}

/// Every setting of a training run, defined once: the clap attributes make the `train_ddp` flag
/// (its help is the doc comment, its default the `default_value`, `env` the post's environment
/// override), the serde derive makes the TOML key (the field name), and the resolved values and
/// their origins make the startup table. Units: lengths in tokens, steps are optimizer steps,
/// `lr` absolute, sizes in MiB, times in seconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, clap::Args)]
#[serde(default, deny_unknown_fields)]
pub struct TrainConfig {
    /// Hub id or local directory of the base model (the post's MODEL_ID).
    #[arg(long, value_name = "ID|DIR", env = "MODEL_ID", default_value = "google/gemma-4-12B-it", help_heading = section::MODEL_DATA)]
    pub model: String,
    /// Hub revision of --model: a branch, tag or commit (default: main).
    #[arg(long, value_name = "REV", help_heading = section::MODEL_DATA)]
    pub revision: Option<String>,
    /// Training data: JSONL, Parquet, Arrow or CSV/TSV, chat/ShareGPT/prompt-completion/text/token
    /// rows (the post's DATA_PATH). A file, a folder (its --data-split, split as Hugging Face
    /// datasets splits a folder; a save_to_disk folder read as load_from_disk reads it), a glob
    /// in quotes ('shards/*.parquet') or a Hub dataset id (owner/name, downloaded into the Hub
    /// cache): several files are one dataset.
    #[arg(long, value_name = "FILE|DIR|GLOB|HUB_ID", env = "DATA_PATH", default_value = "train.jsonl", help_heading = section::MODEL_DATA)]
    pub data: PathBuf,
    /// The split of a --data folder or Hub dataset to train on (default: train).
    #[arg(long, value_name = "SPLIT", help_heading = section::MODEL_DATA)]
    pub data_split: Option<String>,
    /// The config (subset) of --data, when its dataset card lists several (default: the card's
    /// default).
    #[arg(long, value_name = "NAME", help_heading = section::MODEL_DATA)]
    pub data_config: Option<String>,
    /// Hub revision of a --data / --eval-data dataset id: a branch, tag or commit (default: main).
    #[arg(long, value_name = "REV", help_heading = section::MODEL_DATA)]
    pub data_revision: Option<String>,
    /// Evaluation data, same formats and forms as --data, evaluated on every rank over a
    /// DistributedSampler, metrics all-reduced.
    #[arg(long, value_name = "FILE|DIR|GLOB|HUB_ID", help_heading = section::MODEL_DATA)]
    pub eval_data: Option<PathBuf>,
    /// The split of an --eval-data folder or Hub dataset (default: validation, else test).
    #[arg(long, value_name = "SPLIT", help_heading = section::MODEL_DATA)]
    pub eval_split: Option<String>,
    /// The config (subset) of --eval-data, as --data-config.
    #[arg(long, value_name = "NAME", help_heading = section::MODEL_DATA)]
    pub eval_config: Option<String>,
    /// Output directory for checkpoints, metrics and the loss plot (the post's OUTPUT_DIR).
    #[arg(long, visible_alias = "output-dir", value_name = "DIR", env = "OUTPUT_DIR", default_value = "checkpoints", help_heading = section::RUN)]
    pub output: PathBuf,
    /// Where each rank runs: cpu, or cuda (GPU number LOCAL_RANK).
    #[arg(long, value_enum, default_value_t = DeviceKind::Cuda, help_heading = section::MODEL_DATA)]
    pub device: DeviceKind,
    /// Dtype of the frozen base weights (adapters and optimizer state are always fp32).
    #[arg(long, value_enum, default_value_t = DTypeKind::Bf16, help_heading = section::MODEL_DATA)]
    pub dtype: DTypeKind,
    /// Tokens per sample after truncation (the post's MAX_LEN).
    #[arg(long, value_name = "TOKENS", default_value_t = 2048, help_heading = section::MODEL_DATA)]
    pub max_len: usize,
    /// Loss on what the format implies (auto), all tokens, or assistant turns only.
    #[arg(long, value_enum, default_value_t = LabelsKind::Auto, help_heading = section::MODEL_DATA)]
    pub labels: LabelsKind,
    /// Row format: chat, sharegpt, prompt_completion, text or tokens (unset: detected from the
    /// first row).
    #[arg(long, value_name = "FORMAT", help_heading = section::MODEL_DATA)]
    pub data_format: Option<g4ft_data::Format>,
    /// enable_thinking passed to the chat template (rows may set their own; unset: not passed).
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL", help_heading = section::MODEL_DATA)]
    pub enable_thinking: Option<bool>,
    /// JSONL lines longer than this many bytes are bad rows, skipped without being parsed; a CSV
    /// record longer than this is an error (a quoted field without its closing quote?).
    #[arg(long, value_name = "BYTES", default_value_t = g4ft_data::source::DEFAULT_MAX_LINE_BYTES, help_heading = section::MODEL_DATA)]
    pub max_line_bytes: usize,
    /// Pack several samples into each row of --max-len tokens (positions restart per sample).
    #[arg(long, help_heading = section::MODEL_DATA)]
    pub packing: bool,
    /// Batch samples of similar length together (transformers' group_by_length).
    #[arg(long, help_heading = section::MODEL_DATA)]
    pub group_by_length: bool,
    /// --no-shuffle keeps the data order; by default the DistributedSampler shuffles with
    /// seed + epoch (TOML key `shuffle`).
    #[arg(long = "no-shuffle", action = clap::ArgAction::SetFalse, help_heading = section::MODEL_DATA)]
    pub shuffle: bool,
    /// Skip malformed rows, with a warning per row, instead of stopping (a CSV file whose
    /// structure is broken, e.g. a row with more fields than the header, still stops).
    #[arg(long, help_heading = section::MODEL_DATA)]
    pub skip_bad_lines: bool,
    /// Samples per rank per forward pass (the post's MICRO_BATCH).
    #[arg(long, visible_alias = "per-device-train-batch-size", value_name = "N", default_value_t = 1, help_heading = section::LAYOUT)]
    pub micro_batch: usize,
    /// Micro-batches per optimizer step, i.e. gradient accumulation (the post's ACCUM_STEPS).
    #[arg(long, visible_alias = "gradient-accumulation-steps", value_name = "N", default_value_t = 8, help_heading = section::LAYOUT)]
    pub accum: usize,
    /// Passes over the data (the post's EPOCHS); --max-steps overrides it.
    #[arg(long, visible_alias = "num-train-epochs", value_name = "N", default_value_t = 1, help_heading = section::OPTIMIZATION)]
    pub epochs: usize,
    /// Optimizer steps of the run, overriding --epochs as transformers' max_steps does: the
    /// schedule spans exactly these steps and the data is passed over as often as needed.
    #[arg(long, value_name = "N", help_heading = section::OPTIMIZATION)]
    pub max_steps: Option<usize>,
    /// Peak learning rate (the post's LR).
    #[arg(long, value_parser = parse_finite, visible_alias = "learning-rate", default_value_t = 1e-4, help_heading = section::OPTIMIZATION)]
    #[serde(deserialize_with = "finite")]
    pub lr: f64,
    /// Learning-rate schedule after the warmup (transformers' lr_scheduler_type).
    #[arg(long, visible_alias = "lr-scheduler-type", value_enum, default_value_t = LrSchedulerKind::Cosine, help_heading = section::OPTIMIZATION)]
    pub lr_scheduler: LrSchedulerKind,
    /// Linear warmup steps (the post's WARMUP_STEPS).
    #[arg(long, visible_alias = "warmup-steps", value_name = "STEPS", default_value_t = 20, help_heading = section::OPTIMIZATION)]
    pub warmup: usize,
    /// Warmup as a fraction of the run's steps, rounded up (replaces --warmup).
    #[arg(long, value_parser = parse_finite, value_name = "FRACTION", help_heading = section::OPTIMIZATION)]
    #[serde(deserialize_with = "finite_opt")]
    pub warmup_ratio: Option<f64>,
    /// AdamW decoupled weight decay.
    #[arg(long, value_parser = parse_finite, default_value_t = 0.0, help_heading = section::OPTIMIZATION)]
    #[serde(deserialize_with = "finite")]
    pub weight_decay: f64,
    /// Clip the global gradient L2 norm to this; 0 disables clipping (the post's MAX_GRAD_NORM).
    #[arg(long, value_parser = parse_finite, default_value_t = 1.0, help_heading = section::OPTIMIZATION)]
    #[serde(deserialize_with = "finite")]
    pub max_grad_norm: f64,
    /// Sum the per-token losses and divide by the global token count instead of averaging
    /// per-micro-batch means (the post's variant for variable-length samples).
    #[arg(long, help_heading = section::OPTIMIZATION)]
    pub token_weighted_loss: bool,
    /// Seed of the LoRA init (same on all ranks), dropout (seed + rank) and sampler shuffling.
    #[arg(long, default_value_t = 42, help_heading = section::MODEL_DATA)]
    pub seed: u64,
    /// LoRA rank r.
    #[arg(long, value_name = "R", default_value_t = 16, help_heading = section::ADAPTER)]
    pub lora_r: usize,
    /// LoRA alpha (scale = alpha / r, or alpha / sqrt(r) with --use-rslora).
    #[arg(long, value_parser = parse_finite, default_value_t = 32.0, help_heading = section::ADAPTER)]
    #[serde(deserialize_with = "finite")]
    pub lora_alpha: f64,
    /// Dropout probability on the adapter input.
    #[arg(long, value_parser = parse_finite, value_name = "P", default_value_t = 0.05, help_heading = section::ADAPTER)]
    #[serde(deserialize_with = "finite")]
    pub lora_dropout: f64,
    /// Regex over module paths selecting the adapted projections (PEFT full-match semantics).
    #[arg(long, value_name = "REGEX", default_value = POST_LORA_TARGETS, help_heading = section::ADAPTER)]
    pub lora_targets: String,
    /// rsLoRA scaling alpha / sqrt(r) instead of alpha / r (PEFT's use_rslora).
    #[arg(long, help_heading = section::ADAPTER)]
    pub use_rslora: bool,
    /// Start from this PEFT adapter directory's weights instead of a fresh init.
    #[arg(long, value_name = "DIR", help_heading = section::START)]
    pub init_adapter: Option<PathBuf>,
    /// Continue from this checkpoint directory (adapter, optimizer, schedule, data position), or
    /// from the newest complete checkpoint of --output with `latest` (or `auto`). Settings not
    /// given come from the checkpoint; the adapter's shape and the batch layout must not change.
    #[arg(long, visible_alias = "resume-from-checkpoint", value_name = "DIR", help_heading = section::START)]
    pub resume: Option<PathBuf>,
    /// Start a new run in an --output that holds another run, deleting that run's checkpoints,
    /// metrics and plots (without this flag such a folder is refused).
    #[arg(long, visible_alias = "overwrite-output-dir", help_heading = section::START)]
    pub overwrite_output: bool,
    /// Also checkpoint every N optimizer steps (OUTPUT/step-N).
    #[arg(long, visible_alias = "save-steps", value_name = "N", help_heading = section::RUN)]
    pub save_every: Option<usize>,
    /// Keep only the newest N checkpoints of the output folder, deleting older ones after each
    /// save (unset: keep all).
    #[arg(long, value_name = "N", help_heading = section::RUN)]
    pub save_total_limit: Option<usize>,
    /// Evaluate --eval-data every N optimizer steps (and always at the end).
    #[arg(long, visible_alias = "eval-steps", value_name = "N", help_heading = section::RUN)]
    pub eval_every: Option<usize>,
    /// Samples per rank per evaluation batch (transformers' per_device_eval_batch_size; unset:
    /// --micro-batch). An evaluation keeps no activations for a backward, so it fits more.
    #[arg(long, visible_alias = "per-device-eval-batch-size", value_name = "N", help_heading = section::RUN)]
    pub eval_micro_batch: Option<usize>,
    /// Print and record metrics every N optimizer steps (the post's LOG_EVERY).
    #[arg(long, visible_alias = "logging-steps", value_name = "N", default_value_t = 10, help_heading = section::RUN)]
    pub log_every: usize,
    /// Also write the metrics for TensorBoard (OUTPUT/tensorboard/), or nothing more.
    #[arg(long, value_enum, default_value_t = ReportTo::None, help_heading = section::RUN)]
    pub report_to: ReportTo,
    /// DDP gradient bucket size in MiB (PyTorch's default 25).
    #[arg(long, value_parser = parse_finite, value_name = "MIB", default_value_t = 25.0, help_heading = section::LAYOUT)]
    #[serde(deserialize_with = "finite")]
    pub bucket_cap_mb: f64,
    /// Seconds a collective may block before the job fails with a per-rank error.
    #[arg(long, value_name = "SECONDS", default_value_t = 600, help_heading = section::FAULTS)]
    pub collective_timeout_s: u64,
    /// Non-finite loss or gradient norm: stop, or skip the optimizer step.
    #[arg(long, value_enum, default_value_t = OnNonFinite::Stop, help_heading = section::FAULTS)]
    pub on_nonfinite: OnNonFinite,
    /// With --on-nonfinite skip: stop after this many skipped steps in a row.
    #[arg(long, value_name = "N", default_value_t = 10, help_heading = section::FAULTS)]
    pub max_nonfinite_skips: usize,
    /// Which layers the backward recomputes: all (least memory), none (keep every layer's
    /// activations), or auto (as many kept as fit --memory-budget-gb).
    #[arg(long, value_enum, default_value_t = RecomputeKind::All, help_heading = section::MEMORY)]
    pub recompute: RecomputeKind,
    /// With --recompute auto: the predicted peak memory per device may reach this many GB (10^9
    /// bytes) (unset: the memory free at start, less 5% and 2 GB; on the CPU the available RAM
    /// shared by this node's ranks).
    #[arg(long, value_parser = parse_finite, value_name = "GB", help_heading = section::MEMORY)]
    #[serde(deserialize_with = "finite_opt")]
    pub memory_budget_gb: Option<f64>,
    /// Keep the recomputed layers' inputs in host memory from the forward to their backward
    /// instead of on the GPU (copied out and back beside the kernels), with their attention and
    /// MLP outputs and attention state, which spare the recompute all but the MLP's gate and up
    /// products (less where the host's RAM holds less): one layer's tensors on the device
    /// instead of one input per recomputed layer, the same gradients.
    #[arg(long, help_heading = section::MEMORY)]
    pub offload_checkpoints: bool,
    /// Dense bf16 peak TFLOP/s of one device, for MFU (unset: look the GPU up in a table).
    #[arg(long, value_parser = parse_finite, value_name = "TFLOPS", help_heading = section::RUN)]
    #[serde(deserialize_with = "finite_opt")]
    pub peak_tflops: Option<f64>,
}

impl Default for TrainConfig {
    /// The `default_value`s above: the constants of the post's `train_ddp.py`, plus PyTorch's
    /// defaults for what it leaves implicit (25 MiB buckets, 10-minute NCCL timeout). The
    /// environment is not consulted.
    fn default() -> Self {
        let cmd = Self::augment_args(clap::Command::new("defaults"))
            .mut_args(|a| a.env(None::<&'static str>));
        let matches = cmd
            .try_get_matches_from(["defaults"])
            .expect("every setting's default parses");
        Self::from_arg_matches(&matches).expect("parsed defaults convert")
    }
}

/// Flag parser of the real-valued settings: a finite number (`nan`, `inf` are rejected here,
/// before they could reach a computation).
fn parse_finite(text: &str) -> std::result::Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if v.is_finite() => Ok(v),
        Ok(_) => Err("not a finite number".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// TOML reader of the real-valued settings: a finite number.
fn finite<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<f64, D::Error> {
    let v = f64::deserialize(d)?;
    if v.is_finite() {
        Ok(v)
    } else {
        Err(serde::de::Error::custom(format!(
            "{v} is not a finite number"
        )))
    }
}

/// [`finite`] for an optional setting.
fn finite_opt<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<f64>, D::Error> {
    match Option::<f64>::deserialize(d)? {
        Some(v) if !v.is_finite() => Err(serde::de::Error::custom(format!(
            "{v} is not a finite number"
        ))),
        v => Ok(v),
    }
}

/// What `--resume` does with a setting, decided by its [`section`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResumeRule {
    /// Shapes the adapter: comes from the checkpoint; a contradicting value is an error.
    FromCheckpoint,
    /// The saved data position or moments are counted in it: a change is an error.
    MustMatch,
    /// Changes the math from here on: allowed and reported.
    Reported,
    /// Run control: changes freely.
    Free,
    /// The starting point itself: never taken from the checkpoint.
    NotInherited,
}

/// One setting as the command line describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettingInfo {
    /// Field name = TOML key (the flag is the same with dashes).
    pub name: String,
    /// Its `--help` section.
    pub section: &'static str,
    /// The environment variable that overrides it, if any.
    pub env: Option<String>,
    /// The flag's other long names (transformers' `TrainingArguments` spellings), with dashes.
    pub aliases: Vec<String>,
}

impl SettingInfo {
    /// What `--resume` does with this setting.
    pub fn resume_rule(&self) -> ResumeRule {
        match self.section {
            section::ADAPTER => ResumeRule::FromCheckpoint,
            section::LAYOUT => ResumeRule::MustMatch,
            section::MODEL_DATA | section::OPTIMIZATION => ResumeRule::Reported,
            section::START => ResumeRule::NotInherited,
            _ => ResumeRule::Free,
        }
    }
}

/// Every setting in declaration order (the order of the table and of `--help` within a section).
pub fn settings() -> Vec<SettingInfo> {
    const SECTIONS: [&str; 8] = [
        section::MODEL_DATA,
        section::ADAPTER,
        section::LAYOUT,
        section::OPTIMIZATION,
        section::START,
        section::RUN,
        section::FAULTS,
        section::MEMORY,
    ];
    TrainConfig::augment_args(clap::Command::new("settings"))
        .get_arguments()
        .map(|a| {
            let heading = a.get_help_heading().unwrap_or_default();
            SettingInfo {
                name: a.get_id().to_string(),
                section: SECTIONS
                    .into_iter()
                    .find(|s| *s == heading)
                    .expect("every setting has one of the sections as help_heading"),
                env: a.get_env().map(|e| e.to_string_lossy().into_owned()),
                aliases: a
                    .get_visible_aliases()
                    .unwrap_or_default()
                    .into_iter()
                    .map(String::from)
                    .collect(),
            }
        })
        .collect()
}

/// Where a resolved value came from, shown in the config table and in validation errors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// The built-in default (the post's constant).
    Default,
    /// The TOML file given to `--config`.
    File(PathBuf),
    /// An environment variable (`MODEL_ID`, `DATA_PATH`, `OUTPUT_DIR`).
    Env(String),
    /// A command-line flag.
    Flag,
    /// The checkpoint or adapter directory the run starts from.
    Saved(PathBuf),
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Default => write!(f, "default"),
            Origin::File(p) => write!(f, "{}", p.display()),
            Origin::Env(v) => write!(f, "${v}"),
            Origin::Flag => write!(f, "flag"),
            Origin::Saved(p) => write!(f, "{}", p.display()),
        }
    }
}

/// A [`TrainConfig`] together with the origin of every value that is not the default.
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedConfig {
    /// The final values.
    pub config: TrainConfig,
    /// Field name → origin, for fields some source set.
    pub origins: BTreeMap<String, Origin>,
}

impl ResolvedConfig {
    /// Origin of `field` (`Default` when no source set it).
    pub fn origin(&self, field: &str) -> Origin {
        self.origins.get(field).cloned().unwrap_or(Origin::Default)
    }

    /// The config table with a third note per row saying which source set the value, e.g.
    /// `lr                    0.0002   (flag)`. Rank 0 prints this at startup.
    pub fn table(&self) -> String {
        let rows: Vec<(String, String)> = self
            .config
            .rows()
            .into_iter()
            .map(|(k, v)| match self.origins.get(&k) {
                Some(o) => {
                    let v = format!("{v}   ({o})");
                    (k, v)
                }
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

/// A value of the serialized config as the table shows it: strings and paths as given, numbers
/// in Rust's shortest round-trip form, unset options as `-`.
pub(crate) fn show_value(v: &serde_json::Value) -> String {
    use serde_json::Value;
    match v {
        Value::Null => "-".to_string(),
        Value::String(s) => s.clone(),
        Value::Number(n) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => u.to_string(),
            (None, Some(i)) => i.to_string(),
            _ => n.as_f64().map_or_else(|| n.to_string(), |f| f.to_string()),
        },
        other => other.to_string(),
    }
}

impl TrainConfig {
    /// `(field, value)` for every setting, in declaration order, formatted for humans (paths as
    /// given, floats in Rust's shortest round-trip form, unset options as `-`). Used by the table,
    /// by the checkpoint's config record and by the resume comparison.
    pub fn rows(&self) -> Vec<(String, String)> {
        let serde_json::Value::Object(values) =
            serde_json::to_value(self).expect("the config serializes")
        else {
            unreachable!("a struct serializes to an object")
        };
        settings()
            .into_iter()
            .map(|s| {
                let v = show_value(&values[&s.name]);
                (s.name, v)
            })
            .collect()
    }

    /// Samples per optimizer step over all ranks: `micro_batch × world_size × accum`
    /// (the post's `global_batch`, computed from the micro-batch, never from a request).
    pub fn global_batch(&self, world_size: usize) -> usize {
        self.micro_batch * world_size * self.accum
    }

    fn check(&self, origin: impl Fn(&str) -> Origin) -> Result<()> {
        let bad = |field: &str, value: String, reason: String| Error::ConfigInvalid {
            field: field.to_string(),
            value,
            origin: origin(field).to_string(),
            reason,
        };
        // Counts: at least 1 and at most a bound no real run gets near (so arithmetic on them
        // cannot overflow and a typo with extra digits is caught).
        let counts = [
            ("max_len", Some(self.max_len), MAX_LEN),
            ("max_line_bytes", Some(self.max_line_bytes), 1 << 40),
            ("micro_batch", Some(self.micro_batch), MAX_COUNT),
            ("accum", Some(self.accum), MAX_COUNT),
            ("epochs", Some(self.epochs), MAX_COUNT),
            ("lora_r", Some(self.lora_r), MAX_LORA_R),
            ("log_every", Some(self.log_every), MAX_STEPS),
            ("max_steps", self.max_steps, MAX_STEPS),
            ("save_every", self.save_every, MAX_STEPS),
            ("eval_every", self.eval_every, MAX_STEPS),
            ("eval_micro_batch", self.eval_micro_batch, MAX_COUNT),
            ("save_total_limit", self.save_total_limit, MAX_STEPS),
        ];
        for (field, v, max) in counts {
            match v {
                Some(0) => {
                    let unset = ["max_steps", "save_every", "eval_every", "save_total_limit"]
                        .contains(&field);
                    let hint = if unset {
                        " (leave unset to disable)"
                    } else {
                        ""
                    };
                    return Err(bad(field, "0".into(), format!("must be at least 1{hint}")));
                }
                Some(v) if v > max => {
                    return Err(bad(field, v.to_string(), format!("must be at most {max}")))
                }
                _ => {}
            }
        }
        if !(1..=MAX_TIMEOUT_S).contains(&self.collective_timeout_s) {
            return Err(bad(
                "collective_timeout_s",
                self.collective_timeout_s.to_string(),
                format!("must be between 1 and {MAX_TIMEOUT_S} seconds (a week)"),
            ));
        }
        // Reals: finite, within a range.
        let reals = [
            ("lr", Some(self.lr), 0.0, false, 1e3),
            ("lora_alpha", Some(self.lora_alpha), 0.0, false, 1e6),
            ("weight_decay", Some(self.weight_decay), 0.0, true, 1e3),
            ("max_grad_norm", Some(self.max_grad_norm), 0.0, true, 1e9),
            (
                "bucket_cap_mb",
                Some(self.bucket_cap_mb),
                0.0,
                false,
                65536.0,
            ),
            ("peak_tflops", self.peak_tflops, 0.0, false, 1e6),
            ("memory_budget_gb", self.memory_budget_gb, 0.0, false, 1e9),
        ];
        for (field, v, lo, lo_ok, hi) in reals {
            let Some(v) = v else { continue };
            let above = if lo_ok { v >= lo } else { v > lo };
            if !(v.is_finite() && above && v <= hi) {
                let op = if lo_ok { ">=" } else { ">" };
                let why = if field == "lora_alpha" && v == 0.0 {
                    ": alpha 0 scales every adapter to nothing, so nothing would train".to_string()
                } else {
                    String::new()
                };
                return Err(bad(
                    field,
                    v.to_string(),
                    format!("must be a finite number {op} {lo} and <= {hi}{why}"),
                ));
            }
        }
        let fractions = [
            (
                "lora_dropout",
                Some(self.lora_dropout),
                "[0, 1)",
                1.0,
                false,
            ),
            ("warmup_ratio", self.warmup_ratio, "[0, 1]", 1.0, true),
        ];
        for (field, v, range, hi, hi_ok) in fractions {
            let Some(v) = v else { continue };
            let below = if hi_ok { v <= hi } else { v < hi };
            if !(v >= 0.0 && below) {
                return Err(bad(field, v.to_string(), format!("must be in {range}")));
            }
        }
        if let Err(e) = regex::Regex::new(&self.lora_targets) {
            return Err(bad(
                "lora_targets",
                self.lora_targets.clone(),
                format!("not a valid regex: {e}"),
            ));
        }
        if self.packing && self.group_by_length {
            return Err(bad(
                "group_by_length",
                "true".into(),
                "has no effect with packing (packed rows are all about max_len long); set one"
                    .into(),
            ));
        }
        if let (Some(gb), false) = (self.memory_budget_gb, self.recompute == RecomputeKind::Auto) {
            return Err(bad(
                "memory_budget_gb",
                gb.to_string(),
                "is the budget of recompute = auto and has no effect otherwise; set recompute \
                 to auto or leave the budget unset"
                    .into(),
            ));
        }
        let needs_eval_data = [
            ("eval_every", self.eval_every.map(|n| n.to_string())),
            (
                "eval_micro_batch",
                self.eval_micro_batch.map(|n| n.to_string()),
            ),
            ("eval_split", self.eval_split.clone()),
            ("eval_config", self.eval_config.clone()),
        ];
        for (field, value) in needs_eval_data {
            if let (Some(v), None) = (value, &self.eval_data) {
                return Err(bad(
                    field,
                    v,
                    "needs eval_data (--eval-data) to evaluate anything".into(),
                ));
            }
        }
        if self.warmup_ratio.is_some() && origin("warmup") != Origin::Default {
            return Err(bad(
                "warmup_ratio",
                self.warmup_ratio
                    .map_or_else(String::new, |r| r.to_string()),
                format!(
                    "give either warmup (= {}, set by {}) or warmup_ratio, not both",
                    self.warmup,
                    origin("warmup")
                ),
            ));
        }
        Ok(())
    }
}

/// Upper bound of `max_len` (tokens per sample).
pub const MAX_LEN: usize = 1 << 20;
/// Upper bound of batch counts and epochs.
pub const MAX_COUNT: usize = 1 << 16;
/// Upper bound of step counts.
pub const MAX_STEPS: usize = 1 << 40;
/// Upper bound of the LoRA rank before the model is known (then: the smallest targeted layer).
pub const MAX_LORA_R: usize = 1 << 16;
/// Upper bound of `collective_timeout_s`: a week.
pub const MAX_TIMEOUT_S: u64 = 7 * 24 * 3600;

/// Formats `(name, value)` rows as a two-column table with aligned values and a rule above and
/// below, like llm.c's startup parameter table.
pub fn format_table(rows: &[(String, String)]) -> String {
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
        assert_eq!(
            (c.recompute, c.memory_budget_gb),
            (RecomputeKind::All, None)
        );
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
        r.origins
            .insert("accum".into(), Origin::File("run.toml".into()));
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
            eval_micro_batch: Some(8),
            ..TrainConfig::default()
        });
        let msg = r.validate().unwrap_err().to_string();
        assert!(
            msg.contains("`eval_micro_batch` = 8") && msg.contains("eval_data"),
            "{msg}"
        );

        let r = resolved(TrainConfig {
            lora_dropout: 1.0,
            ..TrainConfig::default()
        });
        assert!(r.validate().is_err());

        let budget = |recompute| TrainConfig {
            recompute,
            memory_budget_gb: Some(80.0),
            ..TrainConfig::default()
        };
        let msg = resolved(budget(RecomputeKind::All))
            .validate()
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("memory_budget_gb") && msg.contains("recompute"),
            "{msg}"
        );
        resolved(budget(RecomputeKind::Auto)).validate().unwrap();
    }

    #[test]
    fn table_aligns_and_marks_origins() {
        let mut r = resolved(TrainConfig::default());
        r.origins.insert("lr".into(), Origin::Flag);
        let t = r.table();
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), TrainConfig::default().rows().len() + 2);
        let width = lines[0].len();
        assert!(lines.iter().all(|l| l.chars().count() == width), "{t}");
        assert!(t.contains("| lr ") && t.contains("0.0001   (flag)"), "{t}");
        assert!(t.contains("| eval_data ") && t.contains("| -"), "{t}");
    }
}
