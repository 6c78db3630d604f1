//! transformers' learning-rate schedules as `LambdaLR`s: the learning rate for the optimizer step
//! about to run is `base_lr · λ(k)` where `k` counts the scheduler steps taken so far and, with
//! `w = warmup`, `T = total` (transformers 5.23 `optimization.py`):
//! ```text
//! warmup (all but constant):  λ(k) = k / max(1, w)                                  if k < w
//! cosine:                     λ(k) = max(0, ½·(1 + cos(π · 2·num_cycles · (k − w) / max(1, T − w))))
//! linear:                     λ(k) = max(0, (T − k) / max(1, T − w))
//! constant_with_warmup:       λ(k) = 1
//! constant:                   λ(k) = 1 (no warmup)
//! ```
//! As in the post, the scheduler is stepped once after each optimizer step, so the very first step
//! runs at `λ(0) = 0` when `warmup > 0`.

use serde::{Deserialize, Serialize};

/// Which schedule (`--lr-scheduler`, transformers' `lr_scheduler_type`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum LrSchedulerKind {
    /// Linear warmup, then cosine decay to 0 (the post's `get_cosine_schedule_with_warmup`).
    #[default]
    Cosine,
    /// Linear warmup, then linear decay to 0 (`get_linear_schedule_with_warmup`).
    Linear,
    /// The peak learning rate throughout, no warmup (`get_constant_schedule`).
    Constant,
    /// Linear warmup, then the peak (`get_constant_schedule_with_warmup`).
    #[value(name = "constant-with-warmup", alias = "constant_with_warmup")]
    ConstantWithWarmup,
}

/// Warmup steps of a run of `total` optimizer steps: `ceil(total · ratio)` when a ratio is given
/// (transformers' `get_warmup_steps` for a fractional `warmup_steps`), else `warmup`.
pub fn warmup_steps(warmup: usize, ratio: Option<f64>, total: u64) -> u64 {
    match ratio {
        Some(r) => (total as f64 * r).ceil() as u64,
        None => warmup as u64,
    }
}

/// A learning-rate schedule. The only state is the step counter, saved in the trainer state so a
/// resumed run continues on the same curve (or on a rebuilt one at the same step, see
/// [`LrSchedule::rebuilt`]).
///
/// ```
/// use g4ft_trainer::step::schedule::LrSchedule;
/// let mut s = LrSchedule::cosine(1e-4, 20, 400);
/// assert_eq!(s.lr(), 0.0); // step 1 runs at lr 0, as in transformers
/// for _ in 0..20 {
///     s.advance(); // after each optimizer step
/// }
/// assert_eq!(s.lr(), 1e-4); // warmup done: the peak
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LrSchedule {
    /// The schedule's shape.
    pub kind: LrSchedulerKind,
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

impl LrSchedule {
    /// `get_scheduler(kind, opt, warmup, total)` at step 0.
    pub fn new(kind: LrSchedulerKind, base_lr: f64, warmup: u64, total: u64) -> Self {
        Self {
            kind,
            base_lr,
            warmup,
            total,
            num_cycles: 0.5,
            step: 0,
        }
    }

    /// The post's schedule: `get_cosine_schedule_with_warmup(opt, warmup, total)`.
    pub fn cosine(base_lr: f64, warmup: u64, total: u64) -> Self {
        Self::new(LrSchedulerKind::Cosine, base_lr, warmup, total)
    }

    /// The schedule `new(kind, base_lr, warmup, total)` would be after this one's steps: what a
    /// resumed run with changed settings continues on.
    pub fn rebuilt(&self, kind: LrSchedulerKind, base_lr: f64, warmup: u64, total: u64) -> Self {
        Self {
            step: self.step,
            ..Self::new(kind, base_lr, warmup, total)
        }
    }

    /// The multiplier λ at scheduler step `k`.
    pub fn lambda(&self, k: u64) -> f64 {
        let warmup = match self.kind {
            LrSchedulerKind::Constant => 0,
            _ => self.warmup,
        };
        if k < warmup {
            return k as f64 / warmup.max(1) as f64;
        }
        let decay_len = self.total.saturating_sub(warmup).max(1) as f64;
        match self.kind {
            LrSchedulerKind::Cosine => {
                let progress = (k - warmup) as f64 / decay_len;
                let factor =
                    0.5 * (1.0 + (std::f64::consts::PI * self.num_cycles * 2.0 * progress).cos());
                factor.max(0.0)
            }
            LrSchedulerKind::Linear => ((self.total as f64 - k as f64) / decay_len).max(0.0),
            LrSchedulerKind::Constant | LrSchedulerKind::ConstantWithWarmup => 1.0,
        }
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
        let mut s = LrSchedule::cosine(1.0, 4, 12);
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
    fn rebuilt_keeps_the_step() {
        let mut s = LrSchedule::cosine(1e-4, 2, 10);
        (0..5).for_each(|_| s.advance());
        let r = s.rebuilt(LrSchedulerKind::Linear, 2e-4, 2, 20);
        assert_eq!(r.step, 5);
        assert!((r.lr() - 2e-4 * 15.0 / 18.0).abs() < 1e-18);
    }

    #[test]
    fn warmup_ratio_rounds_up() {
        assert_eq!(warmup_steps(20, None, 100), 20);
        assert_eq!(warmup_steps(20, Some(0.1), 41), 5);
        assert_eq!(warmup_steps(20, Some(0.0), 41), 0);
    }

    #[test]
    fn serde_roundtrip_keeps_position() {
        let mut s = LrSchedule::cosine(1e-4, 20, 400);
        (0..37).for_each(|_| s.advance());
        let back: LrSchedule = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back, s);
        assert_eq!(back.lr(), s.lr());
    }
}
