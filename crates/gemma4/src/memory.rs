//! The memory model of one LoRA training step on one device: what
//! [`crate::Gemma4Model::forward_backward`] and the trainer around it hold, and the predicted
//! peak under a [`KeepMask`]. `examples/memory_plan.rs` prints it; `--recompute auto` resolves
//! its budget with [`MemoryModel::plan`].
//!
//! Bytes, with `b` micro-batch, `t` sequence length, `H` hidden, `w` bytes per weight/activation
//! element:
//! - frozen weights: every text parameter in the weight dtype;
//! - LoRA state: fp32 parameters + AdamW `m` and `v` (12 B/param), and DDP's flat fp32 gradient
//!   buckets, the only copy of the gradients (4 B/param);
//! - per layer, held from the forward to its backward ([`LayerMemory`]): a recomputed layer its
//!   input `b·t·H·w` and its adapters' down products (`b·t·r·w` per adapted projection; plus the
//!   K/V a KV producer lends its consumers), a layer that keeps its
//!   activations its explicit-backward tape (which holds the input and the lent K/V), and its
//!   adapters' copies in the activation dtype (`w` B/param: each layer casts them at its forward,
//!   `DecoderLayer::hold_adapter_copies`, and the tape keeps them for the backward);
//! - a layer's backward on top of its tape: the upstream gradient and one LoRA-dropout chunk (8M
//!   elements) at the `down_proj` backward, or the grouped expert gradients of a MoE layer;
//! - CE working set: one `(chunk_rows, V)` logits chunk in the weight dtype (d(logits) overwrite
//!   it in place), plus d(hidden) and the normed hidden of all `b·t` rows;
//! - the batch's prepared inputs, held through the step: the RoPE tables (cos and sin, `(b, t, d)`
//!   per layer type) and the per-layer-embedding inputs `(b, t, L, P)`; and the rows the tables
//!   are gathered from, held by the model (cos and sin, [`crate::rope::cache_rows`]`(t − 1)`
//!   positions by `d` per layer type);
//! - with offloaded checkpoints ([`StepShape::parked`]) the recomputed layers' inputs wait in
//!   host memory instead, perhaps each with the layer's attention and MLP outputs (one or three
//!   `b·t·H·w` tensors per layer) and its attention state ([`LayerMemory::parked`]); the device
//!   holds one layer's in flight: the last ones parked, at the loss head, and those prefetched
//!   below a layer during its backward.
//!
//! The peak is the largest of two moments ([`PeakAt`]): the loss head (everything the forward
//! held, plus the CE working set) and each layer's backward (what the layers below still hold,
//! plus this layer's tape and backward working set). Layers below `j` hold the same at `j`'s
//! backward whichever layers keep their activations, so keeping the *last* layers (freed first by
//! the walk) costs the least peak for a given count; [`MemoryModel::plan`] keeps those. The
//! forward is not a separate moment: at a layer it holds about what that layer's backward holds
//! (its output in place of the upstream gradient), and the loss head that follows holds
//! everything. Not modelled: the attention masks (`(b, t)` key-padding flags and sequence starts
//! for causal batches, packed ones included; the dense `(b, 1, t, t)` masks of bidirectional
//! models), the gradients of K/V lent to producers, the CUDA context and library workspaces (outside the
//! allocator's pool).

use std::fmt;

use candle_core::DType;

use crate::config::{Config, KvSharing, LayerConfig, LayerType};
use crate::model::Gemma4Model;
use crate::recompute::{KeepMask, Parked, Recompute};
use crate::rope::cache_rows;

/// Bytes per GB in what this module prints (`1e9`, as `nvidia-smi` and the benchmarks).
pub const GB: f64 = 1e9;

/// Elements of one LoRA-dropout chunk (`g4ft_ops::lora_dropout`).
const DROPOUT_CHUNK: u64 = 8 << 20;

/// The step the memory is modelled for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepShape {
    /// Samples per micro-batch.
    pub micro_batch: usize,
    /// Tokens per sample (the longest batch of the run: the model holds the most for it).
    pub seq: usize,
    /// LoRA rank; the tapes keep one `(b·t, r)` LoRA input per projection (all 7 of a layer
    /// counted).
    pub lora_r: usize,
    /// Trainable LoRA parameters (fp32).
    pub trainable: u64,
    /// Weight and activation dtype.
    pub dtype: DType,
    /// What of each recomputed layer waits in host memory from the forward to its backward
    /// ([`Gemma4Model::set_offload_checkpoints`] on a GPU); `None`: its input waits on the
    /// device.
    pub parked: Option<Parked>,
}

