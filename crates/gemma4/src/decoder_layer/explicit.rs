//! Explicit backward of a decoder layer (llm.c / torchtune style): a graph-free forward that keeps
//! exactly what the backward reads ([`LayerTape`]), either in the first forward (a layer that keeps
//! its activations) or in a recompute from the saved input, then each fused op's backward in
//! reverse order. Compared with Candle's autograd walk over the same layer it skips the zero-fill
//! and add of a gradient buffer per graph edge, frees every saved tensor right after its last use,
//! and the recompute does not compute the layer output the backward never reads. Same kernels and roundings as
//! [`DecoderLayer::forward`], which stays the reference (checked in `tests/layerwise.rs`); on CUDA
//! the MLP's gate / up adapter terms are added in the GeGLU's pass (`Mlp::gate_up_saved`), which
//! stores the bits the projections themselves would.
//!
//! Covers every layer kind: own or shared K/V (a KV-sharing consumer returns the gradient of the
//! producer's K/V; the producer's backward adds it to its own), sliding and full attention under a
//! causal mask (fused: key padding, packed sequences) or a dense additive mask (bidirectional
//! batches), the dense MLP, the MoE branch (26B-A4B) and the per-layer embedding (E2B/E4B).

use candle_core::Tensor;
use g4ft_lora::{AdapterGrads, LoraContext, ProjectionSaved};
use g4ft_ops::{
    gelu_tanh_mul, gelu_tanh_mul_backward, gelu_tanh_mul_backward_in_place, linear_frozen,
    linear_frozen_backward, rms_norm, rms_norm_add, rms_norm_backward,
    rms_norm_backward_over_input,
};

use super::{DecoderLayer, LayerInputs, LayerMoe, LayerPle};
use crate::attention::explicit::{AttentionLows, AttentionRecall, AttentionState, AttentionTape};
use crate::attention::KvPair;
use crate::config::LayerType;
use crate::error::Result;
use crate::mask::Scores;
use crate::mlp::GateUpSaved;
use crate::moe::MoeTape;
use crate::rope::RopeTable;

/// What [`DecoderLayer::backward_saved`] reads, kept by [`DecoderLayer::forward_saved`]. The
/// normed inputs (of the attention, the MLP and the experts) are recomputed instead, unless the
/// tape is whole ([`crate::KeepMask::whole_tapes`]): then those of the attention and the MLP are
/// kept from the forward, with the attention's roped queries and `o_proj` input.
pub(crate) struct LayerTape {
    /// The layer input (input norm backward): a layer that keeps its tape saves no other copy.
    x: Tensor,
    /// A whole tape's `input_layernorm(x)`.
    xn: Option<Tensor>,
    /// A whole tape's `pre_feedforward_layernorm(h1)`.
    hn: Option<Tensor>,
    attn: AttentionTape,
    /// Attention output before `post_attention_layernorm`.
    a: Tensor,
    /// Residual stream after attention (the feed-forward norms' input).
    h1: Tensor,
    mlp: MlpTape,
    moe: Option<MoeBranchTape>,
    ple: Option<PleTape>,
}

impl LayerTape {
    /// The K/V the layer attended to (a producer lends them to its consumers; they share storage
    /// with the tape).
    pub(crate) fn kv(&self) -> KvPair {
        self.attn.kv()
    }
}

/// The dense MLP `down(gelu(gate(hn)) · up(hn))`.
struct MlpTape {
    gate_proj: ProjectionSaved,
    up_proj: ProjectionSaved,
    down_proj: ProjectionSaved,
    /// The gate and up outputs (`None` only in the tape of a checkpointing forward, which is
    /// dropped, never walked back).
    gate: Option<Tensor>,
    up: Option<Tensor>,
    /// `gelu(gate)·up`, the input of `down_proj` (its memory takes d(act) in the backward).
    act: Tensor,
    /// MLP output: the input of `post_feedforward_layernorm` (or `_1` with the MoE branch).
    m: Tensor,
}

/// The MoE branch: `mt = post_ff_1(m) + post_ff_2(moe(h1, pre_ff_2(h1)))`, `post_ff(mt)`.
struct MoeBranchTape {
    moe: MoeTape,
    /// Expert output `(b, t, h)` before `post_feedforward_layernorm_2`.
    m2: Tensor,
    /// The sum of both branches, the input of `post_feedforward_layernorm`.
    mt: Tensor,
}

