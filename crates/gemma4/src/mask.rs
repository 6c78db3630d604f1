//! Additive attention masks for full and sliding layers (transformers `masking_utils`, `docs/gemma4.md` §4.3).
//!
//! `A[b, i, j]` ("query i may attend key j"): causal `j ≤ i`; sliding additionally `i − j < W`
//! (exactly `W` keys including the query); and the key is not padding. Packed sequences (no
//! attention mask, `position_ids` that restart) restrict attention to the same sequence.
//!
//! The common case (causal, right padding) is described by the key-padding mask alone and runs
//! through the fused `g4ft_ops::attention`; packed or bidirectional batches get dense additive
//! fp32 masks (finite minimum for blocked entries, as HF, never −inf) for the composite path.

use candle_core::{Device, Tensor};

use crate::error::Result;

/// How attention is restricted for one batch.
#[derive(Debug, Clone)]
pub enum AttentionBias {
    /// Causal (+ window on sliding layers) with an optional key-padding mask `(b, t)` u32.
    Causal {
        /// 1 = key may be attended, 0 = padding; `None` = no padding.
        key_mask: Option<Tensor>,
    },
    /// Dense additive masks (packed sequences, bidirectional attention).
    Additive(Masks),
}

impl AttentionBias {
    /// Chooses the representation for a batch (see [`build_masks`] for the arguments).
    pub fn new(
        (b, t): (usize, usize),
        attention_mask: Option<&[u32]>,
        position_ids: Option<&[u32]>,
        window: usize,
        causal: bool,
        device: &Device,
    ) -> Result<Self> {
        let packed = attention_mask.is_none()
            && position_ids.is_some_and(|p| packed_sequence_ids(p, b, t).iter().any(|&s| s != 0));
        if causal && !packed {
            let key_mask = match attention_mask {
                Some(m) if m.contains(&0) => Some(Tensor::from_slice(m, (b, t), device)?),
                _ => None,
            };
            return Ok(AttentionBias::Causal { key_mask });
        }
        Ok(AttentionBias::Additive(build_masks(
            (b, t),
            attention_mask,
            position_ids,
            window,
            causal,
            device,
        )?))
    }
}

/// The two additive masks of a batch, each `(b, 1, t, t)` fp32.
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
        let add: Vec<f32> = keep
            .iter()
            .map(|&k| if k { 0.0 } else { f32::MIN })
            .collect();
        Ok(Tensor::from_vec(add, (b, 1, t, t), device)?)
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
        // docs/gemma4.md §4.3, verified with W=4: row 7 attends keys 4..7.
        let m = build_masks((1, 8), None, None, 4, true, &Device::Cpu).unwrap();
        let s = keep(&m.sliding);
        assert_eq!(s[7], vec![0, 0, 0, 0, 1, 1, 1, 1]);
        assert_eq!(s[2], vec![1, 1, 1, 0, 0, 0, 0, 0]);
        assert_eq!(keep(&m.full)[7], vec![1; 8]);
    }

    #[test]
    fn padding_and_packing() {
        let am = [1, 1, 1, 0];
        let m = build_masks((1, 4), Some(&am), None, 8, true, &Device::Cpu).unwrap();
        assert_eq!(keep(&m.full)[3], vec![1, 1, 1, 0]);
        // Packed: positions restart at index 2 → block diagonal.
        let pos = [0, 1, 0, 1];
        let m = build_masks((1, 4), None, Some(&pos), 8, true, &Device::Cpu).unwrap();
        assert_eq!(keep(&m.full)[3], vec![0, 0, 1, 1]);
        assert_eq!(keep(&m.full)[1], vec![1, 1, 0, 0]);
    }

    #[test]
    fn causal_batches_use_the_key_mask_only() {
        let am = [1, 1, 0, 1, 1, 1];
        let bias = AttentionBias::new((2, 3), Some(&am), None, 2, true, &Device::Cpu).unwrap();
        assert!(matches!(bias, AttentionBias::Causal { key_mask: Some(_) }));
        let pos = [0, 1, 2, 0, 1, 2];
        let bias = AttentionBias::new((2, 3), None, Some(&pos), 2, true, &Device::Cpu).unwrap();
        assert!(matches!(bias, AttentionBias::Causal { key_mask: None }));
        let pos = [0, 1, 0, 0, 1, 2];
        let bias = AttentionBias::new((2, 3), None, Some(&pos), 2, true, &Device::Cpu).unwrap();
        assert!(matches!(bias, AttentionBias::Additive(_)));
        let v: Vec<f32> = match bias {
            AttentionBias::Additive(m) => m.full.flatten_all().unwrap().to_vec1().unwrap(),
            _ => unreachable!(),
        };
        assert!(v.iter().all(|x| x.is_finite()));
    }
}
