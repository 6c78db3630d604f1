//! The step recipe: what `examples/train_ddp.rs` (and `examples/bench_train.rs`, so the
//! benchmark times exactly the training step) calls inside its loop, over the model, DDP and the
//! optimizer: one micro-batch's forward + backward with each finished layer's LoRA gradients
//! handed to DDP ([`backward`]), an optimizer step's window of micro-batches with `no_sync`
//! accumulation and the final synchronised backward ([`accumulate_window`], observable phase by
//! phase through [`StepObserver`]), the loss scale of the two loss modes ([`LossWeighting`]),
//! AdamW over DDP's flat buckets ([`adamw_step`]), scalar all-reduces ([`all_reduce_sum`]),
//! evaluation ([`evaluate`]) and the model's FLOP shape for MFU under its recompute policy
//! ([`flops_model`], for the model-agnostic count in [`crate::metrics::mfu`]).
//!
//! The pieces of a step have their own modules: the AdamW state ([`optim`]), gradient clipping
//! ([`clip`]), the learning-rate schedule ([`schedule`]) and the skip-or-stop decision on a
//! non-finite step ([`nonfinite`]); [`profile`] holds the observers that time a step.
//!
//! Collectives: [`accumulate_window`] and [`backward`] into DDP itself (the gradient
//! all-reduce, bucket by bucket), [`all_reduce_sum`] and [`evaluate`] are collective (every rank
//! must call them, in the same order); the rest is local. Plain functions over the crates'
//! types, so the order of the calls stays visible in the example.

pub mod clip;
pub mod nonfinite;
pub mod optim;
pub mod profile;
pub mod schedule;

use std::time::Instant;

use anyhow::Result;
use candle_core::{DType, Device, Tensor, Var};
use g4ft_data::{Batch, DataLoader};
use g4ft_ddp::{signals, DdpError, DistributedDataParallel, NoSync, ProcessGroup, ReduceOp};
use g4ft_gemma4::{Gemma4Model, LayerType, LossOutput, Parked, ProjectionShape, TokenBatch};
use g4ft_lora::{AdapterGrads, LoraContext};
use g4ft_wait::Schedule;

use crate::metrics::mfu::{AttnLayer, FlopsModel, LayerFlops};
use optim::{AdamW, FlatBucket};

/// Where a layer's finished gradients go: DDP itself on the synchronised micro-batch (buckets
/// all-reduce as they fill), or its [`NoSync`] guard on the others (local accumulation only).
pub trait GradSink {
    /// Hands over every wrapped parameter's gradient found in `grads`.
    fn report(&mut self, grads: &AdapterGrads) -> std::result::Result<usize, DdpError>;
}

impl GradSink for DistributedDataParallel<'_> {
    fn report(&mut self, grads: &AdapterGrads) -> std::result::Result<usize, DdpError> {
        self.grads_ready_with(|v| grads.get(v).cloned())
    }
}

impl GradSink for NoSync<'_, '_> {
    fn report(&mut self, grads: &AdapterGrads) -> std::result::Result<usize, DdpError> {
        self.grads_ready_with(|v| grads.get(v).cloned())
    }
}

/// The model's view of a collated batch. A packed batch passes its restarting positions and no
/// attention mask, so that attention stays within each sample (see [`Batch`]).
pub fn token_batch(b: &Batch) -> TokenBatch<'_> {
    TokenBatch {
        input_ids: &b.input_ids,
        attention_mask: (!b.is_packed()).then_some(&b.attention_mask[..]),
        position_ids: b.position_ids.as_deref(),
        batch: b.batch,
        seq_len: b.seq_len,
    }
}

/// The LoRA context of training micro-step `micro_step` on `rank`: dropout seeded with
/// `seed + rank` (the post's `torch.manual_seed(SEED + rank)` after the DDP wrap), replayable
/// from the micro-step counter on resume.
pub fn train_context(seed: u64, rank: usize, micro_step: u64) -> LoraContext {
    LoraContext {
        training: true,
        track_grad: true,
        seed: seed.wrapping_add(rank as u64),
        micro_step,
    }
}

