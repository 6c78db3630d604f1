//! Trainable Gemma 4 text decoder on Candle, numerically matching transformers 5.23.
//!
//! What is here: the config (both model types, both per-layer forms), checkpoint loading (local
//! directory or Hub cache, memory-mapped, text tensors only), the training forward without KV
//! cache (sliding/full attention, proportional RoPE, `attention_k_eq_v`, KV sharing, per-layer
//! embeddings, MoE, final softcap), the transformers loss, a layer-wise backward with per-layer
//! recompute of the layers that do not keep their activations ([`KeepMask`]) whose per-layer
//! gradients are reported as soon as they are final, the step's memory model ([`MemoryModel`]),
//! and the generation forward: a [`KvCache`] (full layers keep every position, sliding layers a
//! ring of the last `window`, KV consumers read their producer's), [`Gemma4Model::prefill`] of
//! left-padded prompts and [`Gemma4Model::decode_step`] of one token per row.
//!
//! What is not: decoding strategies (`g4ft-generate`), vision and audio towers, multimodal masks. Every
//! projection is a [`g4ft_lora::LoraLinear`] named by its checkpoint path, and every op on the
//! training path is a differentiable op from `g4ft_ops`.
//!
//! Reference: `models/gemma4/modeling_gemma4.py` and `models/gemma4_unified/` of transformers
//! 5.23.0; what we compute and match is described in `docs/gemma4.md`.

pub mod attention;
mod backward;
pub mod config;
pub mod decoder_layer;
pub mod error;
pub mod gguf_names;
pub mod kv_cache;
pub mod loader;
pub mod mask;
pub mod memory;
pub mod mlp;
pub mod model;
pub mod moe;
mod numerics;
pub mod recompute;
pub mod rope;
pub mod weights;

pub use config::{
    Config, KvSharing, LayerConfig, LayerType, MoeConfig, ProjectionShape, RopeParams, RopeType,
};
pub use error::{Error, Result};
pub use kv_cache::KvCache;
pub use loader::{Checkpoint, Hub, ModelFiles};
pub use memory::{MemoryBudget, MemoryModel, RecomputePlan, StepShape};
pub use model::{shift_labels, Gemma4Model, LossOutput, TokenBatch};
pub use recompute::{KeepMask, Parked, Recompute};
