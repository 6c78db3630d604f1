//! AdamW with `torch.optim.AdamW` semantics over flat fp32 buffers (`kernels/adamw.cu`), and
//! the L2 norm that `clip_grad_norm_` takes. The one definition of the optimizer arithmetic: the
//! trainer's optimizer (`g4ft_trainer::step::optim::AdamW`) keeps the moments and the step counter and
//! calls [`adamw_step`] on every device.
//!
//! Per element, with `t` the 1-based step and `g` the gradient times the clip coefficient:
//! ```text
//! p ← p·(1 − lr·wd)                                  (decoupled weight decay)
//! m ← lerp(m, g, 1 − β₁) = m + (1 − β₁)·(g − m)      (torch: exp_avg.lerp_(g, 1 − β₁))
//! v ← v·β₂ + (1 − β₂)·g·g
//! p ← p − (lr / (1 − β₁ᵗ)) · m / (√v / √(1 − β₂ᵗ) + ε)
//! ```
//! This is torch 2.11's single-tensor path (`_single_tensor_adam`, no amsgrad, no maximize): the
//! bias corrections and the step size in f64 ([`AdamWScalars::new`]), the elementwise work in
//! f32 in the same operation order, so the CPU result is torch's CPU result bit for bit (checked
//! against torch by `crates/trainer/tests/golden_optim.rs`). Folding the clip coefficient into
//! the step (`g·clip`, the same f32 product as `clip_grad_norm_`'s in-place `mul_`) gives exactly
//! clip-then-step without a pass over the gradients.
//!
//! CPU: three in-place passes (m, v, then p). CUDA: one launch with the same per-element
//! arithmetic (explicit `_rn` intrinsics, no FMA contraction), except the last product: the
//! kernel forms `−step·(m/denom)` as torch's CUDA `addcdiv` does, the CPU `(−step·m)/denom` as
//! torch's CPU `addcdiv` does. Moments are bit-identical across devices, parameters agree to an
//! ulp.

use crate::util::cpu_slice;
use candle_core::{bail, CpuStorage, DType, InplaceOp3, Layout, Result, Tensor};

/// AdamW hyper-parameters that stay fixed over a run (the learning rate comes from the schedule
/// at each step; torch names).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWParams {
    /// β₁, decay of the first moment (torch default 0.9).
    pub beta1: f64,
    /// β₂, decay of the second moment (torch default 0.999).
    pub beta2: f64,
    /// ε added to the bias-corrected √v (torch default 1e-8).
    pub eps: f64,
    /// Decoupled weight decay (torch AdamW default 0.01).
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

/// The per-step scalars of one AdamW update, computed in f64 as torch does in Python and used as
/// f32 by the elementwise code (the CPU passes and the CUDA kernel).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWScalars {
    /// Multiplier for the weight decay, `1 − lr·wd` (exactly 1 when wd = 0).
    pub decay: f32,
    /// `1 − β₁`, the lerp weight of the first moment.
    pub one_minus_beta1: f32,
    /// β₂.
    pub beta2: f32,
    /// `1 − β₂`.
    pub one_minus_beta2: f32,
    /// ε.
    pub eps: f32,
    /// `lr / (1 − β₁ᵗ)`.
    pub step_size: f32,
    /// `√(1 − β₂ᵗ)`.
    pub bias_correction2_sqrt: f32,
}

impl AdamWScalars {
    /// Scalars for step `step` (1-based, the value after torch's `state_steps += 1`) with
    /// learning rate `lr`.
    ///
    /// # Panics
    /// If `step` is 0 (the bias correction `1 − β₁⁰` would be 0).
    pub fn new(p: &AdamWParams, lr: f64, step: u64) -> Self {
        assert!(step > 0, "AdamW steps are 1-based");
        let t = step as f64;
        let bias_correction1 = 1.0 - p.beta1.powf(t);
        let bias_correction2 = 1.0 - p.beta2.powf(t);
        Self {
            decay: (1.0 - lr * p.weight_decay) as f32,
            one_minus_beta1: (1.0 - p.beta1) as f32,
            beta2: p.beta2 as f32,
            one_minus_beta2: (1.0 - p.beta2) as f32,
            eps: p.eps as f32,
            step_size: (lr / bias_correction1) as f32,
            bias_correction2_sqrt: bias_correction2.sqrt() as f32,
        }
    }

