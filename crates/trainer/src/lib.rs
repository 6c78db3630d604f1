//! The reusable pieces of the training job that `examples/train_ddp.rs` composes: configuration
//! (TOML + environment + flags), AdamW over flat fp32 buffers, gradient clipping, the cosine
//! schedule with warmup, step metrics with MFU, atomic checkpoints with resumable trainer state,
//! and the non-finite skip/stop decision.
//!
//! Everything here follows PyTorch/transformers semantics (`torch.optim.AdamW`,
//! `clip_grad_norm_`, `get_cosine_schedule_with_warmup`) so a run can be compared step by step
//! with the post's `train_ddp.py`. Deliberately left out: the training loop itself (it lives in the
//! example, readable top to bottom), the model, the data pipeline and the collectives; this crate
//! takes plain buffers, numbers and closures, and never issues a collective.

pub mod checkpoint;
pub mod cli;
pub mod clip;
pub mod config;
pub mod device;
pub mod error;
pub mod memory;
pub mod metrics;
pub mod mfu;
pub mod nonfinite;
pub mod optim;
pub mod plot;
pub mod resume;
pub mod run_dir;
pub mod schedule;
pub mod state;
pub mod step;
pub mod tensorboard;

pub use cli::Cli;
pub use config::{ResolvedConfig, TrainConfig};
pub use error::{Error, Result};
