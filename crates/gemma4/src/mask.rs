//! Attention masks for full and sliding layers (transformers `masking_utils`, `docs/gemma4.md` §4.3).
//!
//! `A[b, i, j]` ("query i may attend key j"): causal `j ≤ i`; sliding additionally `i − j < W`
//! (exactly `W` keys including the query); and the key is not padding. Packed sequences (no
//! attention mask, `position_ids` that restart) restrict attention to the same sequence.
//!
//! Every causal batch runs through the fused `g4ft_ops::attention` with no `(t, t)` tensor: the
//! key-padding mask, and for packed rows each token's sequence start (found from the position
//! restarts on the host), describe it completely. Only what those cannot express gets dense
//! additive fp32 masks `(b, 1, t, t)` (finite minimum for blocked entries, as HF, never −inf) for
//! the composite path: bidirectional attention (`use_bidirectional_attention = "all"`) and the
//! cached decode step's masks over the KV cache (`KvCache::step_masks`).

use candle_core::{Device, Tensor};
use g4ft_ops::KeyMask;

use crate::config::LayerType;
use crate::error::Result;

/// How attention is restricted for one batch.
#[derive(Debug, Clone)]
pub enum AttentionBias {
    /// Causal (+ window on sliding layers), fused: an optional key-padding mask and, for rows
    /// that pack several sequences, each token's sequence start.
    Causal {
        /// `(b, t)` u32, 1 = key may be attended, 0 = padding; `None` = no padding.
        key_mask: Option<Tensor>,
        /// `(b, t)` u32, the index of the first token of each token's sequence (non-decreasing
        /// along a row); `None` = one sequence per row.
        seq_start: Option<Tensor>,
    },
    /// Dense additive masks (bidirectional attention, cached decoding).
    Additive(Masks),
}

/// How one layer's attention scores are masked: the borrowed form of an [`AttentionBias`] for a
/// layer type.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Scores<'a> {
    /// Causal (+ window on sliding layers) through the fused op.
    Causal {
        key_mask: KeyMask<'a>,
        window: Option<usize>,
    },
    /// A dense additive fp32 mask `(b, 1, t, t)`, through the composite.
    Dense(&'a Tensor),
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
        if causal {
            let key_mask = match attention_mask {
                Some(m) if m.contains(&0) => Some(Tensor::from_slice(m, (b, t), device)?),
                _ => None,
            };
            let seq_start = match packed_sequence_starts(attention_mask, position_ids, (b, t)) {
                Some(s) if s.iter().any(|&x| x != 0) => Some(Tensor::from_vec(s, (b, t), device)?),
                _ => None,
            };
            return Ok(AttentionBias::Causal {
                key_mask,
                seq_start,
            });
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

impl AttentionBias {
    /// The masking of a layer of type `layer_type` (`window`: the sliding window of sliding
    /// layers).
    pub(crate) fn scores(&self, layer_type: LayerType, window: usize) -> Scores<'_> {
        match self {
            AttentionBias::Causal {
                key_mask,
                seq_start,
            } => Scores::Causal {
                key_mask: KeyMask {
                    padding: key_mask.as_ref(),
                    seq_start: seq_start.as_ref(),
                },
                window: (layer_type == LayerType::Sliding).then_some(window),
            },
            AttentionBias::Additive(masks) => Scores::Dense(match layer_type {
                LayerType::Sliding => &masks.sliding,
                LayerType::Full => &masks.full,
            }),
        }
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

/// Packing detection (transformers' packed path: position ids and no attention mask): for each
/// token the index of the first token of its sequence, a new sequence starting where
/// `pos[j] != pos[j-1] + 1`. `None` with an attention mask or without positions.
fn packed_sequence_starts(
    attention_mask: Option<&[u32]>,
    position_ids: Option<&[u32]>,
    (b, t): (usize, usize),
) -> Option<Vec<u32>> {
    let positions = match (attention_mask, position_ids) {
        (None, Some(p)) => p,
        _ => return None,
    };
    let mut starts = vec![0u32; b * t];
    for r in 0..b {
        let row = &positions[r * t..(r + 1) * t];
        for j in 1..t {
            starts[r * t + j] = if row[j] != row[j - 1].wrapping_add(1) {
                j as u32
            } else {
                starts[r * t + j - 1]
            };
        }
    }
    Some(starts)
}

/// Builds the additive masks.
///
/// `attention_mask`: `(b, t)` row-major 1 = token, 0 = padding (`None` = all tokens);
/// `position_ids`: `(b, t)` (used only for packing detection, and only without attention mask:
/// `packed_sequence_starts`);
/// `window`: sliding window `W`; `causal`: `false` for `use_bidirectional_attention = "all"`.
pub fn build_masks(
    (b, t): (usize, usize),
    attention_mask: Option<&[u32]>,
    position_ids: Option<&[u32]>,
    window: usize,
    causal: bool,
    device: &Device,
) -> Result<Masks> {
    let seq = packed_sequence_starts(attention_mask, position_ids, (b, t));
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
    fn causal_batches_take_the_fused_path() {
        let dev = &Device::Cpu;
        let am = [1, 1, 0, 1, 1, 1];
        let bias = AttentionBias::new((2, 3), Some(&am), None, 2, true, dev).unwrap();
        assert!(matches!(
            bias,
            AttentionBias::Causal {
                key_mask: Some(_),
                seq_start: None
            }
        ));
        let pos = [0, 1, 2, 0, 1, 2];
        let bias = AttentionBias::new((2, 3), None, Some(&pos), 2, true, dev).unwrap();
        assert!(matches!(
            bias,
            AttentionBias::Causal {
                key_mask: None,
                seq_start: None
            }
        ));
        // Packed: row 0 restarts at 2 and at 3 (a sequence of one token), row 1 at 2.
        let pos = [0, 1, 0, 0, 0, 1, 0, 1];
        let bias = AttentionBias::new((2, 4), None, Some(&pos), 2, true, dev).unwrap();
        let AttentionBias::Causal {
            key_mask: None,
            seq_start: Some(s),
        } = bias
        else {
            panic!("a packed causal batch is fused with segment starts: {bias:?}");
        };
        assert_eq!(
            s.to_vec2::<u32>().unwrap(),
            vec![vec![0, 0, 2, 3], vec![0, 0, 2, 2]]
        );
        // With an attention mask the positions are not read as packing (transformers).
        let bias = AttentionBias::new((2, 4), Some(&[1; 8]), Some(&pos), 2, true, dev).unwrap();
        assert!(matches!(
            bias,
            AttentionBias::Causal {
                seq_start: None,
                ..
            }
        ));
    }

    #[test]
    fn bidirectional_batches_get_finite_dense_masks() {
        let pos = [0, 1, 0, 0, 1, 2];
        let bias = AttentionBias::new((2, 3), None, Some(&pos), 2, false, &Device::Cpu).unwrap();
        let AttentionBias::Additive(m) = bias else {
            panic!("bidirectional attention takes the dense masks");
        };
        let v: Vec<f32> = m.full.flatten_all().unwrap().to_vec1().unwrap();
        assert!(v.iter().all(|x| x.is_finite()));
        // Row 0: keys of the same sequence only, in both directions.
        assert_eq!(
            keep(&m.full.get(0).unwrap().unsqueeze(0).unwrap())[0],
            vec![1, 1, 0]
        );
    }
}
