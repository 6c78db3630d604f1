//! Export of an adapter as a llama.cpp LoRA adapter (GGUF), the file `convert_lora_to_gguf.py`
//! writes and llama.cpp's `--lora` loads.
//!
//! What llama.cpp's loader reads: metadata `general.type = "adapter"`,
//! `general.architecture` (must equal the base model's llama.cpp architecture), `adapter.type =
//! "lora"` and `adapter.lora.alpha` (f32); per adapted module two tensors named after the base
//! model's GGUF tensor, `<name>.lora_a` holding `A (r, in)` (ggml `ne = [in, r]`) and
//! `<name>.lora_b` holding `B (out, r)` (`ne = [r, out]`). It scales each pair by `alpha / r`,
//! `r` being that pair's rank (by 1 when alpha is 0). PEFT's scale differs under rsLoRA
//! (`alpha / √r`) or an `alpha_pattern`; there the ratio is folded into `lora_b`, so llama.cpp
//! computes exactly PEFT's `scale · B·A`. Written with candle's GGUF writer, through a temporary
//! file renamed into place.

use std::path::Path;

use candle_core::quantized::{gguf_file, GgmlDType, QTensor};

use crate::error::{io_err, CandleContext, LoraError, Result};
use crate::io::AdapterWeights;
use crate::target::Targeting;

/// What [`write_gguf_adapter`] wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufReport {
    /// Tensors written (two per module).
    pub tensors: usize,
    /// `adapter.lora.alpha`.
    pub alpha: f32,
    /// Modules whose `lora_b` carries a folded scale ratio.
    pub folded: usize,
}

/// Writes `adapter` to `path` as a llama.cpp LoRA GGUF for a base model of llama.cpp
/// architecture `architecture`, tensors in `dtype` (`F32`, `F16` or `BF16`). `tensor_name` maps a
/// module path to its base GGUF tensor name (`blk.3.attn_q.weight`); a module it does not know is
/// an error naming the module.
pub fn write_gguf_adapter(
    adapter: &AdapterWeights,
    path: &Path,
    architecture: &str,
    dtype: GgmlDType,
    tensor_name: impl Fn(&str) -> Option<String>,
) -> Result<GgufReport> {
    if !matches!(dtype, GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16) {
        return Err(LoraError::Safetensors {
            path: path.to_path_buf(),
            msg: format!("GGUF adapter tensors must be F32, F16 or BF16, got {dtype:?}"),
        });
    }
    let targeting = Targeting::new(&adapter.config)?;
    let alpha = adapter.config.lora_alpha as f32;
    let mut tensors: Vec<(String, QTensor)> = Vec::new();
    let mut folded = 0;
    for (module, (a, b)) in &adapter.modules {
        let name = tensor_name(module).ok_or_else(|| LoraError::Safetensors {
            path: adapter.file.clone(),
            msg: format!("module {module} has no llama.cpp `{architecture}` tensor name"),
        })?;
        let r = a.dims()[0] as f64;
        let llama_scale = if alpha != 0.0 { alpha as f64 / r } else { 1.0 };
        let ratio = targeting.scale(module) / llama_scale;
        let ctx = || format!("{module}: GGUF tensors");
        let b = if (ratio - 1.0).abs() > 1e-12 {
            folded += 1;
            (b * ratio).ctx(ctx)?
        } else {
            b.clone()
        };
        tensors.push((
            format!("{name}.lora_a"),
            QTensor::quantize(a, dtype).ctx(ctx)?,
        ));
        tensors.push((
            format!("{name}.lora_b"),
            QTensor::quantize(&b, dtype).ctx(ctx)?,
        ));
    }
    let meta = [
        (
            "general.architecture",
            gguf_file::Value::String(architecture.to_string()),
        ),
        ("general.type", gguf_file::Value::String("adapter".into())),
        ("adapter.type", gguf_file::Value::String("lora".into())),
        ("adapter.lora.alpha", gguf_file::Value::F32(alpha)),
    ];
    let meta_refs: Vec<(&str, &gguf_file::Value)> = meta.iter().map(|(k, v)| (*k, v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let tmp = path.with_extension("gguf.tmp");
    {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&tmp).map_err(io_err(&tmp))?);
        gguf_file::write(&mut f, &meta_refs, &tensor_refs)
            .ctx(|| format!("writing {}", tmp.display()))?;
        std::io::Write::flush(&mut f).map_err(io_err(&tmp))?;
    }
    std::fs::rename(&tmp, path).map_err(io_err(path))?;
    Ok(GgufReport {
        tensors: tensors.len(),
        alpha,
        folded,
    })
}
