//! The Gemma 4 text decoder: embeddings, per-layer embeddings, the layer stack, the tied head and
//! the transformers causal-LM loss (`Gemma4TextModel` + `ForCausalLMLoss`, transformers 5.23;
//! `docs/gemma4.md` §4.2, §4.7, §4.8).
//!
//! The embedding scale `√H` is rounded to the weight dtype before the multiply; the head is the
//! tied `embed_tokens` (not scaled) followed by `cap·tanh(x/cap)` in the logits dtype; the loss
//! upcasts to fp32, shifts labels left, ignores -100 and is summed here (divide by
//! [`LossOutput::n_tokens`] for the transformers mean).

use std::sync::{Arc, Mutex};

use candle_core::{DType, Device, Tensor};
use g4ft_lora::{LoraContext, LoraLinear};
use g4ft_ops::{
    linear_cross_entropy, linear_frozen, mul_scalar, rms_norm, softcap, AttentionPlan, HostOffload,
};

use crate::config::{Config, KvSharing, LayerType};
use crate::decoder_layer::{DecoderLayer, LayerInputs};
use crate::error::{Error, Result};
use crate::loader::{Checkpoint, ModelFiles};
use crate::mask::AttentionBias;
use crate::numerics::round_to_dtype;
use crate::recompute::{KeepMask, Parked};
use crate::rope::{RopeCache, RopeTable};
use crate::weights::Weights;

mod cached;

/// A batch of token rows, row-major `(batch, seq_len)`, right padded.
#[derive(Debug, Clone, Copy)]
pub struct TokenBatch<'a> {
    /// Token ids `(batch, seq_len)`.
    pub input_ids: &'a [u32],
    /// 1 = real token, 0 = padding; `None` = no padding.
    pub attention_mask: Option<&'a [u32]>,
    /// Positions `(batch, seq_len)`; `None` = `0..seq_len` for every row (also with right padding,
    /// as transformers). Packed rows (several samples per row, as `g4ft_data::Batch` collates
    /// them) pass no attention mask and positions that restart at 0 at every sample: column `c`
    /// then attends only to columns `c - position_ids[c] ..= c` of its row (its own sample, and on
    /// sliding layers its window within it), and RoPE sees each sample's own positions.
    pub position_ids: Option<&'a [u32]>,
    /// Rows.
    pub batch: usize,
    /// Columns.
    pub seq_len: usize,
}

impl TokenBatch<'_> {
    fn validate(&self, vocab: usize) -> Result<()> {
        let n = self.batch * self.seq_len;
        if n == 0 {
            return Err(Error::batch("input_ids", "empty batch"));
        }
        let check_len = |field: &'static str, len: usize| {
            if len != n {
                return Err(Error::batch(
                    field,
                    format!(
                        "expected batch·seq_len = {}·{} = {n} values, got {len}",
                        self.batch, self.seq_len
                    ),
                ));
            }
            Ok(())
        };
        check_len("input_ids", self.input_ids.len())?;
        if let Some(m) = self.attention_mask {
            check_len("attention_mask", m.len())?;
        }
        if let Some(p) = self.position_ids {
            check_len("position_ids", p.len())?;
        }
        if let Some((i, &id)) = self
            .input_ids
            .iter()
            .enumerate()
            .find(|(_, &id)| id as usize >= vocab)
        {
            return Err(Error::batch(
                "input_ids",
                format!(
                    "token {id} at row {}, column {} is outside the vocabulary (size {vocab})",
                    i / self.seq_len,
                    i % self.seq_len
                ),
            ));
        }
        Ok(())
    }
}

/// Summed token loss of a batch and the number of tokens it sums over.
///
/// The sum stays on the model's device until [`LossOutput::sum_value`] or [`LossOutput::mean`]
/// reads it: a read waits for every kernel queued before it, so a training loop reads its losses
/// once per optimizer step, not between a micro-batch's forward and backward.
#[derive(Debug, Clone)]
pub struct LossOutput {
    /// Σ of the token NLLs (scalar f32; part of the graph when the forward tracked gradients).
    pub sum: Tensor,
    /// Number of non-ignored (shifted) targets.
    pub n_tokens: usize,
}

impl LossOutput {
    /// The sum on the host (waits for the device).
    pub fn sum_value(&self) -> Result<f64> {
        Ok(self
            .sum
            .to_dtype(candle_core::DType::F32)?
            .to_scalar::<f32>()? as f64)
    }

