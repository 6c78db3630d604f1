//! Differentiable ops for training a Gemma 4 decoder on Candle.
//!
//! Candle's own fused `rms_norm`, `softmax_last_dim` and `rope` record no backward (their gradients
//! silently stop, see `docs/design.md`). Every op here carries a gradient. The public functions are
//! the stable API the model uses; each has a `_slow` composite reference built from basic Candle ops,
//! and fused versions (custom ops with `cpu_fwd`, `cuda_fwd` and `bwd`) replace the bodies without
//! changing signatures.
//!
//! Numerics follow transformers 5.23 (see `gemma4-text-spec.md` §4 and §6): norms and softmax in fp32
//! with one rounding back to the input dtype, RoPE products in the activation dtype.

use candle_core::{DType, Result, Tensor, D};

/// Gemma RMSNorm over the last axis: `y = x·rsqrt(mean(x²)+eps)·w`, computed in fp32, rounded once
/// to `x`'s dtype. `weight = None` is the scale-free variant (`v_norm`, the MoE router norm).
/// No `1 + w` (that was Gemma 2/3).
pub fn rms_norm(x: &Tensor, weight: Option<&Tensor>, eps: f64) -> Result<Tensor> {
    rms_norm_slow(x, weight, eps)
}

/// Composite reference for [`rms_norm`].
pub fn rms_norm_slow(x: &Tensor, weight: Option<&Tensor>, eps: f64) -> Result<Tensor> {
    let dtype = x.dtype();
    let xf = x.to_dtype(DType::F32)?;
    let ms = xf.sqr()?.mean_keepdim(D::Minus1)?;
    let mut y = xf.broadcast_mul(&(ms + eps)?.sqrt()?.recip()?)?;
    if let Some(w) = weight {
        y = y.broadcast_mul(&w.to_dtype(DType::F32)?)?;
    }
    y.to_dtype(dtype)
}

/// Rotary embedding, half-split (`rotate_half`) layout: `x·cos + rotate_half(x)·sin`.
/// `x`: (b, h, t, d); `cos`, `sin`: (b, t, d) in `x`'s dtype. Products in the activation dtype.
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    rope_slow(x, cos, sin)
}

/// Composite reference for [`rope`].
pub fn rope_slow(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let d = x.dim(D::Minus1)?;
    let x1 = x.narrow(D::Minus1, 0, d / 2)?;
    let x2 = x.narrow(D::Minus1, d / 2, d / 2)?;
    let rotated = Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?;
    let cos = cos.unsqueeze(1)?;
    let sin = sin.unsqueeze(1)?;
    x.broadcast_mul(&cos)? + rotated.broadcast_mul(&sin)?
}

/// Softmax over the last axis in fp32, result rounded to `x`'s dtype (transformers'
/// `softmax(..., dtype=float32).to(dtype)`).
pub fn softmax_last_dim(x: &Tensor) -> Result<Tensor> {
    softmax_last_dim_slow(x)
}

/// Composite reference for [`softmax_last_dim`].
pub fn softmax_last_dim_slow(x: &Tensor) -> Result<Tensor> {
    let dtype = x.dtype();
    let xf = x.to_dtype(DType::F32)?;
    let max = xf.max_keepdim(D::Minus1)?;
    let e = xf.broadcast_sub(&max)?.exp()?;
    let s = e.sum_keepdim(D::Minus1)?;
    e.broadcast_div(&s)?.to_dtype(dtype)
}

/// GeGLU: `gelu_tanh(gate) * up`, gelu computed in fp32 and rounded once (PyTorch's
/// `gelu_pytorch_tanh`), the product in the activation dtype.
pub fn gelu_tanh_mul(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    gelu_tanh_mul_slow(gate, up)
}

/// Composite reference for [`gelu_tanh_mul`].
pub fn gelu_tanh_mul_slow(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    let act = gelu_tanh(gate)?;
    act * up
}

/// `gelu_pytorch_tanh`: `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))` in fp32, rounded once.
pub fn gelu_tanh(x: &Tensor) -> Result<Tensor> {
    let dtype = x.dtype();
    x.to_dtype(DType::F32)?.gelu()?.to_dtype(dtype)
}

/// `x @ wᵀ` for a frozen weight `w` of shape (out, in): the backward produces only d(x), never a
/// weight-sized d(w). `x`: (..., in) → (..., out).
pub fn linear_frozen(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    x.broadcast_matmul(&w.detach().t()?)
}

/// Final-logit softcap `cap·tanh(x/cap)`, in the logits dtype.
pub fn softcap(logits: &Tensor, cap: f64) -> Result<Tensor> {
    (logits / cap)?.tanh()? * cap
}

/// Sum of token cross-entropies over rows of `logits` (n, v) whose target is not ignored.
/// `targets`: (n,) `u32`; `u32::MAX` marks an ignored position (-100 in PyTorch).
/// Logits are upcast to fp32 first (transformers' `logits.float()`). Returns a scalar f32 tensor.
pub fn cross_entropy_sum(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    let lf = logits.to_dtype(DType::F32)?;
    let max = lf.max_keepdim(D::Minus1)?;
    let shifted = lf.broadcast_sub(&max)?;
    let lse = shifted.exp()?.sum_keepdim(D::Minus1)?.log()?;
    let logp = shifted.broadcast_sub(&lse)?;
    // gather returns 0 for the u32::MAX index, so ignored rows contribute nothing.
    let picked = logp.gather(&targets.unsqueeze(1)?, 1)?;
    picked.sum_all()?.neg()
}
