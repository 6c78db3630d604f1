//! The KV cache of generation (transformers' `DynamicCache` with sliding-window layers, 5.23).
//!
//! Rows are left padded, so every row has the same number of columns: column `j` is the `j`-th
//! token of the padded batch, real or padding (`key_mask`). Each layer that computes its own K/V
//! keeps them after norm and RoPE, `(b, kv_heads, slots, d)` in the model dtype, preallocated:
//!
//! - full layers keep every column (`slots` = capacity, column `j` in slot `j`);
//! - sliding layers keep the last `window` columns in a ring (`slots = min(window, capacity)`,
//!   column `j` in slot `j % window`). A step writes its column first, so a query at column `q`
//!   attends exactly `q − window + 1 ..= q`, as transformers' cache keeps `window − 1` columns
//!   and concatenates the new one. The order of keys inside the ring does not matter: RoPE is
//!   applied before caching and the softmax is over a set.
//!
//! KV-sharing layers (E2B/E4B) have no entry: they read their producer's, written earlier in the
//! same forward. The cache never holds a graph (generation runs without gradients).

use candle_core::{Device, Tensor};

use crate::attention::KvPair;
use crate::error::{Error, Result};
use crate::mask::Masks;

/// One layer's cached keys and values.
#[derive(Debug, Clone)]
struct LayerKv {
    k: Tensor,
    v: Tensor,
    sliding: bool,
}

/// Cached K/V of every layer for a batch of left-padded rows, plus the key mask and the next
/// RoPE position of each row.
#[derive(Debug, Clone)]
pub struct KvCache {
    layers: Vec<Option<LayerKv>>,
    sliding: Vec<bool>,
    batch: usize,
    capacity: usize,
    window: usize,
    /// Columns written so far.
    len: usize,
    /// `(batch, capacity)` row-major, 1 = real token.
    key_mask: Vec<u8>,
    /// Position id the next token of each row gets.
    next_positions: Vec<u32>,
}

impl KvCache {
    /// An empty cache for `batch` rows of at most `capacity` columns (prompt + new tokens) of a
    /// model whose layer `i` is sliding iff `sliding[i]`, with sliding window `window`.
    pub(crate) fn new(sliding: Vec<bool>, batch: usize, capacity: usize, window: usize) -> Self {
        KvCache {
            layers: vec![None; sliding.len()],
            sliding,
            batch,
            capacity,
            window: window.max(1),
            len: 0,
            key_mask: vec![0; batch * capacity],
            next_positions: vec![0; batch],
        }
    }

    /// Rows.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Columns (tokens per row, padding included) written so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing was written yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The most columns the cache can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Position id the next token of each row gets (its count of real tokens so far).
    pub fn next_positions(&self) -> &[u32] {
        &self.next_positions
    }

