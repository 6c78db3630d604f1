//! Self-attention of one decoder layer (`Gemma4TextAttention`, transformers 5.23; `docs/gemma4.md` §4.5).
//!
//! `q = rope(q_norm(q_proj(x)))`; own K/V: `k = rope(k_norm(k_proj(x)))`, `v = v_norm(v_proj(x))`
//! where `v_norm` has no weight and, with `attention_k_eq_v` on full layers, `v_proj(x)` is
//! replaced by the raw `k_proj(x)`. KV consumers take the producer's (post-norm, post-RoPE) K/V.
//! Scores use scale 1.0; scores, softmax and `P·V` in fp32 (HF sdpa numerics) through the fused
//! `g4ft_ops::attention` (causal, padded or packed batches), or the composite
//! `g4ft_ops::attention_dense` with a dense mask for bidirectional batches and cached decoding.

use candle_core::Tensor;
use g4ft_lora::{LoraContext, LoraLinear};
use g4ft_ops::{attention_dense, rms_norm, rope, swap_dims12, AttentionPlan};

use crate::config::{Config, LayerConfig, LayerType};
use crate::error::Result;
use crate::mask::{AttentionBias, Scores};
use crate::rope::RopeTable;
use crate::weights::Weights;

pub(crate) mod explicit;

/// K/V of a layer after norm and RoPE, each `(b, kv_heads, t, d)`: what a producer lends.
#[derive(Debug, Clone)]
pub struct KvPair {
    /// Keys `(b, kv, t, d)`.
    pub k: Tensor,
    /// Values `(b, kv, t, d)`.
    pub v: Tensor,
}

/// The attention block of one layer.
#[derive(Debug, Clone)]
pub struct Attention {
    pub(crate) q_proj: LoraLinear,
    pub(crate) k_proj: Option<LoraLinear>,
    pub(crate) v_proj: Option<LoraLinear>,
    pub(crate) o_proj: LoraLinear,
    q_norm: Tensor,
    k_norm: Option<Tensor>,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
    eps: f64,
    /// The kernels of the fused causal attention ([`crate::Gemma4Model::set_attention_plan`]).
    pub(crate) plan: AttentionPlan,
}

impl Attention {
    /// Loads `layers.{i}.self_attn.*`.
    pub fn new(cfg: &Config, layer: &LayerConfig, i: usize, w: &Weights) -> Result<Self> {
        let h = cfg.hidden_size;
        let (nh, kv, d) = (
            cfg.num_attention_heads,
            layer.num_key_value_heads,
            layer.head_dim,
        );
        let p = format!("layers.{i}.self_attn");
        let (k_proj, v_proj, k_norm) = if layer.has_kv_proj() {
            let k = w.linear(&format!("{p}.k_proj"), kv * d, h)?;
            let v = if layer.has_v_proj {
                Some(w.linear(&format!("{p}.v_proj"), kv * d, h)?)
            } else {
                None
            };
            (
                Some(k),
                v,
                Some(w.tensor(&format!("{p}.k_norm.weight"), &[d])?),
            )
        } else {
            (None, None, None)
        };
        Ok(Attention {
            q_proj: w.linear(&format!("{p}.q_proj"), nh * d, h)?,
            k_proj,
            v_proj,
            o_proj: w.linear(&format!("{p}.o_proj"), h, nh * d)?,
            q_norm: w.tensor(&format!("{p}.q_norm.weight"), &[d])?,
            k_norm,
            num_heads: nh,
            num_kv_heads: kv,
            head_dim: d,
            eps: cfg.rms_norm_eps,
            plan: AttentionPlan::default(),
        })
    }

