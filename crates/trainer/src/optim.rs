//! AdamW with `torch.optim.AdamW` semantics over flat fp32 buffers laid out like DDP's buckets.
//!
//! Per element, with `t` the 1-based step and `g` the (already clipped) gradient:
//! ```text
//! p ← p·(1 − lr·wd)                                  (decoupled weight decay, only if wd ≠ 0)
//! m ← lerp(m, g, 1 − β₁) = m + (1 − β₁)·(g − m)      (torch: exp_avg.lerp_(g, 1 − β₁))
//! v ← v·β₂ + (1 − β₂)·g·g
//! p ← p − (lr / (1 − β₁ᵗ)) · m / (√v / √(1 − β₂ᵗ) + ε)
//! ```
//! This mirrors torch 2.11's single-tensor path (`torch/optim/adam.py`, `_single_tensor_adam`):
//! the bias corrections and step size are computed in f64, the elementwise work in f32, in the
//! same operation order. The fused variants (`fused=True`, our CUDA kernel) compute the same
//! expression. Moments live in flat buffers, one per bucket, in the bucket's layout; the
//! parameters are separate `Var`s that occupy consecutive ranges of that layout, in order.
//!
//! Clipping is folded in as `grad_scale` (the coefficient from [`crate::clip::clip_coef`]):
//! `g·grad_scale` is the same f32 product `clip_grad_norm_`'s in-place `mul_` makes, so the
//! result is bit-for-bit what clip-then-step gives, without a separate pass over the grads.
//!
//! Two implementations ([`AdamWKernel`]): on CPU the reference above over host copies; on other
//! devices `g4ft_ops::adamw_step` in place (moments and parameters updated where they live, no
//! temporaries). The fused op takes one contiguous parameter buffer, and the LoRA parameters are
//! separate `Var`s (Candle cannot make `Var`s share one storage), so it runs once per parameter
//! range of a bucket: one launch per parameter instead of the composite's ~10 whole-bucket passes
//! plus a copy per parameter. The fused op writes `p·decay + (−step)·(m/denom)`, the reference
//! `p·decay + (−step·m)/denom` (torch's CPU `addcdiv`): moments are bit-identical, parameters
//! agree to an ulp or two.

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor, Var};

use crate::error::{Error, Result};

/// AdamW hyper-parameters that stay fixed over a run (the learning rate comes from the schedule
/// at each step).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWParams {
    /// β₁, decay of the first moment (torch default 0.9).
    pub beta1: f64,
    /// β₂, decay of the second moment (torch default 0.999).
    pub beta2: f64,
    /// ε added to the bias-corrected √v (torch default 1e-8).
    pub eps: f64,
    /// Decoupled weight decay (torch default 0.01; the post passes 0.0).
    pub weight_decay: f64,
}

impl AdamWParams {
    /// torch's betas (0.9, 0.999) and eps 1e-8 with the given weight decay.
    pub fn with_weight_decay(weight_decay: f64) -> Self {
        Self {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay,
        }
    }
}

/// The per-step scalars of one AdamW update, computed in f64 as torch does in Python and
/// consumed as f32 by the elementwise kernels (the reference below, the tensor path, and the
/// CUDA kernel).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWScalars {
    /// Multiplier for the weight decay, `1 − lr·wd`.
    pub decay: f32,
    /// Whether weight decay applies at all (torch skips the `mul_` when wd = 0).
    pub apply_decay: bool,
    /// `1 − β₁`, the lerp weight of the first moment.
    pub one_minus_beta1: f32,
    /// β₂.
    pub beta2: f32,
    /// `1 − β₂`.
    pub one_minus_beta2: f32,
    /// `lr / (1 − β₁ᵗ)`.
    pub step_size: f32,
    /// `√(1 − β₂ᵗ)`.
    pub bias_correction2_sqrt: f32,
    /// ε.
    pub eps: f32,
    /// Clip coefficient multiplied into every gradient first (1.0 = unclipped).
    pub grad_scale: f32,
}

