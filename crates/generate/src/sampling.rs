//! Choosing the next token from a row of logits: greedy, or sampling with transformers' warpers
//! in transformers' order (temperature, then top-k, then top-p) and a seeded RNG.
//!
//! - temperature: logits divided by `T`;
//! - top-k: tokens scoring below the `k`-th largest score are removed (ties with it are kept);
//! - top-p: over the softmax of what is left, sorted ascending, tokens whose cumulative
//!   probability is `<= 1 − p` are removed, the most likely token always kept;
//! - then one draw from the softmax of the remaining scores.
//!
//! Draw `n` (one per row per step, rows in order) is element `n` of `g4ft-hash`'s SplitMix64
//! stream keyed on the seed: the same seed gives the same text on every machine and device. It
//! does not reproduce PyTorch's `multinomial` stream.

use g4ft_hash::{stream_key, stream_unit_f64};

use crate::error::{GenerateError, Result};

/// How tokens are chosen.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Sampling {
    /// The most likely token (argmax on the model's device).
    Greedy,
    /// A draw from the warped distribution.
    Random(SamplingParams),
}

/// Sampling settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature, `> 0`.
    pub temperature: f64,
    /// Keep the `k` most likely tokens; 0 keeps all.
    pub top_k: usize,
    /// Nucleus mass in `(0, 1]`; 1 keeps all.
    pub top_p: f64,
    /// RNG seed.
    pub seed: u64,
}

impl SamplingParams {
    /// Errors on a temperature `<= 0` or a top-p outside `(0, 1]`, naming the option.
    pub fn validate(&self) -> Result<()> {
        if !(self.temperature > 0.0 && self.temperature.is_finite()) {
            return Err(GenerateError::Option {
                option: "temperature",
                msg: format!(
                    "must be > 0, got {} (temperature 0 is greedy decoding: `--greedy`)",
                    self.temperature
                ),
            });
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(GenerateError::Option {
                option: "top_p",
                msg: format!("must be in (0, 1], got {}", self.top_p),
            });
        }
        Ok(())
    }
}

/// A seeded sampler.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    key: u64,
    draws: u64,
}

impl Sampler {
    /// A sampler for validated `params`.
    pub fn new(params: SamplingParams) -> Result<Self> {
        params.validate()?;
        Ok(Sampler {
            params,
            key: stream_key(&[params.seed]),
            draws: 0,
        })
    }

    /// The probabilities the next draw uses (0 on removed tokens), in f64.
    pub fn probabilities(&self, logits: &[f32]) -> Vec<f64> {
        let p = &self.params;
        let mut scores: Vec<f64> = logits.iter().map(|&x| x as f64 / p.temperature).collect();
        if p.top_k > 0 && p.top_k < scores.len() {
            let mut sorted = scores.clone();
            sorted.sort_by(|a, b| b.total_cmp(a));
            let kth = sorted[p.top_k - 1];
            for s in scores.iter_mut().filter(|s| **s < kth) {
                *s = f64::NEG_INFINITY;
            }
        }
        let mut probs = softmax(&scores);
        if p.top_p < 1.0 {
            let mut order: Vec<usize> = (0..probs.len()).collect();
            // Ascending by score; the last entry (most likely) is always kept.
            order.sort_by(|&a, &b| scores[a].total_cmp(&scores[b]).then(b.cmp(&a)));
            let mut cum = 0.0;
            for &i in &order[..order.len() - 1] {
                cum += probs[i];
                if cum <= 1.0 - p.top_p {
                    scores[i] = f64::NEG_INFINITY;
                }
            }
            probs = softmax(&scores);
        }
        probs
    }

    /// Draws a token from `logits` (one row).
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let probs = self.probabilities(logits);
        let u = stream_unit_f64(self.key, self.draws);
        self.draws += 1;
        let mut cum = 0.0;
        let mut last = 0;
        for (i, &q) in probs.iter().enumerate() {
            if q == 0.0 {
                continue;
            }
            cum += q;
            last = i;
            if u < cum {
                return i as u32;
            }
        }
        last as u32 // rounding left `cum` just below 1
    }
}

fn softmax(scores: &[f64]) -> Vec<f64> {
    let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = scores.iter().map(|&s| (s - m).exp()).collect();
    let z: f64 = e.iter().sum();
    e.into_iter().map(|x| x / z).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f64, top_k: usize, top_p: f64) -> SamplingParams {
        SamplingParams {
            temperature,
            top_k,
            top_p,
            seed: 5,
        }
    }

    #[test]
    fn warpers_keep_what_transformers_keeps() {
        let logits = [2.0f32, 1.0, 0.0, -1.0, 1.0];
        let s = Sampler::new(params(1.0, 2, 1.0)).unwrap();
        // top-2 keeps 2.0 and both 1.0 ties.
        let p = s.probabilities(&logits);
        assert!(p[0] > 0.0 && p[1] > 0.0 && p[4] > 0.0 && p[2] == 0.0 && p[3] == 0.0);
        // Full softmax: [0.5206, 0.1915, 0.0705, 0.0259, 0.1915]; ascending cumulative
        // 0.0259, 0.0964, 0.2879, ... -> top_p 0.8 removes ids 3 and 2 (<= 0.2), keeps the rest.
        let s = Sampler::new(params(1.0, 0, 0.8)).unwrap();
        let p = s.probabilities(&logits);
        assert_eq!(p.iter().filter(|&&x| x > 0.0).count(), 3, "{p:?}");
        assert!(p[2] == 0.0 && p[3] == 0.0);
        // A tiny top_p keeps exactly the most likely token.
        let s = Sampler::new(params(1.0, 0, 1e-6)).unwrap();
        assert_eq!(s.probabilities(&logits), vec![1.0, 0.0, 0.0, 0.0, 0.0]);
        // Temperature sharpens.
        let cold = Sampler::new(params(0.5, 0, 1.0))
            .unwrap()
            .probabilities(&logits);
        let warm = Sampler::new(params(2.0, 0, 1.0))
            .unwrap()
            .probabilities(&logits);
        assert!(cold[0] > warm[0]);
    }

    #[test]
    fn draws_follow_the_distribution_and_the_seed() {
        let logits = [0.0f32, (3.0f32).ln(), f32::NEG_INFINITY];
        let mut s = Sampler::new(params(1.0, 0, 1.0)).unwrap();
        let draws: Vec<u32> = (0..4000).map(|_| s.sample(&logits)).collect();
        let ones = draws.iter().filter(|&&t| t == 1).count() as f64 / 4000.0;
        assert!((ones - 0.75).abs() < 0.03, "{ones}");
        assert!(!draws.contains(&2));
        let mut again = Sampler::new(params(1.0, 0, 1.0)).unwrap();
        let first: Vec<u32> = (0..50).map(|_| again.sample(&logits)).collect();
        assert_eq!(first, draws[..50]);
        let mut top1 = Sampler::new(params(1.0, 1, 1.0)).unwrap();
        assert!((0..20).all(|_| top1.sample(&logits) == 1));
    }

    #[test]
    fn bad_options_are_named() {
        let e = Sampler::new(params(0.0, 0, 1.0)).unwrap_err().to_string();
        assert!(e.starts_with("temperature:"), "{e}");
        let e = Sampler::new(params(1.0, 0, 1.5)).unwrap_err().to_string();
        assert!(e.starts_with("top_p:"), "{e}");
    }
}
