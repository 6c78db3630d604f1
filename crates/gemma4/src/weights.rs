//! Typed access to the model's tensors while building it: the target dtype/device, the
//! checkpoint module paths of the `LoraLinear`s, and where the values come from — an opened
//! checkpoint, or random values for benchmarks ([`Weights::random`]).
//!
//! Random values follow transformers' `_init_weights` for Gemma 4 in spirit: every matrix
//! `N(0, 0.02²)`; norm weights `1 + N(0, 0.01²)` (a small perturbation so the weight multiply is
//! not a no-op in tests); `layer_scalar` and the MoE `per_expert_scale` exactly 1. On a GPU they
//! are drawn on the device (curand, seeded per tensor), so a 12B model builds without host
//! round trips; on the CPU from a counter-based hash, so a seed gives the same model every run.

use candle_core::{DType, Device, Tensor};
use g4ft_hash::{box_muller, fnv1a64, mix64, stream_u64};
use g4ft_lora::LoraLinear;

use crate::error::Result;
use crate::loader::Checkpoint;

/// Standard deviation of random matrices (transformers' `initializer_range` for Gemma 4).
pub const RANDOM_INIT_STD: f64 = 0.02;
/// Standard deviation of the perturbation around 1 of random norm weights.
pub const RANDOM_NORM_STD: f64 = 0.01;
/// The text prefix of random models (the released multimodal checkpoints' layout).
pub const RANDOM_PREFIX: &str = "model.language_model";

/// Where tensor values come from.
#[derive(Debug)]
enum Source<'a> {
    Checkpoint(&'a Checkpoint),
    Random { seed: u64 },
}

/// A tensor source plus the dtype and device the model is built in.
#[derive(Debug)]
pub struct Weights<'a> {
    source: Source<'a>,
    prefix: String,
    dtype: DType,
    device: Device,
}

/// How a random tensor is initialised, decided from its name.
#[derive(Debug, Clone, Copy, PartialEq)]
enum RandomKind {
    /// Exactly one.
    One,
    /// `1 + N(0, RANDOM_NORM_STD²)`.
    Norm,
    /// `N(0, RANDOM_INIT_STD²)`.
    Matrix,
}

impl RandomKind {
    fn of(name: &str) -> Self {
        if name.ends_with("layer_scalar") || name.ends_with("per_expert_scale") {
            RandomKind::One
        } else if name.ends_with("norm.weight") || name.ends_with("router.scale") {
            RandomKind::Norm
        } else {
            RandomKind::Matrix
        }
    }

    fn mean_std(self) -> (f64, f64) {
        match self {
            RandomKind::One => (1.0, 0.0),
            RandomKind::Norm => (1.0, RANDOM_NORM_STD),
            RandomKind::Matrix => (0.0, RANDOM_INIT_STD),
        }
    }
}

impl<'a> Weights<'a> {
    /// Wraps a checkpoint for loading in `dtype` on `device`.
    pub fn new(ckpt: &'a Checkpoint, dtype: DType, device: &Device) -> Self {
        Weights {
            prefix: ckpt.prefix().to_string(),
            source: Source::Checkpoint(ckpt),
            dtype,
            device: device.clone(),
        }
    }

    /// Random values (see the module docs) keyed by `seed` and the tensor name, with the
    /// `model.language_model` prefix.
    pub fn random(seed: u64, dtype: DType, device: &Device) -> Weights<'static> {
        Weights {
            source: Source::Random { seed },
            prefix: RANDOM_PREFIX.to_string(),
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

    /// The text prefix (`model.language_model` or `model`).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Tensor `{prefix}.{name}` with the given shape, in the model dtype.
    pub fn tensor(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        match &self.source {
            Source::Checkpoint(ckpt) => ckpt.tensor(name, shape, self.dtype, &self.device),
            Source::Random { seed } => self.random_tensor(*seed, name, shape),
        }
    }

    /// A frozen projection `{prefix}.{module}.weight` of shape `(out, in)`, named by its module path.
    pub fn linear(&self, module: &str, out: usize, inp: usize) -> Result<LoraLinear> {
        let w = self.tensor(&format!("{module}.weight"), &[out, inp])?;
        Ok(LoraLinear::new(format!("{}.{module}", self.prefix()), w))
    }

    fn random_tensor(&self, seed: u64, name: &str, shape: &[usize]) -> Result<Tensor> {
        let (mean, std) = RandomKind::of(name).mean_std();
        let key = mix64(seed ^ mix64(fnv1a64(format!("{}.{name}", self.prefix).as_bytes())));
        let t = if std == 0.0 {
            Tensor::ones(shape, self.dtype, &self.device)?
        } else if self.device.is_cpu() {
            let n: usize = shape.iter().product();
            let v: Vec<f32> = (0..n as u64)
                .map(|i| (mean + std * normal(key, i)) as f32)
                .collect();
            Tensor::from_vec(v, shape, &self.device)?.to_dtype(self.dtype)?
        } else {
            // curand draws f32 only; one generator per tensor keeps values order-independent.
            self.device.set_seed(key)?;
            Tensor::randn(mean as f32, std as f32, shape, &self.device)?.to_dtype(self.dtype)?
        };
        Ok(t)
    }
}

/// Element `i` of a standard normal stream `key` (Box–Muller on two uniforms in `(0, 1)`).
fn normal(key: u64, i: u64) -> f64 {
    let unit = |j: u64| ((stream_u64(key, j) >> 11) as f64 + 0.5) * (1.0 / (1u64 << 53) as f64);
    box_muller(unit(2 * i), unit(2 * i + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_follow_names() {
        assert_eq!(RandomKind::of("layers.3.layer_scalar"), RandomKind::One);
        assert_eq!(
            RandomKind::of("layers.3.self_attn.q_norm.weight"),
            RandomKind::Norm
        );
        assert_eq!(
            RandomKind::of("layers.0.input_layernorm.weight"),
            RandomKind::Norm
        );
        assert_eq!(RandomKind::of("norm.weight"), RandomKind::Norm);
        assert_eq!(
            RandomKind::of("layers.0.mlp.up_proj.weight"),
            RandomKind::Matrix
        );
        assert_eq!(RandomKind::of("embed_tokens.weight"), RandomKind::Matrix);
    }

    #[test]
    fn cpu_values_have_the_requested_moments_and_repeat() {
        let w = Weights::random(7, DType::F32, &Device::Cpu);
        let t = w
            .tensor("layers.0.mlp.up_proj.weight", &[200, 100])
            .unwrap();
        let v = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let n = v.len() as f64;
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n;
        let sd = (v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n).sqrt();
        assert!(mean.abs() < 5e-4, "mean {mean}");
        assert!((sd - RANDOM_INIT_STD).abs() < 5e-4, "sd {sd}");
        let again = w
            .tensor("layers.0.mlp.up_proj.weight", &[200, 100])
            .unwrap();
        assert_eq!(again.flatten_all().unwrap().to_vec1::<f32>().unwrap(), v);
        let other = w
            .tensor("layers.1.mlp.up_proj.weight", &[200, 100])
            .unwrap();
        assert_ne!(other.flatten_all().unwrap().to_vec1::<f32>().unwrap(), v);
        let norm = w
            .tensor("norm.weight", &[64])
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        assert!(norm.iter().all(|&x| (x - 1.0).abs() < 0.06));
        assert!(norm.iter().any(|&x| x != 1.0));
    }
}