    /// transformers' `outputs.loss`: the sum over the valid targets (NaN when there is none, as
    /// in PyTorch). Waits for the device.
    pub fn mean(&self) -> Result<f64> {
        Ok(self.sum_value()? / self.n_tokens as f64)
    }
}

/// Shifted targets for the loss: `target[b, t] = labels[b, t+1]`, the last column ignored;
/// -100 (and the last column) become `u32::MAX`. Returns the targets and the valid count.
pub fn shift_labels(
    labels: &[i64],
    (b, t): (usize, usize),
    vocab: usize,
) -> Result<(Vec<u32>, usize)> {
    if labels.len() != b * t {
        return Err(Error::batch(
            "labels",
            format!("expected {b}·{t} = {} values, got {}", b * t, labels.len()),
        ));
    }
    let mut out = vec![u32::MAX; b * t];
    let mut n = 0;
    for r in 0..b {
        for c in 0..t.saturating_sub(1) {
            let l = labels[r * t + c + 1];
            if l == -100 {
                continue;
            }
            if l < 0 || l as usize >= vocab {
                return Err(Error::batch(
                    "labels",
                    format!(
                        "label {l} at row {r}, column {} is neither -100 nor a token id < {vocab}",
                        c + 1
                    ),
                ));
            }
            out[r * t + c] = l as u32;
            n += 1;
        }
    }
    Ok((out, n))
}

/// Global per-layer-embedding weights (E2B/E4B).
#[derive(Debug, Clone)]
struct PleGlobal {
    embed_tokens_per_layer: Tensor,     // (V_ple, L·P)
    per_layer_model_projection: Tensor, // (L·P, H)
    per_layer_projection_norm: Tensor,  // (P,)
}

/// Everything computed once per batch before layer 0.
pub(crate) struct Prepared {
    pub(crate) embeds: Tensor,
    pub(crate) inputs: LayerInputs,
}

/// The Gemma 4 text decoder with a tied, softcapped head.
#[derive(Debug, Clone)]
pub struct Gemma4Model {
    cfg: Config,
    prefix: String,
    dtype: DType,
    device: Device,
    embed_tokens: Tensor,
    norm: Tensor,
    ple: Option<PleGlobal>,
    pub(crate) layers: Vec<DecoderLayer>,
    keep: KeepMask,
    /// The RoPE rows of each layer type that has rotary heads.
    rope_sliding: Option<RopeCache>,
    rope_full: Option<RopeCache>,
    /// Where the recomputed layers' parked tensors wait with offloaded checkpoints (`None`:
    /// inputs on the device).
    pub(crate) offload: Option<Offload>,
}

/// Offloaded checkpoints: what is parked, and where.
#[derive(Debug, Clone)]
pub(crate) struct Offload {
    pub(crate) parked: Parked,
    /// Shared by clones, locked for a whole forward + backward.
    pub(crate) host: Arc<Mutex<HostOffload>>,
}

impl Gemma4Model {
    /// Loads a model from a local directory or a Hub id (see [`ModelFiles::resolve`]) in `dtype`
    /// (`F32` or `BF16`) on `device`.
    pub fn load(model: &str, dtype: DType, device: &Device) -> Result<Self> {
        let files = ModelFiles::resolve(model)?;
        let cfg = Config::from_file(&files.config)?;
        let ckpt = Checkpoint::open(&files.weights)?;
        Self::from_checkpoint(cfg, &ckpt, dtype, device)
    }

    /// Builds the model from a parsed config and an opened checkpoint.
    pub fn from_checkpoint(
        cfg: Config,
        ckpt: &Checkpoint,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        Self::from_weights(cfg, &Weights::new(ckpt, dtype, device))
    }

    /// Builds every text tensor of `cfg` with random values (`N(0, 0.02²)` matrices, norms
    /// `≈ 1`, `layer_scalar = 1`; see [`crate::weights`]) generated on `device`, under the
    /// checkpoint paths `model.language_model.*`. Same seed, same device kind → same model. For
    /// benchmarks and tests; the layer construction is the checkpoint path's.
    pub fn random_init(cfg: &Config, dtype: DType, device: &Device, seed: u64) -> Result<Self> {
        Self::from_weights(cfg.clone(), &Weights::random(seed, dtype, device))
    }

