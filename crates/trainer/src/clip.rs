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

/// L2 norm over all `grads` viewed as one vector, accumulated in f64 (torch accumulates per-tensor
/// norms in f32; the difference is below 1e-6 relative for realistic sizes).
pub fn grad_norm_cpu(grads: &[&[f32]]) -> f32 {
    let sum_sq: f64 = grads
        .iter()
        .flat_map(|g| g.iter())
        .map(|&x| (x as f64) * (x as f64))
        .sum();
    sum_sq.sqrt() as f32
}

/// [`grad_norm_cpu`] over flat gradient tensors (the DDP buckets). On CPU it reads the values
/// and accumulates in f64; on other devices each bucket's norm comes from
/// `g4ft_ops::clip_coefficient` (two launches, fp32, fixed summation order) and the bucket
/// norms are read back together (one device sync, which the log line needs anyway) and combined
/// in f64.
pub fn grad_norm(grads: &[Tensor]) -> Result<f32> {
    match grads.first() {
        Some(g) if !g.device().is_cpu() => grad_norm_fused(grads),
        _ => {
            let mut sum_sq = 0f64;
            for g in grads {
                let v = g.flatten_all()?.to_vec1::<f32>()?;
                let n = grad_norm_cpu(&[&v]) as f64;
                sum_sq += n * n;
            }
            Ok(sum_sq.sqrt() as f32)
        }
    }
}

/// The device path of [`grad_norm`]: per-bucket norms from the fused op, combined on the host.
fn grad_norm_fused(grads: &[Tensor]) -> Result<f32> {
    let norms = grads
        .iter()
        .map(|g| Ok(g4ft_ops::clip_coefficient(g, 1.0)?.0.reshape(1)?))
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
/// [`crate::nonfinite`] before stepping.
///
/// ```
/// use g4ft_trainer::clip::{clip_coef, grad_norm_cpu};
/// let norm = grad_norm_cpu(&[&[3.0, 0.0], &[4.0]]); // one vector over all buckets
/// assert_eq!(norm, 5.0);
/// assert_eq!(clip_coef(norm, 1.0), 1.0 / (5.0 + 1e-6)); // scale down to norm ~1
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

/// `clip_grad_norm_` on host buffers: scales `grads` in place and returns the pre-clip norm.
/// The training loop uses [`grad_norm`] + [`clip_coef`] and passes the coefficient to
/// [`crate::optim::AdamW::step`] instead; this in-place form is the reference for that fusion.
pub fn clip_grad_norm_cpu(grads: &mut [&mut [f32]], max_norm: f64) -> f32 {
    let norm = {
        let views: Vec<&[f32]> = grads.iter().map(|g| &**g).collect();
        grad_norm_cpu(&views)
    };
    let coef = clip_coef(norm, max_norm);
    for g in grads.iter_mut() {
        g.iter_mut().for_each(|x| *x *= coef);
    }
    norm
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn norm_spans_all_buffers() {
        assert_eq!(grad_norm_cpu(&[&[3.0], &[4.0, 0.0]]), 5.0);
        let t = [
            Tensor::new(&[3.0f32], &Device::Cpu).unwrap(),
            Tensor::new(&[0.0f32, 4.0], &Device::Cpu).unwrap(),
        ];
        assert_eq!(grad_norm(&t).unwrap(), 5.0);
    }

    #[test]
    fn fused_norm_matches_cpu() {
        // The device path (g4ft_ops::clip_coefficient, here its CPU implementation).
        let a: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.01).sin()).collect();
        let b: Vec<f32> = (0..37).map(|i| i as f32 * -0.5).collect();
        let t = [
            Tensor::from_slice(&a, a.len(), &Device::Cpu).unwrap(),
            Tensor::from_slice(&b, b.len(), &Device::Cpu).unwrap(),
        ];
        let (cpu, fused) = (grad_norm(&t).unwrap(), grad_norm_fused(&t).unwrap());
        assert_eq!(cpu, grad_norm_cpu(&[&a, &b]));
        assert!((cpu - fused).abs() <= 1e-6 * cpu, "{cpu} vs {fused}");
        assert_eq!(grad_norm_fused(&[]).unwrap(), 0.0);
    }

    #[test]
    fn coef_is_clamped_and_can_be_disabled() {
        assert_eq!(clip_coef(0.5, 1.0), 1.0);
        assert_eq!(clip_coef(10.0, 1.0), 1.0f32 / (10.0 + 1e-6));
        assert_eq!(clip_coef(10.0, 0.0), 1.0);
        assert!(clip_coef(f32::NAN, 1.0).is_nan());
    }

    #[test]
    fn clip_in_place_returns_pre_clip_norm() {
        let (mut a, mut b) = (vec![3.0f32], vec![4.0f32]);
        let norm = clip_grad_norm_cpu(&mut [&mut a, &mut b], 1.0);
        assert_eq!(norm, 5.0);
        assert!((grad_norm_cpu(&[&a, &b]) - 1.0).abs() < 1e-6);
    }
}
