//! Layer-wise backward with per-layer recompute (gradient checkpointing) of the layers the
//! model's [`crate::KeepMask`] does not keep, so each layer's gradients are final — and can be
//! handed to DDP — while earlier layers are still pending.
//!
//! 1. Forward without a graph (`decoder_layer/explicit.rs`), saving each recomputed layer's input
//!    and its adapters' down products (`tokens × r` each, which spare the recompute the adapters'
//!    down kernels; with offloaded checkpoints, [`Gemma4Model::set_offload_checkpoints`], the input
//!    is parked in host memory, perhaps with the layer's attention and MLP outputs and its
//!    attention state, which spare the recompute all its frozen products but the MLP's gate and
//!    up, and the attention kernel),
//!    each kept layer's tape (which holds its input), and the K/V each KV producer lends its
//!    consumers.
//! 2. Head + loss on the final hidden state (a `Var`), backward → d(hidden).
//! 3. For layers `L−1 … 0`: take the kept tape, or recompute the layer from its saved input
//!    without a graph, keeping its tape (a parked input is fetched back, and the next parked one
//!    down starts coming back while this layer runs); run the fused ops' backward in reverse with
//!    the upstream gradient; report the layer's adapter gradients ([`AdapterGrads`]); carry
//!    d(input) to the layer below.
//!
//! KV sharing: a consumer's backward returns the gradient of the producer's K/V it attended to;
//! it is summed per producer and added to the producer's own K/V gradient when the walk reaches
//! the producer (consumers always come later, so the sum is complete by then). Candle's autograd
//! over [`crate::decoder_layer::DecoderLayer::forward`] is the reference this walk is tested
//! against (`tests/layerwise.rs`), per layer kind; equal up to summation order.

use std::collections::HashMap;
use std::sync::{MutexGuard, PoisonError};

use candle_core::Var;
use g4ft_lora::{AdapterGrads, LoraContext};
use g4ft_ops::HostOffload;

use crate::attention::explicit::AttentionState;
use crate::attention::KvPair;
use crate::config::KvSharing;
use crate::decoder_layer::explicit::{BlockOutputs, LayerLows, LayerRecall, LayerTape};
use crate::error::Error;
use crate::model::{shift_labels, Gemma4Model, LossOutput, Prepared, TokenBatch};
use crate::recompute::Parked;

/// What the forward keeps of one layer for the backward walk.
enum Saved {
    /// A recomputed layer: its input and its adapters' down products.
    Input(candle_core::Tensor, LayerLows),
    /// A recomputed layer whose input (and perhaps [`BlockOutputs`]) wait in host memory, in the
    /// slots of this mask ([`Parking`]), and its adapters' down products (on the device).
    Parked(u8, LayerLows),
    /// A layer that keeps its activations: its tape (which holds its input).
    Tape(Box<LayerTape>),
}

/// Host-offload slots per layer: the input, the attention and MLP outputs, and the attention
/// state's raw q, raw k, raw v, output and log-sum-exp (layer `i` has `SLOTS * i ..`).
const SLOTS: usize = Parked::MOST.tensors_per_layer();

/// The host offload of one forward + backward (locked for the call) and what it parks per layer.
struct Parking<'a> {
    parked: Parked,
    host: MutexGuard<'a, HostOffload>,
}

impl Parking<'_> {
    /// Parks layer `i`'s input (before the layer runs, so that the copy overlaps its kernels).
    fn park_input(&mut self, i: usize, input: &candle_core::Tensor) -> Result<(), Error> {
        Ok(self.host.park(SLOTS * i, input)?)
    }

    /// Parks what the level keeps of layer `i`'s `outputs`; the mask of the layer's slots that
    /// hold a tensor (its input's included).
    fn park_outputs(&mut self, i: usize, outputs: BlockOutputs) -> Result<u8, Error> {
        let mut mask = 1;
        for (k, t) in into_slots(outputs, self.parked).into_iter().enumerate() {
            if let Some(t) = t {
                self.host.park(SLOTS * i + k + 1, &t)?;
                mask |= 1 << (k + 1);
            }
        }
        Ok(mask)
    }

    /// Layer `i`'s parked input and block outputs (those of `mask`), back on the device.
    fn fetch(
        &mut self,
        i: usize,
        mask: u8,
    ) -> Result<(candle_core::Tensor, Option<BlockOutputs>), Error> {
        let mut slots: [Option<candle_core::Tensor>; SLOTS] = Default::default();
        for (k, slot) in slots.iter_mut().enumerate() {
            if mask & (1 << k) != 0 {
                *slot = Some(self.host.fetch(SLOTS * i + k)?);
            }
        }
        let [input, outputs @ ..] = slots;
        let input = input.expect("a parked layer parks its input");
        Ok((input, from_slots(outputs)))
    }

    /// Before the backward walk: the compute stream waits for the copies out still running, and
    /// their device tensors go back to the pool at this point, so the walk starts with none of
    /// them held, as the memory model counts, however far ahead of the device the host runs.
    fn settle(&mut self) -> Result<(), Error> {
        Ok(self.host.settle()?)
    }

    /// Starts bringing back what the highest parked layer of `saved` parked (`saved[j]` is layer
    /// `j`'s), so that it arrives while the layer above runs its backward.
    fn prefetch_next(&mut self, saved: &[Saved]) -> Result<(), Error> {
        let below = saved.iter().enumerate().rev().find_map(|(j, s)| match s {
            Saved::Parked(mask, _) => Some((j, *mask)),
            _ => None,
        });
        if let Some((j, mask)) = below {
            for k in (0..SLOTS).filter(|k| mask & (1 << k) != 0) {
                self.host.prefetch(SLOTS * j + k)?;
            }
        }
        Ok(())
    }
}

