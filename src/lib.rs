//! g4ft: umbrella crate re-exporting the workspace crates for the examples, benches and tests.
pub use g4ft_data as data;
pub use g4ft_ddp as ddp;
pub use g4ft_gemma4 as gemma4;
pub use g4ft_generate as generate;
pub use g4ft_hash as hash;
pub use g4ft_lora as lora;
pub use g4ft_ops as ops;
pub use g4ft_trainer as trainer;

use std::path::Path;

use anyhow::Context;

/// The model of an inference command (`score`, `generate`): loaded on `device` (`cpu` or `cuda`,
/// GPU 0) in `dtype` (`f32` or `bf16`), with the PEFT adapter in `adapter` attached unmerged
/// when given.
pub fn load_inference_model(
    model: &str,
    adapter: Option<&Path>,
    device: &str,
    dtype: &str,
) -> anyhow::Result<gemma4::Gemma4Model> {
    let device = match device {
        "cuda" => candle_core::Device::new_cuda(0)
            .context("--device cuda (build with --features cuda)")?,
        _ => candle_core::Device::Cpu,
    };
    let dtype = if dtype == "bf16" {
        candle_core::DType::BF16
    } else {
        candle_core::DType::F32
    };
    let mut m = gemma4::Gemma4Model::load(model, dtype, &device)?;
    if let Some(dir) = adapter {
        let context = || format!("--adapter {}", dir.display());
        if Path::new(model).is_dir() {
            lora::check_not_merged(Path::new(model), dir).with_context(context)?;
        }
        lora::load_adapter(dir, m.projections_mut()).with_context(context)?;
    }
    Ok(m)
}