impl AdamWScalars {
    /// Scalars for step `step` (1-based, the value after torch's `state_steps += 1`).
    pub fn new(p: &AdamWParams, lr: f64, step: u64, grad_scale: f32) -> Self {
        let t = step as f64;
        let bias_correction1 = 1.0 - p.beta1.powf(t);
        let bias_correction2 = 1.0 - p.beta2.powf(t);
        Self {
            decay: (1.0 - lr * p.weight_decay) as f32,
            apply_decay: p.weight_decay != 0.0,
            one_minus_beta1: (1.0 - p.beta1) as f32,
            beta2: p.beta2 as f32,
            one_minus_beta2: (1.0 - p.beta2) as f32,
            step_size: (lr / bias_correction1) as f32,
            bias_correction2_sqrt: bias_correction2.sqrt() as f32,
            eps: p.eps as f32,
            grad_scale,
        }
    }
}

/// The CPU reference update over one contiguous range: `params`, `grads`, `exp_avg`,
/// `exp_avg_sq` all of the same length, fp32. The CUDA kernel is tested against this.
///
/// # Panics
/// If the four slices differ in length (callers check shapes and report errors first).
pub fn adamw_update_cpu(
    s: &AdamWScalars,
    params: &mut [f32],
    grads: &[f32],
    exp_avg: &mut [f32],
    exp_avg_sq: &mut [f32],
) {
    assert!(
        grads.len() == params.len()
            && exp_avg.len() == params.len()
            && exp_avg_sq.len() == params.len(),
        "adamw_update_cpu: slice lengths differ"
    );
    let neg_step = -s.step_size;
    for i in 0..params.len() {
        let g = grads[i] * s.grad_scale;
        let mut p = params[i];
        if s.apply_decay {
            p *= s.decay;
        }
        let m = lerp(exp_avg[i], g, s.one_minus_beta1);
        let v = exp_avg_sq[i] * s.beta2 + s.one_minus_beta2 * g * g;
        let denom = v.sqrt() / s.bias_correction2_sqrt + s.eps;
        params[i] = p + neg_step * m / denom;
        exp_avg[i] = m;
        exp_avg_sq[i] = v;
    }
}

/// torch's scalar `lerp(start, end, weight)` (ATen `Lerp.h`): two forms for accuracy near 0 and
/// 1, no fused multiply-add (the same arithmetic as `g4ft_ops`' CUDA kernel, so the two agree
/// bit for bit).
fn lerp(start: f32, end: f32, weight: f32) -> f32 {
    if weight.abs() < 0.5 {
        start + weight * (end - start)
    } else {
        end - (end - start) * (1.0 - weight)
    }
}

/// One DDP bucket as the optimizer sees it: its flat gradient buffer and the parameters whose
/// gradients it holds, in the bucket's order (parameter `k` occupies the range after
/// parameters `0..k`).
#[derive(Debug, Clone, Copy)]
pub struct FlatBucket<'a> {
    /// The trainable fp32 parameters of this bucket, in layout order.
    pub params: &'a [Var],
    /// `(n,)` fp32, `n` = total elements of `params`, already averaged across ranks.
    pub grads: &'a Tensor,
}

/// Which implementation runs the elementwise update of [`AdamW::step`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdamWKernel {
    /// [`adamw_update_cpu`] over host copies, written back with `Var::set` (torch's
    /// single-tensor arithmetic bit for bit). The default on CPU.
    Reference,
    /// `g4ft_ops::adamw_step` in place on the parameters and the moment buffers, one call per
    /// parameter range of a bucket. The default on every other device; on CPU it runs the op's
    /// CPU implementation (tests).
    Fused,
}

impl AdamWKernel {
    /// The default for `device`: [`AdamWKernel::Reference`] on CPU, else [`AdamWKernel::Fused`].
    pub fn for_device(device: &Device) -> Self {
        if device.is_cpu() {
            AdamWKernel::Reference
        } else {
            AdamWKernel::Fused
        }
    }
}

