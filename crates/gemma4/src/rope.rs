//! Rotary-embedding tables (`Gemma4TextRotaryEmbedding`, transformers 5.23; `docs/gemma4.md` §4.4).
//!
//! One table per layer type. Angles are `float(pos) · inv_freq` in fp32 (never in the activation
//! dtype: bf16 cannot hold positions > 256), cos/sin are taken in fp32 and rounded once to the
//! activation dtype. `proportional` RoPE zero-pads `inv_freq` so only the first
//! `int(p·d // 2)` pairs rotate; the exponent denominator is the full head size `d`.

use candle_core::{DType, Device, Tensor};

use crate::config::{RopeParams, RopeType};
use crate::error::Result;

/// Inverse frequencies (`d/2` values, fp32) of one layer type with head size `head_dim`.
pub fn inv_freq(params: &RopeParams, head_dim: usize) -> Vec<f32> {
    let half = head_dim / 2;
    let rotated = match params.rope_type {
        RopeType::Default => half,
        RopeType::Proportional => {
            ((params.partial_rotary_factor * head_dim as f64) as usize / 2).min(half)
        }
    };
    (0..half)
        .map(|k| {
            if k >= rotated {
                return 0.0;
            }
            // torch: 1.0 / (base ** (arange(0, d, 2).float() / d)), all in fp32.
            let exponent = (2 * k) as f32 / head_dim as f32;
            let f = 1.0f32 / (params.rope_theta.powf(exponent as f64) as f32);
            (f as f64 / params.factor) as f32
        })
        .collect()
}

/// cos/sin tables of one layer type for a batch: both `(b, t, d)` in `dtype`.
#[derive(Debug, Clone)]
pub struct RopeTable {
    /// `cos(emb)`, `(b, t, d)`.
    pub cos: Tensor,
    /// `sin(emb)`, `(b, t, d)`.
    pub sin: Tensor,
}

impl RopeTable {
    /// Builds the table from `positions` (row-major `(b, t)`), `emb = concat(freqs, freqs)`.
    pub fn new(
        params: &RopeParams,
        head_dim: usize,
        positions: &[u32],
        (b, t): (usize, usize),
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let inv = inv_freq(params, head_dim);
        let half = inv.len();
        let mut cos = Vec::with_capacity(b * t * head_dim);
        let mut sin = Vec::with_capacity(b * t * head_dim);
        for &p in positions {
            let row_start = cos.len();
            for &f in &inv {
                let a = p as f32 * f; // fp32 angle, as torch
                cos.push(a.cos());
                sin.push(a.sin());
            }
            cos.extend_from_within(row_start..row_start + half);
            sin.extend_from_within(row_start..row_start + half);
        }
        let cos = Tensor::from_vec(cos, (b, t, head_dim), device)?.to_dtype(dtype)?;
        let sin = Tensor::from_vec(sin, (b, t, head_dim), device)?.to_dtype(dtype)?;
        Ok(RopeTable { cos, sin })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proportional_inv_freq_matches_spec_example() {
        // docs/gemma4.md §4.4: d=16, p=0.25, theta=1e6 → [1, 0.17783, 0 × 6].
        let p = RopeParams {
            rope_type: RopeType::Proportional,
            rope_theta: 1e6,
            partial_rotary_factor: 0.25,
            factor: 1.0,
        };
        let f = inv_freq(&p, 16);
        assert_eq!(f.len(), 8);
        assert_eq!(f[0], 1.0);
        assert!((f[1] - 0.177_828).abs() < 1e-5, "{f:?}");
        assert!(f[2..].iter().all(|&x| x == 0.0), "{f:?}");
    }

    #[test]
    fn default_table_rotates_every_pair() {
        let p = RopeParams {
            rope_type: RopeType::Default,
            rope_theta: 10_000.0,
            partial_rotary_factor: 1.0,
            factor: 1.0,
        };
        let t = RopeTable::new(&p, 4, &[0, 3], (1, 2), DType::F32, &Device::Cpu).unwrap();
        let cos: Vec<f32> = t.cos.flatten_all().unwrap().to_vec1().unwrap();
        let inv = inv_freq(&p, 4);
        assert_eq!(inv, vec![1.0, 0.01]);
        assert_eq!(&cos[..4], &[1.0; 4]);
        assert_eq!(cos[4], 3.0f32.cos());
        assert_eq!(cos[6], 3.0f32.cos());
        assert_eq!(cos[5], (3.0f32 * 0.01).cos());
    }
}