    /// Builds the model from a tensor source (checkpoint or random).
    fn from_weights(cfg: Config, w: &Weights) -> Result<Self> {
        let (dtype, device) = (w.dtype(), w.device().clone());
        if !matches!(dtype, DType::F32 | DType::BF16) {
            return Err(Error::batch(
                "dtype",
                format!("expected f32 or bf16, got {dtype:?}"),
            ));
        }
        let h = cfg.hidden_size;
        let embed_tokens = w.tensor("embed_tokens.weight", &[cfg.vocab_size, h])?;
        let norm = w.tensor("norm.weight", &[h])?;
        let p = cfg.hidden_size_per_layer_input;
        let l = cfg.num_hidden_layers;
        let ple = if p > 0 {
            Some(PleGlobal {
                embed_tokens_per_layer: w.tensor(
                    "embed_tokens_per_layer.weight",
                    &[cfg.vocab_size_per_layer_input, l * p],
                )?,
                per_layer_model_projection: w
                    .tensor("per_layer_model_projection.weight", &[l * p, h])?,
                per_layer_projection_norm: w.tensor("per_layer_projection_norm.weight", &[p])?,
            })
        } else {
            None
        };
        let layers = (0..l)
            .map(|i| DecoderLayer::new(&cfg, i, w))
            .collect::<Result<Vec<_>>>()?;
        let keep = KeepMask::recompute_all(l);
        let rope = |ty: LayerType| {
            cfg.rope_head_dim(ty)
                .map(|d| RopeCache::new(cfg.rope(ty), d, dtype, &device))
        };
        let (rope_sliding, rope_full) = (rope(LayerType::Sliding), rope(LayerType::Full));
        Ok(Gemma4Model {
            prefix: w.prefix().to_string(),
            cfg,
            dtype,
            device,
            embed_tokens,
            norm,
            ple,
            layers,
            keep,
            rope_sliding,
            rope_full,
            offload: None,
        })
    }

    /// The config.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The text prefix of the checkpoint the model was loaded from (`model.language_model` or
    /// `model`); projection paths start with it.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Activation / weight dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Device.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The rows per loss chunk for a vocabulary: per-chunk logits of about 64 Mi elements
    /// (`2^26 / vocab`, at least 1; 256 rows for Gemma 4's 262144 tokens).
    pub fn default_loss_chunk_rows(vocab: usize) -> usize {
        ((1usize << 26) / vocab.max(1)).max(1)
    }

    /// Rows of logits per chunk in the loss (working set `rows × vocab`):
    /// [`Gemma4Model::default_loss_chunk_rows`] of the vocabulary.
    pub fn loss_chunk_rows(&self) -> usize {
        Self::default_loss_chunk_rows(self.cfg.vocab_size)
    }

    /// The kernels of every layer's causal attention on CUDA ([`AttentionPlan::default`] after
    /// loading; benchmarks set others to compare them).
    pub fn set_attention_plan(&mut self, plan: AttentionPlan) {
        for layer in &mut self.layers {
            layer.self_attn.plan = plan;
        }
    }

    /// Which layers [`Gemma4Model::forward_backward`] keeps the activations of instead of
    /// recomputing them (default: none, every layer recomputed).
    pub fn keep_mask(&self) -> &KeepMask {
        &self.keep
    }

    /// Sets which layers keep their activations through the forward (see [`crate::recompute`];
    /// resolve a policy with [`crate::memory::MemoryModel::plan`]). The gradients do not depend
    /// on it. Errors if the mask does not cover exactly the model's layers.
    pub fn set_keep_mask(&mut self, keep: KeepMask) -> Result<()> {
        keep.check_len(self.layers.len())?;
        self.keep = keep;
        Ok(())
    }

    /// What [`Gemma4Model::forward_backward`] parks in host memory for each layer it recomputes
    /// (offloaded checkpoints), `None` when nothing.
    pub fn offloaded_checkpoints(&self) -> Option<Parked> {
        self.offload.as_ref().map(|o| o.parked)
    }

