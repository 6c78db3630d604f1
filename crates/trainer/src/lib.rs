//! The training job around the model that `examples/train_ddp.rs` composes, in four parts:
//!
//! - [`step`], the step recipe: a micro-batch's forward + layer-wise backward with each finished
//!   layer's gradients handed to DDP, an optimizer step's window of micro-batches (`no_sync`
//!   accumulation, then the synchronised backward and `finish`), the loss weighting, AdamW over
//!   DDP's flat buckets ([`step::optim`]), clipping ([`step::clip`]), the learning-rate schedules
//!   ([`step::schedule`]), the non-finite skip/stop decision ([`step::nonfinite`]),
//!   evaluation, the model's FLOP shape for MFU, and observers that time a step
//!   ([`step::profile`]);
//! - [`checkpoint`], what a run keeps and how it starts from it: atomic checkpoint directories,
//!   the trainer state saved in them ([`checkpoint::state`]), the start of a run, fresh, from an
//!   adapter or a checkpoint ([`checkpoint::resume`]), and the output folder
//!   ([`checkpoint::run_dir`]);
//! - [`metrics`], what a run reports: the log line, JSONL and progress bar, MFU
//!   ([`metrics::mfu`]), peak memory ([`metrics::memory`]), the loss plot ([`metrics::plot`]) and
//!   TensorBoard events ([`metrics::tensorboard`]);
//! - [`config`], the settings: [`TrainConfig`] defines each once (flag, TOML key, environment
//!   override, startup table) and [`config::cli`] resolves the command line.
//!
//! Besides: [`device`] (the CPU or CUDA device a training process computes on) and [`error`].
//!
//! Everything follows PyTorch/transformers semantics (`torch.optim.AdamW`, `clip_grad_norm_`,
//! transformers' schedules) so a run can be compared step by step with the post's `train_ddp.py`.
//! The training loop itself lives in the example, readable top to bottom; the model, the data
//! pipeline and the collectives' implementation are other crates'. Collectives are issued only
//! by the step recipe, through DDP and the process group ([`step::accumulate_window`],
//! [`step::backward`] into DDP itself, [`step::all_reduce_sum`], [`step::evaluate`]; every rank
//! calls them in the same order); the other parts take plain buffers and numbers (already
//! all-reduced where the ranks must agree).

pub mod checkpoint;
pub mod config;
pub mod device;
pub mod error;
pub mod metrics;
pub mod step;

pub use config::cli::Cli;
pub use config::{ResolvedConfig, TrainConfig};
pub use error::{Error, Result};