/// The per-layer embedding `h3 = h2 + post_norm(proj(gelu(gate(h2)) · ple_l))`.
struct PleTape {
    /// `per_layer_input_gate(h2)` `(b, t, P)`.
    gate: Tensor,
    /// This layer's PLE input `(b, t, P)` (a constant).
    pli: Tensor,
    /// `per_layer_projection(..)` `(b, t, h)`, the input of `post_per_layer_input_norm`.
    p: Tensor,
}

/// A layer's two block outputs before their norms: the attention's (`o_proj`'s output) and the
/// dense MLP's (`down_proj`'s). Kept from the first forward beside the input, they spare the
/// recompute both frozen products, whose only use is these outputs; with the attention's
/// [`AttentionState`] the recompute runs no attention product or kernel either.
pub(crate) struct BlockOutputs {
    pub(crate) attn: Tensor,
    pub(crate) mlp: Tensor,
    pub(crate) attention: Option<AttentionState>,
}

/// The adapters' down products `low = drop(x)·Aᵀ` (`tokens × r` each) of a recomputed layer's
/// projections, kept on the device from its first forward (`r` elements per token per adapted
/// projection): the recompute takes them instead of running the adapters' down kernels again,
/// the same bits. `None` for a projection without an adapter.
#[derive(Default)]
pub(crate) struct LayerLows {
    pub(crate) attention: AttentionLows,
    pub(crate) gate: Option<Tensor>,
    pub(crate) up: Option<Tensor>,
    pub(crate) down: Option<Tensor>,
}

/// What a recompute of a layer takes from its first forward instead of computing it again
/// (nothing by default).
#[derive(Default, Clone, Copy)]
pub(crate) struct LayerRecall<'a> {
    /// The block outputs (and perhaps the attention state), parked by offloaded checkpoints.
    pub(crate) outputs: Option<&'a BlockOutputs>,
    /// The adapters' down products.
    pub(crate) lows: Option<&'a LayerLows>,
}

/// Which of [`DecoderLayer`]'s graph-free forwards `run` is.
#[derive(Clone, Copy)]
enum Run {
    /// The first forward of a layer that keeps its tape: the output too; `whole`: a whole tape.
    Forward { whole: bool },
    /// The first forward of a recomputed layer: the output, and of the tape what the caller
    /// keeps (block outputs, down products, K/V); the MLP's gate and up are not stored.
    Checkpoint,
    /// A recompute from the saved input: the tape alone (a lean one).
    Recompute,
}

/// What a layer's backward hands back: d(layer input), and for a KV-sharing consumer the
/// gradient of the producer's K/V it attended to.
pub(crate) struct LayerGrads {
    /// d(layer input).
    pub(crate) dx: Tensor,
    /// Gradient of the borrowed K/V (consumers only).
    pub(crate) borrowed_kv: Option<KvPair>,
}

impl DecoderLayer {
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