    /// torch's scalar `lerp(m, g, 1 − β₁)` (ATen `Lerp.h`: two forms for accuracy near 0 and 1).
    #[inline]
    fn first_moment(&self, m: f32, g: f32) -> f32 {
        let w = self.one_minus_beta1;
        if w < 0.5 {
            m + w * (g - m)
        } else {
            g - (g - m) * (1.0 - w)
        }
    }

    #[inline]
    fn second_moment(&self, v: f32, g: f32) -> f32 {
        v * self.beta2 + self.one_minus_beta2 * g * g
    }

    /// The decayed parameter plus torch's CPU `addcdiv(p, m, denom, value = −step)`.
    #[inline]
    fn param(&self, p: f32, m: f32, v: f32) -> f32 {
        let denom = v.sqrt() / self.bias_correction2_sqrt + self.eps;
        p * self.decay + -self.step_size * m / denom
    }
}

/// Which buffer a CPU pass updates in place.
#[derive(Clone, Copy)]
enum Pass {
    /// m ← lerp(m, g·clip): sources (g, clip).
    First,
    /// v ← v·β2 + (1−β2)·(g·clip)²: sources (g, clip).
    Second,
    /// p ← p·(1−lr·wd) − step·m/(√v/√bc2 + eps): sources (m, v).
    Param,
}

struct AdamWPass(AdamWScalars, Pass);

impl InplaceOp3 for AdamWPass {
    fn name(&self) -> &'static str {
        "adamw-step"
    }

    fn cpu_fwd(
        &self,
        s1: &mut CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<()> {
        let op = self.name();
        let (a, b) = l1.contiguous_offsets().ok_or_else(|| {
            candle_core::Error::Msg(format!("{op}: destination must be contiguous"))
        })?;
        let CpuStorage::F32(dst) = s1 else {
            bail!("{op}: buffers must be f32");
        };
        let dst = &mut dst[a..b];
        let x = cpu_slice::<f32>(s2, l2, op, "source")?;
        let y = cpu_slice::<f32>(s3, l3, op, "source")?;
        let sc = self.0;
        match self.1 {
            Pass::First => dst
                .iter_mut()
                .zip(x)
                .for_each(|(m, g)| *m = sc.first_moment(*m, g * y[0])),
            Pass::Second => dst
                .iter_mut()
                .zip(x)
                .for_each(|(v, g)| *v = sc.second_moment(*v, g * y[0])),
            Pass::Param => {
                for ((p, m), v) in dst.iter_mut().zip(x).zip(y) {
                    *p = sc.param(*p, *m, *v);
                }
            }
        }
        Ok(())
    }
}

#[cfg(feature = "cuda")]
mod cuda_impl {
    use super::AdamWScalars;
    use crate::cuda::{self, cuda_module, cuda_of, Module};
    use candle_core::cuda_backend::cudarc::driver::DevicePtr;
    use candle_core::cuda_backend::WrapErr;
    use candle_core::{Result, Tensor};

    const MODULE: Module = cuda_module!("adamw");

    /// One launch updating p, m, v. They are written through device pointers taken under read
    /// locks: device memory is never borrowed by Rust, and the kernel runs on candle's stream
    /// after every kernel that produced these buffers.
    pub(super) fn step(ts: [&Tensor; 5], sc: &AdamWScalars, n: usize) -> Result<()> {
        let op = "adamw-step";
        let names = ["params", "grads", "m", "v", "clip_coef"];
        let guards = ts.map(|t| t.storage_and_layout());
        let mut views = Vec::with_capacity(5);
        for (i, (s, l)) in guards.iter().enumerate() {
            views.push(cuda::view::<f32>(
                cuda_of(s, op, names[i])?,
                l,
                op,
                names[i],
            )?);
        }
        let dev = cuda_of(&guards[0].0, op, "params")?.device.clone();
        let stream = dev.cuda_stream();
        let f = cuda::func(&dev, &MODULE, "adamw_f32")?;
        let (p, _gp) = views[0].device_ptr(&stream);
        let (m, _gm) = views[2].device_ptr(&stream);
        let (v, _gv) = views[3].device_ptr(&stream);
        let scalars = [
            sc.decay,
            sc.one_minus_beta1,
            sc.beta2,
            sc.one_minus_beta2,
            sc.eps,
            sc.step_size,
            sc.bias_correction2_sqrt,
        ];
        let mut b = cuda::launch_args(&stream, &f);
        b.arg(&p)
            .arg(&views[1])
            .arg(&m)
            .arg(&v)
            .arg(&views[4])
            .arg(&n);
        for x in &scalars {
            b.arg(x);
        }
        // SAFETY: p, g, m, v hold n f32 each (checked by the caller), clip one f32; p, m and v are
        // distinct tensors (checked), so the kernel's writes do not alias its other inputs.
        unsafe { b.launch(cuda::elementwise(n)) }.w()?;
        Ok(())
    }

