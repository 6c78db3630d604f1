//! One decoder layer against a [`KvCache`]: the prompt (prefill, through the same fused attention
//! as training) or one new token per row (decode, attending to the cache through the dense path).

use std::collections::HashMap;

use candle_core::Tensor;
use g4ft_lora::LoraContext;
use g4ft_ops::rms_norm;

use super::{DecoderLayer, LayerInputs};
use crate::attention::KvPair;
use crate::config::KvSharing;
use crate::error::{Error, Result};
use crate::kv_cache::KvCache;

impl DecoderLayer {
    /// Runs the layer on the new columns `xs (b, t, h)`: writes its own K/V to `cache` and attends
    /// to the prompt (`prefill`: the new K/V themselves, masked by `inputs.bias`) or to the cached
    /// columns (decode: `inputs.bias` holds [`KvCache::step_masks`]). `lent` holds the K/V each
    /// producer attended to in this forward; a consumer reads its producer's from there, as
    /// transformers' `shared_kv_states`.
    pub(crate) fn forward_cached(
        &self,
        xs: &Tensor,
        cache: &mut KvCache,
        lent: &mut HashMap<usize, KvPair>,
        prefill: bool,
        inputs: &LayerInputs,
        ctx: &LoraContext,
    ) -> Result<Tensor> {
        let _copies = self.hold_adapter_copies(xs.dtype())?;
        let rope_t = self.rope_table(inputs);
        let x = rms_norm(xs, Some(&self.input_layernorm), self.eps)?;
        let kv = match self.cfg.kv_sharing {
            KvSharing::Reuse { producer } => lent.get(&producer).cloned().ok_or_else(|| {
                Error::batch(
                    "shared_kv",
                    format!("layer {}: producer {producer} ran no K/V", self.index),
                )
            })?,
            sharing => {
                let own = self
                    .self_attn
                    .own_kv(&x, rope_t, ctx)?
                    .expect("a layer that is not a KV consumer computes its own K/V");
                cache.write(self.index, &own)?;
                let kv = if prefill {
                    own
                } else {
                    cache.view(self.index)?
                };
                if sharing == KvSharing::Store {
                    lent.insert(self.index, kv.clone());
                }
                kv
            }
        };
        let kind = (self.cfg.layer_type, inputs.sliding_window);
        let a = self
            .self_attn
            .attend(&x, &kv, rope_t, &inputs.bias, kind, ctx)?;
        let a = rms_norm(&a, Some(&self.post_attention_layernorm), self.eps)?;
        self.feed_forward(&(xs + a)?, inputs, ctx)
    }
}
