//! Explicit forward/backward of the attention block, for [`crate::decoder_layer::DecoderLayer`]'s
//! explicit layer backward: own K/V or a KV producer's (KV-sharing consumers, whose K/V gradient
//! goes back to the producer), causal attention (padded or packed) through the fused op or a dense
//! additive mask (bidirectional batches, through the composite). Same ops, in the same order, as
//! [`Attention::own_kv`] + [`Attention::attend`], which stay the autograd reference.
//!
//! Memory: the tape keeps the raw q/k/v projections, the post-norm K/V, the attention output and
//! its log-sum-exp; the roped queries and the `o_proj` input (a transpose of the output) are
//! recomputed in the backward unless the tape is whole (`whole` in [`Attention::forward_saved`]:
//! then kept from the forward), and the normed block input is passed back in by the layer.

use candle_core::Tensor;
use g4ft_lora::{AdapterGrads, LoraContext, LoraLinear, ProjectionSaved};
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
    /// A whole tape's roped queries `(b, heads, t, d)` from the forward (`None`: rebuilt from
    /// `q_raw` in the backward).
    q: Option<Tensor>,
    /// A whole tape's `o_proj` input `(b, t, heads·d)` from the forward (`None`: transposed from
    /// `o` again in the backward).
    o_flat: Option<Tensor>,
}

impl AttentionTape {
    /// The K/V this block attended to (a producer lends them to its consumers).
    pub(crate) fn kv(&self) -> KvPair {
        KvPair {
            k: self.k.clone(),
            v: self.v.clone(),
        }
    }

    /// The adapters' down products of the block's projections (share storage with the tape).
    pub(crate) fn lows(&self) -> AttentionLows {
        let own = self.own.as_ref();
        AttentionLows {
            q: self.q_proj.low().cloned(),
            k: own.and_then(|own| own.k_proj.low().cloned()),
            v: own.and_then(|own| own.v_proj.as_ref()?.low().cloned()),
            o: self.o_proj.low().cloned(),
        }
    }

    /// The part of the tape a recompute can take instead of computing it (shares storage).
    pub(crate) fn state(&self) -> AttentionState {
        AttentionState {
            q_raw: self.q_raw.clone(),
            own_raw: (self.own.as_ref()).map(|own| {
                let v_raw = own.v_proj.as_ref().map(|_| own.v_raw.clone());
                (own.k_raw.clone(), v_raw)
            }),
            o: self.o.clone(),
            lse: match &self.core {
                CoreSaved::Fused(saved) => Some(saved.lse().clone()),
                CoreSaved::Dense(_) => None,
            },
        }
    }
}

/// What the attention block's backward reads of its forward besides the normed input, the K/V
/// (rebuilt from the raw projections by the cheap norm and RoPE kernel) and the LoRA states: the
/// raw projections, the output and its log-sum-exp. Kept from the first forward (offloaded
/// checkpoints, `Parked::InputsOutputsAndAttention`), they spare the recompute the q/k/v frozen
/// products and the attention kernel.
pub(crate) struct AttentionState {
    /// `q_proj`'s output `(b, t, heads, d)`.
    pub(crate) q_raw: Tensor,
    /// A block with its own K/V: `k_proj`'s output `(b, t, kv, d)` and `v_proj`'s (`None` with
    /// `attention_k_eq_v`, whose V is the raw K).
    pub(crate) own_raw: Option<(Tensor, Option<Tensor>)>,
    /// The attention output `(b, heads, t, d)`.
    pub(crate) o: Tensor,
    /// Its per-row log-sum-exp `(b, heads, t)` fp32 (fused attention; `None` under a dense
    /// mask, whose backward recomputes the probabilities).
    pub(crate) lse: Option<Tensor>,
}

/// The adapters' down products `low = drop(x)·Aᵀ` of the attention block's projections, from its
/// first forward (`None` for a projection without an adapter, or without the projection: a
/// KV-sharing consumer's k and v, v with `attention_k_eq_v`).
#[derive(Default)]
pub(crate) struct AttentionLows {
    pub(crate) q: Option<Tensor>,
    pub(crate) k: Option<Tensor>,
    pub(crate) v: Option<Tensor>,
    pub(crate) o: Option<Tensor>,
}