    /// The L2 norm (0-dim) of a contiguous f32 CUDA tensor: two launches, deterministic order.
    pub(super) fn l2_norm(grads: &Tensor) -> Result<Tensor> {
        let op = "l2-norm";
        let (s, l) = grads.storage_and_layout();
        let cs = cuda_of(&s, op, "grads")?;
        let g = cuda::view::<f32>(cs, l, op, "grads")?;
        let dev = cs.device.clone();
        let stream = dev.cuda_stream();
        let n = l.shape().elem_count();
        let cfg = cuda::elementwise(n);
        let nparts = cfg.grid_dim.0 as i32;
        // SAFETY: each block writes its partial; the finish kernel writes the output.
        let partial = unsafe { dev.alloc::<f32>(nparts as usize)? };
        let out = unsafe { dev.alloc::<f32>(1)? };
        let f = cuda::func(&dev, &MODULE, "sumsq_partial_f32")?;
        let mut b = cuda::launch_args(&stream, &f);
        b.arg(&g).arg(&partial).arg(&n);
        // SAFETY: g holds n f32, partial one per block.
        unsafe { b.launch(cfg) }.w()?;
        let f = cuda::func(&dev, &MODULE, "norm_finish_f32")?;
        let mut b = cuda::launch_args(&stream, &f);
        b.arg(&partial).arg(&nparts).arg(&out);
        // SAFETY: one block reads nparts partials and writes 1 f32.
        unsafe { b.launch(cuda::per_row(1, 1024)) }.w()?;
        Ok(crate::util::tensor_from_storage(
            candle_core::Storage::Cuda(cuda::wrap(out, &dev)),
            &[],
        ))
    }
}

/// One AdamW step, in place on `params`, `m` and `v` (all flat fp32 of the same length, distinct
/// tensors, contiguous), from `grads` (same length) times `clip_coef` (a 1-element f32 tensor on
/// the same device: the clip coefficient, 1.0 for no clipping), with the scalars of this step.
/// `grads` is not modified.
pub fn adamw_step(
    params: &Tensor,
    grads: &Tensor,
    m: &Tensor,
    v: &Tensor,
    scalars: &AdamWScalars,
    clip_coef: &Tensor,
) -> Result<()> {
    let n = check(params, grads, m, v, clip_coef)?;
    let clip = clip_coef.flatten_all()?;
    #[cfg(feature = "cuda")]
    if params.device().is_cuda() {
        return cuda_impl::step([params, grads, m, v, &clip], scalars, n);
    }
    let _ = n;
    let sc = *scalars;
    m.inplace_op3(grads, &clip, &AdamWPass(sc, Pass::First))?;
    v.inplace_op3(grads, &clip, &AdamWPass(sc, Pass::Second))?;
    params.inplace_op3(m, v, &AdamWPass(sc, Pass::Param))
}

fn check(p: &Tensor, g: &Tensor, m: &Tensor, v: &Tensor, clip: &Tensor) -> Result<usize> {
    let n = p.elem_count();
    for (name, t) in [("params", p), ("grads", g), ("m", m), ("v", v)] {
        if t.dtype() != DType::F32 || t.elem_count() != n || !t.is_contiguous() {
            bail!(
                "adamw_step: {name} must be contiguous f32 with {n} elements like params, got {:?} {:?}",
                t.dtype(),
                t.dims()
            );
        }
    }
    if clip.dtype() != DType::F32 || clip.elem_count() != 1 {
        bail!(
            "adamw_step: clip_coef must be one f32, got {:?} {:?}",
            clip.dtype(),
            clip.dims()
        );
    }
    if p.id() == m.id() || p.id() == v.id() || m.id() == v.id() {
        bail!("adamw_step: params, m and v must be distinct tensors");
    }
    Ok(n)
}

