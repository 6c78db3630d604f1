//! The skip-or-stop decision for a non-finite loss or gradient norm.
//!
//! The decision must be identical on every rank, or the ranks' collectives diverge and the job
//! hangs (the post's "rank-divergent code paths"). [`decide`] is a pure function of values that are
//! already identical everywhere after the step's all-reduces: the all-reduced loss (a sum is NaN or
//! infinite as soon as any rank's term is) and the norm of the all-reduced gradients. For belt and
//! braces the loop may still let rank 0 decide and broadcast [`StepDecision::code`] (one f32),
//! then act on [`StepDecision::from_code`] of the received value, as the post recommends.

use crate::config::OnNonFinite;
use crate::error::Error;

/// What the loop does with the optimizer step it just prepared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepDecision {
    /// Everything finite: clip, step the optimizer, advance the schedule.
    Apply,
    /// Non-finite, `on_nonfinite = skip`: zero the grads, leave the parameters, optimizer moments
    /// and schedule untouched, and continue with the next accumulation window.
    Skip,
    /// Non-finite and the policy (or the skip budget) says stop: every rank returns
    /// [`stop_error`].
    Stop,
}

impl StepDecision {
    /// Wire encoding for a broadcast: Apply = 0, Skip = 1, Stop = 2 (exact in f32).
    pub fn code(self) -> f32 {
        match self {
            StepDecision::Apply => 0.0,
            StepDecision::Skip => 1.0,
            StepDecision::Stop => 2.0,
        }
    }

    /// Decodes a broadcast [`StepDecision::code`]; anything unexpected (a corrupted value) is
    /// treated as `Stop`, the safe side.
    pub fn from_code(code: f32) -> Self {
        if code == 0.0 {
            StepDecision::Apply
        } else if code == 1.0 {
            StepDecision::Skip
        } else {
            StepDecision::Stop
        }
    }
}

/// Decides what to do with this step. `loss` is the all-reduced loss, `grad_norm` the norm of
/// the all-reduced gradients, `skipped_in_a_row` how many steps directly before this one were
/// skipped. With `Skip`, the `max_skips + 1`-th consecutive bad step stops the run.
pub fn decide(
    loss: f64,
    grad_norm: f32,
    policy: OnNonFinite,
    max_skips: usize,
    skipped_in_a_row: usize,
) -> StepDecision {
    if loss.is_finite() && grad_norm.is_finite() {
        return StepDecision::Apply;
    }
    match policy {
        OnNonFinite::Skip if skipped_in_a_row < max_skips => StepDecision::Skip,
        _ => StepDecision::Stop,
    }
}

/// The error every rank returns on `Stop`: names the step and which value was bad.
pub fn stop_error(
    step: u64,
    loss: f64,
    grad_norm: f32,
    policy: OnNonFinite,
    skipped_in_a_row: usize,
) -> Error {
    let mut bad = Vec::new();
    if !loss.is_finite() {
        bad.push(format!("loss = {loss}"));
    }
    if !grad_norm.is_finite() {
        bad.push(format!("grad norm = {grad_norm}"));
    }
    let mut what = format!("non-finite {}", bad.join(", "));
    if skipped_in_a_row > 0 {
        what.push_str(&format!(" after {skipped_in_a_row} skipped steps in a row"));
    }
    let policy = match policy {
        OnNonFinite::Stop => "stop",
        OnNonFinite::Skip => "skip, budget used up",
    };
    Error::NonFinite {
        step,
        what,
        policy: policy.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finite_steps_apply() {
        assert_eq!(
            decide(1.5, 0.3, OnNonFinite::Stop, 0, 0),
            StepDecision::Apply
        );
    }

    #[test]
    fn stop_policy_stops_on_nan_or_inf() {
        assert_eq!(
            decide(f64::NAN, 0.3, OnNonFinite::Stop, 10, 0),
            StepDecision::Stop
        );
        assert_eq!(
            decide(1.0, f32::INFINITY, OnNonFinite::Stop, 10, 0),
            StepDecision::Stop
        );
    }

    #[test]
    fn skip_policy_has_a_budget() {
        assert_eq!(
            decide(f64::NAN, 1.0, OnNonFinite::Skip, 2, 0),
            StepDecision::Skip
        );
        assert_eq!(
            decide(f64::NAN, 1.0, OnNonFinite::Skip, 2, 1),
            StepDecision::Skip
        );
        assert_eq!(
            decide(f64::NAN, 1.0, OnNonFinite::Skip, 2, 2),
            StepDecision::Stop
        );
    }

    #[test]
    fn broadcast_code_roundtrips() {
        for d in [StepDecision::Apply, StepDecision::Skip, StepDecision::Stop] {
            assert_eq!(StepDecision::from_code(d.code()), d);
        }
        assert_eq!(StepDecision::from_code(f32::NAN), StepDecision::Stop);
    }

    #[test]
    fn stop_error_names_step_and_value() {
        let msg = stop_error(12, f64::NAN, 0.5, OnNonFinite::Skip, 3).to_string();
        assert!(
            msg.starts_with("step 12: non-finite loss = NaN after 3 skipped"),
            "{msg}"
        );
        assert!(msg.contains("hint:"), "{msg}");
    }
}
