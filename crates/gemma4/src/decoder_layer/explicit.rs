//! Explicit backward of a dense decoder layer (llm.c / torchtune style): a graph-free recompute
//! that keeps exactly what the backward reads ([`LayerTape`]), then each fused op's backward in
//! reverse order. Compared with Candle's autograd walk over the same layer it skips the zero-fill
//! and add of a gradient buffer per graph edge, frees every saved tensor right after its last use,
//! and does not compute the layer output the backward never reads. Same kernels and roundings as
//! [`DecoderLayer::forward`], which stays the reference (checked in `tests/parity.rs`).
//!
//! Covers layers with their own K/V, no MoE block and no per-layer embedding, under causal
//! attention (the 12B/31B shapes); the others keep the autograd path.

use candle_core::Tensor;
use g4ft_lora::{AdapterGrads, LoraContext, ProjectionSaved};
use g4ft_ops::{
    gelu_tanh_mul, gelu_tanh_mul_backward_in_place, rms_norm, rms_norm_add, rms_norm_backward,
    rms_norm_backward_over_input,
};

use super::{DecoderLayer, LayerInputs};
use crate::attention::explicit::AttentionTape;
use crate::config::{KvSharing, LayerType};
use crate::error::Result;
use crate::mask::AttentionBias;
use crate::rope::RopeTable;

/// What [`DecoderLayer::backward_saved`] reads, kept by [`DecoderLayer::forward_saved`]. The two
/// normed inputs (of the attention and of the MLP) are recomputed from `x` and `h1` instead.
pub(crate) struct LayerTape {
    /// The layer input (input norm backward).
    x: Tensor,
    attn: AttentionTape,
    /// Attention output before `post_attention_layernorm`.
    a: Tensor,
    /// Residual stream after attention (`pre_feedforward_layernorm`'s input).
    h1: Tensor,
    gate_proj: ProjectionSaved,
    up_proj: ProjectionSaved,
    down_proj: ProjectionSaved,
    gate: Tensor,
    up: Tensor,
    /// `gelu(gate)·up`, the input of `down_proj` (its memory takes d(act) in the backward).
    act: Tensor,
    /// MLP output before `post_feedforward_layernorm`.
    m: Tensor,
}

impl DecoderLayer {
    /// Whether [`DecoderLayer::forward_saved`] covers this layer (with causal attention).
    pub(crate) fn has_explicit_backward(&self) -> bool {
        self.moe.is_none()
            && self.ple.is_none()
            && self.cfg.kv_sharing == KvSharing::None
            && self.self_attn.has_own_kv()
    }