impl StepShape {
    /// `model`'s step on `micro_batch` samples of `seq` tokens: its dtype, and from its adapters
    /// the largest rank and the trainable count.
    pub fn of_model(model: &Gemma4Model, micro_batch: usize, seq: usize) -> Self {
        let (mut lora_r, mut trainable) = (0, 0);
        for a in model.projections().filter_map(|p| p.adapter()) {
            lora_r = lora_r.max(a.a.dims()[0]);
            trainable += (a.a.elem_count() + a.b.elem_count()) as u64;
        }
        StepShape {
            micro_batch,
            seq,
            lora_r,
            trainable,
            dtype: model.dtype(),
            // On the CPU a parked tensor stays where it was: nothing moves off the device.
            parked: model
                .offloaded_checkpoints()
                .filter(|_| model.device().is_cuda()),
        }
    }
}

/// The bytes one decoder layer holds and needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerMemory {
    /// Held from the forward to its backward when recomputed: its input and its adapters' down
    /// products, plus the K/V of a KV producer (kept for its consumers).
    pub saved: u64,
    /// Held from the forward to its backward when it keeps its activations, and built by the
    /// recompute otherwise: the explicit-backward tape (`decoder_layer/explicit.rs`): layer input,
    /// raw q (and raw k/v of a layer with its own K/V), the K/V attended to (a consumer's alias its
    /// producer's: not counted), attention output, the two residual-stream tensors, gate, up, their
    /// product, the MLP output, the LoRA inputs; the expert tape of a MoE layer (router
    /// probabilities, the `n·k` grouped gate, up and expert output rows, the branch's two
    /// outputs); the gate, input and projection of a per-layer-embedding layer.
    pub tape: u64,
    /// Needed on top of the tape during its backward: the upstream gradient and one dropout chunk
    /// at the `down_proj` backward (d(MLP output) and d(product) take the memory of the MLP output
    /// and of the product), and for a MoE layer the grouped gradients (d(output rows), d(act),
    /// d(gate‖up), d(input rows)).
    pub backward: u64,
    /// What it parks in host memory when recomputed with offloaded checkpoints (0 without):
    /// its input, perhaps its attention and MLP outputs and its attention state (raw q/k/v
    /// projections, attention output, fp32 log-sum-exp).
    pub parked: u64,
    /// What a whole tape ([`KeepMask::whole_tapes`]) holds beyond `tape`: the normed inputs of
    /// the attention and the MLP, the roped queries and the `o_proj` input.
    pub whole_extra: u64,
}

/// Where the predicted peak is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeakAt {
    /// The fused linear cross-entropy on the final hidden state.
    LossHead,
    /// The backward of this layer.
    LayerBackward(usize),
}

impl fmt::Display for PeakAt {
    /// `at the loss head`, `at layer 47's backward`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PeakAt::LossHead => write!(f, "at the loss head"),
            PeakAt::LayerBackward(i) => write!(f, "at layer {i}'s backward"),
        }
    }
}

/// A predicted peak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peak {
    /// Bytes.
    pub bytes: u64,
    /// When.
    pub at: PeakAt,
}

/// The memory of one training step of one model shape; see the module docs for each term.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryModel {
    /// The step it is modelled for.
    pub shape: StepShape,
    /// Text parameters (frozen).
    pub n_params: u64,
    /// Frozen weights, bytes.
    pub weights: u64,
    /// LoRA parameters and AdamW moments, bytes.
    pub lora_state: u64,
    /// DDP's fp32 gradient buckets, bytes.
    pub grad_buckets: u64,
    /// The batch's RoPE tables, the rows they are gathered from and the per-layer-embedding
    /// inputs, bytes.
    pub prepared: u64,
    /// Each decoder layer, in order.
    pub layers: Vec<LayerMemory>,
    /// One layer's input `b·t·H·w` (part of each [`LayerMemory::saved`]), bytes.
    pub layer_input: u64,
    /// Rows of one logits chunk of the loss.
    pub ce_chunk_rows: u64,
    /// The loss head's working set, bytes.
    pub ce: u64,
}

/// A [`Recompute`] policy resolved for one [`MemoryModel`].
#[derive(Debug, Clone, PartialEq)]
pub struct RecomputePlan {
    /// What was asked for.
    pub policy: Recompute,
    /// Which layers keep their activations.
    pub keep: KeepMask,
    /// The predicted peak under `keep`.
    pub peak: Peak,
    /// What of each recomputed layer waits in host memory (offloaded checkpoints; `None`
    /// without).
    pub parked: Option<Parked>,
    /// Bytes of recomputed layers' tensors waiting in host memory (0 without offload).
    pub host_parked: u64,
}

