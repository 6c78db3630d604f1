//! Fused multi-tensor AdamW + global-norm clip over flat fp32 buffers (`kernels/adamw.cu`).
//!
//! The trainer keeps every LoRA parameter, its gradient and both moments in four flat fp32 buffers
//! laid out alike (`docs/design.md`: "AdamW over flat fp32 buffers"); one kernel updates them all.
//! Semantics are `torch.optim.AdamW` (foreach / single-tensor path, no amsgrad, no maximize) applied
//! after `clip_grad_norm_`; the clip coefficient stays on the device (no host sync per step).
//! CUDA: one launch, bit-identical to the CPU reference (no FMA contraction). CPU: three in-place
//! passes (m, v, then p) with the same per-element arithmetic.

use crate::util::cpu_slice;
use candle_core::{bail, CpuStorage, DType, InplaceOp3, Layout, Result, Tensor};

/// AdamW hyper-parameters (torch names; `lr` already scheduled for this step).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamW {
    /// Learning rate of this step.
    pub lr: f64,
    /// First-moment decay (torch default 0.9).
    pub beta1: f64,
    /// Second-moment decay (torch default 0.999).
    pub beta2: f64,
    /// Denominator epsilon (torch default 1e-8).
    pub eps: f64,
    /// Decoupled weight decay (torch AdamW default 0.01).
    pub weight_decay: f64,
}

/// The f32 scalars the kernel takes, computed in f64 like torch's Python-side scalars.
#[derive(Clone, Copy)]
struct Scalars {
    decay: f32,
    w1: f32,
    beta2: f32,
    one_m_beta2: f32,
    eps: f32,
    step_size: f32,
    bc2_sqrt: f32,
}

impl Scalars {
    fn new(hp: &AdamW, step: u64) -> Self {
        let bc1 = 1.0 - hp.beta1.powi(step as i32);
        let bc2 = 1.0 - hp.beta2.powi(step as i32);
        Scalars {
            decay: (1.0 - hp.lr * hp.weight_decay) as f32,
            w1: (1.0 - hp.beta1) as f32,
            beta2: hp.beta2 as f32,
            one_m_beta2: (1.0 - hp.beta2) as f32,
            eps: hp.eps as f32,
            step_size: (hp.lr / bc1) as f32,
            bc2_sqrt: bc2.sqrt() as f32,
        }
    }

    /// torch's `lerp(m, g, w1)` in f32.
    #[inline]
    fn first_moment(&self, m: f32, g: f32) -> f32 {
        if self.w1 < 0.5 {
            m + self.w1 * (g - m)
        } else {
            g - (g - m) * (1.0 - self.w1)
        }
    }

    #[inline]
    fn second_moment(&self, v: f32, g: f32) -> f32 {
        v * self.beta2 + self.one_m_beta2 * g * g
    }

