//! Rotary-embedding tables (`Gemma4TextRotaryEmbedding`, transformers 5.23; `docs/gemma4.md` §4.4).
//!
//! One table per layer type. Angles are `float(pos) · inv_freq` in fp32 (never in the activation
//! dtype: bf16 cannot hold positions > 256), cos/sin are taken in fp32 and rounded once to the
//! activation dtype. `proportional` RoPE zero-pads `inv_freq` so only the first
//! `int(p·d // 2)` pairs rotate; the exponent denominator is the full head size `d`.
//!
//! A batch's table is gathered on the device from a [`RopeCache`] of rows per position, each row
//! computed once per process, so that no batch takes the host through `b·t·d` cos and sin or
//! copies a table that size from pageable memory, a copy that waits for the stream to drain
//! (`docs/design.md`, "The host runs ahead").

use std::sync::{Arc, Mutex};

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

/// fp32 cos and sin rows, `2·inv.len()` values each, of `positions` in order.
fn host_rows(inv: &[f32], positions: impl ExactSizeIterator<Item = u32>) -> (Vec<f32>, Vec<f32>) {
    let half = inv.len();
    let mut cos = Vec::with_capacity(positions.len() * 2 * half);
    let mut sin = Vec::with_capacity(positions.len() * 2 * half);
    for p in positions {
        let row_start = cos.len();
        for &f in inv {
            let a = p as f32 * f; // fp32 angle, as torch
            cos.push(a.cos());
            sin.push(a.sin());
        }
        cos.extend_from_within(row_start..row_start + half);
        sin.extend_from_within(row_start..row_start + half);
    }
    (cos, sin)
}

/// Rows a [`RopeCache`] holds once it has seen position `max_position`: the next power of two
/// above it, so that a run whose lengths grow rebuilds the rows a logarithmic number of times.
pub fn cache_rows(max_position: usize) -> usize {
    (max_position + 1).next_power_of_two()
}

/// The cos/sin rows of positions `0..rows` of one layer type on the device, in the activation
/// dtype; a batch's [`RopeTable`] gathers its positions' rows. Each row has the bits
/// the batch's own computation would give that position. Clones share the rows.
#[derive(Debug, Clone)]
pub struct RopeCache {
    inv: Vec<f32>,
    dtype: DType,
    device: Device,
    rows: Arc<Mutex<Option<RopeTable>>>,
}

impl RopeCache {
    /// An empty cache of one layer type with head size `head_dim`.
    pub fn new(params: &RopeParams, head_dim: usize, dtype: DType, device: &Device) -> Self {
        RopeCache {
            inv: inv_freq(params, head_dim),
            dtype,
            device: device.clone(),
            rows: Arc::new(Mutex::new(None)),
        }
    }

    /// The table of the positions in `ids` (u32 on the device, row-major `(b, t)`), whose largest
    /// is `max_position`.
    pub fn table(
        &self,
        ids: &Tensor,
        max_position: u32,
        (b, t): (usize, usize),
    ) -> Result<RopeTable> {
        let d = 2 * self.inv.len();
        let mut rows = self.rows.lock().unwrap_or_else(|e| e.into_inner());
        if rows
            .as_ref()
            .is_none_or(|r| r.cos.dims()[0] <= max_position as usize)
        {
            // Dropped first: the old rows and the new are never held together.
            *rows = None;
            let n = cache_rows(max_position as usize);
            let (cos, sin) = host_rows(&self.inv, 0..n as u32);
            let upload = |v: Vec<f32>| -> Result<Tensor> {
                Ok(Tensor::from_vec(v, (n, d), &self.device)?.to_dtype(self.dtype)?)
            };
            *rows = Some(RopeTable {
                cos: upload(cos)?,
                sin: upload(sin)?,
            });
        }
        let r = rows.as_ref().expect("filled above");
        let gather =
            |x: &Tensor| -> Result<Tensor> { Ok(x.index_select(ids, 0)?.reshape((b, t, d))?) };
        Ok(RopeTable {
            cos: gather(&r.cos)?,
            sin: gather(&r.sin)?,
        })
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

    fn positions(device: &Device, p: &[u32]) -> Tensor {
        Tensor::from_slice(p, p.len(), device).unwrap()
    }

    fn values(t: &Tensor) -> Vec<f32> {
        t.flatten_all()
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap()
            .to_vec1()
            .unwrap()
    }

    #[test]
    fn default_table_rotates_every_pair() {
        let p = RopeParams {
            rope_type: RopeType::Default,
            rope_theta: 10_000.0,
            partial_rotary_factor: 1.0,
            factor: 1.0,
        };
        let cache = RopeCache::new(&p, 4, DType::F32, &Device::Cpu);
        let t = cache
            .table(&positions(&Device::Cpu, &[0, 3]), 3, (1, 2))
            .unwrap();
        assert_eq!(t.cos.dims(), [1, 2, 4]);
        let cos = values(&t.cos);
        let inv = inv_freq(&p, 4);
        assert_eq!(inv, vec![1.0, 0.01]);
        assert_eq!(&cos[..4], &[1.0; 4]);
        assert_eq!(cos[4], 3.0f32.cos());
        assert_eq!(cos[6], 3.0f32.cos());
        assert_eq!(cos[5], (3.0f32 * 0.01).cos());
        assert_eq!(values(&t.sin)[5], (3.0f32 * 0.01).sin());
    }

    /// Gathered rows are the bits of each position's own computation rounded to the dtype, for
    /// rows of different positions (packed sequences) and after the cache grows.
    #[test]
    fn gathered_rows_match_the_positions_own_rows() {
        let p = RopeParams {
            rope_type: RopeType::Proportional,
            rope_theta: 1e6,
            partial_rotary_factor: 0.25,
            factor: 1.0,
        };
        let dev = Device::Cpu;
        let cache = RopeCache::new(&p, 16, DType::BF16, &dev);
        let inv = inv_freq(&p, 16);
        for pos in [vec![0u32, 1, 2, 0, 1, 5], vec![7, 300, 1000, 2, 999, 4]] {
            let max = *pos.iter().max().unwrap();
            let t = cache.table(&positions(&dev, &pos), max, (2, 3)).unwrap();
            assert_eq!(t.sin.dims(), [2, 3, 16]);
            let rows = cache.rows.lock().unwrap().as_ref().unwrap().cos.dims()[0];
            assert_eq!(rows, cache_rows(max as usize));
            let (cos, sin) = host_rows(&inv, pos.iter().copied());
            let round = |v: Vec<f32>| {
                values(
                    &Tensor::from_vec(v, pos.len() * 16, &dev)
                        .unwrap()
                        .to_dtype(DType::BF16)
                        .unwrap(),
                )
            };
            assert_eq!(values(&t.cos), round(cos));
            assert_eq!(values(&t.sin), round(sin));
        }
        assert_eq!(cache_rows(1000), 1024);
        assert_eq!(cache_rows(1023), 1024);
        assert_eq!(cache_rows(1024), 2048);
    }
}
