//! Attaching fresh adapters to a model's projections and listing the trainable parameters.
//!
//! Works on any sequence of [`LoraLinear`]s in model order (the model's `projections_mut()`), so
//! the crate stays model-agnostic. Parameter order is the design's contract: for each projection
//! with an adapter, in model order, `lora_A` then `lora_B`.

use candle_core::Var;

use crate::config::LoraConfig;
use crate::error::{CandleContext, Result};
use crate::init::init_adapter_values;
use crate::linear::{Adapter, LoraLinear};
use crate::target::Targeting;

/// A trainable tensor with its PEFT-style name (`<module path>.lora_A.weight`).
#[derive(Debug, Clone)]
pub struct NamedVar {
    /// `<module path>.lora_A.weight` or `<module path>.lora_B.weight` (the PEFT key without
    /// `base_model.model.`).
    pub name: String,
    /// The fp32 parameter.
    pub var: Var,
}

/// Attaches a freshly initialised adapter (see [`init_adapter_values`]) to every targeted projection and
/// removes adapters from the others. Returns the adapted module paths, in model order.
///
/// `seed` must be the same on every rank (init), unlike the per-rank dropout seed of
/// [`crate::LoraContext`]. Errors when the config targets none of the projections (the message
/// lists some available paths); targeted names absent in some layers are simply skipped.
pub fn attach<'a>(
    cfg: &LoraConfig,
    projections: impl IntoIterator<Item = &'a mut LoraLinear>,
    seed: u64,
) -> Result<Vec<String>> {
    cfg.validate("LoraConfig")?;
    let targeting = Targeting::new(cfg)?;
    let mut projections: Vec<&mut LoraLinear> = projections.into_iter().collect();
    let chosen = targeting.select(projections.iter().map(|p| p.path()))?;
    let mut adapted = Vec::new();
    for (proj, chosen) in projections.iter_mut().zip(chosen) {
        if !chosen {
            proj.set_adapter(None);
            continue;
        }
        let path = proj.path().to_string();
        let r = targeting.rank(&path);
        let (inf, outf) = (proj.in_features(), proj.out_features());
        let (a, b) = init_adapter_values(cfg.init_lora_weights, seed, &path, r, inf, outf);
        let device = proj.weight().device().clone();
        let a = Var::from_vec(a, (r, inf), &device).ctx(|| format!("{path}: lora_A"))?;
        let b = Var::from_vec(b, (outf, r), &device).ctx(|| format!("{path}: lora_B"))?;
        proj.set_adapter(Some(Adapter {
            a,
            b,
            scale: targeting.scale(&path),
            dropout: cfg.lora_dropout,
        }));
        adapted.push(path);
    }
    Ok(adapted)
}

/// The adapters' parameters in model order: `lora_A` then `lora_B` of each adapted projection.
pub fn lora_parameters<'a>(projections: impl IntoIterator<Item = &'a LoraLinear>) -> Vec<NamedVar> {
    let mut out = Vec::new();
    for p in projections {
        if let Some(ad) = p.adapter() {
            for (which, var) in [("lora_A", &ad.a), ("lora_B", &ad.b)] {
                out.push(NamedVar {
                    name: format!("{}.{which}.weight", p.path()),
                    var: var.clone(),
                });
            }
        }
    }
    out
}
