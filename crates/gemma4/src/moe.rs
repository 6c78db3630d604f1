//! The mixture-of-experts block of 26B-A4B (`Gemma4TextRouter` + `Gemma4TextExperts`; `docs/gemma4.md` §4.6).
//!
//! Router on the residual `r`: `z = rmsnorm_noscale(r) · scale · H^-½`, `p = softmax_fp32(proj(z))`,
//! top-k (descending), renormalised to sum 1, times `per_expert_scale`. Experts on
//! `u = pre_feedforward_layernorm_2(r)`: `y_e = down_e(gelu_tanh(gate_e(u)) · up_e(u))`, weighted in
//! fp32 and summed in fp32 (grouped_mm semantics), cast back once. The top-k choice is
//! non-differentiable; gradients flow through the selected weights and the expert inputs. Expert
//! weights are frozen (never LoRA targets).
//!
//! Two forwards with the same numerics: [`Moe::forward`] (differentiable by Candle's autograd, one
//! matmul per expert over its rows: the reference) and `Moe::forward_saved` + `Moe::backward_saved`
//! (the training path: routing, grouping and the expert matmuls as device ops of `g4ft-ops`, a
//! handful of launches per layer whatever the number of experts, no host copy). The decoder
//! layer's graph forward uses the second whenever no adapter gradient is tracked (evaluation,
//! generation), so only autograd-based tests run the reference.

use candle_core::{DType, Tensor, D};
use g4ft_ops::{
    gelu_tanh_mul, gelu_tanh_mul_halves, gelu_tanh_mul_halves_backward, grouped_matmul,
    linear_frozen, linear_frozen_backward, moe_combine, moe_combine_backward, moe_gather,
    moe_group, moe_topk, mul_scalar_vector, mul_vector_scalar, rms_norm, rms_norm_backward,
    softmax_last_dim, MoeGroups,
};

use crate::config::{Config, MoeConfig};
use crate::error::Result;
use crate::weights::Weights;

/// Router and experts of one layer.
#[derive(Debug, Clone)]
pub struct Moe {
    cfg: MoeConfig,
    hidden: usize,
    eps: f64,
    proj: Tensor,             // (E, H)
    scale: Tensor,            // (H,)
    per_expert_scale: Tensor, // (E,) f32
    gate_up: Tensor,          // (E, 2·I, H)
    down: Tensor,             // (E, H, I)
}

impl Moe {
    /// Loads `layers.{i}.router.*` and `layers.{i}.experts.*`.
    pub fn new(cfg: &Config, moe: &MoeConfig, i: usize, w: &Weights) -> Result<Self> {
        let (h, e, im) = (cfg.hidden_size, moe.num_experts, moe.moe_intermediate_size);
        Ok(Moe {
            cfg: *moe,
            hidden: h,
            eps: cfg.rms_norm_eps,
            proj: w.tensor(&format!("layers.{i}.router.proj.weight"), &[e, h])?,
            scale: w.tensor(&format!("layers.{i}.router.scale"), &[h])?,
            per_expert_scale: w
                .tensor(&format!("layers.{i}.router.per_expert_scale"), &[e])?
                .to_dtype(DType::F32)?,
            gate_up: w.tensor(&format!("layers.{i}.experts.gate_up_proj"), &[e, 2 * im, h])?,
            down: w.tensor(&format!("layers.{i}.experts.down_proj"), &[e, h, im])?,
        })
    }

    /// The router: probabilities `(n, E)` f32 of the flat residual `(n, h)`.
    fn router_probs(&self, residual: &Tensor) -> Result<Tensor> {
        let z = rms_norm(residual, None, self.eps)?;
        let z = mul_vector_scalar(&z, &self.scale, (self.hidden as f64).powf(-0.5))?;
        let logits = linear_frozen(&z, &self.proj)?; // (n, E)
        Ok(softmax_last_dim(&logits.to_dtype(DType::F32)?)?)
    }

    /// Top-k routing from the probabilities: indices `(n, k)` u32 (on the device) and the routing
    /// weights `(n, k)` f32 (differentiable through `probs`): the chosen probabilities,
    /// renormalised to sum 1, times `per_expert_scale`. Also the parts the backward reads.
    fn route(&self, probs: &Tensor) -> Result<Routing> {
        let idx = moe_topk(&probs.detach(), self.cfg.top_k_experts)?;
        let top = probs.gather(&idx, 1)?; // (n, k)
        let sum = top.sum_keepdim(D::Minus1)?;
        let normed = top.broadcast_div(&sum)?;
        let (n, k) = idx.dims2()?;
        let pes = self
            .per_expert_scale
            .index_select(&idx.flatten_all()?, 0)?
            .reshape((n, k))?;
        let weights = (&normed * &pes)?;
        Ok(Routing {
            idx,
            normed,
            sum,
            pes,
            weights,
        })
    }

