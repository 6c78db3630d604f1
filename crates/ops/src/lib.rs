//! Differentiable ops for training a Gemma 4 decoder on Candle.
//!
//! Candle's own fused `rms_norm`, `softmax_last_dim` and `rope` record no backward (their gradients
//! silently stop, see `docs/design.md`). Every op here carries a gradient. The public functions are
//! the stable API the model uses. Each fused op is a Candle custom op with a plain-loop `cpu_fwd`
//! (the reference), a `cuda_fwd` (feature `cuda`, kernels in `kernels/<op>.cu` compiled to PTX by
//! `build.rs` with nvcc) and a `bwd`; beside it sits a `_slow` composite twin built from basic Candle
//! ops, and the module's tests check fused == slow (forward) and bwd == autograd of slow on the CPU.
//!
//! Numerics follow transformers 5.23 (see `gemma4-text-spec.md` §4 and §6): norms and softmax in fp32
//! with one rounding back to the input dtype, RoPE products in the activation dtype.
//!
//! Left out on purpose: gradients for frozen operands (norm weights, projection weights, the tied
//! embedding in the loss) are never computed.

mod attention;
mod cross_entropy;
#[cfg(feature = "cuda")]
mod cuda;
mod dropout;
mod geglu;
mod linear_frozen;
mod optim;
mod rms_norm;
mod rope;
mod seed_grad;
mod softmax;
#[cfg(test)]
mod testing;
mod util;

pub use attention::{attention, attention_slow};
pub use cross_entropy::{
    cross_entropy_sum, linear_cross_entropy, linear_cross_entropy_slow, softcap,
};
pub use dropout::{dropout_key, dropout_mask, lora_dropout, lora_dropout_slow};
pub use geglu::{gelu_tanh, gelu_tanh_mul, gelu_tanh_mul_slow};
pub use linear_frozen::{linear_frozen, linear_frozen_slow};
pub use optim::{adamw_step, adamw_step_slow, clip_coefficient, AdamW};
pub use rms_norm::{rms_norm, rms_norm_slow};
pub use rope::{rope, rope_slow};
pub use seed_grad::backward_with_seed;
pub use softmax::{softmax_last_dim, softmax_last_dim_slow};
