//! g4ft-generate: text generation with the g4ft Gemma 4 decoder — the model you trained, with
//! its adapters unmerged or merged — as transformers' `generate` does it.
//!
//! The model side (KV cache, prefill, one-token decode steps) is `g4ft_gemma4`'s; this crate
//! holds the decoding: [`GenerationConfig`] (stop ids and sampling defaults from
//! `generation_config.json`), [`Sampling`] (greedy, or temperature → top-k → top-p with a seeded
//! RNG), and [`generate`] (a batch of prompts of different lengths, left padded, each row's
//! positions starting at 0, stopping per row on a stop id or after `max_new_tokens`).
//!
//! Greedy decoding reproduces transformers 5.23 token for token, with per-step logits within
//! 1e-4 (`tests/parity.rs`). Left out: beam search, repetition penalties, speculative decoding.

mod config;
mod error;
mod generate;
mod sampling;

pub use config::{GenerationConfig, GENERATION_CONFIG_NAME};
pub use error::{GenerateError, Result};
pub use generate::{generate, left_pad, FinishReason, GenerateOptions, Generation, Step};
pub use sampling::{Sampler, Sampling, SamplingParams};
