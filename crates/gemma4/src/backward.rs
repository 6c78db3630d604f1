//! Layer-wise backward with per-layer recompute (gradient checkpointing), so each layer's
//! gradients are final — and can be handed to DDP — while earlier layers are still pending
//! (`candle-training-notes.md` §2.2).
//!
//! 1. Forward without graph (`track_grad = false`), saving each layer's input and each KV
//!    producer's K/V.
//! 2. Head + loss on the final hidden state (a `Var`), backward → d(hidden).
//! 3. For layers `L−1 … 0`: recompute the layer from its saved input and run its backward with the
//!    upstream gradient, report the layer's adapter gradients ([`AdapterGrads`]), carry d(input)
//!    to the layer below. With [`BackwardMode::Explicit`] the layers it covers recompute without a
//!    graph and run the fused ops' backward in reverse (`decoder_layer/explicit.rs`); the others
//!    recompute with `track_grad = true` from a `Var` input and seed Candle's autograd.
//!
//! KV sharing: a consumer's borrowed K/V are `Var`s during its recompute; their gradients are
//! accumulated per producer and seeded into the producer's K/V outputs together with its hidden
//! output when the walk reaches the producer (consumers always come later, so the accumulated
//! gradient is complete by then). Equal to the full-graph backward up to summation order.

use std::collections::HashMap;

use candle_core::backprop::GradStore;
use candle_core::{Tensor, Var};
use g4ft_lora::{AdapterGrads, LoraContext};
use g4ft_ops::backward_with_seed;

use crate::attention::KvPair;
use crate::config::KvSharing;
use crate::decoder_layer::DecoderLayer;
use crate::error::{Error, Result};
use crate::mask::AttentionBias;
use crate::model::{shift_labels, BackwardMode, Gemma4Model, TokenBatch};

/// What a layer-wise forward/backward measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LossStats {
    /// Σ of the token NLLs (fp32 sum, unscaled).
    pub loss_sum: f64,
    /// Number of valid (shifted, non-ignored) targets.
    pub n_tokens: usize,
}

impl LossStats {
    /// transformers' `outputs.loss` (NaN when there is no valid target, as in PyTorch).
    pub fn mean(&self) -> f64 {
        self.loss_sum / self.n_tokens as f64
    }
}

/// Backward of several outputs at once: `Σ_i <out_i, seed_i>`. One output goes straight to
/// [`backward_with_seed`]; several are flattened and concatenated into one seeded tensor.
fn backward_seeded(pairs: &[(&Tensor, &Tensor)]) -> Result<GradStore> {
    if let [(out, seed)] = pairs {
        return Ok(backward_with_seed(out, seed)?);
    }
    let outs = pairs
        .iter()
        .map(|(o, _)| o.flatten_all())
        .collect::<candle_core::Result<Vec<_>>>()?;
    let seeds = pairs
        .iter()
        .map(|(_, s)| s.flatten_all())
        .collect::<candle_core::Result<Vec<_>>>()?;
    let out = Tensor::cat(&outs, 0)?;
    let seed = Tensor::cat(&seeds, 0)?;
    Ok(backward_with_seed(&out, &seed)?)
}

/// The adapter gradients of `layer`'s projections found in an autograd `store`.
fn adapter_grads(layer: &DecoderLayer, store: &GradStore) -> Result<AdapterGrads> {
    let mut grads = AdapterGrads::default();
    for ad in layer.projections().filter_map(|p| p.adapter()) {
        for var in [&ad.a, &ad.b] {
            if let Some(g) = store.get(var.as_tensor()) {
                grads.push(var, g.clone())?;
            }
        }
    }
    Ok(grads)
}

fn detach_kv(kv: &KvPair) -> KvPair {
    KvPair {
        k: kv.k.detach(),
        v: kv.v.detach(),
    }
}

