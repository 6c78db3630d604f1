//! Shared helpers for the g4ft-lora integration tests: the Rust twin of the toy model in
//! `tools/reference/lora/toy.py`, fixture paths, and `assert_close`.
#![allow(dead_code)] // each test binary uses a different subset

use std::collections::HashMap;
use std::path::PathBuf;

use candle_core::{Device, Tensor, D};
use g4ft_lora::{LoraContext, LoraLinear};

/// `tools/reference/lora/fixtures`.
pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tools/reference/lora/fixtures")
}

/// Reads a safetensors file onto the CPU.
pub fn load(path: &std::path::Path) -> HashMap<String, Tensor> {
    candle_core::safetensors::load(path, &Device::Cpu)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The toy model: `model.layers.{0,1}` with q/k/v/o and gate/up/down projections (layer 1 has no
/// v_proj), then `model.proj_out`. Projections are kept in model order.
pub struct Toy {
    /// Every linear, model order (layer 0: q, k, v, o, gate, up, down; layer 1 ...; proj_out).
    pub projections: Vec<LoraLinear>,
}

const LAYERS: usize = 2;

impl Toy {
    /// Builds the toy from `fixtures/base/model.safetensors`.
    pub fn load_base() -> Toy {
        let weights = load(&fixtures().join("base/model.safetensors"));
        let mut projections = Vec::new();
        let mut add = |path: String| {
            if let Some(w) = weights.get(&format!("{path}.weight")) {
                projections.push(LoraLinear::new(path, w.clone()));
            }
        };
        for l in 0..LAYERS {
            for p in ["q_proj", "k_proj", "v_proj", "o_proj"] {
                add(format!("model.layers.{l}.self_attn.{p}"));
            }
            for p in ["gate_proj", "up_proj", "down_proj"] {
                add(format!("model.layers.{l}.mlp.{p}"));
            }
        }
        add("model.proj_out".into());
        assert_eq!(
            projections.len(),
            14,
            "toy fixture: 7 + 6 layer projections + proj_out"
        );
        Toy { projections }
    }

    fn proj(&self, path: &str) -> Option<&LoraLinear> {
        self.projections.iter().find(|p| p.path() == path)
    }

    fn apply(&self, path: &str, x: &Tensor, ctx: &LoraContext) -> candle_core::Result<Tensor> {
        self.proj(path)
            .unwrap_or_else(|| panic!("no {path}"))
            .forward(x, ctx)
    }

    /// The toy forward of `toy.py` (x: (b, t, 8) → (b, t, 8)).
    pub fn forward(&self, x: &Tensor, ctx: &LoraContext) -> candle_core::Result<Tensor> {
        let mut h = x.clone();
        for l in 0..LAYERS {
            let attn = format!("model.layers.{l}.self_attn");
            let q = self.apply(&format!("{attn}.q_proj"), &h, ctx)?;
            let k = self.apply(&format!("{attn}.k_proj"), &h, ctx)?;
            let v_path = format!("{attn}.v_proj");
            let v = match self.proj(&v_path) {
                Some(_) => self.apply(&v_path, &h, ctx)?,
                None => k.clone(),
            };
            let kv = (k * v)?;
            let a = (q.tanh()? + Tensor::cat(&[&kv, &kv, &kv], D::Minus1)?)?;
            let residual = h.clone();
            h = (residual + self.apply(&format!("{attn}.o_proj"), &a, ctx)?)?;
            let mlp = format!("model.layers.{l}.mlp");
            let gate = self.apply(&format!("{mlp}.gate_proj"), &h, ctx)?.tanh()?;
            let up = self.apply(&format!("{mlp}.up_proj"), &h, ctx)?;
            let residual = h.clone();
            h = (residual + self.apply(&format!("{mlp}.down_proj"), &(gate * up)?, ctx)?)?;
        }
        self.apply("model.proj_out", &h, ctx)
    }

    /// `mean(y²)`, the fixtures' loss.
    pub fn loss(y: &Tensor) -> candle_core::Result<Tensor> {
        y.sqr()?.mean_all()
    }

    /// Number of base parameters.
    pub fn base_params(&self) -> u64 {
        self.projections
            .iter()
            .map(|p| (p.in_features() * p.out_features()) as u64)
            .sum()
    }
}

/// Training context without dropout randomness concerns (dropout is 0 in the fixtures).
pub const TRAIN: LoraContext = LoraContext {
    training: true,
    track_grad: true,
    seed: 0,
    micro_step: 0,
};

/// Collects tensor comparisons and fails once at the end, so one run lists every mismatch.
#[derive(Default)]
pub struct Checks {
    failures: Vec<String>,
    /// Largest relative error seen.
    pub max_rel: f64,
}

impl Checks {
    /// Compares `got` with `want`: a mismatch when `max|got - want| > rtol · max|want|`. Prints the
    /// tensor name, shape, max abs and relative diff, the worst index with both values and the first
    /// values side by side.
    pub fn close(&mut self, name: &str, got: &Tensor, want: &Tensor, rtol: f64) {
        if got.dims() != want.dims() {
            self.failures.push(format!(
                "{name}: shape {:?} vs {:?}",
                got.dims(),
                want.dims()
            ));
            return;
        }
        let flat = |t: &Tensor| -> Vec<f32> {
            t.flatten_all()
                .unwrap()
                .to_dtype(candle_core::DType::F32)
                .unwrap()
                .to_vec1()
                .unwrap()
        };
        let (g, w) = (flat(got), flat(want));
        let (mut worst, mut max_abs) = (0usize, 0f64);
        for (i, (a, b)) in g.iter().zip(&w).enumerate() {
            let d = (f64::from(*a) - f64::from(*b)).abs();
            if d > max_abs || d.is_nan() {
                (worst, max_abs) = (i, d);
            }
        }
        let scale = w
            .iter()
            .map(|v| f64::from(v.abs()))
            .fold(0.0, f64::max)
            .max(1e-30);
        let rel = max_abs / scale;
        let line = format!(
            "{name} {:?}: max abs diff {max_abs:.3e}, rel {rel:.3e} (worst [{worst}]: got {} want {}); \
             first got {:?} want {:?}",
            want.dims(),
            g[worst],
            w[worst],
            &g[..g.len().min(3)],
            &w[..w.len().min(3)],
        );
        println!("{line}");
        self.max_rel = self.max_rel.max(rel);
        if rel.is_nan() || rel > rtol {
            self.failures.push(format!("{line} > rtol {rtol:e}"));
        }
    }

    /// Panics listing every mismatch, if any.
    pub fn finish(self) {
        println!("max rel diff over all checks: {:.3e}", self.max_rel);
        assert!(
            self.failures.is_empty(),
            "{} mismatches:\n{}",
            self.failures.len(),
            self.failures.join("\n")
        );
    }
}