impl MemoryModel {
    /// The model of `cfg`'s training step of `shape`, with the loss head's default chunking
    /// ([`Gemma4Model::default_loss_chunk_rows`]).
    pub fn new(cfg: &Config, shape: StepShape) -> Self {
        let w = shape.dtype.size_in_bytes() as u64;
        let bt = (shape.micro_batch * shape.seq) as u64;
        let n_params = cfg.num_text_parameters();
        let h = cfg.hidden_size as u64;
        let v = cfg.vocab_size as u64;
        let elements: Vec<LayerElements> = cfg
            .layers
            .iter()
            .map(|l| layer_elements(cfg, l, bt, shape.lora_r as u64))
            .collect();
        // The trainable parameters shared out over the layers as their adapted shapes are.
        let adapter_params: u64 = elements.iter().map(|e| e.adapter_params).sum();
        let layer_input = bt * h * w;
        let layers = elements
            .iter()
            .map(|e| {
                let copies = shape.trainable * e.adapter_params / adapter_params.max(1);
                let parked = match shape.parked {
                    None => 0,
                    Some(Parked::Inputs) => layer_input,
                    Some(Parked::InputsAndOutputs) => 3 * layer_input,
                    Some(Parked::InputsOutputsAndAttention) => {
                        3 * layer_input + e.attention_state * w + e.attention_lse * 4
                    }
                };
                LayerMemory {
                    saved: e.saved * w,
                    tape: (e.tape + copies) * w,
                    backward: e.backward * w,
                    parked,
                    whole_extra: e.whole_extra * w,
                }
            })
            .collect();
        let ce_chunk_rows = Gemma4Model::default_loss_chunk_rows(cfg.vocab_size) as u64;
        let ce = ce_chunk_rows.min(bt) * v * w + bt * h * (w + 4) + bt * h * w;
        let rope: u64 = [LayerType::Sliding, LayerType::Full]
            .into_iter()
            .filter_map(|ty| cfg.rope_head_dim(ty))
            .map(|d| 2 * (bt + cache_rows(shape.seq.max(1) - 1) as u64) * d as u64)
            .sum();
        let ple = bt * (cfg.num_hidden_layers * cfg.hidden_size_per_layer_input) as u64;
        MemoryModel {
            shape,
            n_params,
            weights: n_params * w,
            lora_state: 12 * shape.trainable,
            grad_buckets: 4 * shape.trainable,
            prepared: (rope + ple) * w,
            layers,
            layer_input,
            ce_chunk_rows,
            ce,
        }
    }

    /// What the whole step holds regardless of which layers keep their activations: weights,
    /// LoRA state, buckets, prepared inputs.
    pub fn fixed(&self) -> u64 {
        self.weights + self.lora_state + self.grad_buckets + self.prepared
    }

    /// Whether layer `i`'s input (and outputs) wait in host memory under `keep`.
    fn parked(&self, keep: &KeepMask, i: usize) -> bool {
        self.shape.parked.is_some() && !keep.keeps(i)
    }

    /// Layer `i`'s tape under `keep`: whole if it keeps it and `keep`'s tapes are whole.
    fn tape(&self, keep: &KeepMask, i: usize) -> u64 {
        let l = &self.layers[i];
        if keep.keeps(i) && keep.whole_tapes() {
            l.tape + l.whole_extra
        } else {
            l.tape
        }
    }

    /// What layer `i` holds on the device from the forward to its backward under `keep`.
    fn held(&self, keep: &KeepMask, i: usize) -> u64 {
        let l = &self.layers[i];
        if keep.keeps(i) {
            self.tape(keep, i)
        } else if self.parked(keep, i) {
            l.saved - self.layer_input
        } else {
            l.saved
        }
    }

    /// Bytes the forward leaves held on the device for the backward under `keep`: (recomputed
    /// layers' saved inputs, down products and lent K/V, kept layers' tapes).
    pub fn held_by_kind(&self, keep: &KeepMask) -> (u64, u64) {
        (0..self.layers.len()).fold((0, 0), |(saved, tapes), i| {
            if keep.keeps(i) {
                (saved, tapes + self.tape(keep, i))
            } else {
                (saved + self.held(keep, i), tapes)
            }
        })
    }

    /// Bytes of layer inputs and outputs waiting in host memory under `keep` (offloaded
    /// checkpoints).
    pub fn host_parked(&self, keep: &KeepMask) -> u64 {
        (0..self.layers.len())
            .filter(|&i| self.parked(keep, i))
            .map(|i| self.layers[i].parked)
            .sum()
    }

