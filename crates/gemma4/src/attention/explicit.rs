//! Explicit forward/backward of the attention block (own K/V, causal attention through the fused
//! op), for [`crate::decoder_layer::DecoderLayer`]'s explicit layer backward. Same ops, in the same
//! order, as [`Attention::own_kv`] + [`Attention::attend`], which stay the autograd reference.
//!
//! Memory: the tape keeps the raw q/k/v projections, the post-norm K/V, the attention output and
//! its log-sum-exp; the roped queries and the `o_proj` input (a transpose of the output) are
//! recomputed in the backward, and the normed block input is passed back in by the layer.

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
    /// Projection outputs as `(b, t, heads, d)`, the inputs of q/k/v norms (`v_raw` is `k_raw`
    /// with `attention_k_eq_v`).
    q_raw: Tensor,
    k_raw: Tensor,
    v_raw: Tensor,
    /// The fused attention's K/V `(b, kv, t, d)` and output `(b, heads, t, d)`.
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

    /// `rope(swap(q_norm(raw)))`: a raw `(b, t, heads, d)` projection to attention's layout.
    fn roped(&self, raw: &Tensor, norm: &Tensor, rope_t: &RopeTable) -> Result<Tensor> {
        let n = swap_dims12(&rms_norm(raw, Some(norm), self.eps)?)?;
        Ok(rope(&n, &rope_t.cos, &rope_t.sin)?)
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
        let q = self.roped(&q_raw, &self.q_norm, rope_t)?;
        let k = self.roped(&k_raw, k_norm, rope_t)?;
        let v = swap_dims12(&rms_norm(&v_raw, None, self.eps)?)?;
        let (o, attn) = attention_saved(&q, &k, &v, key_mask, window, 1.0)?;
        drop(q);
        let flat = swap_dims12(&o)?.reshape((b, t, nh * d))?;
        let (out, o_proj) = self.o_proj.forward_saved(&flat, ctx)?;
        let tape = AttentionTape {
            q_proj,
            k_proj,
            v_proj,
            q_raw,
            k_raw,
            v_raw,
            k,
            v,
            o,
            attn,
            o_proj,
        };
        Ok((out, tape))
    }

    /// d(normed input) from d(attention output) `g (b, t, h)` (consumed: freed after `o_proj`);
    /// `normed_input` recomputes the normed input the forward saw, called only for the q/k/v
    /// projections at the end. Adapter gradients go to `grads`. Consumes the tape so each saved
    /// tensor is freed right after its last use.
    pub(crate) fn backward_saved(
        &self,
        tape: AttentionTape,
        g: Tensor,
        normed_input: impl FnOnce() -> Result<Tensor>,
        rope_t: &RopeTable,
        grads: &mut AdapterGrads,
    ) -> Result<Tensor> {
        let (b, t, _) = g.dims3()?;
        let (nh, d) = (self.num_heads, self.head_dim);
        let k_norm = self
            .k_norm
            .as_ref()
            .expect("forward_saved checked the own K/V");
        // o_proj's input is a transpose of the output: recomputed, and its memory takes d(input).
        let flat = swap_dims12(&tape.o)?.reshape((b, t, nh * d))?;
        let d_flat = tape.o_proj.backward_over_input(flat, &g, grads)?;
        drop((tape.o_proj, g));
        let d_o = swap_dims12(&d_flat.reshape((b, t, nh, d))?)?;
        drop(d_flat);
        let q = self.roped(&tape.q_raw, &self.q_norm, rope_t)?;
        let (dq, dk, dv) = tape.attn.backward(&q, &tape.k, &tape.v, &tape.o, &d_o)?;
        drop((q, tape.k, tape.v, tape.o, d_o, tape.attn));
        // d(raw) of a roped, normed projection: rope⁻ᵀ, back to (b, t, heads, d), norm backward
        // (plus `extra`, another gradient of the same raw output, added in the same kernel).
        let unroped = |dy: &Tensor, raw: &Tensor, norm: &Tensor, extra: Option<&Tensor>| {
            let dn = swap_dims12(&rope_backward(dy, &rope_t.cos, &rope_t.sin)?)?;
            Ok::<_, Error>(rms_norm_backward(raw, Some(norm), &dn, self.eps, extra)?)
        };
        let dv_raw = rms_norm_backward(&tape.v_raw, None, &swap_dims12(&dv)?, self.eps, None)?;
        drop((dv, tape.v_raw));
        let flat = |t4: Tensor| -> Result<Tensor> {
            let (b, t, n, d) = t4.dims4()?;
            Ok(t4.reshape((b, t, n * d))?)
        };
        let dq_raw = unroped(&dq, &tape.q_raw, &self.q_norm, None)?;
        drop((dq, tape.q_raw));
        let x = &normed_input()?;
        let dx = tape.q_proj.backward(x, &flat(dq_raw)?, grads)?;
        // attention_k_eq_v: V is the raw k_proj output too, so its gradient joins dK's.
        let (dk_raw, dv_raw) = match &tape.v_proj {
            Some(_) => (unroped(&dk, &tape.k_raw, k_norm, None)?, Some(dv_raw)),
            None => (unroped(&dk, &tape.k_raw, k_norm, Some(&dv_raw))?, None),
        };
        drop((dk, tape.k_raw));
        let mut dx = tape.k_proj.backward_acc(x, &flat(dk_raw)?, dx, grads)?;
        if let (Some(v_proj), Some(dv_raw)) = (&tape.v_proj, dv_raw) {
            dx = v_proj.backward_acc(x, &flat(dv_raw)?, dx, grads)?;
        }
        Ok(dx)
    }
}
