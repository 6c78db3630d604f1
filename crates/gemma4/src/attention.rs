//! Self-attention of one decoder layer (`Gemma4TextAttention`, transformers 5.23; `docs/gemma4.md` §4.5).
//!
//! `q = rope(q_norm(q_proj(x)))`; own K/V: `k = rope(k_norm(k_proj(x)))`, `v = v_norm(v_proj(x))`
//! where `v_norm` has no weight and, with `attention_k_eq_v` on full layers, `v_proj(x)` is
//! replaced by the raw `k_proj(x)`. KV consumers take the producer's (post-norm, post-RoPE) K/V.
//! Scores use scale 1.0; scores, softmax and `P·V` in fp32 (HF sdpa numerics) through the fused
//! `g4ft_ops::attention`, or a composite with a dense mask for packed / bidirectional batches.

use candle_core::{DType, Tensor};
use g4ft_lora::{LoraContext, LoraLinear};
use g4ft_ops::{rms_norm, rope, softmax_last_dim, swap_dims12};

use crate::config::{Config, LayerConfig, LayerType};
use crate::error::Result;
use crate::mask::AttentionBias;
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

/// Composite scaled-dot-product attention with GQA, scale 1.0, dense additive mask.
///
/// `q`: `(b, nh, t, d)`; `k`, `v`: `(b, kv, s, d)` with `nh % kv == 0` (query head `h` uses kv head
/// `h / (nh/kv)`); `mask`: additive fp32 `(b, 1, t, s)`. Same numerics as the fused
/// `g4ft_ops::attention` (and HF sdpa): fp32 scores, softmax and `P·V`, one rounding at the end.
/// Used for packed or bidirectional batches, and for decoding against a KV cache (`s` keys for `t`
/// new queries). Returns `(b, nh, t, d)`.
pub fn attention_dense(q: &Tensor, k: &Tensor, v: &Tensor, mask: &Tensor) -> Result<Tensor> {
    let (b, nh, t, d) = q.dims4()?;
    let (kv, s) = (k.dim(1)?, k.dim(2)?);
    let rep = nh / kv;
    let f32_ = |x: &Tensor| x.to_dtype(DType::F32);
    // Group the query heads of each kv head: (b, kv, rep·t, d) — no repeat_kv copy of K/V.
    let qg = f32_(q)?.reshape((b, kv, rep * t, d))?;
    let scores = qg.matmul(&f32_(k)?.t()?)?; // (b, kv, rep·t, s)
    let scores = scores.reshape((b, nh, t, s))?.broadcast_add(mask)?;
    let probs = softmax_last_dim(&scores)?;
    let out = probs.reshape((b, kv, rep * t, s))?.matmul(&f32_(v)?)?; // (b, kv, rep·t, d)
    Ok(out.reshape((b, nh, t, d))?.to_dtype(q.dtype())?)
}

/// The backward of [`attention_dense`]: `(dq, dk, dv)` in the inputs' dtype from the forward's
/// inputs and the output gradient `g (b, nh, t, d)`, in fp32 (probabilities recomputed:
/// `dS = P ⊙ (dP − rowsum(P ⊙ dP))`, `dP = g·Vᵀ`). K/V gradients sum over the query heads of
/// each kv head. Records no graph.
pub fn attention_dense_backward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: &Tensor,
    g: &Tensor,
) -> Result<(Tensor, Tensor, Tensor)> {
    let (b, nh, t, d) = q.dims4()?;
    let kv = k.dim(1)?;
    let rep = nh / kv;
    let f32_ = |x: &Tensor| x.detach().to_dtype(DType::F32);
    let (kf, vf) = (f32_(k)?, f32_(v)?);
    let qg = f32_(q)?.reshape((b, kv, rep * t, d))?;
    let scores = qg
        .matmul(&kf.t()?)?
        .reshape((b, nh, t, t))?
        .broadcast_add(mask)?;
    let p = softmax_last_dim(&scores)?.reshape((b, kv, rep * t, t))?;
    drop(scores);
    let gg = f32_(g)?.reshape((b, kv, rep * t, d))?;
    let dp = gg.matmul(&vf.t()?)?; // (b, kv, rep·t, t)
    let dot = (&p * &dp)?.sum_keepdim(candle_core::D::Minus1)?;
    let ds = (&p * dp.broadcast_sub(&dot)?)?;
    drop((dp, dot));
    let dq = ds.matmul(&kf)?.reshape((b, nh, t, d))?;
    let dk = ds.t()?.matmul(&qg)?; // (b, kv, t, d)
    let dv = p.t()?.matmul(&gg)?;
    let dt = q.dtype();
    Ok((dq.to_dtype(dt)?, dk.to_dtype(dt)?, dv.to_dtype(dt)?))
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
        let o = match bias {
            AttentionBias::Causal { key_mask } => {
                let window = (layer_type == LayerType::Sliding).then_some(window);
                g4ft_ops::attention(&q, &kv.k, &kv.v, key_mask.as_ref(), window, 1.0)?
            }
            AttentionBias::Additive(masks) => {
                let mask = match layer_type {
                    LayerType::Sliding => &masks.sliding,
                    LayerType::Full => &masks.full,
                };
                attention_dense(&q, &kv.k, &kv.v, mask)?
            }
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
    use candle_core::{DType, Device, D};

    /// GQA grouping without repeat_kv equals the explicit repeat_kv formulation, and the dense
    /// path equals the fused op on a causal mask.
    #[test]
    fn grouped_attention_equals_repeat_kv() -> Result<()> {
        let dev = Device::Cpu;
        let (b, nh, kv, t, d) = (2, 4, 2, 3, 5);
        let q = Tensor::randn(0f32, 1., (b, nh, t, d), &dev)?;
        let k = Tensor::randn(0f32, 1., (b, kv, t, d), &dev)?;
        let v = Tensor::randn(0f32, 1., (b, kv, t, d), &dev)?;
        let mask = Tensor::zeros((b, 1, t, t), DType::F32, &dev)?;
        let got = attention_dense(&q, &k, &v, &mask)?;
        let rep = |x: &Tensor| -> Result<Tensor> {
            Ok(x.unsqueeze(2)?
                .broadcast_as((b, kv, nh / kv, t, d))?
                .reshape((b, nh, t, d))?)
        };
        let s = q.matmul(&rep(&k)?.t()?)?;
        let e = s.broadcast_sub(&s.max_keepdim(D::Minus1)?)?.exp()?;
        let p = e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?;
        let want = p.matmul(&rep(&v)?)?;
        let diff = (&got - want)?.abs()?.max_all()?.to_scalar::<f32>()?;
        assert!(diff < 1e-6, "{diff}");
        let masks = crate::mask::build_masks((b, t), None, None, 2, true, &dev)?;
        let dense = attention_dense(&q, &k, &v, &masks.sliding)?;
        let fused = g4ft_ops::attention(&q, &k, &v, None, Some(2), 1.0)?;
        let diff = (dense - fused)?.abs()?.max_all()?.to_scalar::<f32>()?;
        assert!(diff < 1e-6, "dense vs fused {diff}");
        Ok(())
    }
}
