//! Typed access to a checkpoint while building the model: the target dtype/device and the
//! checkpoint module paths of the `LoraLinear`s.

use candle_core::{DType, Device, Tensor};
use g4ft_lora::LoraLinear;

use crate::error::Result;
use crate::loader::Checkpoint;

/// A checkpoint plus the dtype and device the model is built in.
#[derive(Debug)]
pub struct Weights<'a> {
    ckpt: &'a Checkpoint,
    dtype: DType,
    device: Device,
}

impl<'a> Weights<'a> {
    /// Wraps a checkpoint for loading in `dtype` on `device`.
    pub fn new(ckpt: &'a Checkpoint, dtype: DType, device: &Device) -> Self {
        Weights {
            ckpt,
            dtype,
            device: device.clone(),
        }
    }

    /// The model dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The model device.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The text prefix of the checkpoint (`model.language_model` or `model`).
    pub fn prefix(&self) -> &str {
        self.ckpt.prefix()
    }

    /// Tensor `{prefix}.{name}` with the given shape, in the model dtype.
    pub fn tensor(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        self.ckpt.tensor(name, shape, self.dtype, &self.device)
    }

    /// A frozen projection `{prefix}.{module}.weight` of shape `(out, in)`, named by its module path.
    pub fn linear(&self, module: &str, out: usize, inp: usize) -> Result<LoraLinear> {
        let w = self.tensor(&format!("{module}.weight"), &[out, inp])?;
        Ok(LoraLinear::new(format!("{}.{module}", self.prefix()), w))
    }
}
