//! The AdamW optimizer state: the step counter and one `exp_avg` / `exp_avg_sq` buffer per DDP
//! bucket, in the bucket's flat layout. The arithmetic is `g4ft_ops::adamw_step` (torch's
//! `torch.optim.AdamW` single-tensor path, documented there), run in place on every device.
//!
//! The parameters are separate `Var`s occupying consecutive ranges of a bucket's layout (Candle
//! cannot make `Var`s share one storage), so a step runs the op once per parameter range: the
//! parameter's own storage and views into the bucket's gradient and moment buffers, no copies.
//! Clipping is folded in as the clip coefficient (from [`crate::step::clip::clip_coef`]).

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor, Var};
pub use g4ft_ops::AdamWParams;
use g4ft_ops::AdamWScalars;

use crate::error::{Error, Result};

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

/// `torch.optim.AdamW` over flat buckets. Holds the step counter and one `exp_avg` and one
/// `exp_avg_sq` buffer per bucket, `(n,)` fp32 on the parameters' device, zero-initialised.
#[derive(Debug)]
pub struct AdamW {
    params: AdamWParams,
    step: u64,
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
    /// [`AdamW::new`] (count, lengths, fp32).
    pub fn step(&mut self, lr: f64, grad_scale: f32, buckets: &[FlatBucket<'_>]) -> Result<()> {
        self.check_layout(buckets)?;
        self.step += 1;
        let scalars = AdamWScalars::new(&self.params, lr, self.step);
        let Some(first) = buckets.first() else {
            return Ok(());
        };
        let coef = Tensor::new(&[grad_scale], first.grads.device())?;
        for (i, b) in buckets.iter().enumerate() {
            let mut offset = 0;
            for p in b.params {
                let n = p.elem_count();
                g4ft_ops::adamw_step(
                    p.as_tensor(),
                    &b.grads.narrow(0, offset, n)?,
                    &self.exp_avg[i].narrow(0, offset, n)?,
                    &self.exp_avg_sq[i].narrow(0, offset, n)?,
                    &scalars,
                    &coef,
                )?;
                offset += n;
            }
        }
        Ok(())
    }

    /// The moments as named tensors for the checkpoint: `exp_avg.{bucket}`, `exp_avg_sq.{bucket}`.
    /// They are the live buffers (updated in place by the next [`AdamW::step`]): save or copy
    /// them before stepping again.
    pub fn state_tensors(&self) -> Vec<(String, Tensor)> {
        let m = self.exp_avg.iter().enumerate();
        let v = self.exp_avg_sq.iter().enumerate();
        m.map(|(i, t)| (format!("exp_avg.{i}"), t.clone()))
            .chain(v.map(|(i, t)| (format!("exp_avg_sq.{i}"), t.clone())))
            .collect()
    }

    /// Restores the step counter and the moments saved by [`AdamW::state_tensors`]; every tensor
    /// must be present with this optimizer's length. Copies them onto this optimizer's device.
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
            // A copy: the moments are updated in place and must not share the caller's storage.
            *slot = t.to_device(slot.device())?.copy()?;
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

    /// One step of a fresh optimizer on one bucket holding `p`; returns the new values.
    fn one_step(wd: f64, lr: f64, p: &[f32], g: &[f32]) -> Vec<f32> {
        let dev = Device::Cpu;
        let params = vec![Var::from_slice(p, p.len(), &dev).unwrap()];
        let grads = Tensor::from_slice(g, g.len(), &dev).unwrap();
        let mut opt = AdamW::new(AdamWParams::with_weight_decay(wd), &[p.len()], &dev).unwrap();
        let bucket = FlatBucket {
            params: &params,
            grads: &grads,
        };
        opt.step(lr, 1.0, &[bucket]).unwrap();
        flat(&params)
    }

    #[test]
    fn first_step_moves_each_weight_by_about_lr() {
        // At t = 1 the bias-corrected update is g/|g| (up to eps): every weight moves by ~lr.
        let got = one_step(0.0, 0.01, &[1.0, -2.0, 0.5], &[0.3, -4.0, 1e-3]);
        for (got, want) in got.iter().zip([0.99f32, -1.99, 0.49]) {
            assert!((got - want).abs() < 1e-5, "{got} vs {want}");
        }
    }

    #[test]
    fn weight_decay_is_decoupled() {
        // With zero gradient the moments stay 0 and only p·(1 − lr·wd) remains.
        assert_eq!(one_step(0.5, 0.1, &[2.0], &[0.0]), [2.0 * 0.95]);
    }

    #[test]
    fn bucket_layout_does_not_change_the_math() {
        // 3 parameters over 2 buckets against the same values as one parameter in one bucket,
        // with weight decay and clipping, over 3 steps: bit-identical parameters and moments.
        let dev = Device::Cpu;
        let shapes: [&[usize]; 3] = [&[2, 3], &[4], &[5]];
        let init: Vec<f32> = (0..15).map(|i| (i as f32 * 0.37).sin()).collect();
        let split = vars(&dev, &shapes, &init);
        let whole = vec![Var::from_slice(&init, 15, &dev).unwrap()];
        let hp = AdamWParams::with_weight_decay(0.1);
        let mut opt_split = AdamW::new(hp, &[10, 5], &dev).unwrap();
        let mut opt_whole = AdamW::new(hp, &[15], &dev).unwrap();
        for step in 1..=3u64 {
            let grads: Vec<f32> = (0..15)
                .map(|i| (i as f32 * 1.3 + step as f32).cos() * 0.2)
                .collect();
            let g0 = Tensor::from_slice(&grads[..10], 10, &dev).unwrap();
            let g1 = Tensor::from_slice(&grads[10..], 5, &dev).unwrap();
            let g = Tensor::from_slice(&grads, 15, &dev).unwrap();
            let (lr, scale) = (2e-2 / step as f64, [1.0f32, 0.7, 0.25][step as usize - 1]);
            let buckets = [
                FlatBucket {
                    params: &split[..2],
                    grads: &g0,
                },
                FlatBucket {
                    params: &split[2..],
                    grads: &g1,
                },
            ];
            opt_split.step(lr, scale, &buckets).unwrap();
            let bucket = FlatBucket {
                params: &whole,
                grads: &g,
            };
            opt_whole.step(lr, scale, &[bucket]).unwrap();
        }
        assert_eq!(flat(&split), flat(&whole));
        assert_ne!(flat(&split), init, "the steps moved the parameters");
        let moments = |opt: &AdamW, name: &str| -> Vec<f32> {
            opt.state_tensors()
                .iter()
                .filter(|(n, _)| n.starts_with(&format!("{name}.")))
                .flat_map(|(_, t)| t.to_vec1::<f32>().unwrap())
                .collect()
        };
        for name in ["exp_avg", "exp_avg_sq"] {
            assert_eq!(
                moments(&opt_split, name),
                moments(&opt_whole, name),
                "{name}"
            );
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
        let bucket = [FlatBucket {
            params: &p,
            grads: &g,
        }];
        let mut opt = AdamW::new(AdamWParams::with_weight_decay(0.0), &[3], &dev).unwrap();
        opt.step(1e-2, 1.0, &bucket).unwrap();
        let saved: HashMap<String, Tensor> = opt.state_tensors().into_iter().collect();
        let mut fresh = AdamW::new(AdamWParams::with_weight_decay(0.0), &[3], &dev).unwrap();
        fresh.load_state(opt.step_count(), &saved).unwrap();
        assert_eq!(fresh.step_count(), 1);
        for ((_, a), (_, b)) in opt.state_tensors().iter().zip(fresh.state_tensors()) {
            assert_eq!(a.to_vec1::<f32>().unwrap(), b.to_vec1::<f32>().unwrap());
        }
        // The restored moments are the optimizer's own: stepping it leaves the saved ones alone.
        let before = saved["exp_avg.0"].to_vec1::<f32>().unwrap();
        fresh.step(1e-2, 1.0, &bucket).unwrap();
        assert_eq!(saved["exp_avg.0"].to_vec1::<f32>().unwrap(), before);
        let mut short = HashMap::new();
        short.insert(
            "exp_avg.0".to_string(),
            Tensor::zeros(2, DType::F32, &dev).unwrap(),
        );
        let msg = fresh.load_state(1, &short).unwrap_err().to_string();
        assert!(msg.contains("exp_avg.0") && msg.contains("[3]"), "{msg}");
    }
}
