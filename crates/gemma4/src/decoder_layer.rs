//! One decoder layer (`Gemma4TextDecoderLayer`, transformers 5.23; `docs/gemma4.md` §4.5).
//!
//! ```text
//! h = r + post_attention_layernorm(attn(input_layernorm(r)))
//! m = mlp(pre_feedforward_layernorm(h))            (+ MoE branch on 26B-A4B)
//! h = h + post_feedforward_layernorm(m)
//! h = h + post_per_layer_input_norm(per_layer_projection(gelu(per_layer_input_gate(h)) · ple_l))   (PLE)
//! h = h · layer_scalar
//! ```
//! A KV producer (`Store`) also returns its K/V; a consumer (`Reuse`) takes them as input.

use candle_core::{DType, Tensor};
use g4ft_lora::{AdapterCopies, LoraContext, LoraLinear};
use g4ft_ops::{gelu_tanh_mul, linear_frozen, rms_norm};

use crate::attention::{Attention, KvPair};
use crate::config::{Config, KvSharing, LayerConfig};
use crate::error::{Error, Result};
use crate::mask::AttentionBias;
use crate::mlp::Mlp;
use crate::moe::Moe;
use crate::rope::RopeTable;
use crate::weights::Weights;

mod cached;
pub(crate) mod explicit;

/// Per-layer-embedding weights of one layer (E2B/E4B).
#[derive(Debug, Clone)]
struct LayerPle {
    input_gate: Tensor, // (P, H)
    projection: Tensor, // (H, P)
    post_norm: Tensor,  // (H,)
}

/// MoE weights and its three extra norms (26B-A4B).
#[derive(Debug, Clone)]
struct LayerMoe {
    moe: Moe,
    pre_feedforward_layernorm_2: Tensor,
    post_feedforward_layernorm_1: Tensor,
    post_feedforward_layernorm_2: Tensor,
}

/// Inputs shared by all layers of one forward: RoPE tables and masks per layer type, and the
/// per-layer-embedding input `(b, t, L, P)` if the model has PLE.
#[derive(Debug, Clone)]
pub struct LayerInputs {
    /// RoPE table of sliding layers.
    pub rope_sliding: RopeTable,
    /// RoPE table of full layers.
    pub rope_full: Option<RopeTable>,
    /// Causal (fused: key padding, sequence starts of packed rows) or dense masks.
    pub bias: AttentionBias,
    /// Sliding window `W` of sliding layers.
    pub sliding_window: usize,
    /// PLE inputs `(b, t, L, P)` (constants: nothing trainable precedes layer 0).
    pub ple: Option<Tensor>,
}

/// One decoder layer.
#[derive(Debug, Clone)]
pub struct DecoderLayer {
    index: usize,
    cfg: LayerConfig,
    pub(crate) self_attn: Attention,
    pub(crate) mlp: Mlp,
    input_layernorm: Tensor,
    post_attention_layernorm: Tensor,
    pre_feedforward_layernorm: Tensor,
    post_feedforward_layernorm: Tensor,
    /// `layer_scalar` (a frozen 1-element buffer), read once at load: the multiply is one
    /// `affine` (no broadcast kernel) and is skipped when the value is exactly 1.
    layer_scalar: f64,
    ple: Option<LayerPle>,
    moe: Option<LayerMoe>,
    eps: f64,
}

impl DecoderLayer {
    /// Loads `layers.{i}.*`.
    pub fn new(cfg: &Config, i: usize, w: &Weights) -> Result<Self> {
        let layer = &cfg.layers[i];
        let h = cfg.hidden_size;
        let norm = |name: &str| w.tensor(&format!("layers.{i}.{name}.weight"), &[h]);
        let p = cfg.hidden_size_per_layer_input;
        let ple = if p > 0 {
            Some(LayerPle {
                input_gate: w
                    .tensor(&format!("layers.{i}.per_layer_input_gate.weight"), &[p, h])?,
                projection: w
                    .tensor(&format!("layers.{i}.per_layer_projection.weight"), &[h, p])?,
                post_norm: norm("post_per_layer_input_norm")?,
            })
        } else {
            None
        };
        let moe = match &cfg.moe {
            Some(m) => Some(LayerMoe {
                moe: Moe::new(cfg, m, i, w)?,
                pre_feedforward_layernorm_2: norm("pre_feedforward_layernorm_2")?,
                post_feedforward_layernorm_1: norm("post_feedforward_layernorm_1")?,
                post_feedforward_layernorm_2: norm("post_feedforward_layernorm_2")?,
            }),
            None => None,
        };
        Ok(DecoderLayer {
            index: i,
            cfg: layer.clone(),
            self_attn: Attention::new(cfg, layer, i, w)?,
            mlp: Mlp::new(cfg, layer, i, w)?,
            input_layernorm: norm("input_layernorm")?,
            post_attention_layernorm: norm("post_attention_layernorm")?,
            pre_feedforward_layernorm: norm("pre_feedforward_layernorm")?,
            post_feedforward_layernorm: norm("post_feedforward_layernorm")?,
            layer_scalar: w
                .tensor(&format!("layers.{i}.layer_scalar"), &[1])?
                .to_dtype(candle_core::DType::F64)?
                .to_vec1::<f64>()?[0],
            ple,
            moe,
            eps: cfg.rms_norm_eps,
        })
    }