/// How a micro-batch's mean loss is scaled before its backward. DDP then averages over ranks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LossWeighting {
    /// The post: `out.loss / ACCUM_STEPS` (every micro-batch weighs the same).
    MeanPerMicroBatch {
        /// Micro-batches per optimizer step.
        accum: usize,
    },
    /// Σ token losses / the optimizer step's token count over all ranks (every token weighs the
    /// same). DDP's average divides by `world_size`, so each rank scales by `world_size` too.
    TokenWeighted {
        /// Ranks.
        world_size: usize,
        /// Loss targets of this optimizer step summed over all ranks and micro-batches.
        global_tokens: u64,
    },
}

impl LossWeighting {
    /// The factor `s` such that the backward of `s · mean_loss` of a micro-batch with
    /// `n_tokens` targets gives the right share of the step's gradient.
    pub fn scale(&self, n_tokens: usize) -> f64 {
        match *self {
            LossWeighting::MeanPerMicroBatch { accum } => 1.0 / accum as f64,
            LossWeighting::TokenWeighted {
                world_size,
                global_tokens,
            } if global_tokens > 0 => world_size as f64 * n_tokens as f64 / global_tokens as f64,
            LossWeighting::TokenWeighted { .. } => 0.0,
        }
    }
}

/// This micro-batch's share of the logged step loss before the cross-rank sum: `scale · mean /
/// world_size` (0 for a batch without targets, whose gradient is zero too). Reads the loss, so
/// it waits for the device.
pub fn loss_share(stats: &LossOutput, scale: f64, world_size: usize) -> Result<f64> {
    if stats.n_tokens == 0 {
        return Ok(0.0);
    }
    Ok(stats.mean()? * scale / world_size as f64)
}

/// A point in [`accumulate_window`] (for a profiler: synchronise the device and read a clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepEvent {
    /// Micro-batch `k` of the window is about to run its forward.
    MicroBatchStart(usize),
    /// Layer `i`'s recompute + backward is done (for the last layer: also the forward of every
    /// layer and the loss head); its gradients go to DDP next.
    LayerBackward(usize),
    /// Layer `i`'s gradients are in DDP's buckets (accumulated; on the synchronised
    /// micro-batch, complete buckets are on the wire).
    LayerReported(usize),
    /// Micro-batch `k`'s forward + backward returned.
    MicroBatchEnd(usize),
    /// `ddp.finish()` returned: the buckets hold the rank-averaged gradients.
    Finished,
}

/// Receives the [`StepEvent`]s of [`accumulate_window`] in order.
pub trait StepObserver {
    /// Called at `event`; an error aborts the step.
    fn event(&mut self, event: StepEvent) -> Result<()>;

    /// A clock reading between the host-side phases after the window (grad norm, AdamW), for
    /// the caller to take: `None` (the default) from an observer that does not measure, else
    /// the time after a device synchronize.
    fn mark(&mut self) -> Result<Option<Instant>> {
        Ok(None)
    }
}

/// The observer of the normal path: does nothing (no device synchronisation).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoObserver;

impl StepObserver for NoObserver {
    fn event(&mut self, _: StepEvent) -> Result<()> {
        Ok(())
    }
}

/// Forward + layer-wise backward of one micro-batch; as soon as layer `i`'s gradients are final
/// they go to `sink`, so on the synchronised micro-batch a full bucket all-reduces while layers
/// `i−1 … 0` are still being recomputed.
pub fn backward(
    model: &Gemma4Model,
    sink: &mut impl GradSink,
    batch: &Batch,
    ctx: &LoraContext,
    loss_scale: f64,
) -> Result<LossOutput> {
    backward_observed(model, sink, batch, ctx, loss_scale, &mut NoObserver)
}

/// [`backward`] reporting [`StepEvent::LayerBackward`] / [`StepEvent::LayerReported`] around
/// each layer's hand-over to `sink`.
pub fn backward_observed(
    model: &Gemma4Model,
    sink: &mut impl GradSink,
    batch: &Batch,
    ctx: &LoraContext,
    loss_scale: f64,
    obs: &mut impl StepObserver,
) -> Result<LossOutput> {
    model.forward_backward(
        &token_batch(batch),
        &batch.labels,
        ctx,
        loss_scale,
        |layer, grads: &AdapterGrads| -> Result<()> {
            obs.event(StepEvent::LayerBackward(layer))?;
            sink.report(grads)?;
            obs.event(StepEvent::LayerReported(layer))
        },
    )
}