impl Gemma4Model {
    /// Forward + layer-wise backward of one micro-batch.
    ///
    /// The gradients are those of `loss_scale · loss_sum / n_tokens`, i.e. of transformers'
    /// mean loss times `loss_scale` (pass `1/grad_accum_steps` for the post's loop, or a
    /// token-weighting factor). A batch without valid targets yields zero gradients (the walk
    /// still runs so every layer is reported). `on_layer(i, grads)` is called for `i = L−1 … 0`
    /// as soon as layer `i`'s gradients are final; `grads` holds the gradients of the adapter
    /// `Var`s of that layer (look them up with `grads.get(&var)`). [`BackwardMode`] picks how
    /// layers are differentiated (same gradients up to summation order). `ctx.track_grad` is ignored
    /// (forced off for the first forward, on for the recompute); dropout replays because both
    /// passes use the same `seed`/`micro_step`.
    pub fn forward_backward<F, E>(
        &self,
        batch: &TokenBatch,
        labels: &[i64],
        ctx: &LoraContext,
        loss_scale: f64,
        mut on_layer: F,
    ) -> std::result::Result<LossStats, E>
    where
        F: FnMut(usize, &AdapterGrads) -> std::result::Result<(), E>,
        E: From<Error>,
    {
        let cfg = self.config();
        let (targets, n_tokens) =
            shift_labels(labels, (batch.batch, batch.seq_len), cfg.vocab_size)?;
        let prep = self.prepare(batch)?;
        let fwd_ctx = LoraContext {
            track_grad: false,
            ..*ctx
        };
        let bwd_ctx = LoraContext {
            track_grad: true,
            ..*ctx
        };

        // 1. Forward without graph; keep layer inputs and producers' K/V.
        let n_layers = self.layers.len();
        let mut saved = Vec::with_capacity(n_layers);
        let mut stored: HashMap<usize, KvPair> = HashMap::new();
        let mut h = prep.embeds.detach();
        let explicit = self.backward_mode == BackwardMode::Explicit
            && matches!(prep.inputs.bias, AttentionBias::Causal { .. });
        for (i, layer) in self.layers.iter().enumerate() {
            if explicit && layer.has_explicit_backward() {
                let out = layer.forward_graph_free(&h, &prep.inputs, &fwd_ctx)?;
                saved.push(std::mem::replace(&mut h, out));
                continue;
            }
            let shared = match layer.config().kv_sharing {
                KvSharing::Reuse { producer } => stored.get(&producer),
                _ => None,
            };
            let (out, own) = layer.forward(&h, shared, &prep.inputs, &fwd_ctx)?;
            if layer.config().kv_sharing == KvSharing::Store {
                let kv = own.expect("a producer computes its own K/V");
                stored.insert(i, detach_kv(&kv));
            }
            saved.push(h);
            h = out.detach();
        }

        // 2. Head and loss → d(final hidden).
        let hv = Var::from_tensor(&h).map_err(Error::from)?;
        let loss_sum = self.head_loss(hv.as_tensor(), &targets)?;
        let loss_value = loss_sum.to_scalar::<f32>().map_err(Error::from)? as f64;
        let factor = if n_tokens > 0 {
            loss_scale / n_tokens as f64
        } else {
            0.0
        };
        let grads = (loss_sum * factor)
            .and_then(|l| l.backward())
            .map_err(Error::from)?;
        // No valid target: the fused loss records no gradient; walk on with zeros.
        let mut g = match grads.get(&hv) {
            Some(g) => g.detach(),
            None => h.zeros_like().map_err(Error::from)?,
        };
        drop(grads);
        drop(hv);

        // 3. Walk the layers backwards with recompute.
        let mut pending: HashMap<usize, (Tensor, Tensor)> = HashMap::new();
        for i in (0..n_layers).rev() {
            let layer = &self.layers[i];
            let input = saved.pop().expect("one saved input per layer");
            if explicit && layer.has_explicit_backward() {
                let tape = layer.forward_saved(&input, &prep.inputs, &bwd_ctx)?;
                drop(input);
                let mut grads = AdapterGrads::default();
                g = layer.backward_saved(tape, &g, &prep.inputs, &mut grads)?;
                on_layer(i, &grads)?;
                continue;
            }
            let xin = if i > 0 {
                Some(Var::from_tensor(&input).map_err(Error::from)?)
            } else {
                None
            };
            let x = xin.as_ref().map(|v| v.as_tensor().clone()).unwrap_or(input);
            let borrowed = match layer.config().kv_sharing {
                KvSharing::Reuse { producer } => {
                    let kv = &stored[&producer];
                    Some((
                        producer,
                        Var::from_tensor(&kv.k).map_err(Error::from)?,
                        Var::from_tensor(&kv.v).map_err(Error::from)?,
                    ))
                }
                _ => None,
            };
            let shared = borrowed.as_ref().map(|(_, k, v)| KvPair {
                k: k.as_tensor().clone(),
                v: v.as_tensor().clone(),
            });
            let (out, own) = layer.forward(&x, shared.as_ref(), &prep.inputs, &bwd_ctx)?;
            let lent = pending.remove(&i);
            let grads = match (&lent, &own) {
                (Some((gk, gv)), Some(kv)) => {
                    backward_seeded(&[(&out, &g), (&kv.k, gk), (&kv.v, gv)])?
                }
                _ => backward_seeded(&[(&out, &g)])?,
            };
            if let Some((producer, kvar, vvar)) = &borrowed {
                let gk = grads.get(kvar).map(Tensor::detach);
                let gv = grads.get(vvar).map(Tensor::detach);
                if let (Some(gk), Some(gv)) = (gk, gv) {
                    let acc = match pending.remove(producer) {
                        Some((ak, av)) => (
                            (ak + gk).map_err(Error::from)?,
                            (av + gv).map_err(Error::from)?,
                        ),
                        None => (gk, gv),
                    };
                    pending.insert(*producer, acc);
                }
            }
            on_layer(i, &adapter_grads(layer, &grads)?)?;
            if let Some(xin) = &xin {
                g = grads
                    .get(xin)
                    .ok_or_else(|| {
                        Error::batch(
                            "input_ids",
                            format!("layer {i} output does not depend on its input"),
                        )
                    })?
                    .detach();
            }
        }
        Ok(LossStats {
            loss_sum: loss_value,
            n_tokens,
        })
    }
}
