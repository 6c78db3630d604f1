//! Global gradient-norm clipping with `torch.nn.utils.clip_grad_norm_` semantics.
//!
//! torch computes the L2 norm over all gradients as if concatenated into one vector, then
//! `coef = max_norm / (norm + 1e-6)` clamped to at most 1, multiplies every gradient by `coef`
//! (always, even when it is 1) and returns the pre-clip norm. Run it after the all-reduce: the
//! averaged gradients are identical on every rank, so is the norm and the coefficient.
//!
//! One deviation: `max_norm = 0` means "no clipping" here (torch would zero the gradients), so
//! the config can switch clipping off.

use candle_core::Tensor;

use crate::error::Result;

/// The L2 norm over all `grads` (the DDP buckets) viewed as one vector: each buffer's norm from
/// `g4ft_ops::l2_norm` (CPU: accumulated in f64; CUDA: two launches, fp32, fixed summation
/// order), read back together (one device sync, which the log line needs anyway) and combined in
/// f64. torch accumulates the per-tensor norms in f32; the difference is below 1e-6 relative for
/// realistic sizes.
///
/// ```
/// use candle_core::{Device, Tensor};
/// use g4ft_trainer::step::clip::grad_norm;
/// let buckets = [
///     Tensor::new(&[3f32, 0.0], &Device::Cpu).unwrap(),
///     Tensor::new(&[4f32], &Device::Cpu).unwrap(),
/// ];
/// assert_eq!(grad_norm(&buckets).unwrap(), 5.0); // one vector over all buckets
/// ```
pub fn grad_norm(grads: &[Tensor]) -> Result<f32> {
    let norms = grads
        .iter()
        .map(|g| Ok(g4ft_ops::l2_norm(g)?.reshape(1)?))
        .collect::<Result<Vec<_>>>()?;
    if norms.is_empty() {
        return Ok(0.0);
    }
    let norms = Tensor::cat(&norms, 0)?.to_vec1::<f32>()?;
    let sum_sq: f64 = norms.iter().map(|&n| n as f64 * n as f64).sum();
    Ok(sum_sq.sqrt() as f32)
}

/// torch's clip coefficient in f32: `min(max_norm / (total_norm + 1e-6), 1)`; 1 when
/// `max_norm` is 0 (clipping off). A NaN norm gives a NaN coefficient, as in torch: check with
/// [`crate::step::nonfinite`] before stepping.
///
/// ```
/// use g4ft_trainer::step::clip::clip_coef;
/// assert_eq!(clip_coef(5.0, 1.0), 1.0 / (5.0 + 1e-6)); // scale down to norm ~1
/// assert_eq!(clip_coef(0.5, 1.0), 1.0); // never scales up
/// ```
pub fn clip_coef(total_norm: f32, max_norm: f64) -> f32 {
    if max_norm == 0.0 {
        return 1.0;
    }
    let coef = max_norm as f32 / (total_norm + 1e-6);
    if coef > 1.0 {
        1.0
    } else {
        coef
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn norm_spans_all_buffers_and_accumulates_in_f64() {
        // Each buffer's norm (an f64 sum of squares, rounded to f32), combined in f64.
        let a: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.01).sin()).collect();
        let b: Vec<f32> = (0..37).map(|i| i as f32 * -0.5).collect();
        let t = [
            Tensor::from_slice(&a, a.len(), &Device::Cpu).unwrap(),
            Tensor::from_slice(&b, b.len(), &Device::Cpu).unwrap(),
        ];
        let sq = |v: &[f32]| v.iter().map(|&x| x as f64 * x as f64).sum::<f64>();
        let norm = |v: &[f32]| sq(v).sqrt() as f32 as f64;
        let (na, nb) = (norm(&a), norm(&b));
        let want = (na * na + nb * nb).sqrt() as f32;
        assert_eq!(grad_norm(&t).unwrap(), want);
        assert_eq!(grad_norm(&[]).unwrap(), 0.0);
    }

    #[test]
    fn coef_is_clamped_and_can_be_disabled() {
        assert_eq!(clip_coef(0.5, 1.0), 1.0);
        assert_eq!(clip_coef(10.0, 1.0), 1.0f32 / (10.0 + 1e-6));
        assert_eq!(clip_coef(10.0, 0.0), 1.0);
        assert!(clip_coef(f32::NAN, 1.0).is_nan());
    }
}