/// `torch.optim.AdamW` over flat buckets. Holds the step counter and one `exp_avg` and one
/// `exp_avg_sq` buffer per bucket, `(n,)` fp32 on the parameters' device, zero-initialised.
#[derive(Debug)]
pub struct AdamW {
    params: AdamWParams,
    step: u64,
    kernel: AdamWKernel,
    exp_avg: Vec<Tensor>,
    exp_avg_sq: Vec<Tensor>,
}

impl AdamW {
    /// A fresh optimizer for buckets of `bucket_lens` elements each.
    pub fn new(params: AdamWParams, bucket_lens: &[usize], device: &Device) -> Result<Self> {
        let zeros = |&n: &usize| Tensor::zeros(n, DType::F32, device);
        Ok(Self {
            params,
            step: 0,
            kernel: AdamWKernel::for_device(device),
            exp_avg: bucket_lens
                .iter()
                .map(zeros)
                .collect::<candle_core::Result<_>>()?,
            exp_avg_sq: bucket_lens
                .iter()
                .map(zeros)
                .collect::<candle_core::Result<_>>()?,
        })
    }

    /// The same optimizer running `kernel` instead of the device's default.
    pub fn with_kernel(mut self, kernel: AdamWKernel) -> Self {
        self.kernel = kernel;
        self
    }

    /// The implementation [`AdamW::step`] runs.
    pub fn kernel(&self) -> AdamWKernel {
        self.kernel
    }

    /// Hyper-parameters.
    pub fn params(&self) -> &AdamWParams {
        &self.params
    }

    /// Optimizer steps taken so far (torch's `state["step"]`).
    pub fn step_count(&self) -> u64 {
        self.step
    }