    /// The RoPE table of this layer's type.
    pub(crate) fn rope_table<'a>(&self, inputs: &'a LayerInputs) -> &'a RopeTable {
        match self.cfg.layer_type {
            LayerType::Sliding => &inputs.rope_sliding,
            LayerType::Full => inputs
                .rope_full
                .as_ref()
                .expect("a full layer exists, so its RoPE table was built"),
        }
    }

    /// Recomputes the layer on `x (b, t, h)` without a graph and keeps its tape (the output itself
    /// is not computed). Requires [`DecoderLayer::has_explicit_backward`] and causal attention.
    pub(crate) fn forward_saved(
        &self,
        x: &Tensor,
        inputs: &LayerInputs,
        ctx: &LoraContext,
    ) -> Result<LayerTape> {
        Ok(self.run(x, inputs, ctx, false)?.0)
    }

    /// The layer output without a graph, through the same fused ops as [`DecoderLayer::forward_saved`]
    /// (residual adds fused into the norms): the first, checkpointing forward of the explicit path.
    pub(crate) fn forward_graph_free(
        &self,
        x: &Tensor,
        inputs: &LayerInputs,
        ctx: &LoraContext,
    ) -> Result<Tensor> {
        let (_, out) = self.run(x, inputs, ctx, true)?;
        Ok(out.expect("run computes the output when asked"))
    }

    /// The graph-free forward: the tape, and the output if `with_output`.
    fn run(
        &self,
        x: &Tensor,
        inputs: &LayerInputs,
        ctx: &LoraContext,
        with_output: bool,
    ) -> Result<(LayerTape, Option<Tensor>)> {
        let AttentionBias::Causal { key_mask } = &inputs.bias else {
            return Err(crate::error::Error::batch(
                "attention_mask",
                "the explicit layer backward needs causal attention (packed or bidirectional batches use autograd)",
            ));
        };
        let window = (self.cfg.layer_type == LayerType::Sliding).then_some(inputs.sliding_window);
        let xn = rms_norm(x, Some(&self.input_layernorm), self.eps)?;
        let (a, attn) = self.self_attn.forward_saved(
            &xn,
            self.rope_table(inputs),
            key_mask.as_ref(),
            window,
            ctx,
        )?;
        drop(xn);
        let h1 = rms_norm_add(&a, Some(&self.post_attention_layernorm), self.eps, x)?;
        let hn = rms_norm(&h1, Some(&self.pre_feedforward_layernorm), self.eps)?;
        let mlp = &self.mlp;
        let (gate, gate_proj) = mlp.gate_proj.forward_saved(&hn, ctx)?;
        let (up, up_proj) = mlp.up_proj.forward_saved(&hn, ctx)?;
        drop(hn);
        let act = gelu_tanh_mul(&gate, &up)?;
        let (m, down_proj) = mlp.down_proj.forward_saved(&act, ctx)?;
        let out = if with_output {
            let out = rms_norm_add(&m, Some(&self.post_feedforward_layernorm), self.eps, &h1)?;
            Some(if self.layer_scalar != 1.0 {
                out.affine(self.layer_scalar, 0.0)?
            } else {
                out
            })
        } else {
            None
        };
        let tape = LayerTape {
            x: x.clone(),
            attn,
            a,
            h1,
            gate_proj,
            up_proj,
            down_proj,
            gate,
            up,
            act,
            m,
        };
        Ok((tape, out))
    }

    /// d(layer input) from d(layer output) `g`, the ops' backward in reverse order; the adapter
    /// gradients of the layer go to `grads`. Consumes the tape (each tensor freed after its last use).
    pub(crate) fn backward_saved(
        &self,
        tape: LayerTape,
        g: &Tensor,
        inputs: &LayerInputs,
        grads: &mut AdapterGrads,
    ) -> Result<Tensor> {
        let eps = self.eps;
        let g = if self.layer_scalar != 1.0 {
            g.affine(self.layer_scalar, 0.0)?
        } else {
            g.clone()
        };
        // --- feed-forward: h2 = h1 + post_ff(down(geglu(gate(hn), up(hn)))) ---
        let dm =
            rms_norm_backward_over_input(tape.m, Some(&self.post_feedforward_layernorm), &g, eps)?;
        let dact = tape.down_proj.backward_over_input(tape.act, &dm, grads)?;
        drop((dm, tape.down_proj));
        // d(gate), d(up) overwrite gate and up (the tape owned them alone).
        let (dgate, dup) = gelu_tanh_mul_backward_in_place(tape.gate, tape.up, &dact)?;
        drop(dact);
        let pre_ff = Some(&self.pre_feedforward_layernorm);
        let hn = rms_norm(&tape.h1, pre_ff, eps)?;
        let dhn = tape.gate_proj.backward(&hn, &dgate, grads)?;
        let dhn = tape.up_proj.backward_acc(&hn, &dup, dhn, grads)?;
        drop((hn, dgate, dup, tape.gate_proj, tape.up_proj));
        // The residual stream's gradient joins inside the norm backward.
        let dh1 = rms_norm_backward(&tape.h1, pre_ff, &dhn, eps, Some(&g))?;
        drop((tape.h1, dhn, g));
        // --- attention: h1 = x + post_attn(attn(input_norm(x))) ---
        let da =
            rms_norm_backward_over_input(tape.a, Some(&self.post_attention_layernorm), &dh1, eps)?;
        let input_norm = || Ok(rms_norm(&tape.x, Some(&self.input_layernorm), eps)?);
        let dxn = self.self_attn.backward_saved(
            tape.attn,
            da,
            input_norm,
            self.rope_table(inputs),
            grads,
        )?;
        Ok(rms_norm_backward(
            &tape.x,
            Some(&self.input_layernorm),
            &dxn,
            eps,
            Some(&dh1),
        )?)
    }
}