/// The tensors of `outputs` that `parked` keeps, in slot order after the input (see [`SLOTS`]).
fn into_slots(outputs: BlockOutputs, parked: Parked) -> [Option<candle_core::Tensor>; SLOTS - 1] {
    if !parked.outputs() {
        return Default::default();
    }
    let state = outputs.attention.filter(|_| parked.attention());
    let (mut q, mut k, mut v, mut o, mut lse) = (None, None, None, None, None);
    if let Some(state) = state {
        (q, o, lse) = (Some(state.q_raw), Some(state.o), state.lse);
        if let Some((k_raw, v_raw)) = state.own_raw {
            (k, v) = (Some(k_raw), v_raw);
        }
    }
    [Some(outputs.attn), Some(outputs.mlp), q, k, v, o, lse]
}

/// [`BlockOutputs`] from what [`into_slots`] parked, `None` when only the input was.
fn from_slots(slots: [Option<candle_core::Tensor>; SLOTS - 1]) -> Option<BlockOutputs> {
    let [attn, mlp, q_raw, k_raw, v_raw, o, lse] = slots;
    let attention = match (q_raw, o) {
        (Some(q_raw), Some(o)) => Some(AttentionState {
            q_raw,
            own_raw: k_raw.map(|k| (k, v_raw)),
            o,
            lse,
        }),
        _ => None,
    };
    Some(BlockOutputs {
        attn: attn?,
        mlp: mlp?,
        attention,
    })
}