/// The gradient work of one optimizer step, as the post's loop does it: every micro-batch of
/// `window` runs [`backward`] with its [`LossWeighting::scale`], all but the last inside
/// `ddp.no_sync` (local accumulation into the buckets), the last one synchronised (buckets
/// all-reduce as they fill); then `ddp.finish()`. Dropout uses [`train_context`] with `seed`,
/// this rank and `*micro_step`, which advances by one per micro-batch. Returns this rank's
/// share of the logged step loss (Σ [`loss_share`]; all-reduce it for the logged value).
pub fn accumulate_window(
    model: &Gemma4Model,
    ddp: &mut DistributedDataParallel<'_>,
    window: &[Batch],
    weighting: LossWeighting,
    seed: u64,
    micro_step: &mut u64,
    obs: &mut impl StepObserver,
) -> Result<f64> {
    let (rank, world_size) = (ddp.group().rank(), ddp.group().world_size());
    // The losses are read after the window is queued: reading one waits for the device.
    let mut losses = Vec::with_capacity(window.len());
    for (k, batch) in window.iter().enumerate() {
        obs.event(StepEvent::MicroBatchStart(k))?;
        let ctx = train_context(seed, rank, *micro_step);
        *micro_step += 1;
        let scale = weighting.scale(batch.n_label_tokens);
        let stats = if k + 1 < window.len() {
            // Skip the gradient all-reduce on all but the last micro-batch.
            ddp.no_sync(|ddp| backward_observed(model, ddp, batch, &ctx, scale, obs))?
        } else {
            backward_observed(model, ddp, batch, &ctx, scale, obs)?
        };
        losses.push((stats, scale));
        obs.event(StepEvent::MicroBatchEnd(k))?;
    }
    ddp.finish()?; // every bucket reduced: the buffers hold the rank-averaged gradients
    obs.event(StepEvent::Finished)?;
    let mut share = 0.0;
    for (stats, scale) in &losses {
        share += loss_share(stats, *scale, world_size)?;
    }
    Ok(share)
}

/// One AdamW step over DDP's flat, already averaged gradient buckets, with the clip coefficient
/// folded in (`clip_grad_norm_` then `optimizer.step()`).
pub fn adamw_step(
    opt: &mut AdamW,
    ddp: &DistributedDataParallel<'_>,
    lr: f64,
    clip_coef: f32,
) -> Result<()> {
    let buckets = ddp.buckets()?;
    let params: Vec<Vec<Var>> = buckets
        .iter()
        .map(|b| {
            b.slots
                .iter()
                .map(|s| ddp.params()[s.index].1.clone())
                .collect()
        })
        .collect();
    let flat: Vec<FlatBucket<'_>> = buckets
        .iter()
        .zip(&params)
        .map(|(b, p)| FlatBucket {
            params: p,
            grads: &b.grad,
        })
        .collect();
    opt.step(lr, clip_coef, &flat)?;
    Ok(())
}

/// Element counts of DDP's buckets, the layout of the optimizer's moments.
pub fn bucket_lens(ddp: &DistributedDataParallel<'_>) -> Result<Vec<usize>> {
    Ok(ddp.buckets()?.iter().map(|b| b.grad.elem_count()).collect())
}

/// The flat gradient buffers, for the norm.
pub fn bucket_grads(ddp: &DistributedDataParallel<'_>) -> Result<Vec<Tensor>> {
    Ok(ddp.buckets()?.iter().map(|b| b.grad.clone()).collect())
}

/// Sums `values` over all ranks (one f64 all-reduce; every rank must call it).
pub fn all_reduce_sum(group: &ProcessGroup, values: &[f64], device: &Device) -> Result<Vec<f64>> {
    let t = Tensor::new(values, device)?;
    group.all_reduce(&t, ReduceOp::Sum)?;
    Ok(t.to_dtype(DType::F64)?.to_vec1::<f64>()?)
}

/// How an evaluation ended.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Evaluation {
    /// Every batch ran: the token-weighted mean loss and the target count over all ranks.
    Done { loss: f64, tokens: u64 },
    /// A rank caught a stop signal ([`signals`]): every rank left after the same `batches` of
    /// its shard's `of`, and nothing was reduced.
    Stopped {
        signal: i32,
        batches: usize,
        of: usize,
    },
}

