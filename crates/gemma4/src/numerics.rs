//! Scalars rounded as transformers rounds them (the products with PyTorch's roundings are
//! `g4ft_ops::mul_scalar` and its vector forms).

use candle_core::DType;

/// `s` rounded to `dtype` (how HF casts the embedding scale to the weight dtype first).
pub fn round_to_dtype(s: f64, dtype: DType) -> f64 {
    match dtype {
        DType::BF16 => half::bf16::from_f64(s).to_f64(),
        DType::F16 => half::f16::from_f64(s).to_f64(),
        DType::F32 => s as f32 as f64,
        _ => s,
    }
}