    /// Offloaded checkpoints on (`Some`: what to park) or off: with them, the input of each layer
    /// the backward recomputes waits in host memory from the forward to the layer's backward
    /// instead of on the device (on CUDA, copied out and back on a stream of its own beside the
    /// kernels; see `g4ft_ops::HostOffload`), and with more than [`Parked::Inputs`] so does what
    /// spares the recompute part of its work (the block outputs, the attention state). The
    /// device holds one layer's parked tensors in flight. The gradients are the same bits. On the
    /// CPU the tensors are in host memory already and stay as they are (the recompute still
    /// skips what they spare).
    pub fn set_offload_checkpoints(&mut self, parked: Option<Parked>) -> Result<()> {
        self.offload = match parked {
            Some(parked) => Some(Offload {
                parked,
                host: Arc::new(Mutex::new(HostOffload::new(
                    &self.device,
                    parked.tensors_per_layer(),
                )?)),
            }),
            None => None,
        };
        Ok(())
    }

    /// All projections in model order: layer 0..L, each `q, k, v, o, gate, up, down` it has.
    pub fn projections(&self) -> impl Iterator<Item = &LoraLinear> {
        self.layers.iter().flat_map(|l| l.projections())
    }

    /// Mutable [`Gemma4Model::projections`] (to attach adapters).
    pub fn projections_mut(&mut self) -> impl Iterator<Item = &mut LoraLinear> {
        self.layers.iter_mut().flat_map(|l| l.projections_mut())
    }

    /// How attention is restricted for `batch` (what every forward of it uses): fused causal
    /// attention with the key-padding mask and, for packed rows (position ids that restart, no
    /// attention mask), each token's sequence start; dense masks only for bidirectional models.
    pub fn attention_bias(&self, batch: &TokenBatch) -> Result<AttentionBias> {
        AttentionBias::new(
            (batch.batch, batch.seq_len),
            batch.attention_mask,
            batch.position_ids,
            self.cfg.sliding_window,
            self.cfg.is_causal,
            &self.device,
        )
    }

    /// Embeddings, PLE inputs, RoPE tables and masks of a batch.
    pub(crate) fn prepare(&self, batch: &TokenBatch) -> Result<Prepared> {
        batch.validate(self.cfg.vocab_size)?;
        let (b, t) = (batch.batch, batch.seq_len);
        let dev = &self.device;
        let ids = Tensor::from_slice(batch.input_ids, b * t, dev)?;
        let h = self.cfg.hidden_size;
        let scale = round_to_dtype(self.cfg.embed_scale(), self.dtype);
        let embeds =
            mul_scalar(&self.embed_tokens.index_select(&ids, 0)?, scale)?.reshape((b, t, h))?;
        let ple = match &self.ple {
            Some(p) => Some(self.ple_inputs(p, &ids, &embeds, batch)?),
            None => None,
        };
        let default_pos: Vec<u32>;
        let positions = match batch.position_ids {
            Some(p) => p,
            None => {
                default_pos = (0..b).flat_map(|_| 0..t as u32).collect();
                &default_pos
            }
        };
        let position_ids = Tensor::from_slice(positions, b * t, dev)?;
        let max_position = positions.iter().copied().max().unwrap_or(0);
        let table = |cache: &Option<RopeCache>| -> Result<Option<RopeTable>> {
            cache
                .as_ref()
                .map(|c| c.table(&position_ids, max_position, (b, t)))
                .transpose()
        };
        let rope_full = table(&self.rope_full)?;
        let rope_sliding = match table(&self.rope_sliding)? {
            Some(r) => r,
            // A model without sliding layers still needs a (unused) table value.
            None => rope_full.clone().expect("the last layer is always full"),
        };
        let bias = self.attention_bias(batch)?;
        Ok(Prepared {
            embeds,
            inputs: LayerInputs {
                rope_sliding,
                rope_full,
                bias,
                sliding_window: self.cfg.sliding_window,
                ple,
            },
        })
    }