impl Gemma4Model {
    /// Forward + layer-wise backward of one micro-batch.
    ///
    /// The gradients are those of `loss_scale · loss_sum / n_tokens`, i.e. of transformers'
    /// mean loss times `loss_scale` (pass `1/grad_accum_steps` for the post's loop, or a
    /// token-weighting factor). A batch without valid targets yields zero gradients (the walk
    /// still runs so every layer is reported). `on_layer(i, grads)` is called for `i = L−1 … 0`
    /// as soon as layer `i`'s gradients are final; `grads` holds the gradients of the adapter
    /// `Var`s of that layer (look them up with `grads.get(&var)`). `ctx.track_grad` is ignored
    /// (no graph is recorded; the recompute keeps what the backward reads); dropout replays because
    /// both passes use the same `seed`/`micro_step`. Layers in [`Gemma4Model::keep_mask`] keep
    /// their tape from the forward and are not recomputed; the gradients are the same bits.
    /// Returns the loss still on the device ([`LossOutput`] says when to read it).
    pub fn forward_backward<F, E>(
        &self,
        batch: &TokenBatch,
        labels: &[i64],
        ctx: &LoraContext,
        loss_scale: f64,
        mut on_layer: F,
    ) -> std::result::Result<LossOutput, E>
    where
        F: FnMut(usize, &AdapterGrads) -> std::result::Result<(), E>,
        E: From<Error>,
    {
        let cfg = self.config();
        let (targets, n_tokens) =
            shift_labels(labels, (batch.batch, batch.seq_len), cfg.vocab_size)?;
        let Prepared { embeds, inputs } = self.prepare(batch)?;
        let fwd_ctx = LoraContext {
            track_grad: false,
            ..*ctx
        };
        let bwd_ctx = LoraContext {
            track_grad: true,
            ..*ctx
        };

        // 1. Forward without a graph; keep the recomputed layers' inputs, the kept layers' tapes
        //    and the producers' K/V.
        let n_layers = self.layers.len();
        let keep = self.keep_mask();
        // Held for the whole call: the slots are this micro-batch's until its backward is done.
        let mut offload = self.offload.as_ref().map(|o| Parking {
            parked: o.parked,
            host: o.host.lock().unwrap_or_else(PoisonError::into_inner),
        });
        let mut saved = Vec::with_capacity(n_layers);
        let mut stored: HashMap<usize, KvPair> = HashMap::new();
        // Layer 0's input is the only reference to the embeddings, so parking it frees them.
        let mut h = embeds.detach();
        drop(embeds);
        for (i, layer) in self.layers.iter().enumerate() {
            let shared = layer.producer().map(|p| &stored[&p]);
            let (out, kv, held) = if keep.keeps(i) {
                let (tape, out) =
                    layer.forward_with_tape(&h, shared, &inputs, &bwd_ctx, keep.whole_tapes())?;
                (out, tape.kv(), Saved::Tape(Box::new(tape)))
            } else {
                // The input is parked before the layer runs, so that the copy overlaps its
                // kernels; the block outputs as soon as they exist.
                if let Some(park) = offload.as_mut() {
                    park.park_input(i, &h)?;
                }
                let (out, kv, outputs, lows) =
                    layer.forward_graph_free(&h, shared, &inputs, &fwd_ctx)?;
                let held = match offload.as_mut() {
                    Some(park) => Saved::Parked(park.park_outputs(i, outputs)?, lows),
                    None => Saved::Input(h, lows),
                };
                (out, kv, held)
            };
            if layer.config().kv_sharing == KvSharing::Store {
                stored.insert(i, kv);
            }
            saved.push(held);
            h = out;
        }

        // The walk fetches the highest parked layer first: its copy back starts now and runs
        // during the loss head, instead of holding the walk's first kernels.
        if let Some(park) = offload.as_mut() {
            park.prefetch_next(&saved)?;
        }

        // 2. Head and loss → d(final hidden).
        let hv = Var::from_tensor(&h).map_err(Error::from)?;
        let loss_sum = self.head_loss(hv.as_tensor(), &targets)?;
        // Read by the caller, after the backward is queued: a read here would hold the host
        // until the forward has run, leaving the GPU idle while it queues the first layers.
        let sum = loss_sum.detach();
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
        drop((grads, hv, h));
        if let Some(park) = offload.as_mut() {
            park.settle()?;
        }

        // 3. Walk the layers backwards, recomputing those that saved only their input.
        let mut lent: HashMap<usize, KvPair> = HashMap::new();
        for i in (0..n_layers).rev() {
            let layer = &self.layers[i];
            let producer = layer.producer();
            let recompute =
                |input: &candle_core::Tensor, outputs: Option<&BlockOutputs>, lows: &LayerLows| {
                    let shared = producer.map(|p| &stored[&p]);
                    let recall = LayerRecall {
                        outputs,
                        lows: Some(lows),
                    };
                    layer.forward_saved(input, recall, shared, &inputs, &bwd_ctx)
                };
            let tape = match saved.pop().expect("one saved input or tape per layer") {
                Saved::Tape(tape) => {
                    if let Some(park) = offload.as_mut() {
                        park.prefetch_next(&saved)?;
                    }
                    *tape
                }
                Saved::Input(input, lows) => recompute(&input, None, &lows)?,
                Saved::Parked(mask, lows) => {
                    let park = offload.as_mut().expect("parked only with offload");
                    let (input, outputs) = park.fetch(i, mask)?;
                    park.prefetch_next(&saved)?;
                    recompute(&input, outputs.as_ref(), &lows)?
                }
            };
            if layer.config().kv_sharing == KvSharing::Store {
                stored.remove(&i); // its last consumer is done
            }
            let mut grads = AdapterGrads::default();
            let out = layer.backward_saved(tape, &g, &inputs, lent.remove(&i), &mut grads)?;
            if let (Some(p), Some(dkv)) = (producer, out.borrowed_kv) {
                let sum = match lent.remove(&p) {
                    Some(acc) => KvPair {
                        k: (acc.k + dkv.k).map_err(Error::from)?,
                        v: (acc.v + dkv.v).map_err(Error::from)?,
                    },
                    None => dkv,
                };
                lent.insert(p, sum);
            }
            on_layer(i, &grads)?;
            g = out.dx;
        }
        Ok(LossOutput { sum, n_tokens })
    }
}
