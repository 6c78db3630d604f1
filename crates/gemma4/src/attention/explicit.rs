//! Explicit forward/backward of the attention block, for [`crate::decoder_layer::DecoderLayer`]'s
//! explicit layer backward: own K/V or a KV producer's (KV-sharing consumers, whose K/V gradient
//! goes back to the producer), causal attention (padded or packed) through the fused op or a dense
//! additive mask (bidirectional batches, through the composite). Same ops, in the same order, as
//! [`Attention::own_kv`] + [`Attention::attend`], which stay the autograd reference.
//!
//! Memory: the tape keeps the raw q/k/v projections, the post-norm K/V, the attention output and
//! its log-sum-exp; the roped queries and the `o_proj` input (a transpose of the output) are
//! recomputed in the backward, and the normed block input is passed back in by the layer.

use candle_core::Tensor;
use g4ft_lora::{AdapterGrads, LoraContext, ProjectionSaved};
use g4ft_ops::{
    attention_dense, attention_dense_backward, attention_saved, heads_norm_rope,
    heads_norm_rope_backward, swap_dims12, AttentionSaved,
};

use super::{Attention, KvPair};
use crate::error::{Error, Result};
use crate::mask::Scores;
use crate::rope::RopeTable;

/// What the attention core's backward needs beyond q, K/V, the output and its gradient.
enum CoreSaved {
    Fused(AttentionSaved),
    Dense(Tensor),
}

/// The layer's own K/V projections and their pre-norm outputs.
struct OwnKv {
    k_proj: ProjectionSaved,
    /// `None` with `attention_k_eq_v` (V comes from the raw `k_proj` output).
    v_proj: Option<ProjectionSaved>,
    /// Projection outputs as `(b, t, kv, d)`, the inputs of the k/v norms (`v_raw` is `k_raw`
    /// with `attention_k_eq_v`).
    k_raw: Tensor,
    v_raw: Tensor,
}

/// What [`Attention::backward_saved`] reads, kept by [`Attention::forward_saved`].
pub(crate) struct AttentionTape {
    q_proj: ProjectionSaved,
    /// `None` for a KV-sharing consumer.
    own: Option<OwnKv>,
    /// `q_proj`'s output as `(b, t, heads, d)`, the input of the q norm.
    q_raw: Tensor,
    /// The K/V attended to `(b, kv, t, d)` (own or the producer's) and the output `(b, heads, t, d)`.
    k: Tensor,
    v: Tensor,
    o: Tensor,
    core: CoreSaved,
    o_proj: ProjectionSaved,
}

impl AttentionTape {
    /// The K/V this block attended to (a producer lends them to its consumers).
    pub(crate) fn kv(&self) -> KvPair {
        KvPair {
            k: self.k.clone(),
            v: self.v.clone(),
        }
    }
}

/// What the attention backward returns besides d(normed input).
pub(crate) struct AttentionGrads {
    /// d(input) of the block (normed layer input).
    pub(crate) dx: Tensor,
    /// For a KV-sharing consumer: the gradient of the producer's K/V it attended to.
    pub(crate) borrowed_kv: Option<KvPair>,
}

impl Attention {
    /// `rope(swap(norm(raw)))`: a raw `(b, t, heads, d)` projection to attention's layout.
    fn roped(&self, raw: &Tensor, norm: &Tensor, rope_t: &RopeTable) -> Result<Tensor> {
        let tables = (&rope_t.cos, &rope_t.sin);
        Ok(heads_norm_rope(raw, Some(norm), Some(tables), self.eps)?)
    }

    /// The attention output `(b, t, h)` of the normed input `x` and its tape. `shared`: the
    /// producer's K/V for a KV-sharing consumer (`None` for a block with its own). `known`: the
    /// output of an earlier forward on the same input (a recompute that kept it), returned as it
    /// is: `o_proj` then keeps only its saved state. Records no graph.
    pub(crate) fn forward_saved(
        &self,
        x: &Tensor,
        shared: Option<&KvPair>,
        rope_t: &RopeTable,
        scores: Scores,
        ctx: &LoraContext,
        known: Option<&Tensor>,
    ) -> Result<(Tensor, AttentionTape)> {
        let (b, t, _) = x.dims3()?;
        let (nh, nkv, d) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let heads = |y: Tensor, n: usize| y.reshape((b, t, n, d));
        let (q_raw, q_proj) = self.q_proj.forward_saved(x, ctx)?;
        let q_raw = heads(q_raw, nh)?;
        let (own, k, v) =
            match (&self.k_proj, &self.k_norm, shared) {
                (Some(k_proj), Some(k_norm), None) => {
                    let (k_raw, k_proj) = k_proj.forward_saved(x, ctx)?;
                    let k_raw = heads(k_raw, nkv)?;
                    let (v_raw, v_proj) = match &self.v_proj {
                        Some(v_proj) => {
                            let (v_raw, saved) = v_proj.forward_saved(x, ctx)?;
                            (heads(v_raw, nkv)?, Some(saved))
                        }
                        None => (k_raw.clone(), None),
                    };
                    let k = self.roped(&k_raw, k_norm, rope_t)?;
                    let v = heads_norm_rope(&v_raw, None, None, self.eps)?;
                    let own = OwnKv {
                        k_proj,
                        v_proj,
                        k_raw,
                        v_raw,
                    };
                    (Some(own), k, v)
                }
                (None, None, Some(kv)) => (None, kv.k.clone(), kv.v.clone()),
                _ => return Err(Error::batch(
                    "shared_kv",
                    "K/V must come from exactly one of the block's own projections or its producer",
                )),
            };
        let q = self.roped(&q_raw, &self.q_norm, rope_t)?;
        let (o, core) = match scores {
            Scores::Causal { key_mask, window } => {
                let (o, saved) = attention_saved(&q, &k, &v, key_mask, window, 1.0, &self.plan)?;
                (o, CoreSaved::Fused(saved))
            }
            Scores::Dense(mask) => (
                attention_dense(&q, &k, &v, mask, 1.0)?,
                CoreSaved::Dense(mask.clone()),
            ),
        };
        drop(q);
        let flat = swap_dims12(&o)?.reshape((b, t, nh * d))?;
        let (out, o_proj) = match known {
            Some(out) => (out.clone(), self.o_proj.forward_saved_state(&flat, ctx)?),
            None => self.o_proj.forward_saved(&flat, ctx)?,
        };
        let tape = AttentionTape {
            q_proj,
            own,
            q_raw,
            k,
            v,
            o,
            core,
            o_proj,
        };
        Ok((out, tape))
    }

