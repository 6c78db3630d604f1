//! PEFT-exact LoRA for Candle linears.
//!
//! A [`LoraLinear`] is a frozen base weight `W (out, in)` plus an optional adapter with fp32
//! `A (r, in)` and `B (out, r)`: `y = x·Wᵀ + dropout(x)·Aᵀ·Bᵀ·scale` (PEFT `peft/tuners/lora/layer.py`).
//! The crate is model-agnostic: a model builds its projections as `LoraLinear`s named by their
//! checkpoint module path, and the adapter machinery works on those paths:
//!
//! - [`LoraConfig`] and [`Targeting`]: PEFT's config and `target_modules` semantics;
//! - [`attach`]: PEFT's init from a seeded counter-based RNG, identical on every rank;
//! - [`lora_dropout`]: replayable dropout masks keyed on `(seed, micro_step, module)`;
//! - [`count_trainable`], [`ParamReport`]: `print_trainable_parameters` from shapes alone;
//! - [`save_adapter`], [`load_adapter`]: PEFT's `adapter_config.json` + `adapter_model.safetensors`;
//! - [`merge_adapter_dir`], [`merge_projections`]: a merged full HF checkpoint;
//! - [`write_gguf_adapter`]: the adapter as a llama.cpp LoRA GGUF.
//!
//! Left out on purpose: DoRA, adapter biases, embedding LoRA, `modules_to_save`, quantised bases;
//! configs asking for them are rejected with an error naming the field.

mod attach;
mod config;
mod count;
mod dropout;
mod error;
mod gguf;
mod init;
mod io;
mod linear;
mod merge;
mod target;

pub use attach::{attach, lora_parameters, NamedVar};
pub use config::{InitLoraWeights, LoraConfig, TargetModules};
pub use count::{count_trainable, ParamReport};
pub use dropout::{dropout_key, lora_dropout};
pub use error::{LoraError, Result};
pub use gguf::{write_gguf_adapter, GgufReport};
pub use init::init_adapter_values;
pub use io::{
    load_adapter, peft_key, read_adapter, save_adapter, write_safetensors, AdapterWeights,
    CONFIG_NAME, KEY_PREFIX, WEIGHTS_NAME,
};
pub use linear::{
    hold_adapter_copies, Adapter, AdapterCopies, AdapterGrads, LoraContext, LoraLinear,
    ProjectionSaved,
};
pub use merge::{
    adapter_fingerprint, check_not_merged, merge_adapter_dir, merge_deltas, merge_projections,
    MergeDelta, MergeOptions, MergeReport, ShardWritten, MERGED_ADAPTERS_NAME,
};
pub use target::{ProjectionShape, Targeting};
