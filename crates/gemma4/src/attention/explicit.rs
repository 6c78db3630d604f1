//! Explicit forward/backward of the attention block (own K/V, causal attention through the fused
//! op), for [`crate::decoder_layer::DecoderLayer`]'s explicit layer backward. Same ops, in the same
//! order, as [`Attention::own_kv`] + [`Attention::attend`], which stay the autograd reference.

use candle_core::Tensor;
use g4ft_lora::{AdapterGrads, LoraContext, ProjectionSaved};
use g4ft_ops::{
    attention_saved, rms_norm, rms_norm_backward, rope, rope_backward, swap_dims12, AttentionSaved,
};

use super::Attention;
use crate::error::{Error, Result};
use crate::rope::RopeTable;

/// What [`Attention::backward_saved`] reads, kept by [`Attention::forward_saved`].
pub(crate) struct AttentionTape {
    q_proj: ProjectionSaved,
    k_proj: ProjectionSaved,
    /// `None` with `attention_k_eq_v` (V comes from the raw `k_proj` output).
    v_proj: Option<ProjectionSaved>,
    /// Projection outputs as `(b, t, heads, d)`, the inputs of q/k/v norms.
    q_raw: Tensor,
    k_raw: Tensor,
    v_raw: Tensor,
    /// The fused attention's inputs `(b, heads, t, d)` and output.
    q: Tensor,
    k: Tensor,
    v: Tensor,
    o: Tensor,
    attn: AttentionSaved,
    o_proj: ProjectionSaved,
}

impl Attention {
    /// Whether the block computes its own K/V (the explicit path's requirement).
    pub(crate) fn has_own_kv(&self) -> bool {
        self.k_proj.is_some() && self.k_norm.is_some()
    }

    /// The attention output `(b, t, h)` of the normed input `x` with causal attention
    /// (`window`: sliding layers), and its tape. Records no graph.
    pub(crate) fn forward_saved(
        &self,
        x: &Tensor,
        rope_t: &RopeTable,
        key_mask: Option<&Tensor>,
        window: Option<usize>,
        ctx: &LoraContext,
    ) -> Result<(Tensor, AttentionTape)> {
        let (Some(k_proj), Some(k_norm)) = (&self.k_proj, &self.k_norm) else {
            return Err(Error::batch(
                "shared_kv",
                "explicit attention backward needs the layer's own k_proj",
            ));
        };
        let (b, t, _) = x.dims3()?;
        let (nh, nkv, d) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let heads = |y: Tensor, n: usize| y.reshape((b, t, n, d));
        let roped = |raw: &Tensor, norm: &Tensor| -> Result<Tensor> {
            let n = swap_dims12(&rms_norm(raw, Some(norm), self.eps)?)?;
            Ok(rope(&n, &rope_t.cos, &rope_t.sin)?)
        };
        let (q_raw, q_proj) = self.q_proj.forward_saved(x, ctx)?;
        let q_raw = heads(q_raw, nh)?;
        let (k_raw, k_proj) = k_proj.forward_saved(x, ctx)?;
        let k_raw = heads(k_raw, nkv)?;
        let (v_raw, v_proj) = match &self.v_proj {
            Some(v_proj) => {
                let (v_raw, saved) = v_proj.forward_saved(x, ctx)?;
                (heads(v_raw, nkv)?, Some(saved))
            }
            None => (k_raw.clone(), None),
        };
        let q = roped(&q_raw, &self.q_norm)?;
        let k = roped(&k_raw, k_norm)?;
        let v = swap_dims12(&rms_norm(&v_raw, None, self.eps)?)?;
        let (o, attn) = attention_saved(&q, &k, &v, key_mask, window, 1.0)?;
        let flat = swap_dims12(&o)?.reshape((b, t, nh * d))?;
        let (out, o_proj) = self.o_proj.forward_saved(&flat, ctx)?;
        let tape = AttentionTape {
            q_proj,
            k_proj,
            v_proj,
            q_raw,
            k_raw,
            v_raw,
            q,
            k,
            v,
            o,
            attn,
            o_proj,
        };
        Ok((out, tape))
    }

    /// d(normed input) from d(attention output) `g (b, t, h)`; adapter gradients go to `grads`.
    /// Consumes the tape so each saved tensor is freed right after its last use.
    pub(crate) fn backward_saved(
        &self,
        tape: AttentionTape,
        g: &Tensor,
        rope_t: &RopeTable,
        grads: &mut AdapterGrads,
    ) -> Result<Tensor> {
        let AttentionTape {
            q_proj,
            k_proj,
            v_proj,
            q_raw,
            k_raw,
            v_raw,
            q,
            k,
            v,
            o,
            attn,
            o_proj,
        } = tape;
        let (b, t, _) = g.dims3()?;
        let (nh, d) = (self.num_heads, self.head_dim);
        let d_flat = o_proj.backward(g, grads)?;
        drop(o_proj);
        let d_o = swap_dims12(&d_flat.reshape((b, t, nh, d))?)?;
        drop(d_flat);
        let (dq, dk, dv) = attn.backward(&q, &k, &v, &o, &d_o)?;
        drop((q, k, v, o, d_o, attn));
        // d(raw) of a roped, normed projection: rope⁻ᵀ, back to (b, t, heads, d), norm backward.
        let unroped = |dy: &Tensor, raw: &Tensor, norm: &Tensor| -> Result<Tensor> {
            let dn = swap_dims12(&rope_backward(dy, &rope_t.cos, &rope_t.sin)?)?;
            Ok(rms_norm_backward(raw, Some(norm), &dn, self.eps)?)
        };
        let k_norm = self
            .k_norm
            .as_ref()
            .expect("forward_saved checked the own K/V");
        let dq_raw = unroped(&dq, &q_raw, &self.q_norm)?;
        let dk_raw = unroped(&dk, &k_raw, k_norm)?;
        let dv_raw = rms_norm_backward(&v_raw, None, &swap_dims12(&dv)?, self.eps)?;
        drop((dq, dk, dv, q_raw, k_raw, v_raw));
        let flat = |t4: Tensor| -> Result<Tensor> {
            let (b, t, n, d) = t4.dims4()?;
            Ok(t4.reshape((b, t, n * d))?)
        };
        let mut dx = q_proj.backward(&flat(dq_raw)?, grads)?;
        match &v_proj {
            Some(v_proj) => {
                dx = (dx + k_proj.backward(&flat(dk_raw)?, grads)?)?;
                dx = (dx + v_proj.backward(&flat(dv_raw)?, grads)?)?;
            }
            None => {
                let dk = (dk_raw + dv_raw)?;
                dx = (dx + k_proj.backward(&flat(dk)?, grads)?)?;
            }
        }
        Ok(dx)
    }
}
