//! PEFT's adapter initialisation (`LoraLayer.reset_lora_parameters`, PEFT 0.21) from the
//! counter-based streams of [`g4ft_hash`].
//!
//! - `init_lora_weights = true`: A ~ kaiming_uniform(a = √5) = U(-1/√in, 1/√in), B = 0.
//! - `"gaussian"`: A ~ N(0, σ = 1/r), B = 0.
//! - `false`: A and B keep `nn.Linear`'s default init, U(-1/√fan_in, 1/√fan_in) (fan_in = in for
//!   A, r for B).
//!
//! Values depend on `(seed, module path, tensor)` only, not on iteration order or on which other
//! modules are targeted, so every rank builds the same adapters from the same seed (the post's
//! `torch.manual_seed(SEED)` before `get_peft_model`). The bits differ from torch's generator.

use crate::config::InitLoraWeights;
use g4ft_hash::{box_muller, fnv1a64, stream_key, stream_unit_f64};

/// Which adapter matrix a stream belongs to (keeps A's and B's draws independent).
#[derive(Debug, Clone, Copy)]
enum Which {
    A = 1,
    B = 2,
}

/// `n` draws of U(-bound, bound).
fn uniform(key: u64, n: usize, bound: f64) -> Vec<f32> {
    (0..n as u64)
        .map(|i| ((2.0 * stream_unit_f64(key, i) - 1.0) * bound) as f32)
        .collect()
}

/// `n` draws of N(0, std²) by Box–Muller on pairs of uniforms.
fn normal(key: u64, n: usize, std: f64) -> Vec<f32> {
    (0..n as u64)
        .map(|i| {
            // 1 - u keeps the log argument in (0, 1].
            let u1 = 1.0 - stream_unit_f64(key, 2 * i);
            let u2 = stream_unit_f64(key, 2 * i + 1);
            (box_muller(u1, u2) * std) as f32
        })
        .collect()
}

fn key(seed: u64, path: &str, which: Which) -> u64 {
    stream_key(&[seed, fnv1a64(path.as_bytes()), which as u64])
}

/// Initial `lora_A` (r, in) and `lora_B` (out, r) of module `path`, row-major fp32.
pub fn init_adapter_values(
    init: InitLoraWeights,
    seed: u64,
    path: &str,
    r: usize,
    in_features: usize,
    out_features: usize,
) -> (Vec<f32>, Vec<f32>) {
    let kaiming_a = || {
        uniform(
            key(seed, path, Which::A),
            r * in_features,
            1.0 / (in_features as f64).sqrt(),
        )
    };
    match init {
        InitLoraWeights::Default => (kaiming_a(), vec![0.0; out_features * r]),
        InitLoraWeights::Gaussian => (
            normal(key(seed, path, Which::A), r * in_features, 1.0 / r as f64),
            vec![0.0; out_features * r],
        ),
        InitLoraWeights::Random => (
            kaiming_a(),
            uniform(
                key(seed, path, Which::B),
                out_features * r,
                1.0 / (r as f64).sqrt(),
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn moments(v: &[f32]) -> (f64, f64) {
        let n = v.len() as f64;
        let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
        let var = v
            .iter()
            .map(|&x| (f64::from(x) - mean).powi(2))
            .sum::<f64>()
            / n;
        (mean, var)
    }

    #[test]
    fn kaiming_bound_and_variance() {
        let (r, fan_in, out) = (16, 256, 8);
        let (a, b) = init_adapter_values(InitLoraWeights::Default, 42, "m.q_proj", r, fan_in, out);
        assert_eq!((a.len(), b.len()), (r * fan_in, out * r));
        assert!(b.iter().all(|&x| x == 0.0));
        let bound = 1.0 / (fan_in as f32).sqrt();
        assert!(a.iter().all(|&x| x.abs() <= bound));
        // U(-b, b) has variance b²/3 = 1/(3·fan_in).
        let (mean, var) = moments(&a);
        let want = 1.0 / (3.0 * fan_in as f64);
        assert!(
            mean.abs() < 3e-3 && (var / want - 1.0).abs() < 0.05,
            "{mean} {var} {want}"
        );
    }

    #[test]
    fn gaussian_std_is_one_over_r() {
        let (a, _) = init_adapter_values(InitLoraWeights::Gaussian, 1, "p", 8, 2048, 4);
        let (mean, var) = moments(&a);
        assert!(
            mean.abs() < 0.01 && (var.sqrt() * 8.0 - 1.0).abs() < 0.03,
            "{mean} {var}"
        );
    }

    #[test]
    fn deterministic_per_seed_and_path() {
        let f = |seed, path| init_adapter_values(InitLoraWeights::Random, seed, path, 4, 32, 16);
        assert_eq!(f(7, "a.q_proj"), f(7, "a.q_proj"));
        assert_ne!(f(7, "a.q_proj").0, f(8, "a.q_proj").0);
        assert_ne!(f(7, "a.q_proj").0, f(7, "a.k_proj").0);
        let (a, b) = f(7, "a.q_proj");
        assert_ne!(a[..4], b[..4], "A and B draw from separate streams");
        assert!(b.iter().all(|&x| x.abs() <= 0.5) && b.iter().any(|&x| x != 0.0));
    }
}