    /// PLE inputs `(b, t, L, P)` (`docs/gemma4.md` §4.7).
    fn ple_inputs(
        &self,
        p: &PleGlobal,
        ids: &Tensor,
        embeds: &Tensor,
        batch: &TokenBatch,
    ) -> Result<Tensor> {
        let (b, t) = (batch.batch, batch.seq_len);
        let (l, pd) = (
            self.cfg.num_hidden_layers,
            self.cfg.hidden_size_per_layer_input,
        );
        if let Some(&bad) = batch
            .input_ids
            .iter()
            .find(|&&id| id as usize >= self.cfg.vocab_size_per_layer_input)
        {
            return Err(Error::batch(
                "input_ids",
                format!(
                    "token {bad} is outside vocab_size_per_layer_input {}",
                    self.cfg.vocab_size_per_layer_input
                ),
            ));
        }
        let tok_scale = round_to_dtype((pd as f64).sqrt(), self.dtype);
        let tok = mul_scalar(&p.embed_tokens_per_layer.index_select(ids, 0)?, tok_scale)?
            .reshape((b, t, l, pd))?;
        let proj = linear_frozen(embeds, &p.per_layer_model_projection)?;
        let proj =
            mul_scalar(&proj, (self.cfg.hidden_size as f64).powf(-0.5))?.reshape((b, t, l, pd))?;
        let proj = rms_norm(
            &proj,
            Some(&p.per_layer_projection_norm),
            self.cfg.rms_norm_eps,
        )?;
        Ok(mul_scalar(&(proj + tok)?, 2f64.powf(-0.5))?)
    }

    /// Runs the decoder stack (all layers) on prepared inputs: final hidden `(b, t, h)` before the
    /// final norm. KV sharing passes the producers' K/V tensors (in the graph) to the consumers.
    pub(crate) fn run_layers(&self, prep: &Prepared, ctx: &LoraContext) -> Result<Tensor> {
        let mut h = prep.embeds.clone();
        let mut stored = std::collections::HashMap::new();
        for (i, layer) in self.layers.iter().enumerate() {
            let shared = match layer.config().kv_sharing {
                KvSharing::Reuse { producer } => stored.get(&producer),
                _ => None,
            };
            let (out, own) = layer.forward(&h, shared, &prep.inputs, ctx)?;
            if layer.config().kv_sharing == KvSharing::Store {
                stored.insert(i, own.expect("a producer computes its own K/V"));
            }
            h = out;
        }
        Ok(h)
    }

    /// Final norm `(…, h)`.
    pub(crate) fn final_norm(&self, h: &Tensor) -> Result<Tensor> {
        Ok(rms_norm(h, Some(&self.norm), self.cfg.rms_norm_eps)?)
    }

    /// Softcapped logits `(b, t, vocab)` in the model dtype (no loss). Materialises all logits:
    /// use [`Gemma4Model::loss`] for training-size batches.
    pub fn forward(&self, batch: &TokenBatch, ctx: &LoraContext) -> Result<Tensor> {
        let prep = self.prepare(batch)?;
        let h = self.final_norm(&self.run_layers(&prep, ctx)?)?;
        let logits = linear_frozen(&h, &self.embed_tokens)?;
        Ok(match self.cfg.final_logit_softcapping {
            Some(cap) => softcap(&logits, cap)?,
            None => logits,
        })
    }

    /// Head + summed loss from the final hidden `(b, t, h)` (before the final norm) and shifted
    /// targets (`u32::MAX` = ignore). Chunked over rows, fp32 loss.
    pub(crate) fn head_loss(&self, h: &Tensor, targets: &[u32]) -> Result<Tensor> {
        let (b, t, hd) = h.dims3()?;
        let x = self.final_norm(h)?.reshape((b * t, hd))?;
        let targets = Tensor::from_slice(targets, b * t, &self.device)?;
        Ok(linear_cross_entropy(
            &x,
            &self.embed_tokens,
            &targets,
            self.cfg.final_logit_softcapping,
            self.loss_chunk_rows(),
        )?)
    }

    /// The transformers causal-LM loss of a batch as a sum over valid tokens (graph kept when
    /// `ctx.track_grad`): labels `(b, t)` with -100 = ignore, shifted inside (target of position
    /// `t` is `labels[t+1]`). `sum / n_tokens` is transformers' `outputs.loss`.
    pub fn loss(
        &self,
        batch: &TokenBatch,
        labels: &[i64],
        ctx: &LoraContext,
    ) -> Result<LossOutput> {
        let (targets, n_tokens) =
            shift_labels(labels, (batch.batch, batch.seq_len), self.cfg.vocab_size)?;
        let prep = self.prepare(batch)?;
        let h = self.run_layers(&prep, ctx)?;
        Ok(LossOutput {
            sum: self.head_loss(&h, &targets)?,
            n_tokens,
        })
    }
}
