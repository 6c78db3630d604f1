//! Trainable-parameter counting and PEFT's `print_trainable_parameters` line.
//!
//! Computable from a shape list alone (no weights): each targeted projection `(out, in)` adds
//! `r·in + out·r` parameters. PEFT's "all params" is the frozen base plus the adapters.

use crate::config::LoraConfig;
use crate::error::Result;
use crate::target::{ProjectionShape, Targeting};

/// Trainable vs all parameters, printed like PEFT's `print_trainable_parameters`.
///
/// ```
/// use g4ft_lora::ParamReport;
/// let report = ParamReport { trainable: 40, all: 88 };
/// assert_eq!(report.to_string(), "trainable params: 40 || all params: 88 || trainable%: 45.4545");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParamReport {
    /// LoRA parameters (A and B of every adapted module).
    pub trainable: u64,
    /// Frozen base parameters plus `trainable`.
    pub all: u64,
}

impl ParamReport {
    /// The report for adapters on `shapes` over a base model of `base_params` parameters.
    /// Errors as [`count_trainable`] does.
    pub fn new(cfg: &LoraConfig, shapes: &[ProjectionShape], base_params: u64) -> Result<Self> {
        let trainable = count_trainable(cfg, shapes)?;
        Ok(Self {
            trainable,
            all: base_params + trainable,
        })
    }
}

impl std::fmt::Display for ParamReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // PEFT: f"trainable params: {t:,d} || all params: {a:,d} || trainable%: {100*t/a:.4f}"
        let pct = if self.all == 0 {
            0.0
        } else {
            100.0 * self.trainable as f64 / self.all as f64
        };
        write!(
            f,
            "trainable params: {} || all params: {} || trainable%: {pct:.4}",
            thousands(self.trainable),
            thousands(self.all)
        )
    }
}

/// LoRA parameters the config adds to `shapes`: Σ over targeted modules of `r·(in + out)`.
/// Errors when the config's regex does not compile or targets nothing.
pub fn count_trainable(cfg: &LoraConfig, shapes: &[ProjectionShape]) -> Result<u64> {
    let targeting = Targeting::new(cfg)?;
    let chosen = targeting.select(shapes.iter().map(|s| s.path.as_str()))?;
    Ok(shapes
        .iter()
        .zip(chosen)
        .filter(|(_, c)| *c)
        .map(|(s, _)| (targeting.rank(&s.path) * (s.in_features + s.out_features)) as u64)
        .sum())
}

/// `12345678` → `"12,345,678"` (Python's `{:,d}`).
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_separators() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(65_568_768), "65,568,768");
    }
}