    /// d(normed input) from d(attention output) `g (b, t, h)` (consumed: freed after `o_proj`);
    /// `normed_input` recomputes the normed input the forward saw, called only for the q/k/v
    /// projections at the end. `lent`: the gradient of this block's own K/V from the KV-sharing
    /// consumers that attended to them (added before the K/V norm and RoPE backward). Adapter
    /// gradients go to `grads`. Consumes the tape so each saved tensor is freed right after its
    /// last use.
    pub(crate) fn backward_saved(
        &self,
        tape: AttentionTape,
        g: Tensor,
        normed_input: impl FnOnce() -> Result<Tensor>,
        rope_t: &RopeTable,
        lent: Option<KvPair>,
        grads: &mut AdapterGrads,
    ) -> Result<AttentionGrads> {
        let (b, t, _) = g.dims3()?;
        let (nh, d) = (self.num_heads, self.head_dim);
        // o_proj's input is a transpose of the output: recomputed, and its memory takes d(input).
        let flat = swap_dims12(&tape.o)?.reshape((b, t, nh * d))?;
        let d_flat = tape.o_proj.backward_over_input(flat, &g, grads)?;
        drop((tape.o_proj, g));
        let d_o = swap_dims12(&d_flat.reshape((b, t, nh, d))?)?;
        drop(d_flat);
        let q = self.roped(&tape.q_raw, &self.q_norm, rope_t)?;
        let (dq, dk, dv) = match &tape.core {
            CoreSaved::Fused(saved) => saved.backward(&q, &tape.k, &tape.v, &tape.o, &d_o)?,
            CoreSaved::Dense(mask) => {
                attention_dense_backward(&q, &tape.k, &tape.v, mask, 1.0, &d_o)?
            }
        };
        drop((q, tape.k, tape.v, tape.o, d_o, tape.core));
        // d(raw) of a roped, normed projection: rope⁻ᵀ, back to (b, t, heads, d), norm backward
        // (plus `extra`, another gradient of the same raw output, added in the same kernel).
        let unroped = |dy: &Tensor, raw: &Tensor, norm: &Tensor, extra: Option<&Tensor>| {
            let tables = (&rope_t.cos, &rope_t.sin);
            let dx = heads_norm_rope_backward(raw, Some(norm), Some(tables), dy, self.eps, extra)?;
            Ok::<_, Error>(dx)
        };
        let flat = |t4: Tensor| -> Result<Tensor> {
            let (b, t, n, d) = t4.dims4()?;
            Ok(t4.reshape((b, t, n * d))?)
        };
        let dq_raw = unroped(&dq, &tape.q_raw, &self.q_norm, None)?;
        drop((dq, tape.q_raw));
        let x = &normed_input()?;
        let dx = tape.q_proj.backward(x, &flat(dq_raw)?, grads)?;
        let Some(own) = tape.own else {
            // A consumer: the K/V gradient belongs to the producer's backward.
            return Ok(AttentionGrads {
                dx,
                borrowed_kv: Some(KvPair { k: dk, v: dv }),
            });
        };
        let (dk, dv) = match lent {
            Some(kv) => ((dk + kv.k)?, (dv + kv.v)?),
            None => (dk, dv),
        };
        let k_norm = self
            .k_norm
            .as_ref()
            .expect("a block with its own K/V has k_norm");
        let dv_raw = heads_norm_rope_backward(&own.v_raw, None, None, &dv, self.eps, None)?;
        drop((dv, own.v_raw));
        // attention_k_eq_v: V is the raw k_proj output too, so its gradient joins dK's.
        let (dk_raw, dv_raw) = match &own.v_proj {
            Some(_) => (unroped(&dk, &own.k_raw, k_norm, None)?, Some(dv_raw)),
            None => (unroped(&dk, &own.k_raw, k_norm, Some(&dv_raw))?, None),
        };
        drop((dk, own.k_raw));
        let mut dx = own.k_proj.backward_acc(x, &flat(dk_raw)?, dx, grads)?;
        if let (Some(v_proj), Some(dv_raw)) = (&own.v_proj, dv_raw) {
            dx = v_proj.backward_acc(x, &flat(dv_raw)?, dx, grads)?;
        }
        Ok(AttentionGrads {
            dx,
            borrowed_kv: None,
        })
    }
}