/// Evaluation over this rank's shard of `loader` with dropout off (collective). Before each
/// batch the ranks all-reduce the stop signals they have caught ([`signals::caught_flags`]) and
/// all leave at the first batch where one has: every rank's shard holds the same number of
/// batches (the sampler pads it), so they leave together and a signal waits for no more than
/// one batch. Rank 0 prints its progress on stderr every 10 s.
pub fn evaluate(
    model: &Gemma4Model,
    loader: &DataLoader,
    group: &ProcessGroup,
    step: u64,
) -> Result<Evaluation> {
    let device = model.device();
    let of = loader.len();
    let (mut loss_sum, mut tokens) = (0f64, 0f64);
    let mut notes = Schedule::progress();
    for (batches, batch) in loader.epoch(0, 0).enumerate() {
        let caught = all_reduce_sum(group, &signals::caught_flags(), device)?;
        if let Some(signal) = signals::flagged(&caught) {
            return Ok(Evaluation::Stopped {
                signal,
                batches,
                of,
            });
        }
        if group.rank() == 0 && notes.due_now() {
            eprintln!("evaluating at step {step}: {batches} of {of} batches");
        }
        let batch = batch?;
        let out = model.loss(&token_batch(&batch), &batch.labels, &LoraContext::EVAL)?;
        loss_sum += out.sum_value()?;
        tokens += out.n_tokens as f64;
    }
    let total = all_reduce_sum(group, &[loss_sum, tokens], device)?;
    Ok(Evaluation::Done {
        loss: total[0] / total[1],
        tokens: total[1] as u64,
    })
}

/// The model's FLOP shape for MFU: each layer's frozen projections, routed experts and router,
/// per-layer-embedding matrices, attention, whether its keep mask recomputes it and which frozen
/// products and attention that recompute reuses from offloaded checkpoints; the tied
/// head; the per-layer-embedding model projection (run once, nothing to differentiate).
pub fn flops_model(model: &Gemma4Model) -> FlopsModel {
    let cfg = model.config();
    let h = cfg.hidden_size as u64;
    let per_layer_moe = cfg.moe.as_ref().map_or(0, |m| {
        let im = m.moe_intermediate_size as u64;
        m.top_k_experts as u64 * 3 * im * h + m.num_experts as u64 * h
    });
    let p = cfg.hidden_size_per_layer_input as u64;
    let per_layer_ple = 2 * p * h;
    let shapes = cfg.projection_shapes(model.prefix());
    let elements = |which: &dyn Fn(&ProjectionShape) -> bool| -> u64 {
        let sizes = shapes.iter().filter(|s| which(s));
        sizes.map(|s| (s.in_features * s.out_features) as u64).sum()
    };
    let parked = model.offloaded_checkpoints();
    let layers = cfg
        .layers
        .iter()
        .enumerate()
        .map(|(i, l)| LayerFlops {
            n_linear: elements(&|s| s.layer == i),
            n_reused: elements(&|s| {
                s.layer == i && parked.is_some_and(|p| p.reuses_projection(&s.path))
            }),
            attention_reused: parked.is_some_and(Parked::attention),
            n_routed: per_layer_moe + per_layer_ple,
            attention: AttnLayer {
                n_heads: cfg.num_attention_heads,
                head_dim: l.head_dim,
                window: (l.layer_type == LayerType::Sliding).then_some(cfg.sliding_window),
            },
            recomputed: !model.keep_mask().keeps(i),
        })
        .collect();
    FlopsModel {
        layers,
        n_head: (cfg.vocab_size * cfg.hidden_size) as u64,
        n_once: cfg.num_hidden_layers as u64 * p * h,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_weighting_divides_by_accum() {
        let w = LossWeighting::MeanPerMicroBatch { accum: 4 };
        assert_eq!(w.scale(17), 0.25);
    }

    #[test]
    fn token_weighting_sums_to_the_global_mean() {
        // Two ranks, step tokens 3 + 5 on rank 0 and 2 on rank 1: a token of a micro-batch with
        // n targets weighs scale(n)/n, halved by DDP's average: 1/10 for every token.
        let w = LossWeighting::TokenWeighted {
            world_size: 2,
            global_tokens: 10,
        };
        for n in [3usize, 5, 2] {
            assert!((w.scale(n) / n as f64 / 2.0 - 0.1).abs() < 1e-15, "n = {n}");
        }
        let none = LossWeighting::TokenWeighted {
            world_size: 2,
            global_tokens: 0,
        };
        assert_eq!(none.scale(0), 0.0);
    }
}