    /// How this layer's attention scores are masked for `inputs`.
    fn scores<'a>(&self, inputs: &'a LayerInputs) -> Scores<'a> {
        inputs
            .bias
            .scores(self.cfg.layer_type, inputs.sliding_window)
    }

    /// Recomputes the layer on `x (b, t, h)` without a graph and keeps its tape (the output itself
    /// is not computed): the backward walk's recompute of a layer that saved its input, its
    /// [`LayerLows`] and perhaps its [`BlockOutputs`] (then `o_proj` and `down_proj` keep only
    /// their saved state, and with the attention state q/k/v too, and the attention kernel does
    /// not run). `shared`: the producer's K/V for a KV-sharing consumer.
    pub(crate) fn forward_saved(
        &self,
        x: &Tensor,
        recall: LayerRecall,
        shared: Option<&KvPair>,
        inputs: &LayerInputs,
        ctx: &LoraContext,
    ) -> Result<LayerTape> {
        Ok(self.run(x, recall, shared, inputs, ctx, Run::Recompute)?.0)
    }

    /// The layer output without a graph and the tape [`DecoderLayer::forward_saved`] would keep,
    /// from the same ops (residual adds fused into the norms): the forward of a layer that keeps
    /// its activations for its backward instead of recomputing them. `whole`: the tape also
    /// keeps the tensors its backward would otherwise recompute ([`LayerTape`]).
    pub(crate) fn forward_with_tape(
        &self,
        x: &Tensor,
        shared: Option<&KvPair>,
        inputs: &LayerInputs,
        ctx: &LoraContext,
        whole: bool,
    ) -> Result<(LayerTape, Tensor)> {
        let (tape, out) = self.run(
            x,
            LayerRecall::default(),
            shared,
            inputs,
            ctx,
            Run::Forward { whole },
        )?;
        Ok((tape, out.expect("run computes the output when asked")))
    }

    /// The layer output without a graph, through the same fused ops as
    /// [`DecoderLayer::forward_saved`]: the first, checkpointing forward of a layer that is
    /// recomputed later. Also the K/V the layer attended to (what a KV producer lends its
    /// consumers), the layer's [`BlockOutputs`], for the caller to keep or drop, and its
    /// [`LayerLows`]; the rest of the tape is dropped.
    pub(crate) fn forward_graph_free(
        &self,
        x: &Tensor,
        shared: Option<&KvPair>,
        inputs: &LayerInputs,
        ctx: &LoraContext,
    ) -> Result<(Tensor, KvPair, BlockOutputs, LayerLows)> {
        let (tape, out) = self.run(
            x,
            LayerRecall::default(),
            shared,
            inputs,
            ctx,
            Run::Checkpoint,
        )?;
        let out = out.expect("run computes the output when asked");
        let outputs = BlockOutputs {
            attn: tape.a.clone(),
            mlp: tape.mlp.m.clone(),
            attention: Some(tape.attn.state()),
        };
        let mlp = &tape.mlp;
        let lows = LayerLows {
            attention: tape.attn.lows(),
            gate: mlp.gate_proj.low().cloned(),
            up: mlp.up_proj.low().cloned(),
            down: mlp.down_proj.low().cloned(),
        };
        Ok((out, tape.kv(), outputs, lows))
    }

    /// The graph-free forward: the tape, and the output unless it is a recompute; `recall`: what
    /// an earlier forward on `x` kept, taken instead of computing it.
    fn run(
        &self,
        x: &Tensor,
        recall: LayerRecall,
        shared: Option<&KvPair>,
        inputs: &LayerInputs,
        ctx: &LoraContext,
        run: Run,
    ) -> Result<(LayerTape, Option<Tensor>)> {
        let (with_output, whole) = match run {
            Run::Forward { whole } => (true, whole),
            Run::Checkpoint => (true, false),
            Run::Recompute => (false, false),
        };
        let _copies = self.hold_adapter_copies(x.dtype())?;
        let (known, lows) = (recall.outputs, recall.lows);
        let low = |pick: fn(&LayerLows) -> &Option<Tensor>| lows.and_then(|l| pick(l).as_ref());
        let eps = self.eps;
        let recall_attn = AttentionRecall {
            out: known.map(|k| &k.attn),
            state: known.and_then(|k| k.attention.as_ref()),
            lows: lows.map(|l| &l.attention),
        };
        // Not formed for a recompute that holds everything the attention would compute from it
        // (the backward forms it again).
        let xn = (whole || self.self_attn.reads_input(&recall_attn))
            .then(|| rms_norm(x, Some(&self.input_layernorm), eps))
            .transpose()?;
        let (a, attn) = self.self_attn.forward_saved(
            xn.as_ref(),
            shared,
            self.rope_table(inputs),
            self.scores(inputs),
            ctx,
            recall_attn,
            whole,
        )?;
        let xn = xn.filter(|_| whole);
        let h1 = rms_norm_add(&a, Some(&self.post_attention_layernorm), eps, x)?;
        let hn = rms_norm(&h1, Some(&self.pre_feedforward_layernorm), eps)?;
        let mlp = &self.mlp;
        let GateUpSaved {
            gate,
            up,
            act,
            gate_proj,
            up_proj,
        } = mlp.gate_up_saved(
            &hn,
            [low(|l| &l.gate), low(|l| &l.up)],
            ctx,
            !matches!(run, Run::Checkpoint),
        )?;
        let hn = whole.then_some(hn);
        let down_low = low(|l| &l.down);
        let (m, down_proj) = match known {
            Some(k) => (
                k.mlp.clone(),
                mlp.down_proj.forward_saved_state(&act, down_low, ctx)?,
            ),
            None => mlp.down_proj.forward_saved(&act, down_low, ctx)?,
        };
        let moe = match &self.moe {
            Some(branch) => Some(self.moe_forward(branch, &m, &h1)?),
            None => None,
        };
        // Without a PLE block the feed-forward output is the layer output, needed only when asked.
        let ff_in = moe.as_ref().map_or(&m, |b| &b.mt);
        let post_ff = Some(&self.post_feedforward_layernorm);
        let (h, ple) = match (&self.ple, &inputs.ple) {
            (Some(ple), Some(all)) => {
                let h2 = rms_norm_add(ff_in, post_ff, eps, &h1)?;
                let (h3, tape) = self.ple_forward(ple, all, &h2, with_output)?;
                (h3, Some(tape))
            }
            _ if with_output => (Some(rms_norm_add(ff_in, post_ff, eps, &h1)?), None),
            _ => (None, None),
        };
        let out = match h {
            Some(h) if self.layer_scalar != 1.0 => Some(h.affine(self.layer_scalar, 0.0)?),
            h => h,
        };
        let tape = LayerTape {
            x: x.clone(),
            xn,
            hn,
            attn,
            a,
            h1,
            mlp: MlpTape {
                gate_proj,
                up_proj,
                down_proj,
                gate,
                up,
                act,
                m,
            },
            moe,
            ple,
        };
        Ok((tape, out))
    }

    /// The MoE branch on the residual `h1 (b, t, h)`, joined with the dense MLP output `m`.
    fn moe_forward(&self, branch: &LayerMoe, m: &Tensor, h1: &Tensor) -> Result<MoeBranchTape> {
        let eps = self.eps;
        let (b, t, h) = h1.dims3()?;
        let flat = h1.reshape((b * t, h))?;
        let u = rms_norm(&flat, Some(&branch.pre_feedforward_layernorm_2), eps)?;
        let (m2, moe) = branch.moe.forward_saved(&flat, &u)?;
        drop(u);
        let m2 = m2.reshape((b, t, h))?;
        let m2n = rms_norm(&m2, Some(&branch.post_feedforward_layernorm_2), eps)?;
        let mt = rms_norm_add(m, Some(&branch.post_feedforward_layernorm_1), eps, &m2n)?;
        Ok(MoeBranchTape { moe, m2, mt })
    }

    /// The per-layer embedding on `h2`: the output `h3` (if `with_output`) and the tape.
    fn ple_forward(
        &self,
        ple: &LayerPle,
        all: &Tensor,
        h2: &Tensor,
        with_output: bool,
    ) -> Result<(Option<Tensor>, PleTape)> {
        let pli = all.narrow(2, self.index, 1)?.squeeze(2)?.contiguous()?; // (b, t, P)
        let gate = linear_frozen(h2, &ple.input_gate)?;
        let p = linear_frozen(&gelu_tanh_mul(&gate, &pli)?, &ple.projection)?;
        let h3 = with_output
            .then(|| rms_norm_add(&p, Some(&ple.post_norm), self.eps, h2))
            .transpose()?;
        Ok((h3, PleTape { gate, pli, p }))
    }

    /// d(layer input) from d(layer output) `g`, the ops' backward in reverse order; the adapter
    /// gradients of the layer go to `grads`. `lent`: the gradient of this layer's K/V from the
    /// KV-sharing consumers that attended to them (producers only). Consumes the tape (each
    /// tensor freed after its last use).
    pub(crate) fn backward_saved(
        &self,
        tape: LayerTape,
        g: &Tensor,
        inputs: &LayerInputs,
        lent: Option<KvPair>,
        grads: &mut AdapterGrads,
    ) -> Result<LayerGrads> {
        let eps = self.eps;
        let mut g = if self.layer_scalar != 1.0 {
            g.affine(self.layer_scalar, 0.0)?
        } else {
            g.clone()
        };
        // --- per-layer embedding: h3 = h2 + post_norm(proj(gelu(gate(h2)) · pli)) ---
        if let (Some(ple), Some(pt)) = (&self.ple, tape.ple) {
            let dp = rms_norm_backward_over_input(pt.p, Some(&ple.post_norm), &g, eps)?;
            let dga = linear_frozen_backward(&dp, &ple.projection)?;
            drop(dp);
            let (dgate, _) = gelu_tanh_mul_backward(&pt.gate, &pt.pli, &dga)?;
            drop((dga, pt.gate, pt.pli));
            g = (linear_frozen_backward(&dgate, &ple.input_gate)? + g)?;
        }
        // --- feed-forward: h2 = h1 + post_ff(mt), mt = m or the MoE join ---
        let post_ff = Some(&self.post_feedforward_layernorm);
        let mlp = tape.mlp;
        let (dm, moe_dh1) = match (&self.moe, tape.moe) {
            (Some(branch), Some(mb)) => {
                let dmt = rms_norm_backward_over_input(mb.mt, post_ff, &g, eps)?;
                let dm = rms_norm_backward(
                    &mlp.m,
                    Some(&branch.post_feedforward_layernorm_1),
                    &dmt,
                    eps,
                    None,
                )?;
                let dm2 = rms_norm_backward_over_input(
                    mb.m2,
                    Some(&branch.post_feedforward_layernorm_2),
                    &dmt,
                    eps,
                )?;
                drop(dmt);
                let (b, t, h) = tape.h1.dims3()?;
                let flat = tape.h1.reshape((b * t, h))?;
                let (du, dres) =
                    branch
                        .moe
                        .backward_saved(mb.moe, &dm2.reshape((b * t, h))?, &flat)?;
                drop(dm2);
                let d_flat = rms_norm_backward(
                    &flat,
                    Some(&branch.pre_feedforward_layernorm_2),
                    &du,
                    eps,
                    Some(&dres),
                )?;
                (dm, Some(d_flat.reshape((b, t, h))?))
            }
            _ => (rms_norm_backward_over_input(mlp.m, post_ff, &g, eps)?, None),
        };
        let dact = mlp.down_proj.backward_over_input(mlp.act, &dm, grads)?;
        drop((dm, mlp.down_proj));
        // d(gate), d(up) overwrite gate and up (the tape owned them alone).
        let walked_back = "a tape the backward walks stores gate and up";
        let (gate, up) = (mlp.gate.expect(walked_back), mlp.up.expect(walked_back));
        let (dgate, dup) = gelu_tanh_mul_backward_in_place(gate, up, &dact)?;
        drop(dact);
        let pre_ff = Some(&self.pre_feedforward_layernorm);
        let hn = match tape.hn {
            Some(hn) => hn,
            None => rms_norm(&tape.h1, pre_ff, eps)?,
        };
        let dhn = mlp.gate_proj.backward(&hn, &dgate, grads)?;
        let dhn = mlp.up_proj.backward_acc(&hn, &dup, dhn, grads)?;
        drop((hn, dgate, dup, mlp.gate_proj, mlp.up_proj));
        // The residual stream's gradient (and the experts') joins inside the norm backward.
        let residual = match moe_dh1 {
            Some(d) => (g + d)?,
            None => g,
        };
        let dh1 = rms_norm_backward(&tape.h1, pre_ff, &dhn, eps, Some(&residual))?;
        drop((tape.h1, dhn, residual));
        // --- attention: h1 = x + post_attn(attn(input_norm(x))) ---
        let da =
            rms_norm_backward_over_input(tape.a, Some(&self.post_attention_layernorm), &dh1, eps)?;
        let (kept_xn, x) = (tape.xn, &tape.x);
        let input_norm = || match kept_xn {
            Some(xn) => Ok(xn),
            None => Ok(rms_norm(x, Some(&self.input_layernorm), eps)?),
        };
        let attn = self.self_attn.backward_saved(
            tape.attn,
            da,
            input_norm,
            self.rope_table(inputs),
            lent,
            grads,
        )?;
        let dx = rms_norm_backward(
            &tape.x,
            Some(&self.input_layernorm),
            &attn.dx,
            eps,
            Some(&dh1),
        )?;
        Ok(LayerGrads {
            dx,
            borrowed_kv: attn.borrowed_kv,
        })
    }
}