    /// The layer's settings.
    pub fn config(&self) -> &LayerConfig {
        &self.cfg
    }

    /// The KV producer whose K/V this layer attends to, for a KV-sharing consumer.
    pub fn producer(&self) -> Option<usize> {
        match self.cfg.kv_sharing {
            KvSharing::Reuse { producer } => Some(producer),
            _ => None,
        }
    }

    /// Runs the layer on `xs (b, t, h)`. `shared` must be the producer's K/V for a consumer layer
    /// (and `None` otherwise). Returns the output `(b, t, h)` and, for every layer that computes
    /// its own K/V, those K/V (a producer lends them to its consumers).
    pub fn forward(
        &self,
        xs: &Tensor,
        shared: Option<&KvPair>,
        inputs: &LayerInputs,
        ctx: &LoraContext,
    ) -> Result<(Tensor, Option<KvPair>)> {
        let _copies = self.hold_adapter_copies(xs.dtype())?;
        let rope_t = self.rope_table(inputs);
        // --- attention ---
        let residual = xs;
        let x = rms_norm(xs, Some(&self.input_layernorm), self.eps)?;
        let own = self.self_attn.own_kv(&x, rope_t, ctx)?;
        let kv = match (&own, shared) {
            (Some(kv), None) => kv,
            (None, Some(kv)) => kv,
            _ => {
                return Err(Error::batch(
                    "shared_kv",
                    format!(
                        "layer {}: K/V must come from exactly one of its own projections or its producer",
                        self.index
                    ),
                ))
            }
        };
        let kind = (self.cfg.layer_type, inputs.sliding_window);
        let a = self
            .self_attn
            .attend(&x, kv, rope_t, &inputs.bias, kind, ctx)?;
        let a = rms_norm(&a, Some(&self.post_attention_layernorm), self.eps)?;
        Ok((self.feed_forward(&(residual + a)?, inputs, ctx)?, own))
    }

    /// Everything after the attention block: the MLP (and MoE) branch, the per-layer embedding and
    /// `layer_scalar`, on the residual stream `xs (b, t, h)` after attention.
    pub(crate) fn feed_forward(
        &self,
        xs: &Tensor,
        inputs: &LayerInputs,
        ctx: &LoraContext,
    ) -> Result<Tensor> {
        let residual = xs;
        let x = rms_norm(residual, Some(&self.pre_feedforward_layernorm), self.eps)?;
        let mut m = self.mlp.forward(&x, ctx)?;
        if let Some(moe) = &self.moe {
            let m1 = rms_norm(&m, Some(&moe.post_feedforward_layernorm_1), self.eps)?;
            let (b, t, h) = residual.dims3()?;
            let flat = residual.reshape((b * t, h))?;
            let u = rms_norm(&flat, Some(&moe.pre_feedforward_layernorm_2), self.eps)?;
            // Without adapter gradients (evaluation, generation) nothing needs the graph: the
            // device ops' path, with no host copy of the routing.
            let m2 = if ctx.track_grad {
                moe.moe.forward(&flat, &u)?
            } else {
                moe.moe.forward_saved(&flat, &u)?.0
            };
            let m2 = m2.reshape((b, t, h))?;
            let m2 = rms_norm(&m2, Some(&moe.post_feedforward_layernorm_2), self.eps)?;
            m = (m1 + m2)?;
        }
        let m = rms_norm(&m, Some(&self.post_feedforward_layernorm), self.eps)?;
        let mut xs = (residual + m)?;
        // --- per-layer embedding ---
        if let (Some(ple), Some(all)) = (&self.ple, &inputs.ple) {
            let pli = all.narrow(2, self.index, 1)?.squeeze(2)?; // (b, t, P)
            let g = linear_frozen(&xs, &ple.input_gate)?;
            let g = gelu_tanh_mul(&g, &pli)?;
            let p = linear_frozen(&g, &ple.projection)?;
            let p = rms_norm(&p, Some(&ple.post_norm), self.eps)?;
            xs = (xs + p)?;
        }
        if self.layer_scalar != 1.0 {
            xs = xs.affine(self.layer_scalar, 0.0)?;
        }
        Ok(xs)
    }

    /// Projections in model order: q, k, v, o, gate, up, down (those the layer has).
    pub fn projections(&self) -> impl Iterator<Item = &LoraLinear> {
        self.self_attn.projections().chain(self.mlp.projections())
    }

    /// This layer's adapters cast to `dtype` together and held for its forward
    /// ([`g4ft_lora::hold_adapter_copies`]: one launch per forward on CUDA instead of two per
    /// projection); the tape of an explicit forward keeps the copies until its backward.
    pub(crate) fn hold_adapter_copies(&self, dtype: DType) -> Result<AdapterCopies<'_>> {
        Ok(g4ft_lora::hold_adapter_copies(self.projections(), dtype)?)
    }

    /// Mutable [`DecoderLayer::projections`].
    pub fn projections_mut(&mut self) -> impl Iterator<Item = &mut LoraLinear> {
        self.self_attn
            .projections_mut()
            .chain(self.mlp.projections_mut())
    }
}