    /// Own K/V from the normed layer input `x (b, t, h)`: `None` for KV consumers.
    pub fn own_kv(
        &self,
        x: &Tensor,
        rope_t: &RopeTable,
        ctx: &LoraContext,
    ) -> Result<Option<KvPair>> {
        let (Some(k_proj), Some(k_norm)) = (&self.k_proj, &self.k_norm) else {
            return Ok(None);
        };
        let (b, t, _) = x.dims3()?;
        let shape = (b, t, self.num_kv_heads, self.head_dim);
        let raw = k_proj.forward(x, ctx)?.reshape(shape)?;
        let vraw = match &self.v_proj {
            Some(v_proj) => v_proj.forward(x, ctx)?.reshape(shape)?,
            None => raw.clone(), // attention_k_eq_v: V from the raw k_proj output
        };
        let k = swap_dims12(&rms_norm(&raw, Some(k_norm), self.eps)?)?;
        let k = rope(&k, &rope_t.cos, &rope_t.sin)?;
        let v = swap_dims12(&rms_norm(&vraw, None, self.eps)?)?;
        Ok(Some(KvPair { k, v }))
    }

    /// Attention output `(b, t, h)` from the normed input `x` and the K/V to attend to
    /// (own or borrowed). `window` is the sliding window of sliding layers.
    #[allow(clippy::too_many_arguments)]
    pub fn attend(
        &self,
        x: &Tensor,
        kv: &KvPair,
        rope_t: &RopeTable,
        bias: &AttentionBias,
        (layer_type, window): (LayerType, usize),
        ctx: &LoraContext,
    ) -> Result<Tensor> {
        let (b, t, _) = x.dims3()?;
        let q = self
            .q_proj
            .forward(x, ctx)?
            .reshape((b, t, self.num_heads, self.head_dim))?;
        let q = swap_dims12(&rms_norm(&q, Some(&self.q_norm), self.eps)?)?;
        let q = rope(&q, &rope_t.cos, &rope_t.sin)?; // (b, nh, t, d)
        let o = match bias.scores(layer_type, window) {
            Scores::Causal { key_mask, window } => {
                g4ft_ops::attention(&q, &kv.k, &kv.v, key_mask, window, 1.0, &self.plan)?
            }
            Scores::Dense(mask) => attention_dense(&q, &kv.k, &kv.v, mask, 1.0)?,
        };
        let o = swap_dims12(&o)?.reshape((b, t, self.num_heads * self.head_dim))?;
        Ok(self.o_proj.forward(&o, ctx)?)
    }

    /// The projections in model order (q, k, v, o).
    pub fn projections(&self) -> impl Iterator<Item = &LoraLinear> {
        std::iter::once(&self.q_proj)
            .chain(self.k_proj.as_ref())
            .chain(self.v_proj.as_ref())
            .chain(std::iter::once(&self.o_proj))
    }

    /// Mutable [`Attention::projections`].
    pub fn projections_mut(&mut self) -> impl Iterator<Item = &mut LoraLinear> {
        std::iter::once(&mut self.q_proj)
            .chain(self.k_proj.as_mut())
            .chain(self.v_proj.as_mut())
            .chain(std::iter::once(&mut self.o_proj))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// The dense masks of a causal batch make the composite equal the fused op.
    #[test]
    fn causal_dense_masks_equal_the_fused_op() -> Result<()> {
        let dev = Device::Cpu;
        let (b, nh, kv, t, d) = (2, 4, 2, 3, 5);
        let q = Tensor::randn(0f32, 1., (b, nh, t, d), &dev)?;
        let k = Tensor::randn(0f32, 1., (b, kv, t, d), &dev)?;
        let v = Tensor::randn(0f32, 1., (b, kv, t, d), &dev)?;
        let masks = crate::mask::build_masks((b, t), None, None, 2, true, &dev)?;
        let dense = attention_dense(&q, &k, &v, &masks.sliding, 1.0)?;
        let plan = AttentionPlan::default();
        let keys = g4ft_ops::KeyMask::default();
        let fused = g4ft_ops::attention(&q, &k, &v, keys, Some(2), 1.0, &plan)?;
        let diff = (dense - fused)?.abs()?.max_all()?.to_scalar::<f32>()?;
        // The two sum in different orders: a few f32 ulps of outputs up to about 4 in size
        // (a wrong mask is off by tenths).
        assert!(diff < 1e-5, "dense vs fused {diff}");
        Ok(())
    }
}