    /// The predicted peak under `keep` (which must cover every layer).
    pub fn peak(&self, keep: &KeepMask) -> Peak {
        let base = self.fixed();
        let mut below = 0u64; // held by layers 0..j
        let mut in_flight = 0u64; // what a parked layer below j parked: prefetched during j's backward
        let mut peak = Peak {
            bytes: 0,
            at: PeakAt::LossHead,
        };
        for (j, l) in self.layers.iter().enumerate() {
            let at_backward = base + below + in_flight + self.tape(keep, j) + l.backward;
            if at_backward > peak.bytes {
                peak = Peak {
                    bytes: at_backward,
                    at: PeakAt::LayerBackward(j),
                };
            }
            below += self.held(keep, j);
            if self.parked(keep, j) {
                in_flight = l.parked;
            }
        }
        // At the head the highest parked layer's tensors are on their way back (`in_flight`);
        // when it is the last layer, their copies out may still run too and count once more.
        let last = self.layers.len().checked_sub(1);
        let leaving = match last {
            Some(j) if self.parked(keep, j) => self.layers[j].parked,
            _ => 0,
        };
        let at_head = base + below + in_flight + leaving + self.ce;
        if at_head >= peak.bytes {
            peak = Peak {
                bytes: at_head,
                at: PeakAt::LossHead,
            };
        }
        peak
    }

    /// Resolves `policy`: `All` recomputes every layer, `None` keeps every layer with whole
    /// tapes, `Auto` does the same if that is predicted within the budget and otherwise keeps the
    /// last `k` layers (tapes not whole) for the largest `k` whose predicted peak is (none if
    /// even recomputing everything is predicted over it: see [`RecomputePlan::fits`]). A whole
    /// tape spares its backward less work per byte than keeping one more layer spares the walk,
    /// so whole tapes only come where every layer is kept.
    pub fn plan(&self, policy: Recompute) -> RecomputePlan {
        let n = self.layers.len();
        let whole = KeepMask::keep_all(n).with_whole_tapes(true);
        let keep = match policy {
            Recompute::All => KeepMask::recompute_all(n),
            Recompute::None => whole,
            Recompute::Auto { budget_bytes } if self.peak(&whole).bytes <= budget_bytes => whole,
            Recompute::Auto { budget_bytes } => {
                // The peak grows with every layer kept (a tape holds more than the input).
                let kept = (1..=n)
                    .take_while(|&k| self.peak(&KeepMask::keep_last(n, k)).bytes <= budget_bytes)
                    .last()
                    .unwrap_or(0);
                KeepMask::keep_last(n, kept)
            }
        };
        let peak = self.peak(&keep);
        let host_parked = self.host_parked(&keep);
        RecomputePlan {
            policy,
            keep,
            peak,
            parked: self.shape.parked.filter(|_| host_parked > 0),
            host_parked,
        }
    }

    /// `policy`'s plan for `cfg`'s step of `shape` with at most `host_bytes` of parked tensors in
    /// host memory: offloaded checkpoints park what `shape` asks, or less
    /// ([`Parked::smaller`]) when that does not fit; `None` when not even the inputs fit. Without
    /// offload, the plan as it is.
    pub fn plan_within_host(
        cfg: &Config,
        shape: StepShape,
        policy: Recompute,
        host_bytes: u64,
    ) -> Option<RecomputePlan> {
        Self::first_plan_that(cfg, shape, policy, |plan| plan.host_parked <= host_bytes)
    }

    /// The first of `policy`'s plans for `shape`, then for each smaller [`Parked`] level, that
    /// `accept`s.
    fn first_plan_that(
        cfg: &Config,
        shape: StepShape,
        policy: Recompute,
        accept: impl Fn(&RecomputePlan) -> bool,
    ) -> Option<RecomputePlan> {
        let mut parked = shape.parked;
        loop {
            let plan = MemoryModel::new(cfg, StepShape { parked, ..shape }).plan(policy);
            if accept(&plan) {
                return Some(plan);
            }
            parked = Some(parked?.smaller()?);
        }
    }
}

/// Sequence lengths [`MemoryModel::longest_seq`] tries at most: 2^26 tokens per sample.
const LONGEST_SEQ_CAP: usize = 1 << 26;

/// What [`MemoryModel::longest_seq`] must fit in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryBudget {
    /// Bytes the predicted peak on the device may reach.
    pub device_bytes: u64,
    /// Bytes of host memory the parked tensors of offloaded checkpoints may take (`None`: not
    /// limited).
    pub host_bytes: Option<u64>,
}

