//! transformers' `get_cosine_schedule_with_warmup` (num_cycles 0.5, min_lr_rate 0), as a
//! `LambdaLR`: the learning rate for the optimizer step about to run is
//! `base_lr · λ(k)` where `k` counts the scheduler steps taken so far and
//! ```text
//! λ(k) = k / max(1, warmup)                                         if k < warmup
//!      = max(0, ½·(1 + cos(π · 2·num_cycles · (k − warmup) / max(1, total − warmup))))  otherwise
//! ```
//! (transformers 5.23 `optimization.py`). As in the post, the scheduler is stepped once after each
//! optimizer step, so the very first step runs at `λ(0) = 0` when `warmup > 0`.

use serde::{Deserialize, Serialize};

/// Cosine decay to 0 after a linear warmup. The only state is the step counter, saved in the
/// trainer state so a resumed run continues on the same curve.
///
/// ```
/// use g4ft_trainer::schedule::CosineWithWarmup;
/// let mut s = CosineWithWarmup::new(1e-4, 20, 400);
/// assert_eq!(s.lr(), 0.0); // step 1 runs at lr 0, as in transformers
/// for _ in 0..20 {
///     s.advance(); // after each optimizer step
/// }
/// assert_eq!(s.lr(), 1e-4); // warmup done: the peak
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CosineWithWarmup {
    /// Peak learning rate (the optimizer's `lr`).
    pub base_lr: f64,
    /// Warmup steps (`num_warmup_steps`).
    pub warmup: u64,
    /// Total optimizer steps of the run (`num_training_steps`).
    pub total: u64,
    /// Number of cosine half-waves ×0.5; transformers' default 0.5 decays exactly to 0.
    pub num_cycles: f64,
    /// Scheduler steps taken (`LambdaLR.last_epoch`).
    pub step: u64,
}

impl CosineWithWarmup {
    /// The post's schedule: `get_cosine_schedule_with_warmup(opt, warmup, total)`.
    pub fn new(base_lr: f64, warmup: u64, total: u64) -> Self {
        Self {
            base_lr,
            warmup,
            total,
            num_cycles: 0.5,
            step: 0,
        }
    }

    /// The multiplier λ at scheduler step `k`.
    pub fn lambda(&self, k: u64) -> f64 {
        if k < self.warmup {
            return k as f64 / self.warmup.max(1) as f64;
        }
        let progress =
            (k - self.warmup) as f64 / self.total.saturating_sub(self.warmup).max(1) as f64;
        let factor = 0.5 * (1.0 + (std::f64::consts::PI * self.num_cycles * 2.0 * progress).cos());
        factor.max(0.0)
    }

    /// Learning rate for the next optimizer step (torch's `get_last_lr()[0]` before
    /// `scheduler.step()`).
    pub fn lr(&self) -> f64 {
        self.base_lr * self.lambda(self.step)
    }

    /// Advances by one optimizer step (torch's `scheduler.step()`).
    pub fn advance(&mut self) {
        self.step += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warmup_then_cosine_to_zero() {
        let mut s = CosineWithWarmup::new(1.0, 4, 12);
        assert_eq!(s.lr(), 0.0, "the first step runs at lr 0 when warming up");
        let lrs: Vec<f64> = (0..=12)
            .map(|_| {
                let lr = s.lr();
                s.advance();
                lr
            })
            .collect();
        assert_eq!(&lrs[..5], &[0.0, 0.25, 0.5, 0.75, 1.0]);
        assert!(
            (lrs[8] - 0.5).abs() < 1e-12,
            "half way down at the middle of the decay"
        );
        assert!(lrs[12].abs() < 1e-12);
        assert!(lrs.windows(2).skip(4).all(|w| w[1] <= w[0]));
    }

    #[test]
    fn serde_roundtrip_keeps_position() {
        let mut s = CosineWithWarmup::new(1e-4, 20, 400);
        (0..37).for_each(|_| s.advance());
        let back: CosineWithWarmup =
            serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back, s);
        assert_eq!(back.lr(), s.lr());
    }
}