/// The L2 norm of all elements of `t` as a 0-dim f32 tensor on its device, the per-tensor norm
/// of `clip_grad_norm_`. CPU: the sum of squares accumulated in f64, rounded once. CUDA (f32):
/// two launches in a fixed summation order (deterministic, no host sync).
pub fn l2_norm(t: &Tensor) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if t.device().is_cuda() && t.dtype() == DType::F32 {
        return cuda_impl::l2_norm(&t.contiguous()?);
    }
    let v = t.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?;
    let sum_sq: f64 = v.iter().map(|&x| x as f64 * x as f64).sum();
    Tensor::new(sum_sq.sqrt() as f32, t.device())
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn zeros(n: usize) -> Result<Tensor> {
        Tensor::zeros(n, DType::F32, &Device::Cpu)
    }

    #[test]
    fn first_step_matches_torch() -> Result<()> {
        // torch 2.11: p = torch.tensor([1., -2.]); p.grad = torch.tensor([.5, .25]);
        // AdamW([p], lr=0.1, weight_decay=0.01).step() -> tensor([0.8990, -2.0980])
        let dev = Device::Cpu;
        let p = Tensor::new(&[1f32, -2.], &dev)?;
        let g = Tensor::new(&[0.5f32, 0.25], &dev)?;
        let (m, v) = (zeros(2)?, zeros(2)?);
        let s = AdamWScalars::new(&AdamWParams::with_weight_decay(0.01), 0.1, 1);
        adamw_step(&p, &g, &m, &v, &s, &Tensor::new(&[1f32], &dev)?)?;
        let got = p.to_vec1::<f32>()?;
        for (got, want) in got.iter().zip([0.899f32, -2.098]) {
            assert!((got - want).abs() < 1e-6, "{got} vs {want}");
        }
        Ok(())
    }

    #[test]
    fn clip_coefficient_is_the_clipped_gradient() -> Result<()> {
        // Folding the coefficient in equals stepping with g·coef, bit for bit, over steps.
        let dev = Device::Cpu;
        let n = 37;
        let init: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
        let a = Tensor::new(init.as_slice(), &dev)?;
        let b = Tensor::new(init.as_slice(), &dev)?;
        let (ma, va, mb, vb) = (zeros(n)?, zeros(n)?, zeros(n)?, zeros(n)?);
        let hp = AdamWParams::with_weight_decay(0.1);
        for step in 1..=3u64 {
            let g: Vec<f32> = (0..n)
                .map(|i| (i as f32 * 1.3 + step as f32).cos())
                .collect();
            let g = Tensor::new(g.as_slice(), &dev)?;
            let coef = 0.3f32;
            let s = AdamWScalars::new(&hp, 1e-2, step);
            adamw_step(&a, &g, &ma, &va, &s, &Tensor::new(&[coef], &dev)?)?;
            let clipped = (&g * coef as f64)?;
            adamw_step(&b, &clipped, &mb, &vb, &s, &Tensor::new(&[1f32], &dev)?)?;
        }
        for (x, y) in [(&a, &b), (&ma, &mb), (&va, &vb)] {
            assert_eq!(x.to_vec1::<f32>()?, y.to_vec1::<f32>()?);
        }
        assert_ne!(a.to_vec1::<f32>()?, init, "the steps moved the parameters");
        Ok(())
    }

    #[test]
    fn bad_buffers_are_named() -> Result<()> {
        let p = zeros(3)?;
        let s = AdamWScalars::new(&AdamWParams::with_weight_decay(0.0), 1e-3, 1);
        let one = Tensor::new(&[1f32], &Device::Cpu)?;
        let err = adamw_step(&p, &zeros(4)?, &zeros(3)?, &zeros(3)?, &s, &one).unwrap_err();
        assert!(
            err.to_string()
                .contains("grads must be contiguous f32 with 3"),
            "{err}"
        );
        let err = adamw_step(&p, &zeros(3)?, &p, &zeros(3)?, &s, &one).unwrap_err();
        assert!(err.to_string().contains("distinct"), "{err}");
        Ok(())
    }

    #[test]
    fn l2_norm_spans_the_tensor() -> Result<()> {
        let t = Tensor::new(&[[3f32, 0.0], [0.0, 4.0]], &Device::Cpu)?;
        assert_eq!(l2_norm(&t)?.to_scalar::<f32>()?, 5.0);
        Ok(())
    }
}