    /// Bytes of the allocated K/V buffers.
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .flatten()
            .map(|l| 2 * l.k.elem_count() * l.k.dtype().size_in_bytes())
            .sum()
    }

    /// Bytes the full-attention layers store per column and row (the part of the cache that
    /// grows with the sequence; sliding layers hold a fixed `window` columns).
    pub fn bytes_per_token(&self) -> usize {
        self.layers
            .iter()
            .flatten()
            .filter(|l| !l.sliding)
            .map(|l| {
                let dims = l.k.dims(); // (b, kv, slots, d)
                2 * dims[1] * dims[3] * l.k.dtype().size_in_bytes()
            })
            .sum()
    }

    /// Appends `t` columns with key mask `mask (batch, t)` (1 = real) and returns their position
    /// ids `(batch, t)`: each row counts its real tokens from 0; padding gets 0 (transformers'
    /// `cumsum(mask) − 1`, padding filled with 0).
    pub(crate) fn push_columns(&mut self, mask: &[u32], t: usize) -> Result<Vec<u32>> {
        if mask.len() != self.batch * t {
            return Err(Error::batch(
                "attention_mask",
                format!(
                    "expected batch·t = {}·{t} values, got {}",
                    self.batch,
                    mask.len()
                ),
            ));
        }
        if self.len + t > self.capacity {
            return Err(Error::batch(
                "kv_cache",
                format!(
                    "{} columns cached + {t} new exceed the capacity {}",
                    self.len, self.capacity
                ),
            ));
        }
        let mut positions = vec![0u32; self.batch * t];
        for r in 0..self.batch {
            for c in 0..t {
                let real = mask[r * t + c] != 0;
                self.key_mask[r * self.capacity + self.len + c] = u8::from(real);
                if real {
                    positions[r * t + c] = self.next_positions[r];
                    self.next_positions[r] += 1;
                }
            }
        }
        self.len += t;
        Ok(positions)
    }

    /// Stores layer `layer`'s K/V `(b, kv, t, d)` of the `t` columns pushed last. A first write
    /// (the prompt) allocates the layer's buffers; later writes must be one column.
    pub(crate) fn write(&mut self, layer: usize, kv: &KvPair) -> Result<()> {
        let (b, heads, t, d) = kv.k.dims4()?;
        let start = self.len - t;
        let sliding = self.sliding[layer];
        let slots = if sliding {
            self.window.min(self.capacity)
        } else {
            self.capacity
        };
        let entry = match &mut self.layers[layer] {
            Some(e) => {
                if t != 1 {
                    return Err(Error::batch(
                        "kv_cache",
                        format!("layer {layer}: a cached step writes one column, got {t}"),
                    ));
                }
                e
            }
            slot @ None => {
                let zeros = || Tensor::zeros((b, heads, slots, d), kv.k.dtype(), kv.k.device());
                slot.insert(LayerKv {
                    k: zeros()?,
                    v: zeros()?,
                    sliding,
                })
            }
        };
        // Columns start..start+t; a sliding layer keeps only the last `slots` of them.
        let first = if sliding {
            (start + t).saturating_sub(slots).max(start)
        } else {
            start
        };
        let mut col = first;
        while col < start + t {
            let slot = col % slots;
            let n = (slots - slot).min(start + t - col);
            let src = |x: &Tensor| x.narrow(2, col - start, n)?.contiguous();
            entry.k.slice_set(&src(&kv.k)?, 2, slot)?;
            entry.v.slice_set(&src(&kv.v)?, 2, slot)?;
            col += n;
        }
        Ok(())
    }

    /// The K/V layer `layer` attends to after the last write: every column of a full layer, the
    /// filled slots of a sliding one.
    pub(crate) fn view(&self, layer: usize) -> Result<KvPair> {
        let e = self.layers[layer].as_ref().ok_or_else(|| {
            Error::batch(
                "kv_cache",
                format!("layer {layer} has no cached K/V (run the prompt through prefill first)"),
            )
        })?;
        let n = self.filled(e.sliding);
        Ok(KvPair {
            k: e.k.narrow(2, 0, n)?,
            v: e.v.narrow(2, 0, n)?,
        })
    }

    fn filled(&self, sliding: bool) -> usize {
        if sliding {
            self.len.min(self.window).min(self.capacity)
        } else {
            self.len
        }
    }

    /// Additive masks `(b, 1, 1, keys)` of the query in the last column against [`KvCache::view`]
    /// of each layer type: a key is blocked when it is padding (or, in the ring, outside the window).
    pub(crate) fn step_masks(&self, device: &Device) -> Result<Masks> {
        let q = self.len - 1;
        let build = |sliding: bool| -> Result<Tensor> {
            let n = self.filled(sliding);
            let mut add = Vec::with_capacity(self.batch * n);
            for r in 0..self.batch {
                for slot in 0..n {
                    // The newest column in this slot.
                    let col = if sliding {
                        slot + self.window * ((q - slot) / self.window)
                    } else {
                        slot
                    };
                    let keep = self.key_mask[r * self.capacity + col] != 0
                        && (!sliding || q - col < self.window);
                    add.push(if keep { 0f32 } else { f32::MIN });
                }
            }
            Ok(Tensor::from_vec(add, (self.batch, 1, 1, n), device)?)
        };
        Ok(Masks {
            full: build(false)?,
            sliding: build(true)?,
        })
    }
}