/// What a recompute of the attention block takes from its first forward (nothing by default).
#[derive(Default, Clone, Copy)]
pub(crate) struct AttentionRecall<'a> {
    /// `o_proj`'s output, the block's output (then `o_proj` keeps only its saved state).
    pub(crate) out: Option<&'a Tensor>,
    /// The tape's raw projections, output and log-sum-exp, if they were kept too.
    pub(crate) state: Option<&'a AttentionState>,
    /// The adapters' down products, taken instead of running them again.
    pub(crate) lows: Option<&'a AttentionLows>,
}

/// What the attention backward returns besides d(normed input).
pub(crate) struct AttentionGrads {
    /// d(input) of the block (normed layer input).
    pub(crate) dx: Tensor,
    /// For a KV-sharing consumer: the gradient of the producer's K/V it attended to.
    pub(crate) borrowed_kv: Option<KvPair>,
}

impl Attention {
    /// Whether [`Attention::forward_saved`] reads its normed input under `recall`: not in a
    /// recompute that holds the attention state and every adapter's down product (the input is
    /// then recomputed for the backward alone).
    pub(crate) fn reads_input(&self, recall: &AttentionRecall) -> bool {
        let Some(state) = recall.state else {
            return true;
        };
        let low = |pick: fn(&AttentionLows) -> &Option<Tensor>| {
            recall.lows.and_then(|l| pick(l).as_ref())
        };
        // A projection reads the input when it is computed (its output not kept) or its state
        // needs it ([`LoraLinear::recall_reads_input`]).
        let reads = |proj: &LoraLinear, kept: bool, low: Option<&Tensor>| {
            !kept || proj.recall_reads_input(low)
        };
        let kv = match (&self.k_proj, &state.own_raw) {
            (None, _) => false, // a KV-sharing consumer's K/V are its producer's
            (Some(_), None) => true,
            (Some(k_proj), Some((_, v_raw))) => {
                reads(k_proj, true, low(|l| &l.k))
                    || (self.v_proj.as_ref())
                        .is_some_and(|v_proj| reads(v_proj, v_raw.is_some(), low(|l| &l.v)))
            }
        };
        reads(&self.q_proj, true, low(|l| &l.q)) || kv
    }

    /// `rope(swap(norm(raw)))`: a raw `(b, t, heads, d)` projection to attention's layout.
    fn roped(&self, raw: &Tensor, norm: &Tensor, rope_t: &RopeTable) -> Result<Tensor> {
        let tables = (&rope_t.cos, &rope_t.sin);
        Ok(heads_norm_rope(raw, Some(norm), Some(tables), self.eps)?)
    }