    #[inline]
    fn param(&self, p: f32, m: f32, v: f32) -> f32 {
        p * self.decay + -self.step_size * (m / (v.sqrt() / self.bc2_sqrt + self.eps))
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

struct AdamWPass(Scalars, Pass);

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
    use super::Scalars;
    use crate::cuda::{self, cuda_module, cuda_of, Module};
    use candle_core::cuda_backend::cudarc::driver::{DevicePtr, PushKernelArg};
    use candle_core::cuda_backend::WrapErr;
    use candle_core::{Result, Tensor};

    const MODULE: Module = cuda_module!("adamw");

    /// One launch updating p, m, v. They are written through device pointers taken under read
    /// locks: device memory is never borrowed by Rust, and the kernel runs on candle's stream
    /// after every kernel that produced these buffers.
    pub(super) fn step(ts: [&Tensor; 5], sc: Scalars, n: usize) -> Result<()> {
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
            sc.w1,
            sc.beta2,
            sc.one_m_beta2,
            sc.eps,
            sc.step_size,
            sc.bc2_sqrt,
        ];
        let mut b = stream.launch_builder(&f);
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

    /// `[norm, coef]` of a contiguous f32 CUDA tensor: two launches, deterministic order.
    pub(super) fn clip(grads: &Tensor, max_norm: f32) -> Result<Tensor> {
        let op = "clip-coefficient";
        let (s, l) = grads.storage_and_layout();
        let cs = cuda_of(&s, op, "grads")?;
        let g = cuda::view::<f32>(cs, l, op, "grads")?;
        let dev = cs.device.clone();
        let stream = dev.cuda_stream();
        let n = l.shape().elem_count();
        let cfg = cuda::elementwise(n);
        let nparts = cfg.grid_dim.0 as i32;
        // SAFETY: each block writes its partial; the finish kernel writes both outputs.
        let partial = unsafe { dev.alloc::<f32>(nparts as usize)? };
        let out = unsafe { dev.alloc::<f32>(2)? };
        let f = cuda::func(&dev, &MODULE, "sumsq_partial_f32")?;
        let mut b = stream.launch_builder(&f);
        b.arg(&g).arg(&partial).arg(&n);
        // SAFETY: g holds n f32, partial one per block.
        unsafe { b.launch(cfg) }.w()?;
        let f = cuda::func(&dev, &MODULE, "clip_finish_f32")?;
        let mut b = stream.launch_builder(&f);
        b.arg(&partial).arg(&nparts).arg(&out).arg(&max_norm);
        // SAFETY: one block reads nparts partials and writes 2 f32.
        unsafe { b.launch(cuda::per_row(1, 1024)) }.w()?;
        Ok(crate::util::tensor_from_storage(
            candle_core::Storage::Cuda(cuda::wrap(out, &dev)),
            &[2],
        ))
    }
}

/// One AdamW step, in place on `params`, `m` and `v` (all flat fp32 of the same length, distinct
/// tensors, contiguous), from `grads` (same length) scaled by `clip_coef` (a 1-element f32 tensor
/// on the same device, e.g. from [`clip_coefficient`]; pass a tensor holding 1.0 for no clipping).
/// `step` is the 1-based optimizer step (bias corrections). `grads` is not modified.
pub fn adamw_step(
    params: &Tensor,
    grads: &Tensor,
    m: &Tensor,
    v: &Tensor,
    hp: &AdamW,
    step: u64,
    clip_coef: &Tensor,
) -> Result<()> {
    let n = check(params, grads, m, v, clip_coef, step)?;
    let sc = Scalars::new(hp, step);
    let clip = clip_coef.flatten_all()?;
    #[cfg(feature = "cuda")]
    if params.device().is_cuda() {
        return cuda_impl::step([params, grads, m, v, &clip], sc, n);
    }
    let _ = n;
    m.inplace_op3(grads, &clip, &AdamWPass(sc, Pass::First))?;
    v.inplace_op3(grads, &clip, &AdamWPass(sc, Pass::Second))?;
    params.inplace_op3(m, v, &AdamWPass(sc, Pass::Param))
}

fn check(
    p: &Tensor,
    g: &Tensor,
    m: &Tensor,
    v: &Tensor,
    clip: &Tensor,
    step: u64,
) -> Result<usize> {
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
    if step == 0 {
        bail!("adamw_step: step is 1-based (bias correction 1 - beta^step would be 0)");
    }
    Ok(n)
}

/// Composite reference for [`adamw_step`]: returns the new `(params, m, v)` computed with tensor ops
/// (the same f32 arithmetic as torch, without torch's lerp branch for `1 − beta1 >= 0.5`).
pub fn adamw_step_slow(
    params: &Tensor,
    grads: &Tensor,
    m: &Tensor,
    v: &Tensor,
    hp: &AdamW,
    step: u64,
    clip_coef: &Tensor,
) -> Result<(Tensor, Tensor, Tensor)> {
    check(params, grads, m, v, clip_coef, step)?;
    let sc = Scalars::new(hp, step);
    let g = grads.broadcast_mul(&clip_coef.flatten_all()?)?;
    let m = (m + ((&g - m)? * sc.w1 as f64)?)?;
    let v = ((v * sc.beta2 as f64)? + ((&g * sc.one_m_beta2 as f64)? * &g)?)?;
    let denom = ((v.sqrt()? / sc.bc2_sqrt as f64)? + sc.eps as f64)?;
    let p = ((params * sc.decay as f64)? + ((&m / &denom)? * -(sc.step_size as f64))?)?;
    Ok((p, m, v))
}

/// `(total_norm, clip_coef)` of `torch.nn.utils.clip_grad_norm_(grads, max_norm)`: the L2 norm over
/// all elements and `min(1, max_norm / (norm + 1e-6))`, both 0-dim f32 tensors on the grads' device
/// (no host sync; on CUDA two launches in a fixed summation order, deterministic). Pass `clip_coef`
/// to [`adamw_step`]; read `total_norm` for logging later.
pub fn clip_coefficient(grads: &Tensor, max_norm: f64) -> Result<(Tensor, Tensor)> {
    #[cfg(feature = "cuda")]
    if grads.device().is_cuda() && grads.dtype() == DType::F32 {
        let out = cuda_impl::clip(&grads.contiguous()?, max_norm as f32)?; // (2,): norm, coef
        return Ok((out.get(0)?, out.get(1)?));
    }
    let norm = grads.to_dtype(DType::F32)?.sqr()?.sum_all()?.sqrt()?;
    let max = Tensor::new(max_norm as f32, grads.device())?;
    let coef = max.div(&(&norm + 1e-6)?)?.minimum(1f32)?;
    Ok((norm, coef))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{assert_close, randn};
    use candle_core::Device;

    fn hp() -> AdamW {
        AdamW {
            lr: 2e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
        }
    }

    #[test]
    fn fused_matches_slow_over_steps() -> Result<()> {
        let dev = Device::Cpu;
        let n = 37;
        let p = randn(&[n], DType::F32, 1, &dev)?;
        let (m, v) = (
            Tensor::zeros(n, DType::F32, &dev)?,
            Tensor::zeros(n, DType::F32, &dev)?,
        );
        let (mut ps, mut ms, mut vs) = (p.copy()?, m.copy()?, v.copy()?);
        for step in 1..=3u64 {
            let g = randn(&[n], DType::F32, 10 + step, &dev)?;
            let (_, coef) = clip_coefficient(&g, 1.0)?;
            assert!(
                coef.to_scalar::<f32>()? < 1.0,
                "the test grads are large enough to be clipped"
            );
            adamw_step(&p, &g, &m, &v, &hp(), step, &coef)?;
            (ps, ms, vs) = adamw_step_slow(&ps, &g, &ms, &vs, &hp(), step, &coef)?;
        }
        assert_close("m", &m, &ms, 0.0, 0.0)?;
        assert_close("v", &v, &vs, 0.0, 0.0)?;
        assert_close("p", &p, &ps, 1e-7, 1e-6)?;
        // the step moved the parameters
        assert!(
            (p - randn(&[n], DType::F32, 1, &dev)?)?
                .abs()?
                .max_all()?
                .to_scalar::<f32>()?
                > 1e-3
        );
        Ok(())
    }

    #[test]
    fn first_step_matches_torch() -> Result<()> {
        // torch 2.11: p = torch.tensor([1., -2.]); p.grad = torch.tensor([.5, .25]);
        // AdamW([p], lr=0.1, weight_decay=0.01).step() -> tensor([0.8990, -2.0980])
        let dev = Device::Cpu;
        let p = Tensor::new(&[1f32, -2.], &dev)?;
        let g = Tensor::new(&[0.5f32, 0.25], &dev)?;
        let (m, v) = (
            Tensor::zeros(2, DType::F32, &dev)?,
            Tensor::zeros(2, DType::F32, &dev)?,
        );
        let hp = AdamW { lr: 0.1, ..hp() };
        adamw_step(&p, &g, &m, &v, &hp, 1, &Tensor::new(&[1f32], &dev)?)?;
        assert_close(
            "p",
            &p,
            &Tensor::new(&[0.899f32, -2.098], &dev)?,
            1e-6,
            1e-6,
        )
    }
}