impl MemoryModel {
    /// The longest sequence, a multiple of `step` tokens, whose step (`shape` with that `seq`) is
    /// predicted to fit `budget` under `policy`, with its plan; `None` when not even `step` tokens
    /// fit. With offloaded checkpoints each length parks what `shape` asks, or less where that
    /// does not fit ([`Parked::smaller`]). Both memories grow with the sequence length, so a
    /// doubling search and a bisection find it in a few dozen models; lengths above 2^26 tokens
    /// are not tried.
    pub fn longest_seq(
        cfg: &Config,
        shape: StepShape,
        policy: Recompute,
        budget: MemoryBudget,
        step: usize,
    ) -> Option<(usize, RecomputePlan)> {
        let within = |plan: &RecomputePlan| {
            plan.fits()
                && plan.peak.bytes <= budget.device_bytes
                && budget
                    .host_bytes
                    .is_none_or(|host| plan.host_parked <= host)
        };
        let plan_at = |seq: usize| {
            MemoryModel::first_plan_that(cfg, StepShape { seq, ..shape }, policy, within)
        };
        let seq = longest_fitting(step.max(1), LONGEST_SEQ_CAP, |seq| plan_at(seq).is_some())?;
        Some((seq, plan_at(seq)?))
    }
}

/// The largest multiple of `step` up to `cap` for which `fits` holds, given that `fits` holds
/// for every length below one that fits; `None` if `step` itself does not fit.
fn longest_fitting(step: usize, cap: usize, fits: impl Fn(usize) -> bool) -> Option<usize> {
    if !fits(step) {
        return None;
    }
    // Multiples of `step`: `lo` fits, `hi` does not (or is past the cap).
    let (mut lo, mut hi) = (1, 2);
    while hi * step <= cap && fits(hi * step) {
        (lo, hi) = (hi, hi * 2);
    }
    let hi_limit = cap / step + 1;
    hi = hi.min(hi_limit);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid * step) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Some(lo * step)
}

impl RecomputePlan {
    /// `false` only for `Auto` whose predicted peak is over the budget even with every layer
    /// recomputed (the run may still fit: the model is a prediction).
    pub fn fits(&self) -> bool {
        match self.policy {
            Recompute::Auto { budget_bytes } => self.peak.bytes <= budget_bytes,
            _ => true,
        }
    }
}

impl fmt::Display for RecomputePlan {
    /// `recompute auto (budget 130.000 GB): 18 of 48 layers keep their activations (30-47), 30
    /// recomputed; predicted peak 125.894 GB at the loss head`; `(all 48, whole tapes)` where the
    /// tapes are whole.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let policy = match self.policy {
            Recompute::All => "all".to_string(),
            Recompute::None => "none".to_string(),
            Recompute::Auto { budget_bytes } => {
                format!("auto (budget {:.3} GB)", budget_bytes as f64 / GB)
            }
        };
        write!(
            f,
            "recompute {policy}: {} of {} layers keep their activations ({}{}), {} recomputed; predicted peak {:.3} GB {}",
            self.keep.kept(),
            self.keep.len(),
            self.keep.describe_kept(),
            if self.keep.whole_tapes() { ", whole tapes" } else { "" },
            self.keep.recomputed(),
            self.peak.bytes as f64 / GB,
            self.peak.at
        )?;
        if let Some(parked) = self.parked {
            write!(
                f,
                "; the recomputed layers' {} in host memory ({:.3} GB, page-locked at the first micro-batch)",
                parked.describe(),
                self.host_parked as f64 / GB
            )?;
        }
        if !self.fits() {
            write!(f, " (over the budget even with every layer recomputed)")?;
        }
        Ok(())
    }
}

/// [`LayerMemory`] in elements of the weight dtype (fp32 values of the MoE tape count twice), and
/// the layer's adapter parameters at rank `r` (q, k and v where the layer has them, o, gate, up,
/// down: the post's targets).
struct LayerElements {
    saved: u64,
    tape: u64,
    backward: u64,
    adapter_params: u64,
    /// The attention state offloaded checkpoints may park: raw q (and raw k/v of a layer with
    /// its own K/V) and the attention output, in the weight dtype.
    attention_state: u64,
    /// Its log-sum-exp, fp32 elements.
    attention_lse: u64,
    /// A whole tape's extra tensors.
    whole_extra: u64,
}

