//! The dense GeGLU MLP (`Gemma4TextMLP`): `down(gelu_tanh(gate(x)) · up(x))`; its width is doubled
//! on KV-consumer layers when `use_double_wide_mlp` is set (E2B).

use candle_core::Tensor;
use g4ft_lora::{LoraContext, LoraLinear};
use g4ft_ops::gelu_tanh_mul;

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

    /// gate, up, down.
    pub fn projections(&self) -> [&LoraLinear; 3] {
        [&self.gate_proj, &self.up_proj, &self.down_proj]
    }

    /// Mutable [`Mlp::projections`].
    pub fn projections_mut(&mut self) -> [&mut LoraLinear; 3] {
        [&mut self.gate_proj, &mut self.up_proj, &mut self.down_proj]
    }
}
