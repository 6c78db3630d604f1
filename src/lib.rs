//! g4ft: umbrella crate re-exporting the workspace crates for the examples, benches and tests.
pub use g4ft_data as data;
pub use g4ft_ddp as ddp;
pub use g4ft_gemma4 as gemma4;
pub use g4ft_generate as generate;
pub use g4ft_hash as hash;
pub use g4ft_hub as hub;
pub use g4ft_lora as lora;
pub use g4ft_ops as ops;
pub use g4ft_trainer as trainer;
pub use g4ft_wait as wait;

use std::path::Path;

use anyhow::Context;

/// Where and in which dtype an inference command (`generate`, `score`, `bench_generate`) runs
/// the model: `#[command(flatten)]` gives it `--device` and `--dtype`.
#[derive(Debug, Clone, clap::Args)]
pub struct InferenceSettings {
    /// Weight / activation dtype (auto: bf16 on a GPU, f32 on the CPU).
    #[arg(long, default_value = "auto", value_parser = ["auto", "f32", "bf16"])]
    pub dtype: String,
    /// Device (auto: GPU 0 when this build has CUDA support and the GPU opens, else the CPU).
    #[arg(long, default_value = "auto", value_parser = ["auto", "cpu", "cuda"])]
    pub device: String,
}

impl InferenceSettings {
    /// The device and dtype, `auto` resolved, and a line to print when `auto` chose the GPU, or
    /// the CPU on a machine with an NVIDIA driver (saying why, and that a build with
    /// `--features cuda` would use the GPU); on a machine without one the CPU needs no saying.
    pub fn resolve(
        &self,
    ) -> anyhow::Result<(candle_core::Device, candle_core::DType, Option<String>)> {
        let device = match self.device.as_str() {
            "cuda" => candle_core::Device::new_cuda(0)
                .context("--device cuda (build with --features cuda)")?,
            "cpu" => candle_core::Device::Cpu,
            _ => candle_core::Device::new_cuda(0).unwrap_or(candle_core::Device::Cpu),
        };
        let dtype = match (self.dtype.as_str(), device.is_cuda()) {
            ("bf16", _) | ("auto", true) => candle_core::DType::BF16,
            _ => candle_core::DType::F32,
        };
        let auto = self.device == "auto" || self.dtype == "auto";
        let why_cpu = (self.device == "auto"
            && !device.is_cuda()
            && Path::new("/proc/driver/nvidia/version").exists())
        .then_some(if cfg!(feature = "cuda") {
            " (this machine has an NVIDIA driver, but GPU 0 did not open)"
        } else {
            " (this machine has an NVIDIA driver; a build with --features cuda runs on its GPU)"
        });
        let note = (auto && (device.is_cuda() || why_cpu.is_some())).then(|| {
            let on = if device.is_cuda() { "GPU 0" } else { "the CPU" };
            format!(
                "running on {on} in {}{}",
                dtype.as_str(),
                why_cpu.unwrap_or_default()
            )
        });
        Ok((device, dtype, note))
    }
}

/// The model of an inference command (`score`, `generate`): loaded on `device` in `dtype`, with
/// the PEFT adapter in `adapter` attached unmerged when given.
pub fn load_inference_model(
    model: &str,
    adapter: Option<&Path>,
    device: &candle_core::Device,
    dtype: candle_core::DType,
) -> anyhow::Result<gemma4::Gemma4Model> {
    let mut m = gemma4::Gemma4Model::load(model, dtype, device)?;
    if let Some(dir) = adapter {
        let context = || format!("--adapter {}", dir.display());
        if Path::new(model).is_dir() {
            lora::check_not_merged(Path::new(model), dir).with_context(context)?;
        }
        lora::load_adapter(dir, m.projections_mut()).with_context(context)?;
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::DType;

    fn settings(device: &str, dtype: &str) -> InferenceSettings {
        InferenceSettings {
            device: device.into(),
            dtype: dtype.into(),
        }
    }

    #[test]
    fn auto_takes_the_gpu_in_bf16_when_one_opens_else_the_cpu_in_f32() {
        let (device, dtype, note) = settings("auto", "auto").resolve().unwrap();
        if candle_core::Device::new_cuda(0).is_ok() {
            assert!(device.is_cuda());
            assert_eq!(dtype, DType::BF16);
            assert_eq!(note.as_deref(), Some("running on GPU 0 in bf16"));
        } else {
            assert!(device.is_cpu());
            assert_eq!(dtype, DType::F32);
            // Said only where a driver suggests a GPU the build could use.
            let driver = Path::new("/proc/driver/nvidia/version").exists();
            assert_eq!(note.is_some(), driver, "{note:?}");
        }
        let (device, dtype, note) = settings("cpu", "bf16").resolve().unwrap();
        assert!(device.is_cpu() && note.is_none());
        assert_eq!(dtype, DType::BF16);
        if !cfg!(feature = "cuda") {
            let err = settings("cuda", "auto").resolve().unwrap_err();
            assert!(format!("{err:#}").contains("--features cuda"), "{err:#}");
        }
    }
}
