//! Scalar multiplies with PyTorch's rounding: `tensor * python_float` computes in fp32 and rounds
//! once to the tensor dtype (Candle's `affine` would first round the scalar to bf16).

use candle_core::{DType, Tensor};

use crate::error::Result;

/// `x · s` with `s` kept in fp32 and one rounding to `x`'s dtype (differentiable).
pub fn mul_scalar(x: &Tensor, s: f64) -> Result<Tensor> {
    if x.dtype() == DType::F32 {
        return Ok((x * s)?);
    }
    Ok((x.to_dtype(DType::F32)? * s)?.to_dtype(x.dtype())?)
}

/// `s` rounded to `dtype` (how HF casts the embedding scale to the weight dtype first).
pub fn round_to_dtype(s: f64, dtype: DType) -> f64 {
    match dtype {
        DType::BF16 => half::bf16::from_f64(s).to_f64(),
        DType::F16 => half::f16::from_f64(s).to_f64(),
        DType::F32 => s as f32 as f64,
        _ => s,
    }
}