    /// MoE output `(n, h)` in `u`'s dtype from the flat residual `(n, h)` (router input) and
    /// the expert input `u = pre_feedforward_layernorm_2(residual)`. Differentiable (Candle's
    /// autograd); one matmul per expert over its grouped rows.
    pub fn forward(&self, residual: &Tensor, u: &Tensor) -> Result<Tensor> {
        let (n, h) = u.dims2()?;
        let routing = self.route(&self.router_probs(residual)?)?;
        let groups = moe_group(&routing.idx, self.cfg.num_experts)?;
        let x = u.index_select(&groups.token, 0)?; // (n·k, h)
        let w = routing
            .weights
            .flatten_all()?
            .index_select(&groups.order, 0)?; // (n·k,) f32
        let im = self.cfg.moe_intermediate_size;
        let offsets = groups.offsets.to_vec1::<u32>()?;
        let mut ys = Vec::with_capacity(self.cfg.num_experts);
        for (e, seg) in offsets.windows(2).enumerate() {
            let (lo, len) = (seg[0] as usize, (seg[1] - seg[0]) as usize);
            if len == 0 {
                continue;
            }
            let xe = x.narrow(0, lo, len)?;
            let gu = linear_frozen(&xe, &self.gate_up.get(e)?)?; // (len, 2·I)
            let act = gelu_tanh_mul(&gu.narrow(1, 0, im)?, &gu.narrow(1, im, im)?)?;
            ys.push(linear_frozen(&act, &self.down.get(e)?)?); // (len, h)
        }
        let y = Tensor::cat(&ys, 0)?;
        let contrib = y.to_dtype(DType::F32)?.broadcast_mul(&w.unsqueeze(1)?)?;
        let out =
            Tensor::zeros((n, h), DType::F32, u.device())?.index_add(&groups.token, &contrib, 0)?;
        Ok(out.to_dtype(u.dtype())?)
    }

    /// [`Moe::forward`] without a graph, through the grouped device ops, and what
    /// [`Moe::backward_saved`] reads. Same numerics.
    pub(crate) fn forward_saved(&self, residual: &Tensor, u: &Tensor) -> Result<(Tensor, MoeTape)> {
        let probs = self.router_probs(residual)?;
        let routing = self.route(&probs)?;
        let groups = moe_group(&routing.idx, self.cfg.num_experts)?;
        let x = moe_gather(u, &groups)?; // (n·k, h)
        let gu = grouped_matmul(&x, &self.gate_up, &groups, true)?; // (n·k, 2·I): [gate | up]
        drop(x);
        let act = gelu_tanh_mul_halves(&gu)?;
        let y = grouped_matmul(&act, &self.down, &groups, true)?; // (n·k, h)
        drop(act);
        let w = routing
            .weights
            .flatten_all()?
            .index_select(&groups.order, 0)?; // (n·k,) f32
        let out = moe_combine(&y, Some(&w), &groups)?;
        let tape = MoeTape {
            probs,
            routing,
            groups,
            w,
            gu,
            y,
        };
        Ok((out, tape))
    }

    /// Gradients of the flat expert input `u` and of the router input `residual` (both `(n, h)`,
    /// in `u`'s dtype) from the output gradient `g (n, h)`: through the expert projections and
    /// through the routing weights, the router softmax, its projection and its norm.
    pub(crate) fn backward_saved(
        &self,
        tape: MoeTape,
        g: &Tensor,
        residual: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        let dtype = g.dtype();
        let MoeTape {
            probs,
            routing,
            groups,
            w,
            gu,
            y,
        } = tape;
        // out = Σ_slots w · f32(y): the expert outputs' gradient and the weights' gradient.
        let (dy, dw_sorted) = moe_combine_backward(g, &y, &w, &groups)?;
        drop((y, w));
        let dact = grouped_matmul(&dy, &self.down, &groups, false)?; // (n·k, I)
        drop(dy);
        let dgu = gelu_tanh_mul_halves_backward(&gu, &dact)?; // (n·k, 2·I)
        drop((gu, dact));
        let dx = grouped_matmul(&dgu, &self.gate_up, &groups, false)?; // (n·k, h)
        drop(dgu);
        let du = moe_combine(&dx, None, &groups)?;
        drop(dx);
        // The routing weights: w = (p_top / Σ p_top) · per_expert_scale.
        let dw = dw_sorted
            .index_select(&groups.slot_pos, 0)?
            .reshape(routing.idx.dims())?;
        let dnormed = (dw * &routing.pes)?;
        let dot = (&dnormed * &routing.normed)?.sum_keepdim(D::Minus1)?;
        let dtop = dnormed.broadcast_sub(&dot)?.broadcast_div(&routing.sum)?;
        let dprobs = probs.zeros_like()?.scatter_add(&routing.idx, &dtop, 1)?;
        // Softmax, then the router projection and its scaled, weightless norm.
        let dot = (&dprobs * &probs)?.sum_keepdim(D::Minus1)?;
        let dlogits = (&probs * dprobs.broadcast_sub(&dot)?)?.to_dtype(dtype)?;
        let dz = linear_frozen_backward(&dlogits, &self.proj)?;
        let dzn = mul_scalar_vector(&dz, (self.hidden as f64).powf(-0.5), &self.scale)?;
        let dres = rms_norm_backward(residual, None, &dzn, self.eps, None)?;
        Ok((du, dres))
    }
}

/// The routing of one batch (see [`Moe::route`]).
#[derive(Debug)]
struct Routing {
    /// Chosen experts `(n, k)` u32.
    idx: Tensor,
    /// Chosen probabilities renormalised to sum 1 `(n, k)` f32.
    normed: Tensor,
    /// Their sum before renormalising `(n, 1)` f32.
    sum: Tensor,
    /// `per_expert_scale` of the chosen experts `(n, k)` f32.
    pes: Tensor,
    /// Final routing weights `normed · pes` `(n, k)` f32.
    weights: Tensor,
}

/// What [`Moe::backward_saved`] reads, kept by [`Moe::forward_saved`]. The grouped expert input
/// is not kept: the frozen weights need no gradient, so nothing in the backward reads it.
pub(crate) struct MoeTape {
    /// Router probabilities `(n, E)` f32.
    probs: Tensor,
    routing: Routing,
    groups: MoeGroups,
    /// Routing weight of each grouped row `(n·k,)` f32.
    w: Tensor,
    /// Expert gate and up projections of the grouped rows side by side `(n·k, 2·I)`.
    gu: Tensor,
    /// Expert outputs of the grouped rows `(n·k, h)`.
    y: Tensor,
}
