//! PEFT-exact LoRA for Candle linears.
//!
//! A [`LoraLinear`] is a frozen base weight `W (out, in)` plus an optional adapter with fp32
//! `A (r, in)` and `B (out, r)`: `y = x·Wᵀ + dropout(x)·Aᵀ·Bᵀ·scale` (PEFT `peft/tuners/lora/layer.py`).
//! The crate is model-agnostic: a model builds its projections as `LoraLinear`s named by their
//! checkpoint module path, and the adapter machinery (config, targeting, init, dropout, PEFT I/O,
//! merge) works on those paths.

mod linear;

pub use linear::{Adapter, LoraContext, LoraLinear};