    /// One optimizer step with learning rate `lr` over every bucket; `grad_scale` is the clip
    /// coefficient (1.0 for none). Errors if the buckets do not match the layout given to
    /// [`AdamW::new`] (count, lengths, fp32). Runs [`AdamW::kernel`]: [`adamw_update_cpu`] on
    /// CPU, `g4ft_ops::adamw_step` in place elsewhere.
    pub fn step(&mut self, lr: f64, grad_scale: f32, buckets: &[FlatBucket<'_>]) -> Result<()> {
        self.check_layout(buckets)?;
        self.step += 1;
        match self.kernel {
            AdamWKernel::Reference => {
                let s = AdamWScalars::new(&self.params, lr, self.step, grad_scale);
                for (i, bucket) in buckets.iter().enumerate() {
                    let (m, v) =
                        step_bucket_reference(&s, bucket, &self.exp_avg[i], &self.exp_avg_sq[i])?;
                    self.exp_avg[i] = m;
                    self.exp_avg_sq[i] = v;
                }
            }
            AdamWKernel::Fused => {
                let hp = g4ft_ops::AdamW {
                    lr,
                    beta1: self.params.beta1,
                    beta2: self.params.beta2,
                    eps: self.params.eps,
                    weight_decay: self.params.weight_decay,
                };
                for (i, bucket) in buckets.iter().enumerate() {
                    let coef = Tensor::new(&[grad_scale], bucket.grads.device())?;
                    step_bucket_fused(
                        &hp,
                        self.step,
                        &coef,
                        bucket,
                        &self.exp_avg[i],
                        &self.exp_avg_sq[i],
                    )?;
                }
            }
        }
        Ok(())
    }

    /// The moments as named tensors for the checkpoint: `exp_avg.{bucket}`, `exp_avg_sq.{bucket}`.
    pub fn state_tensors(&self) -> Vec<(String, Tensor)> {
        let m = self.exp_avg.iter().enumerate();
        let v = self.exp_avg_sq.iter().enumerate();
        m.map(|(i, t)| (format!("exp_avg.{i}"), t.clone()))
            .chain(v.map(|(i, t)| (format!("exp_avg_sq.{i}"), t.clone())))
            .collect()
    }

    /// Restores the step counter and the moments saved by [`AdamW::state_tensors`]; every tensor
    /// must be present with this optimizer's length. Moves them to this optimizer's device.
    pub fn load_state(&mut self, step: u64, tensors: &HashMap<String, Tensor>) -> Result<()> {
        let load = |name: String, slot: &mut Tensor| -> Result<()> {
            let t = tensors.get(&name).ok_or_else(|| Error::OptimShape {
                what: format!("saved moment `{name}`"),
                expected: "present in the optimizer state".into(),
                got: "missing".into(),
            })?;
            if t.dims() != slot.dims() || t.dtype() != DType::F32 {
                return Err(Error::OptimShape {
                    what: format!("saved moment `{name}`"),
                    expected: format!("{:?} f32", slot.dims()),
                    got: format!("{:?} {:?}", t.dims(), t.dtype()),
                });
            }
            *slot = t.to_device(slot.device())?;
            Ok(())
        };
        for (i, slot) in self.exp_avg.iter_mut().enumerate() {
            load(format!("exp_avg.{i}"), slot)?;
        }
        for (i, slot) in self.exp_avg_sq.iter_mut().enumerate() {
            load(format!("exp_avg_sq.{i}"), slot)?;
        }
        self.step = step;
        Ok(())
    }

    fn check_layout(&self, buckets: &[FlatBucket<'_>]) -> Result<()> {
        if buckets.len() != self.exp_avg.len() {
            return Err(Error::OptimShape {
                what: "bucket count".into(),
                expected: self.exp_avg.len().to_string(),
                got: buckets.len().to_string(),
            });
        }
        for (i, (b, m)) in buckets.iter().zip(&self.exp_avg).enumerate() {
            let n = m.elem_count();
            if b.grads.dtype() != DType::F32 || b.grads.dims() != [n] {
                return Err(Error::OptimShape {
                    what: format!("bucket {i} grads"),
                    expected: format!("[{n}] f32"),
                    got: format!("{:?} {:?}", b.grads.dims(), b.grads.dtype()),
                });
            }
            let total: usize = b.params.iter().map(|p| p.elem_count()).sum();
            if let Some(p) = b.params.iter().find(|p| p.dtype() != DType::F32) {
                return Err(Error::OptimShape {
                    what: format!("bucket {i} parameter of shape {:?}", p.dims()),
                    expected: "f32 (adapters are trained in fp32)".into(),
                    got: format!("{:?}", p.dtype()),
                });
            }
            if total != n {
                return Err(Error::OptimShape {
                    what: format!("bucket {i} parameters (total elements)"),
                    expected: n.to_string(),
                    got: total.to_string(),
                });
            }
        }
        Ok(())
    }
}

/// CPU: copy out, run the reference over each parameter's range, write back with `Var::set`.
fn step_bucket_reference(
    s: &AdamWScalars,
    b: &FlatBucket<'_>,
    exp_avg: &Tensor,
    exp_avg_sq: &Tensor,
) -> Result<(Tensor, Tensor)> {
    let grads = b.grads.to_vec1::<f32>()?;
    let mut m = exp_avg.to_vec1::<f32>()?;
    let mut v = exp_avg_sq.to_vec1::<f32>()?;
    let mut offset = 0;
    for p in b.params {
        let n = p.elem_count();
        let range = offset..offset + n;
        let mut values = p.flatten_all()?.to_vec1::<f32>()?;
        adamw_update_cpu(
            s,
            &mut values,
            &grads[range.clone()],
            &mut m[range.clone()],
            &mut v[range],
        );
        p.set(&Tensor::from_vec(values, p.shape(), p.device())?)?;
        offset += n;
    }
    let dev = exp_avg.device();
    Ok((
        Tensor::from_vec(m, offset, dev)?,
        Tensor::from_vec(v, offset, dev)?,
    ))
}

/// Any device: `g4ft_ops::adamw_step` in place over each parameter's range of the bucket (the
/// parameter's own storage, and views into the bucket's gradient and moment buffers).
fn step_bucket_fused(
    hp: &g4ft_ops::AdamW,
    step: u64,
    grad_scale: &Tensor,
    b: &FlatBucket<'_>,
    exp_avg: &Tensor,
    exp_avg_sq: &Tensor,
) -> Result<()> {
    let mut offset = 0;
    for p in b.params {
        let n = p.elem_count();
        g4ft_ops::adamw_step(
            p.as_tensor(),
            &b.grads.narrow(0, offset, n)?,
            &exp_avg.narrow(0, offset, n)?,
            &exp_avg_sq.narrow(0, offset, n)?,
            hp,
            step,
            grad_scale,
        )?;
        offset += n;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(dev: &Device, shapes: &[&[usize]], values: &[f32]) -> Vec<Var> {
        let mut off = 0;
        shapes
            .iter()
            .map(|s| {
                let n: usize = s.iter().product();
                let v = Var::from_slice(&values[off..off + n], *s, dev).unwrap();
                off += n;
                v
            })
            .collect()
    }

    fn flat(vs: &[Var]) -> Vec<f32> {
        vs.iter()
            .flat_map(|v| v.flatten_all().unwrap().to_vec1::<f32>().unwrap())
            .collect()
    }

    #[test]
    fn first_step_moves_each_weight_by_about_lr() {
        // At t = 1 the bias-corrected update is g/|g| (up to eps): every weight moves by ~lr.
        let s = AdamWScalars::new(&AdamWParams::with_weight_decay(0.0), 0.01, 1, 1.0);
        let mut p = vec![1.0f32, -2.0, 0.5];
        let g = [0.3f32, -4.0, 1e-3];
        let (mut m, mut v) = (vec![0.0; 3], vec![0.0; 3]);
        adamw_update_cpu(&s, &mut p, &g, &mut m, &mut v);
        let want = [0.99f32, -1.99, 0.49];
        for (got, want) in p.iter().zip(want) {
            assert!((got - want).abs() < 1e-5, "{got} vs {want}");
        }
    }

    #[test]
    fn weight_decay_is_decoupled() {
        // With zero gradient the moments stay 0 and only p·(1 − lr·wd) remains.
        let s = AdamWScalars::new(&AdamWParams::with_weight_decay(0.5), 0.1, 1, 1.0);
        let mut p = vec![2.0f32];
        let (mut m, mut v) = (vec![0.0], vec![0.0]);
        adamw_update_cpu(&s, &mut p, &[0.0], &mut m, &mut v);
        assert_eq!(p[0], 2.0 * 0.95);
    }

    #[test]
    fn fused_path_matches_reference() {
        // The CUDA path (g4ft_ops::adamw_step, here through the op's CPU implementation) against
        // the CPU trainer path: 2 buckets, 3 params, weight decay, clipping, 3 steps.
        let dev = Device::Cpu;
        let shapes: [&[usize]; 3] = [&[2, 3], &[4], &[5]];
        let init: Vec<f32> = (0..15).map(|i| (i as f32 * 0.37).sin()).collect();
        let (a, b) = (vars(&dev, &shapes, &init), vars(&dev, &shapes, &init));
        let hp = AdamWParams::with_weight_decay(0.1);
        let mut reference = AdamW::new(hp, &[10, 5], &dev)
            .unwrap()
            .with_kernel(AdamWKernel::Reference);
        let mut fused = AdamW::new(hp, &[10, 5], &dev)
            .unwrap()
            .with_kernel(AdamWKernel::Fused);
        assert_eq!(AdamWKernel::for_device(&dev), AdamWKernel::Reference);
        for step in 1..=3u64 {
            let grads: Vec<f32> = (0..15)
                .map(|i| (i as f32 * 1.3 + step as f32).cos() * 0.2)
                .collect();
            let g0 = Tensor::from_slice(&grads[..10], 10, &dev).unwrap();
            let g1 = Tensor::from_slice(&grads[10..], 5, &dev).unwrap();
            let scale = [1.0f32, 0.7, 0.25][step as usize - 1];
            for (opt, p) in [(&mut reference, &a), (&mut fused, &b)] {
                let buckets = [
                    FlatBucket {
                        params: &p[..2],
                        grads: &g0,
                    },
                    FlatBucket {
                        params: &p[2..],
                        grads: &g1,
                    },
                ];
                opt.step(2e-2 / step as f64, scale, &buckets).unwrap();
            }
        }
        assert_eq!(fused.step_count(), 3);
        for (x, y) in flat(&a).iter().zip(flat(&b)) {
            // the two param formulas round differently (see the module docs): a few ulps
            assert!((x - y).abs() <= 4.0 * f32::EPSILON * x.abs(), "{x} vs {y}");
        }
        assert_ne!(flat(&a), init, "the step moved the parameters");
        for ((na, ta), (nb, tb)) in reference.state_tensors().iter().zip(fused.state_tensors()) {
            assert_eq!(*na, nb);
            let (ta, tb) = (ta.to_vec1::<f32>().unwrap(), tb.to_vec1::<f32>().unwrap());
            assert_eq!(ta, tb, "{na}: the moments are bit-identical");
        }
    }

    #[test]
    fn layout_errors_name_the_bucket() {
        let dev = Device::Cpu;
        let mut opt = AdamW::new(AdamWParams::with_weight_decay(0.0), &[4], &dev).unwrap();
        let p = vec![Var::zeros((2, 2), DType::F32, &dev).unwrap()];
        let g = Tensor::zeros(5, DType::F32, &dev).unwrap();
        let msg = opt
            .step(
                1e-3,
                1.0,
                &[FlatBucket {
                    params: &p,
                    grads: &g,
                }],
            )
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("bucket 0 grads") && msg.contains("[4] f32"),
            "{msg}"
        );
        let g = Tensor::zeros(4, DType::F32, &dev).unwrap();
        let msg = opt.step(1e-3, 1.0, &[]).unwrap_err().to_string();
        assert!(msg.contains("bucket count"), "{msg}");
        assert_eq!(opt.step_count(), 0, "a rejected step does not count");
        opt.step(
            1e-3,
            1.0,
            &[FlatBucket {
                params: &p,
                grads: &g,
            }],
        )
        .unwrap();
        assert_eq!(opt.step_count(), 1);
    }

    #[test]
    fn state_roundtrip_restores_moments() {
        let dev = Device::Cpu;
        let p = vec![Var::from_slice(&[1.0f32, 2.0, 3.0], 3, &dev).unwrap()];
        let g = Tensor::from_slice(&[0.1f32, -0.2, 0.3], 3, &dev).unwrap();
        let mut opt = AdamW::new(AdamWParams::with_weight_decay(0.0), &[3], &dev).unwrap();
        opt.step(
            1e-2,
            1.0,
            &[FlatBucket {
                params: &p,
                grads: &g,
            }],
        )
        .unwrap();
        let saved: HashMap<String, Tensor> = opt.state_tensors().into_iter().collect();
        let mut fresh = AdamW::new(AdamWParams::with_weight_decay(0.0), &[3], &dev).unwrap();
        fresh.load_state(opt.step_count(), &saved).unwrap();
        assert_eq!(fresh.step_count(), 1);
        for ((_, a), (_, b)) in opt.state_tensors().iter().zip(fresh.state_tensors()) {
            assert_eq!(a.to_vec1::<f32>().unwrap(), b.to_vec1::<f32>().unwrap());
        }
        let mut short = HashMap::new();
        short.insert(
            "exp_avg.0".to_string(),
            Tensor::zeros(2, DType::F32, &dev).unwrap(),
        );
        let msg = fresh.load_state(1, &short).unwrap_err().to_string();
        assert!(msg.contains("exp_avg.0") && msg.contains("[3]"), "{msg}");
    }
}