/// One layer's [`LayerElements`] for `bt` tokens and LoRA rank `r`.
fn layer_elements(cfg: &Config, l: &LayerConfig, bt: u64, r: u64) -> LayerElements {
    let d = l.head_dim as u64;
    let h = cfg.hidden_size as u64;
    let q = cfg.num_attention_heads as u64 * d;
    let kvd = l.num_key_value_heads as u64 * d;
    let im = l.intermediate_size as u64;
    // Raw k (and v) projections of a layer with its own K/V; without v_proj, v's raw is k's.
    let own_raw = if l.has_kv_proj() {
        kvd + if l.has_v_proj { kvd } else { 0 }
    } else {
        0
    };
    // Adapted K/V projections: none for a KV-sharing consumer, k alone with attention_k_eq_v.
    let n_kv = match (l.has_kv_proj(), l.has_v_proj) {
        (false, _) => 0,
        (true, false) => 1,
        (true, true) => 2,
    };
    // The normed, roped K and the normed V: a consumer's are its producer's.
    let attended = if l.has_kv_proj() { 2 * kvd } else { 0 };
    let dense = bt * (h + q + own_raw + attended + q + 2 * h + 3 * im + h + 7 * r);
    let p = cfg.hidden_size_per_layer_input as u64;
    let ple = bt * (2 * p + h);
    let (moe_tape, moe_backward) = cfg.moe.as_ref().map_or((0, 0), |m| {
        let (e, k, mi) = (
            m.num_experts as u64,
            m.top_k_experts as u64,
            m.moe_intermediate_size as u64,
        );
        (
            bt * (2 * e + 3 * k + k * (2 * mi + h) + 2 * h),
            bt * k * (h + mi + 2 * mi + h),
        )
    });
    let lent = if l.kv_sharing == KvSharing::Store {
        bt * 2 * kvd
    } else {
        0
    };
    // The adapters' down products a recomputed layer keeps: q, o, gate, up, down and its K/V's.
    let lows = bt * r * (5 + n_kv);
    LayerElements {
        saved: bt * h + lows + lent,
        tape: dense + if p > 0 { ple } else { 0 } + moe_tape,
        backward: bt * h + DROPOUT_CHUNK.min(bt * im) + moe_backward,
        adapter_params: r * ((h + q) + n_kv * (h + kvd) + (q + h) + 2 * (h + im) + (im + h)),
        attention_state: bt * (q + own_raw + q),
        attention_lse: bt * cfg.num_attention_heads as u64,
        whole_extra: bt * (2 * h + 2 * q),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(layers: Vec<(u64, u64, u64)>, ce: u64) -> MemoryModel {
        MemoryModel {
            shape: StepShape {
                micro_batch: 1,
                seq: 1,
                lora_r: 1,
                trainable: 0,
                dtype: DType::BF16,
                parked: None,
            },
            n_params: 0,
            weights: 1000,
            lora_state: 0,
            grad_buckets: 0,
            prepared: 0,
            layers: layers
                .into_iter()
                .map(|(saved, tape, backward)| LayerMemory {
                    saved,
                    tape,
                    backward,
                    parked: 0,
                    whole_extra: 0,
                })
                .collect(),
            layer_input: 10,
            ce_chunk_rows: 1,
            ce,
        }
    }

    #[test]
    fn peak_is_the_larger_of_the_head_and_each_backward() {
        // Three layers: input 10, tape 100, backward 5; the head needs 50.
        let m = model(vec![(10, 100, 5); 3], 50);
        // Recompute all: head 1000 + 30 + 50 = 1080; layer 2's backward 1000 + 20 + 105 = 1125.
        let all = m.peak(&KeepMask::recompute_all(3));
        assert_eq!((all.bytes, all.at), (1125, PeakAt::LayerBackward(2)));
        // Keep the last: head 1000 + 10 + 10 + 100 + 50 = 1170.
        let last = m.peak(&KeepMask::keep_last(3, 1));
        assert_eq!((last.bytes, last.at), (1170, PeakAt::LossHead));
        // Keeping the first instead costs the same at the head, more at layer 2's backward.
        let first = m.peak(&KeepMask::from_layers(vec![true, false, false]));
        assert_eq!(first.bytes, 1000 + 100 + 10 + 105);
        assert_eq!(m.peak(&KeepMask::keep_all(3)).bytes, 1000 + 300 + 50);
    }

    #[test]
    fn offloaded_checkpoints_leave_one_layer_in_flight_on_the_device() {
        let mut m = model(vec![(10, 100, 5); 3], 50);
        m.shape.parked = Some(Parked::InputsAndOutputs);
        for l in &mut m.layers {
            l.parked = 30; // input and two outputs of 10
        }
        let all = KeepMask::recompute_all(3);
        // Nothing held below a layer but what the layer under it parked, prefetched: layers 1
        // and 2 peak at 1000 + 30 + 105; layer 0 has none below; the head 1000 + 2·30 + 50 (the
        // last layer's tensors copied out and on their way back).
        let peak = m.peak(&all);
        assert_eq!((peak.bytes, peak.at), (1135, PeakAt::LayerBackward(1)));
        m.ce = 80;
        let peak = m.peak(&all);
        assert_eq!((peak.bytes, peak.at), (1140, PeakAt::LossHead));
        m.ce = 50;
        assert_eq!(m.held_by_kind(&all), (0, 0));
        assert_eq!(m.host_parked(&all), 90);
        // A kept layer keeps its tape on the device; only the recomputed ones are parked.
        let last = KeepMask::keep_last(3, 1);
        assert_eq!(m.host_parked(&last), 60);
        assert_eq!(m.peak(&last).bytes, 1000 + 30 + 100 + 50);
        assert_eq!(
            m.plan(Recompute::All).parked,
            Some(Parked::InputsAndOutputs)
        );
        m.shape.parked = None;
        assert_eq!(m.host_parked(&all), 0);
        assert_eq!(m.plan(Recompute::All).parked, None);
    }

    #[test]
    fn longest_fitting_finds_the_last_multiple_that_fits() {
        for limit in [0, 5, 1024, 1025, 5000, 196_608, 200_000] {
            let got = longest_fitting(1024, 1 << 26, |seq| seq <= limit);
            let want = (limit >= 1024).then_some(limit / 1024 * 1024);
            assert_eq!(got, want, "limit {limit}");
        }
        // Everything fits: the cap's last multiple.
        assert_eq!(longest_fitting(1000, 10_500, |_| true), Some(10_000));
    }

    #[test]
    fn the_longest_sequence_fits_and_one_step_more_does_not() {
        let cfg = Config::from_file(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/configs/gemma-4-12B-it.json"),
        )
        .unwrap();
        let shape = StepShape {
            micro_batch: 1,
            seq: 1,
            lora_r: 16,
            trainable: 65_568_768,
            dtype: DType::BF16,
            parked: None,
        };
        let budget = 139e9 as u64;
        let device = |device_bytes| MemoryBudget {
            device_bytes,
            host_bytes: None,
        };
        let (seq, plan) =
            MemoryModel::longest_seq(&cfg, shape, Recompute::All, device(budget), 1024).unwrap();
        assert!(plan.peak.bytes <= budget && seq % 1024 == 0, "{seq} {plan}");
        let next = MemoryModel::new(
            &cfg,
            StepShape {
                seq: seq + 1024,
                ..shape
            },
        )
        .plan(Recompute::All);
        assert!(next.peak.bytes > budget, "{} fits too", seq + 1024);
        // Keeping every layer's activations fits a much shorter sequence.
        let (none, _) =
            MemoryModel::longest_seq(&cfg, shape, Recompute::None, device(budget), 1024).unwrap();
        assert!(none < seq / 2, "{none} vs {seq}");
        assert!(MemoryModel::longest_seq(&cfg, shape, Recompute::All, device(1), 1024).is_none());
        // Offloading the checkpoints leaves the device only the working set of one layer.
        let offload = StepShape {
            parked: Some(Parked::InputsAndOutputs),
            ..shape
        };
        let (longer, _) =
            MemoryModel::longest_seq(&cfg, offload, Recompute::All, device(budget), 1024).unwrap();
        assert!(longer > seq * 3 / 2, "{longer} vs {seq}");
        // Unless the host cannot hold the parked tensors: inputs and outputs take
        // 48 × 3 × 3840 × 2 B = 1,105,920 B per token, the inputs alone a third of it, and the
        // longest sequence parks the inputs alone.
        let host = MemoryBudget {
            device_bytes: budget,
            host_bytes: Some(100e9 as u64),
        };
        let (within, plan) =
            MemoryModel::longest_seq(&cfg, offload, Recompute::All, host, 1024).unwrap();
        assert_eq!(plan.parked, Some(Parked::Inputs), "{plan}");
        assert!(plan.host_parked <= 100e9 as u64, "{plan}");
        assert_eq!(within, 100e9 as usize / 368_640 / 1024 * 1024);
        assert!(within < longer, "{within} vs {longer}");
    }

    #[test]
    fn offloaded_checkpoints_park_what_fits_the_host() {
        let cfg = Config::from_file(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/configs/gemma-4-12B-it.json"),
        )
        .unwrap();
        let at = |seq| StepShape {
            micro_batch: 1,
            seq,
            lora_r: 16,
            trainable: 65_568_768,
            dtype: DType::BF16,
            parked: Some(Parked::InputsAndOutputs),
        };
        let host = 100e9 as u64;
        let plan = |seq| MemoryModel::plan_within_host(&cfg, at(seq), Recompute::All, host);
        // 1,105,920 B per token with the outputs: up to 90,422 tokens; 368,640 with the inputs
        // alone: up to 271,267.
        let short = plan(90_000).unwrap();
        assert_eq!(short.parked, Some(Parked::InputsAndOutputs));
        assert_eq!(short.host_parked, 90_000 * 1_105_920);
        let long = plan(91_000).unwrap();
        assert_eq!(long.parked, Some(Parked::Inputs));
        assert_eq!(long.host_parked, 91_000 * 368_640);
        assert!(
            long.to_string()
                .ends_with("the recomputed layers' inputs in host memory (33.546 GB, page-locked at the first micro-batch)"),
            "{long}"
        );
        assert!(plan(272_000).is_none());
        // With the attention state: 40 sliding layers of (3·3840 + 3·4096)·2 + 16·4 B and 8 full
        // ones of (3·3840 + 2·8192 + 512)·2 + 16·4 B (one K head, V is K) per token.
        let most = StepShape {
            parked: Some(Parked::MOST),
            ..at(2048)
        };
        let most = MemoryModel::new(&cfg, most).plan(Recompute::All);
        assert_eq!(most.host_parked, 2048 * (40 * 47_680 + 8 * 56_896));
        // Without offload nothing is parked, whatever the length.
        let plain = StepShape {
            parked: None,
            ..at(1 << 20)
        };
        let plain = MemoryModel::plan_within_host(&cfg, plain, Recompute::All, 0).unwrap();
        assert_eq!((plain.parked, plain.host_parked), (None, 0));
    }

    #[test]
    fn whole_tapes_only_where_every_layer_is_kept_with_them() {
        let mut m = model(vec![(10, 100, 5); 3], 50);
        for l in &mut m.layers {
            l.whole_extra = 20;
        }
        let whole = KeepMask::keep_all(3).with_whole_tapes(true);
        // Each kept tape 120 instead of 100: 1000 + 360 + 50 at the head.
        assert_eq!(m.peak(&whole).bytes, 1410);
        assert_eq!(m.held_by_kind(&whole), (0, 360));
        // Recomputed layers build lean tapes whatever the flag: layer 2's backward 1000 + 20 + 105.
        let lean_recompute = KeepMask::recompute_all(3).with_whole_tapes(true);
        assert_eq!(m.peak(&lean_recompute).bytes, 1125);
        assert_eq!(m.plan(Recompute::None).keep, whole);
        let plan = |budget_bytes| m.plan(Recompute::Auto { budget_bytes }).keep;
        assert_eq!(plan(1410), whole);
        // Lean tapes for all three fit where whole ones do not; fewer layers, lean, below that.
        assert_eq!(plan(1409), KeepMask::keep_all(3));
        assert_eq!(plan(1349), KeepMask::keep_last(3, 2));
        assert!(m
            .plan(Recompute::None)
            .to_string()
            .contains("3 of 3 layers keep their activations (all 3, whole tapes)"));
    }

    #[test]
    fn auto_keeps_the_most_last_layers_within_the_budget() {
        let m = model(vec![(10, 100, 5); 3], 50);
        let plan = |budget_bytes| m.plan(Recompute::Auto { budget_bytes });
        assert_eq!(plan(1169).keep, KeepMask::recompute_all(3));
        assert!(plan(1169).fits());
        assert_eq!(plan(1170).keep, KeepMask::keep_last(3, 1));
        assert_eq!(plan(1259).keep, KeepMask::keep_last(3, 1));
        assert_eq!(plan(1260).keep, KeepMask::keep_last(3, 2));
        // Every layer kept: whole tapes where they fit (here they add nothing).
        assert_eq!(
            plan(1350).keep,
            KeepMask::keep_all(3).with_whole_tapes(true)
        );
        let over = plan(1100);
        assert_eq!(over.keep, KeepMask::recompute_all(3));
        assert!(!over.fits());
        assert!(over.to_string().contains("over the budget"), "{over}");
        assert_eq!(
            plan(1260).to_string(),
            "recompute auto (budget 0.000 GB): 2 of 3 layers keep their activations (1-2), 1 \
             recomputed; predicted peak 0.000 GB at the loss head"
        );
    }
}
