//! The dense GeGLU MLP (`Gemma4TextMLP`): `down(gelu_tanh(gate(x)) · up(x))`; its width is doubled
//! on KV-consumer layers when `use_double_wide_mlp` is set (E2B).

use candle_core::Tensor;
use g4ft_lora::{LoraContext, LoraLinear, ProjectionSaved};
use g4ft_ops::{gelu_tanh_mul, gelu_tanh_mul_lora_up, gelu_tanh_mul_lora_up_act, LoraUp};

use crate::config::{Config, LayerConfig};
use crate::error::Result;
use crate::weights::Weights;

/// `mlp.{gate,up,down}_proj` of one layer.
#[derive(Debug, Clone)]
pub struct Mlp {
    pub(crate) gate_proj: LoraLinear,
    pub(crate) up_proj: LoraLinear,
    pub(crate) down_proj: LoraLinear,
}

impl Mlp {
    /// Loads `layers.{i}.mlp.*` with the layer's width.
    pub fn new(cfg: &Config, layer: &LayerConfig, i: usize, w: &Weights) -> Result<Self> {
        let (h, im) = (cfg.hidden_size, layer.intermediate_size);
        Ok(Mlp {
            gate_proj: w.linear(&format!("layers.{i}.mlp.gate_proj"), im, h)?,
            up_proj: w.linear(&format!("layers.{i}.mlp.up_proj"), im, h)?,
            down_proj: w.linear(&format!("layers.{i}.mlp.down_proj"), h, im)?,
        })
    }

    /// `x (b, t, h) → (b, t, h)`.
    pub fn forward(&self, x: &Tensor, ctx: &LoraContext) -> Result<Tensor> {
        let gate = self.gate_proj.forward(x, ctx)?;
        let up = self.up_proj.forward(x, ctx)?;
        Ok(self.down_proj.forward(&gelu_tanh_mul(&gate, &up)?, ctx)?)
    }

    /// The gate and up projections of `x (b, t, h)` and their GeGLU without a graph, for the
    /// explicit layer backward: `(gate, up, act)`, each `(b, t, intermediate)`, and the two
    /// projections' saved state. Same values as [`Mlp::forward`]'s; with adapters on both, their
    /// up products are added in the GeGLU's pass ([`g4ft_ops::gelu_tanh_mul_lora_up`]).
    /// `kept_lows`: gate's and up's adapter down products from an earlier forward on `x`
    /// ([`LoraLinear::forward_saved`]'s `kept_low`). Without `keep_gate_up` (a forward that only
    /// hands `act` on) gate and up come back `None` and, with both adapters, the fused pass writes
    /// `act` alone ([`g4ft_ops::gelu_tanh_mul_lora_up_act`]).
    pub(crate) fn gate_up_saved(
        &self,
        x: &Tensor,
        kept_lows: [Option<&Tensor>; 2],
        ctx: &LoraContext,
        keep_gate_up: bool,
    ) -> Result<GateUpSaved> {
        let [gate_low, up_low] = kept_lows;
        let (gate, gate_proj, gate_term) =
            self.gate_proj.forward_saved_deferred(x, gate_low, ctx)?;
        let (up, up_proj, up_term) = self.up_proj.forward_saved_deferred(x, up_low, ctx)?;
        let (gate, up, act) = match (gate_term, up_term) {
            (Some(gt), Some(ut)) if !keep_gate_up => {
                (None, None, gelu_tanh_mul_lora_up_act(gate, up, &gt, &ut)?)
            }
            (Some(gt), Some(ut)) => {
                let (gate, up, act) = gelu_tanh_mul_lora_up(gate, up, &gt, &ut)?;
                (Some(gate), Some(up), act)
            }
            (gt, ut) => {
                let add = |y: Tensor, term: Option<LoraUp>| match term {
                    Some(t) => t.add_to(y),
                    None => Ok(y),
                };
                let (gate, up) = (add(gate, gt)?, add(up, ut)?);
                let act = gelu_tanh_mul(&gate, &up)?;
                let keep = |t: Tensor| keep_gate_up.then_some(t);
                (keep(gate), keep(up), act)
            }
        };
        Ok(GateUpSaved {
            gate,
            up,
            act,
            gate_proj,
            up_proj,
        })
    }

    /// gate, up, down.
    pub fn projections(&self) -> [&LoraLinear; 3] {
        [&self.gate_proj, &self.up_proj, &self.down_proj]
    }

    /// Mutable [`Mlp::projections`].
    pub fn projections_mut(&mut self) -> [&mut LoraLinear; 3] {
        [&mut self.gate_proj, &mut self.up_proj, &mut self.down_proj]
    }
}

/// [`Mlp::gate_up_saved`]'s outputs and the projections' saved state.
pub(crate) struct GateUpSaved {
    /// The gate and up outputs (adapter terms included), when asked for.
    pub(crate) gate: Option<Tensor>,
    pub(crate) up: Option<Tensor>,
    /// `gelu_tanh(gate)·up`, the input of `down_proj`.
    pub(crate) act: Tensor,
    pub(crate) gate_proj: ProjectionSaved,
    pub(crate) up_proj: ProjectionSaved,
}