    /// The attention output `(b, t, h)` of the normed input `x` and its tape. `shared`: the
    /// producer's K/V for a KV-sharing consumer (`None` for a block with its own). `recall`: what
    /// an earlier forward on the same input kept (a recompute): perhaps its output, returned as it
    /// is (`o_proj` then keeps only its saved state), its [`AttentionState`], taken instead of
    /// running the q/k/v frozen products and the attention kernel, and its adapters' down
    /// products. `whole`: the tape also keeps the roped queries and the `o_proj` input. Records no
    /// graph.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn forward_saved(
        &self,
        x: Option<&Tensor>,
        shared: Option<&KvPair>,
        rope_t: &RopeTable,
        scores: Scores,
        ctx: &LoraContext,
        recall: AttentionRecall,
        whole: bool,
    ) -> Result<(Tensor, AttentionTape)> {
        let (nh, nkv, d) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let state = recall.state;
        let lows = recall.lows;
        let input = || {
            x.ok_or_else(|| {
                Error::batch(
                    "attention",
                    "a recompute that computes a projection needs the normed input",
                )
            })
        };
        let (b, t) = match (x, state) {
            (None, Some(state)) => {
                let (b, t, _, _) = state.q_raw.dims4()?;
                (b, t)
            }
            _ => {
                let (b, t, _) = input()?.dims3()?;
                (b, t)
            }
        };
        // A projection's raw output `(b, t, n, d)` and saved state: computed, or the kept output
        // with the LoRA state alone (from the kept down product, if any).
        let project = |proj: &LoraLinear, kept: Option<&Tensor>, low: Option<&Tensor>, n| match kept
        {
            Some(raw) => Ok::<_, Error>((raw.clone(), proj.recalled_state(x, low, ctx)?)),
            None => {
                let (raw, saved) = proj.forward_saved(input()?, low, ctx)?;
                Ok((raw.reshape((b, t, n, d))?, saved))
            }
        };
        let low = |pick: fn(&AttentionLows) -> &Option<Tensor>| lows.and_then(|l| pick(l).as_ref());
        let (q_raw, q_proj) = project(&self.q_proj, state.map(|s| &s.q_raw), low(|l| &l.q), nh)?;
        let (own, k, v) = match (&self.k_proj, &self.k_norm, shared) {
            (Some(k_proj), Some(k_norm), None) => {
                let kept = state.and_then(|s| s.own_raw.as_ref());
                let (k_raw, k_proj) = project(k_proj, kept.map(|(k, _)| k), low(|l| &l.k), nkv)?;
                let (v_raw, v_proj) = match &self.v_proj {
                    Some(v_proj) => {
                        let kept_v = kept.and_then(|(_, v)| v.as_ref());
                        let (v_raw, saved) = project(v_proj, kept_v, low(|l| &l.v), nkv)?;
                        (v_raw, Some(saved))
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
            _ => {
                return Err(Error::batch(
                    "shared_kv",
                    "K/V must come from exactly one of the block's own projections or its producer",
                ))
            }
        };
        let mut kept_q = None;
        let (o, core) = match (state, scores) {
            (Some(state), Scores::Causal { key_mask, window }) => {
                let lse = state.lse.clone().ok_or_else(|| {
                    Error::batch(
                        "attention",
                        "a kept fused attention state has its log-sum-exp",
                    )
                })?;
                let saved = AttentionSaved::from_lse(
                    &state.o, &k, &v, key_mask, window, 1.0, &self.plan, lse,
                )?;
                (state.o.clone(), CoreSaved::Fused(saved))
            }
            (Some(state), Scores::Dense(mask)) => (state.o.clone(), CoreSaved::Dense(mask.clone())),
            (None, scores) => {
                let q = self.roped(&q_raw, &self.q_norm, rope_t)?;
                kept_q = whole.then(|| q.clone());
                match scores {
                    Scores::Causal { key_mask, window } => {
                        let (o, saved) =
                            attention_saved(&q, &k, &v, key_mask, window, 1.0, &self.plan)?;
                        (o, CoreSaved::Fused(saved))
                    }
                    Scores::Dense(mask) => (
                        attention_dense(&q, &k, &v, mask, 1.0)?,
                        CoreSaved::Dense(mask.clone()),
                    ),
                }
            }
        };
        // o_proj's input, a transpose of the output: not formed for a recompute that holds the
        // block output and o_proj's down product.
        let o_low = low(|l| &l.o);
        let flat = (whole || recall.out.is_none() || self.o_proj.recall_reads_input(o_low))
            .then(|| swap_dims12(&o)?.reshape((b, t, nh * d)))
            .transpose()?;
        let (out, o_proj) = match (recall.out, &flat) {
            (Some(out), flat) => (
                out.clone(),
                self.o_proj.recalled_state(flat.as_ref(), o_low, ctx)?,
            ),
            (None, Some(flat)) => self.o_proj.forward_saved(flat, o_low, ctx)?,
            (None, None) => unreachable!("the input of a computed o_proj is formed"),
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
            q: kept_q,
            o_flat: flat.filter(|_| whole),
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
        // o_proj's input is a transpose of the output (recomputed unless kept); its memory takes
        // d(input).
        let flat = match tape.o_flat {
            Some(flat) => flat,
            None => swap_dims12(&tape.o)?.reshape((b, t, nh * d))?,
        };
        let d_flat = tape.o_proj.backward_over_input(flat, &g, grads)?;
        drop((tape.o_proj, g));
        let d_o = swap_dims12(&d_flat.reshape((b, t, nh, d))?)?;
        drop(d_flat);
        let q = match tape.q {
            Some(q) => q,
            None => self.roped(&tape.q_raw, &self.q_norm, rope_t)?,
        };
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
