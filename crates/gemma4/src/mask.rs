//! Additive attention masks for full and sliding layers (transformers `masking_utils`, spec §4.3).
//!
//! `A[b, i, j]` ("query i may attend key j"): causal `j ≤ i`; sliding additionally `i − j < W`
//! (exactly `W` keys including the query); and the key is not padding. Packed sequences (no
//! attention mask, `position_ids` that restart) restrict attention to the same sequence. Blocked
//! entries get the dtype's finite minimum (HF eager), never −inf.

use candle_core::{DType, Device, Tensor};
use half::{bf16, f16};

use crate::error::{Error, Result};

/// The two masks of a batch, each `(b, 1, t, t)` in the activation dtype.
#[derive(Debug, Clone)]
pub struct Masks {
    /// Full-attention layers.
    pub full: Tensor,
    /// Sliding-window layers.
    pub sliding: Tensor,
}

/// Sequence ids for packing detection: a new sequence starts where `pos[j] != pos[j-1] + 1`.
fn packed_sequence_ids(positions: &[u32], b: usize, t: usize) -> Vec<u32> {
    let mut ids = vec![0u32; b * t];
    for r in 0..b {
        let row = &positions[r * t..(r + 1) * t];
        let mut id = 0;
        for j in 1..t {
            if row[j] != row[j - 1].wrapping_add(1) {
                id += 1;
            }
            ids[r * t + j] = id;
        }
    }
    ids
}

/// Builds the additive masks.
///
/// `attention_mask`: `(b, t)` row-major 1 = token, 0 = padding (`None` = all tokens);
/// `position_ids`: `(b, t)` (used only for packing detection, and only without attention mask);
/// `window`: sliding window `W`; `causal`: `false` for `use_bidirectional_attention = "all"`.
pub fn build_masks(
    (b, t): (usize, usize),
    attention_mask: Option<&[u32]>,
    position_ids: Option<&[u32]>,
    window: usize,
    causal: bool,
    dtype: DType,
    device: &Device,
) -> Result<Masks> {
    let seq = match (attention_mask, position_ids) {
        (None, Some(p)) => Some(packed_sequence_ids(p, b, t)),
        _ => None,
    };
    let allowed = |r: usize, i: usize, j: usize, sliding: bool| -> bool {
        if let Some(m) = attention_mask {
            if m[r * t + j] == 0 {
                return false;
            }
        }
        if let Some(s) = &seq {
            if s[r * t + i] != s[r * t + j] {
                return false;
            }
        }
        if causal {
            j <= i && (!sliding || i - j < window)
        } else {
            !sliding || i.abs_diff(j) < window
        }
    };
    let build = |sliding: bool| -> Result<Tensor> {
        let mut keep = Vec::with_capacity(b * t * t);
        for r in 0..b {
            for i in 0..t {
                for j in 0..t {
                    keep.push(allowed(r, i, j, sliding));
                }
            }
        }
        let shape = (b, 1, t, t);
        let tensor = match dtype {
            DType::F32 => Tensor::from_vec(
                keep.iter()
                    .map(|&k| if k { 0.0 } else { f32::MIN })
                    .collect::<Vec<_>>(),
                shape,
                device,
            ),
            DType::BF16 => Tensor::from_vec(
                keep.iter()
                    .map(|&k| if k { bf16::ZERO } else { bf16::MIN })
                    .collect::<Vec<_>>(),
                shape,
                device,
            ),
            DType::F16 => Tensor::from_vec(
                keep.iter()
                    .map(|&k| if k { f16::ZERO } else { f16::MIN })
                    .collect::<Vec<_>>(),
                shape,
                device,
            ),
            other => {
                return Err(Error::batch(
                    "dtype",
                    format!("masks need a float activation dtype, got {other:?}"),
                ))
            }
        }?;
        Ok(tensor)
    };
    Ok(Masks {
        full: build(false)?,
        sliding: build(true)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keep(m: &Tensor) -> Vec<Vec<u8>> {
        let v: Vec<Vec<f32>> = m.squeeze(0).unwrap().squeeze(0).unwrap().to_vec2().unwrap();
        v.iter()
            .map(|r| r.iter().map(|&x| u8::from(x == 0.0)).collect())
            .collect()
    }

    #[test]
    fn sliding_window_has_exactly_w_keys_including_self() {
        // Spec §4.3, verified with W=4: row 7 attends keys 4..7.
        let m = build_masks((1, 8), None, None, 4, true, DType::F32, &Device::Cpu).unwrap();
        let s = keep(&m.sliding);
        assert_eq!(s[7], vec![0, 0, 0, 0, 1, 1, 1, 1]);
        assert_eq!(s[2], vec![1, 1, 1, 0, 0, 0, 0, 0]);
        assert_eq!(keep(&m.full)[7], vec![1; 8]);
    }

    #[test]
    fn padding_and_packing() {
        let am = [1, 1, 1, 0];
        let m = build_masks((1, 4), Some(&am), None, 8, true, DType::F32, &Device::Cpu).unwrap();
        assert_eq!(keep(&m.full)[3], vec![1, 1, 1, 0]);
        // Packed: positions restart at index 2 → block diagonal.
        let pos = [0, 1, 0, 1];
        let m = build_masks((1, 4), None, Some(&pos), 8, true, DType::F32, &Device::Cpu).unwrap();
        assert_eq!(keep(&m.full)[3], vec![0, 0, 1, 1]);
        assert_eq!(keep(&m.full)[1], vec![1, 1, 0, 0]);
    }

    #[test]
    fn bf16_mask_is_finite() {
        let m = build_masks((1, 3), None, None, 2, true, DType::BF16, &Device::Cpu).unwrap();
        let v: Vec<f32> = m
            .full
            .to_dtype(DType::F32)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        assert!(v.iter().all(|x| x.is_finite()));
        assert_eq!(v[1], bf16::MIN.to_f32());
    }
}
