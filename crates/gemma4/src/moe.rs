//! The mixture-of-experts block of 26B-A4B (`Gemma4TextRouter` + `Gemma4TextExperts`; spec §4.6).
//!
//! Router on the residual `r`: `z = rmsnorm_noscale(r) · scale · H^-½`, `p = softmax_fp32(proj(z))`,
//! top-k (descending), renormalised to sum 1, times `per_expert_scale`. Experts on
//! `u = pre_feedforward_layernorm_2(r)`: `y_e = down_e(gelu_tanh(gate_e(u)) · up_e(u))`, weighted in
//! fp32 and summed in fp32 (grouped_mm semantics), cast back once. The top-k choice is
//! non-differentiable (indices picked on the host); gradients flow through the selected weights and
//! the expert inputs. Expert weights are frozen (never LoRA targets).

use candle_core::{DType, IndexOp, Tensor, D};
use g4ft_ops::{gelu_tanh_mul, linear_frozen, rms_norm, softmax_last_dim};

use crate::config::{Config, MoeConfig};
use crate::error::Result;
use crate::numerics::mul_scalar;
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

    /// Top-k routing of `residual (n, h)`: weights `(n, k)` f32 (differentiable) and expert
    /// indices (host, row-major `(n, k)`).
    fn route(&self, residual: &Tensor) -> Result<(Tensor, Vec<u32>)> {
        let z = rms_norm(residual, None, self.eps)?;
        let z = mul_scalar(
            &z.broadcast_mul(&self.scale)?,
            (self.hidden as f64).powf(-0.5),
        )?;
        let logits = linear_frozen(&z, &self.proj)?; // (n, E)
        let probs = softmax_last_dim(&logits.to_dtype(DType::F32)?)?; // (n, E) f32
        let (n, e) = probs.dims2()?;
        let k = self.cfg.top_k_experts;
        let host: Vec<f32> = probs.detach().flatten_all()?.to_vec1()?;
        let mut idx = Vec::with_capacity(n * k);
        for row in host.chunks(e) {
            let mut order: Vec<u32> = (0..e as u32).collect();
            // Descending by probability; ties keep the lower index first.
            order.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]));
            idx.extend_from_slice(&order[..k]);
        }
        let idx_t = Tensor::from_vec(idx.clone(), (n, k), probs.device())?;
        let w = probs.gather(&idx_t, 1)?; // (n, k)
        let w = w.broadcast_div(&w.sum_keepdim(D::Minus1)?)?;
        let pes = self
            .per_expert_scale
            .index_select(&idx_t.flatten_all()?, 0)?
            .reshape((n, k))?;
        Ok(((w * pes)?, idx))
    }

    /// MoE output `(n, h)` in `u`'s dtype from the flat residual `(n, h)` (router input) and
    /// the expert input `u = pre_feedforward_layernorm_2(residual)`.
    pub fn forward(&self, residual: &Tensor, u: &Tensor) -> Result<Tensor> {
        let (n, h) = u.dims2()?;
        let k = self.cfg.top_k_experts;
        let (weights, idx) = self.route(residual)?;
        let flat_w = weights.flatten_all()?; // (n·k,) f32
        let im = self.cfg.moe_intermediate_size;
        let mut out = Tensor::zeros((n, h), DType::F32, u.device())?;
        for e in 0..self.cfg.num_experts {
            // (token, slot) pairs routed to expert e, in token order.
            let (mut tokens, mut slots) = (Vec::new(), Vec::new());
            for (pos, &ex) in idx.iter().enumerate() {
                if ex as usize == e {
                    tokens.push((pos / k) as u32);
                    slots.push(pos as u32);
                }
            }
            if tokens.is_empty() {
                continue;
            }
            let m = tokens.len();
            let tok = Tensor::from_vec(tokens, m, u.device())?;
            let slot = Tensor::from_vec(slots, m, u.device())?;
            let x = u.index_select(&tok, 0)?; // (m, h)
            let gu = linear_frozen(&x, &self.gate_up.i(e)?)?; // (m, 2·I)
            let act = gelu_tanh_mul(&gu.narrow(1, 0, im)?, &gu.narrow(1, im, im)?)?;
            let y = linear_frozen(&act, &self.down.i(e)?)?; // (m, h)
            let we = flat_w.index_select(&slot, 0)?.unsqueeze(1)?; // (m, 1) f32
            let contrib = y.to_dtype(DType::F32)?.broadcast_mul(&we)?;
            out = out.index_add(&tok, &contrib, 0)?;
        }
        Ok(out.to_dtype(u.dtype())?)
    }
}
