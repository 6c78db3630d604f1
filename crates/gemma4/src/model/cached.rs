//! Generation forward of [`Gemma4Model`] with a [`KvCache`] (transformers 5.23 `generate`): the
//! prompt in one forward, then one token per row and step. Same layers, numerics, MoE, per-layer
//! embeddings and final softcap as training; only the attention reads cached K/V.

use std::collections::HashMap;

use candle_core::{DType, Tensor};
use g4ft_lora::LoraContext;
use g4ft_ops::{linear_frozen, softcap};

use super::{Gemma4Model, Prepared, TokenBatch};
use crate::config::LayerType;
use crate::error::{Error, Result};
use crate::kv_cache::KvCache;
use crate::mask::AttentionBias;

impl Gemma4Model {
    /// An empty KV cache for `batch` rows of at most `capacity` tokens each (prompt, padding
    /// included, plus new tokens). Errors for bidirectional models, which do not generate.
    pub fn new_cache(&self, batch: usize, capacity: usize) -> Result<KvCache> {
        if !self.cfg.is_causal {
            return Err(Error::batch(
                "use_bidirectional_attention",
                "a model with bidirectional text attention cannot generate left to right",
            ));
        }
        if batch == 0 || capacity == 0 {
            return Err(Error::batch(
                "kv_cache",
                format!("batch ({batch}) and capacity ({capacity}) must be at least 1"),
            ));
        }
        let sliding = self
            .cfg
            .layers
            .iter()
            .map(|l| l.layer_type == LayerType::Sliding)
            .collect();
        Ok(KvCache::new(
            sliding,
            batch,
            capacity,
            self.cfg.sliding_window,
        ))
    }

    /// Runs the prompt `input_ids (b, t)` (row-major, left padded: `attention_mask` is 1 on real
    /// tokens and every row's last column is real) into the empty `cache`. Each row's positions
    /// start at 0 on its first real token. Returns the softcapped fp32 logits `(b, vocab)` of the
    /// last column.
    pub fn prefill(
        &self,
        cache: &mut KvCache,
        input_ids: &[u32],
        attention_mask: &[u32],
        ctx: &LoraContext,
    ) -> Result<Tensor> {
        if !cache.is_empty() {
            return Err(Error::batch(
                "kv_cache",
                "prefill needs an empty cache (one prompt per cache)",
            ));
        }
        let b = cache.batch();
        let t = input_ids.len() / b;
        let unpositioned = TokenBatch {
            input_ids,
            attention_mask: Some(attention_mask),
            position_ids: None,
            batch: b,
            seq_len: t,
        };
        unpositioned.validate(self.cfg.vocab_size)?;
        if let Some(r) = (0..b).find(|r| attention_mask[r * t + t - 1] == 0) {
            return Err(Error::batch(
                "attention_mask",
                format!("row {r} ends in padding: prompts must be left padded"),
            ));
        }
        let positions = cache.push_columns(attention_mask, t)?;
        let prep = self.prepare(&TokenBatch {
            position_ids: Some(&positions),
            ..unpositioned
        })?;
        self.run_cached(prep, cache, true, ctx)
    }

    /// Appends one token per row (`tokens`, length `b`) to a prefilled `cache` and returns the
    /// softcapped fp32 logits `(b, vocab)` of that column.
    pub fn decode_step(
        &self,
        cache: &mut KvCache,
        tokens: &[u32],
        ctx: &LoraContext,
    ) -> Result<Tensor> {
        if cache.is_empty() {
            return Err(Error::batch(
                "kv_cache",
                "decode_step needs a prefilled cache",
            ));
        }
        let b = cache.batch();
        let unpositioned = TokenBatch {
            input_ids: tokens,
            attention_mask: None,
            position_ids: None,
            batch: b,
            seq_len: 1,
        };
        unpositioned.validate(self.cfg.vocab_size)?;
        let positions = cache.push_columns(&vec![1; b], 1)?;
        let mut prep = self.prepare(&TokenBatch {
            position_ids: Some(&positions),
            ..unpositioned
        })?;
        prep.inputs.bias = AttentionBias::Additive(cache.step_masks(&self.device)?);
        self.run_cached(prep, cache, false, ctx)
    }

    /// The layer stack on prepared columns, then the head on the last column.
    fn run_cached(
        &self,
        prep: Prepared,
        cache: &mut KvCache,
        prefill: bool,
        ctx: &LoraContext,
    ) -> Result<Tensor> {
        let mut h = prep.embeds;
        let mut lent = HashMap::new();
        for layer in &self.layers {
            h = layer.forward_cached(&h, cache, &mut lent, prefill, &prep.inputs, ctx)?;
        }
        let t = h.dim(1)?;
        let h = self.final_norm(&h.narrow(1, t - 1, 1)?.squeeze(1)?)?;
        let logits = linear_frozen(&h, &self.embed_tokens)?;
        let logits = match self.cfg.final_logit_softcapping {
            Some(cap) => softcap(&logits, cap)?,
            None => logits,
        };
        Ok(logits.to_dtype(DType::F32)?)
    }
}
