//! g4ft-data: training data for Gemma 4 LoRA fine-tuning — the post's `ChatJsonl`,
//! `DistributedSampler`, `DataLoader` and `PadCollate`, in Rust.
//!
//! Pipeline: a JSONL, Parquet, Arrow or CSV file of chat, ShareGPT, prompt/completion, text or
//! pre-tokenized rows ([`Format`]) → [`TokenDataset::open`] (conversations rendered with the
//! model's chat template through minijinja as transformers renders them, tools and tool calls
//! included; tokenized without special tokens; labels `auto`, `full` or `assistant_only`;
//! truncated to `max_len`; in parallel; cached on disk per file/tokenizer/template/settings; a
//! [`PrepareReport`]) → [`DataLoader`] (PyTorch's [`DistributedSampler`] semantics, optional
//! length grouping or packing, [`PadCollate`] on a prefetch thread) → [`Batch`]. `docs/data.md`
//! describes the formats, the label rule and the packed batch representation.
//!
//! ```no_run
//! # fn main() -> g4ft_data::Result<()> {
//! use std::sync::Arc;
//! use g4ft_data::{DataLoader, DatasetOptions, Encoder, LoaderConfig, TokenDataset};
//! let encoder = Encoder::from_model_dir("assets/tiny".as_ref())?;
//! // every rank, before any collective (the first one tokenizes, the others reuse the cache)
//! let ds = Arc::new(TokenDataset::open("assets/sample/chat.jsonl".as_ref(), Some(&encoder), &DatasetOptions::default())?);
//! let loader = DataLoader::new(ds, LoaderConfig { batch_size: 4, rank: 0, world_size: 2, seed: 42, ..Default::default() })?;
//! for epoch in 0..2 {
//!     for batch in loader.epoch(epoch, 0) {
//!         let batch = batch?; // (batch.batch, batch.seq_len) row-major arrays
//!         assert_eq!(batch.input_ids.len(), batch.batch * batch.seq_len);
//!     }
//! }
//! # Ok(()) }
//! ```
//!
//! Deliberately left out: the model (packed rows reach it as restarting `position_ids`),
//! multimodal content parts (text-only training: image/audio parts are bad rows), and any
//! communication — the sampler needs none, every rank computes the same plan.

pub mod batching;
pub mod cache;
pub mod card;
pub mod collate;
pub mod dataset;
pub mod encoder;
pub mod error;
pub mod files;
mod glob;
pub mod hash;
pub mod hub;
pub mod labels;
pub mod loader;
pub mod prepare;
pub mod pyhelpers;
pub mod randperm;
pub mod rows;
pub mod sampler;
mod saved;
pub mod source;
pub mod template;

pub use batching::Batching;
pub use collate::{Batch, PadCollate};
pub use dataset::{detect_files_format, DatasetOptions, Sample, TokenDataset};
pub use encoder::{Encoded, Encoder};
pub use error::{BadLine, DataError, Result, RowError, SkipReason};
pub use files::{resolve_local, DataFiles, SplitChoice};
pub use labels::{LabelMode, ModelSpans, TurnMarkers, IGNORE};
pub use loader::{Batches, DataLoader, LoaderConfig};
pub use prepare::{
    detect_format, skipped_row_warnings, tokenize_file, write_skipped_rows, LengthStats,
    PrepareOptions, PrepareReport,
};
pub use rows::{Format, Row};
pub use sampler::DistributedSampler;
pub use template::{ChatTemplate, Conversation, RenderOptions};
