//! Differentiable ops for training a Gemma 4 decoder on Candle.
//!
//! Candle's own fused `rms_norm`, `softmax_last_dim` and `rope` record no backward (their gradients
//! silently stop, see `docs/design.md`). Every op here carries a gradient. The public functions are
//! the stable API the model uses. Each fused op is a Candle custom op with a plain-loop `cpu_fwd`
//! (the reference), a `cuda_fwd` (feature `cuda`, kernels in `kernels/<op>.cu` compiled to PTX by
//! `build.rs` with nvcc) and a `bwd`; beside it sits a `_slow` composite twin built from basic Candle
//! ops, and the module's tests check fused == slow (forward) and bwd == autograd of slow on the CPU.
//!
//! Numerics follow transformers 5.23 (`docs/gemma4.md` §4 and §6): norms and softmax in fp32
//! with one rounding back to the input dtype, RoPE products in the activation dtype.
//!
//! Ops: [`backward_with_seed`] (SeedGrad), [`linear_frozen`] (FrozenMatmul: d(x) only),
//! [`lora_linear`] (frozen linear + LoRA branch as one node; [`lora_linear_saved_deferred`] +
//! [`gelu_tanh_mul_lora_up`] add the MLP's gate / up adapter terms in the GeGLU's pass), [`rms_norm`], [`rope`],
//! [`heads_norm_rope`] (attention's per-head norm, layout move and RoPE in one kernel; graph-free), [`softmax_last_dim`], [`gelu_tanh_mul`], [`linear_cross_entropy`]
//! (chunked, loss and d(hidden) in one pass), [`attention`] (causal, sliding window, key padding and
//! packed sequences ([`KeyMask`]), GQA, no (t, t) tensor; CUDA kernels picked by an [`AttentionPlan`]) and the composite
//! [`attention_dense`] (dense additive mask; [`attention_slow`] is it with the causal mask), [`adamw_step`] + [`l2_norm`] (AdamW and the clip norm over flat fp32 buffers), [`lora_dropout`] /
//! [`dropout_mask`] (counter-hash mask that replays, identical bits on CPU and CUDA), and
//! [`HostOffload`] (tensors parked in host memory from a forward to its backward, copied on a stream
//! of their own on CUDA).
//!
//! CUDA build: with the `cuda` feature, `build.rs` runs nvcc (`-arch=compute_$CUDA_COMPUTE_CAP`,
//! `docs/cuda.md`) on each `kernels/<op>.cu` and the PTX is embedded with `include_str!`; the driver
//! JIT-compiles it once per process. Chosen over NVRTC because the GPU machine then needs no CUDA
//! headers or libnvrtc at run time, and kernel compile errors surface at build time. nvcc must match
//! the driver's PTX ISA (13.0 for driver 580). `src/gpu_tests.rs` checks every CUDA op against
//! its CPU reference and times it (`docs/benchmarks.md` §4).
//!
//! Left out on purpose: gradients for frozen operands (norm weights, projection weights, the tied
//! embedding in the loss) are never computed.

#[cfg(feature = "cuda")]
mod adapter_cuda;
mod attention;
mod cast;
mod cross_entropy;
#[cfg(feature = "cuda")]
mod cublas;
#[cfg(feature = "cuda")]
mod cuda;
mod dropout;
mod geglu;
#[cfg(all(test, feature = "cuda"))]
mod gpu_tests;
mod heads_norm;
mod linear_frozen;
mod lora_geglu;
mod lora_linear;
mod moe;
mod offload;
mod optim;
mod rms_norm;
mod rope;
mod scale;
mod seed_grad;
mod softmax;
#[cfg(test)]
mod testing;
mod transpose;
mod util;

pub use attention::{
    attention, attention_dense, attention_dense_backward, attention_saved, attention_slow,
    AttentionBackward, AttentionForward, AttentionPlan, AttentionSaved, KeyMask,
};
pub use cast::cast_together;
pub use cross_entropy::{
    cross_entropy_sum, linear_cross_entropy, linear_cross_entropy_slow, softcap,
};
pub use dropout::{dropout_key, dropout_mask, lora_dropout, lora_dropout_slow};
pub use geglu::{
    gelu_tanh, gelu_tanh_mul, gelu_tanh_mul_backward, gelu_tanh_mul_backward_in_place,
    gelu_tanh_mul_halves, gelu_tanh_mul_halves_backward, gelu_tanh_mul_slow,
};
pub use heads_norm::{heads_norm_rope, heads_norm_rope_backward, RopeTables};
pub use linear_frozen::{linear_frozen, linear_frozen_backward, linear_frozen_slow};
pub use lora_geglu::{gelu_tanh_mul_lora_up, gelu_tanh_mul_lora_up_act, LoraUp};
pub use lora_linear::{
    lora_linear, lora_linear_saved, lora_linear_saved_deferred, lora_linear_saved_state,
    lora_linear_saved_state_of_low, lora_linear_slow, AdapterOperands, LoraDropout,
    LoraLinearSaved,
};
pub use moe::{
    grouped_matmul, moe_combine, moe_combine_backward, moe_gather, moe_group, moe_topk, MoeGroups,
};
pub use offload::HostOffload;
pub use optim::{adamw_step, l2_norm, AdamWParams, AdamWScalars};
pub use rms_norm::{
    rms_norm, rms_norm_add, rms_norm_backward, rms_norm_backward_over_input, rms_norm_slow,
};
pub use rope::{rope, rope_backward, rope_slow};
pub use scale::{mul_scalar, mul_scalar_vector, mul_vector_scalar};
pub use seed_grad::backward_with_seed;
pub use softmax::{softmax_last_dim, softmax_last_dim_slow};
pub use transpose::{swap_dims12, swap_dims12_slow};
