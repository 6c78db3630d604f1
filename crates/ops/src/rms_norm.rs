//! Gemma 4 RMSNorm, fused (`kernels/rms_norm.cu`): `y = x·r·w`, `r = 1/sqrt(mean(x²) + eps)` over the
//! last axis, fp32 math, one rounding to `x`'s dtype (transformers `Gemma4RMSNorm`, no `1 + w`).
//!
//! The weight is frozen in LoRA training, so it is an attribute of the op, not an input: the backward
//! returns only `dx = r·(u − x·r²·mean(u·x))` with `u = g·w` (fp32), and never a weight gradient.

use crate::util::{cpu_slice, with_cpu_storage, with_float_type, Elem, Storable};
use candle_core::{
    bail, CpuStorage, CustomOp1, CustomOp2, DType, Layout, Result, Shape, Tensor, D,
};

/// Forward op on `x`; `weight` (d,) in `x`'s dtype or `None` (scale-free); `residual` (x's shape)
/// is added to the rounded output (graph-free callers only).
struct RmsNorm {
    weight: Option<Tensor>,
    eps: f32,
    residual: Option<Tensor>,
}

/// Backward op on `(x, g)` → `dx` (plus `residual`, if any).
struct RmsNormBwd {
    weight: Option<Tensor>,
    eps: f32,
    residual: Option<Tensor>,
}

/// `y[i] = r(residual[i] + y[i])` on the CPU (the kernels' `with_res`).
fn add_residual<T: Elem>(mut y: Vec<T>, residual: Option<&Tensor>, op: &str) -> Result<Vec<T>> {
    if let Some(res) = residual {
        with_cpu_storage(res, op, "residual", |rs, rl| {
            let r = cpu_slice::<T>(rs, rl, op, "residual")?;
            for (y, r) in y.iter_mut().zip(r) {
                *y = T::from_f32(r.to_f32() + y.to_f32());
            }
            Ok(())
        })?;
    }
    Ok(y)
}

fn fwd_cpu<T: Elem>(x: &[T], w: Option<&[T]>, d: usize, eps: f32) -> Vec<T> {
    let mut y = Vec::with_capacity(x.len());
    for row in x.chunks_exact(d) {
        let ss: f32 = row.iter().map(|v| v.to_f32() * v.to_f32()).sum();
        let r = 1.0 / (ss / d as f32 + eps).sqrt();
        for (i, v) in row.iter().enumerate() {
            let wi = w.map_or(1.0, |w| w[i].to_f32());
            y.push(T::from_f32(v.to_f32() * r * wi));
        }
    }
    y
}

fn bwd_cpu<T: Elem>(x: &[T], w: Option<&[T]>, g: &[T], d: usize, eps: f32) -> Vec<T> {
    let mut dx = Vec::with_capacity(x.len());
    for (row, grow) in x.chunks_exact(d).zip(g.chunks_exact(d)) {
        let u = |i: usize| grow[i].to_f32() * w.map_or(1.0, |w| w[i].to_f32());
        let ss: f32 = row.iter().map(|v| v.to_f32() * v.to_f32()).sum();
        let ux: f32 = (0..d).map(|i| u(i) * row[i].to_f32()).sum();
        let r = 1.0 / (ss / d as f32 + eps).sqrt();
        let c = r * r * ux / d as f32;
        for (i, x) in row.iter().enumerate() {
            dx.push(T::from_f32(r * (u(i) - x.to_f32() * c)));
        }
    }
    dx
}

fn check_weight(w: &Option<Tensor>, x: &Tensor) -> Result<()> {
    if let Some(w) = w {
        let d = x.dim(D::Minus1)?;
        if w.dims() != [d] || w.dtype() != x.dtype() {
            bail!(
                "rms_norm: weight must be ({d},) {:?} like x's last axis, got {:?} {:?}",
                x.dtype(),
                w.dims(),
                w.dtype()
            );
        }
    }
    Ok(())
}

impl CustomOp1 for RmsNorm {
    fn name(&self) -> &'static str {
        "rms-norm"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let d = l.dims().last().copied().unwrap_or(1);
        with_float_type!(s, self.name(), T => {
            let x = cpu_slice::<T>(s, l, self.name(), "x")?;
            let y = match &self.weight {
                None => fwd_cpu(x, None, d, self.eps),
                Some(w) => with_cpu_storage(w, self.name(), "weight", |ws, wl| {
                    Ok(fwd_cpu(x, Some(cpu_slice::<T>(ws, wl, self.name(), "weight")?), d, self.eps))
                })?,
            };
            let y = add_residual(y, self.residual.as_ref(), self.name())?;
            Ok((T::storage(y), l.shape().clone()))
        })
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let y = cuda_impl::launch(
            self.name(),
            (s, l),
            None,
            (self.weight.as_ref(), self.residual.as_ref()),
            self.eps,
        )?;
        Ok((y, l.shape().clone()))
    }

    fn bwd(&self, x: &Tensor, _res: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        let op = RmsNormBwd {
            weight: self.weight.clone(),
            eps: self.eps,
            residual: None,
        };
        Ok(Some(x.apply_op2_no_bwd(&g.contiguous()?, &op)?))
    }
}

/// The backward of [`rms_norm`] on its own, for explicit (graph-free) backward passes: `dx` from
/// the forward input `x` and the output gradient `g` (the kernel autograd runs), plus `residual`
/// (another gradient of `x`, rounded like a separate add) in the same pass. Records no graph.
pub fn rms_norm_backward(
    x: &Tensor,
    weight: Option<&Tensor>,
    g: &Tensor,
    eps: f64,
    residual: Option<&Tensor>,
) -> Result<Tensor> {
    let weight = weight.map(|w| w.detach().contiguous()).transpose()?;
    check_weight(&weight, x)?;
    for (t, what) in std::iter::once((g, "grad")).chain(residual.map(|r| (r, "residual"))) {
        if t.dims() != x.dims() || t.dtype() != x.dtype() {
            bail!(
                "rms_norm_backward: {what} {:?} {:?} must match x {:?} {:?}",
                t.dims(),
                t.dtype(),
                x.dims(),
                x.dtype()
            );
        }
    }
    let op = RmsNormBwd {
        weight,
        eps: eps as f32,
        residual: residual.map(|r| r.contiguous()).transpose()?,
    };
    x.contiguous()?.apply_op2_no_bwd(&g.contiguous()?, &op)
}

/// [`rms_norm_backward`] for a forward input that dies here: `dx` is written over `x`'s memory
/// (each kernel row reads its `x` before writing `dx`), so `x` (consumed; contiguous, owning its
/// storage alone) comes back holding `dx`. No new buffer. Records no graph.
pub fn rms_norm_backward_over_input(
    x: Tensor,
    weight: Option<&Tensor>,
    g: &Tensor,
    eps: f64,
) -> Result<Tensor> {
    let weight = weight.map(|w| w.detach().contiguous()).transpose()?;
    check_weight(&weight, &x)?;
    if g.dims() != x.dims() || g.dtype() != x.dtype() || !x.is_contiguous() {
        bail!(
            "rms_norm_backward_over_input: grad {:?} {:?} must match x {:?} {:?}, x contiguous",
            g.dims(),
            g.dtype(),
            x.dims(),
            x.dtype()
        );
    }
    let op = RmsNormBwd {
        weight,
        eps: eps as f32,
        residual: None,
    };
    x.inplace_op2(&g.contiguous()?, &op)?;
    Ok(x)
}

impl candle_core::InplaceOp2 for RmsNormBwd {
    fn name(&self) -> &'static str {
        "rms-norm-bwd-over-input"
    }

    fn cpu_fwd(&self, s: &mut CpuStorage, l: &Layout, gs: &CpuStorage, gl: &Layout) -> Result<()> {
        let op = candle_core::InplaceOp2::name(self);
        let Some((a, b)) = l.contiguous_offsets() else {
            bail!("{op}: x must be contiguous");
        };
        let (dx, _) = CustomOp2::cpu_fwd(self, s, l, gs, gl)?;
        with_float_type!(gs, op, T => {
            T::slice_mut(s, op, "x")?[a..b].copy_from_slice(T::slice(&dx, op, "dx")?);
            Ok(())
        })
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &mut candle_core::CudaStorage,
        l: &Layout,
        gs: &candle_core::CudaStorage,
        gl: &Layout,
    ) -> Result<()> {
        cuda_impl::launch_over_input(
            candle_core::InplaceOp2::name(self),
            (s, l),
            (gs, gl),
            self.weight.as_ref(),
            self.eps,
        )
    }
}

/// `residual + rms_norm(x, weight)` in one pass without a graph (explicit forward passes), rounded
/// like the separate ops: `r(residual + r(norm))`. `residual` must match `x`.
pub fn rms_norm_add(
    x: &Tensor,
    weight: Option<&Tensor>,
    eps: f64,
    residual: &Tensor,
) -> Result<Tensor> {
    let weight = weight.map(|w| w.detach().contiguous()).transpose()?;
    check_weight(&weight, x)?;
    if residual.dims() != x.dims() || residual.dtype() != x.dtype() {
        bail!(
            "rms_norm_add: residual {:?} {:?} must match x {:?} {:?}",
            residual.dims(),
            residual.dtype(),
            x.dims(),
            x.dtype()
        );
    }
    let op = RmsNorm {
        weight,
        eps: eps as f32,
        residual: Some(residual.contiguous()?),
    };
    x.contiguous()?.apply_op1_no_bwd(&op)
}

impl CustomOp2 for RmsNormBwd {
    fn name(&self) -> &'static str {
        "rms-norm-bwd"
    }

    fn cpu_fwd(
        &self,
        s: &CpuStorage,
        l: &Layout,
        gs: &CpuStorage,
        gl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let d = l.dims().last().copied().unwrap_or(1);
        with_float_type!(s, self.name(), T => {
            let x = cpu_slice::<T>(s, l, self.name(), "x")?;
            let g = cpu_slice::<T>(gs, gl, self.name(), "grad")?;
            let dx = match &self.weight {
                None => bwd_cpu(x, None, g, d, self.eps),
                Some(w) => with_cpu_storage(w, self.name(), "weight", |ws, wl| {
                    Ok(bwd_cpu(x, Some(cpu_slice::<T>(ws, wl, self.name(), "weight")?), g, d, self.eps))
                })?,
            };
            let dx = add_residual(dx, self.residual.as_ref(), self.name())?;
            Ok((T::storage(dx), l.shape().clone()))
        })
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
        gs: &candle_core::CudaStorage,
        gl: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let dx = cuda_impl::launch(
            self.name(),
            (s, l),
            Some((gs, gl)),
            (self.weight.as_ref(), self.residual.as_ref()),
            self.eps,
        )?;
        Ok((dx, l.shape().clone()))
    }
}

#[cfg(feature = "cuda")]
mod cuda_impl {
    use crate::cuda::{self, cuda_module, with_cuda_float_type, Module};
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::{DevicePtr, LaunchConfig};
    use candle_core::cuda_backend::WrapErr;
    use candle_core::{CudaStorage, Layout, Result, Tensor};

    const MODULE: Module = cuda_module!("rms_norm");

    /// Kernel roots by [backward][warp layout].
    const ROOTS: [[&str; 2]; 2] = [
        ["rms_norm_fwd", "rms_norm_fwd_warp"],
        ["rms_norm_bwd", "rms_norm_bwd_warp"],
    ];

    /// Launch shape and kernel root: rows up to 1024 elements get one warp each (8 rows per
    /// block, the `_warp` kernels); longer rows one block each, a thread per 16-byte pack.
    fn launch_layout(rows: usize, d: usize, backward: bool) -> (LaunchConfig, &'static str) {
        let warp = d <= 1024;
        let cfg = if warp {
            cuda::warp_per_row(rows)
        } else {
            cuda::per_row(rows, cuda::row_threads(d.div_ceil(8)).min(512))
        };
        (cfg, ROOTS[usize::from(backward)][usize::from(warp)])
    }

    /// The backward kernel with `dx` written over `x`.
    pub(super) fn launch_over_input(
        op: &str,
        (s, l): (&mut CudaStorage, &Layout),
        (gs, gl): (&CudaStorage, &Layout),
        weight: Option<&Tensor>,
        eps: f32,
    ) -> Result<()> {
        let dev = s.device().clone();
        let d = l.dims().last().copied().unwrap_or(1);
        let rows = l.shape().elem_count() / d.max(1);
        let wguard = weight.map(|w| w.storage_and_layout());
        let stream = dev.cuda_stream();
        with_cuda_float_type!(gs, op, T => {
            let x = cuda::view::<T>(s, l, op, "x")?.device_ptr(&stream).0;
            let g = cuda::view::<T>(gs, gl, op, "grad")?;
            let w = match &wguard {
                Some((ws, wl)) => cuda::view::<T>(cuda::cuda_of(ws, op, "weight")?, wl, op, "weight")?.device_ptr(&stream).0,
                None => 0u64,
            };
            let (cfg, root) = launch_layout(rows, d, true);
            let f = cuda::func(&dev, &MODULE, &cuda::kname::<T>(root))?;
            let (rows_i, d_i, null) = (rows as i32, d as i32, 0u64);
            let mut b = cuda::launch_args(&stream, &f);
            b.arg(&x).arg(&w).arg(&g).arg(&null).arg(&x).arg(&rows_i).arg(&d_i).arg(&eps);
            // SAFETY: x and g hold rows·d elements of T, w holds d (or is null); each thread
            // reads its elements of x before it writes dx there, after the row's reductions.
            unsafe { b.launch(cfg) }.w()?;
            Ok(())
        })
    }

    /// Forward (`grad = None`) or backward (`grad = Some`) kernel (layout: [`launch_layout`]),
    /// with the optional residual added to the output.
    pub(super) fn launch(
        op: &str,
        (s, l): (&CudaStorage, &Layout),
        grad: Option<(&CudaStorage, &Layout)>,
        (weight, residual): (Option<&Tensor>, Option<&Tensor>),
        eps: f32,
    ) -> Result<CudaStorage> {
        let dev = s.device().clone();
        let d = l.dims().last().copied().unwrap_or(1);
        let rows = l.shape().elem_count() / d.max(1);
        let wguard = weight.map(|w| w.storage_and_layout());
        let rguard = residual.map(|r| r.storage_and_layout());
        with_cuda_float_type!(s, op, T => {
            let x = cuda::view::<T>(s, l, op, "x")?;
            let w = match &wguard {
                Some((ws, wl)) => Some(cuda::view::<T>(cuda::cuda_of(ws, op, "weight")?, wl, op, "weight")?),
                None => None,
            };
            let g = match grad {
                Some((gs, gl)) => Some(cuda::view::<T>(gs, gl, op, "grad")?),
                None => None,
            };
            let res = match &rguard {
                Some((rs, rl)) => Some(cuda::view::<T>(cuda::cuda_of(rs, op, "residual")?, rl, op, "residual")?),
                None => None,
            };
            // SAFETY: every element is written by the kernel before use.
            let y = unsafe { dev.alloc::<T>(rows * d)? };
            let (cfg, root) = launch_layout(rows, d, grad.is_some());
            let f = cuda::func(&dev, &MODULE, &cuda::kname::<T>(root))?;
            let (rows_i, d_i, null) = (rows as i32, d as i32, 0u64);
            let stream = dev.cuda_stream();
            let mut b = cuda::launch_args(&stream, &f);
            b.arg(&x);
            match &w {
                Some(w) => b.arg(w),
                None => b.arg(&null),
            };
            if let Some(g) = &g {
                b.arg(g);
            }
            match &res {
                Some(r) => b.arg(r),
                None => b.arg(&null),
            };
            b.arg(&y);
            b.arg(&rows_i);
            b.arg(&d_i);
            b.arg(&eps);
            // SAFETY: x, g, res (or null), y hold rows·d elements of T and w holds d (or is null),
            // as the kernel reads and writes them.
            unsafe { b.launch(cfg) }.w()?;
            Ok(cuda::wrap(y, &dev))
        })
    }
}

/// Gemma RMSNorm over the last axis: `y = x·rsqrt(mean(x²)+eps)·w`, computed in fp32, rounded once
/// to `x`'s dtype. `weight = None` is the scale-free variant (`v_norm`, the MoE router norm).
/// No `1 + w` (that was Gemma 2/3). `weight` must be `(d,)` in `x`'s dtype; it is treated as frozen
/// and gets **no gradient** (LoRA never trains norm weights); `x` gets one. Fused custom op.
pub fn rms_norm(x: &Tensor, weight: Option<&Tensor>, eps: f64) -> Result<Tensor> {
    let weight = weight.map(|w| w.detach().contiguous()).transpose()?;
    check_weight(&weight, x)?;
    x.contiguous()?.apply_op1(RmsNorm {
        weight,
        eps: eps as f32,
        residual: None,
    })
}

/// Composite reference for [`rms_norm`] (its autograd also differentiates a tracked weight).
pub fn rms_norm_slow(x: &Tensor, weight: Option<&Tensor>, eps: f64) -> Result<Tensor> {
    let dtype = x.dtype();
    let xf = x.to_dtype(DType::F32)?;
    let ms = xf.sqr()?.mean_keepdim(D::Minus1)?;
    let mut y = xf.broadcast_mul(&(ms + eps)?.sqrt()?.recip()?)?;
    if let Some(w) = weight {
        y = y.broadcast_mul(&w.to_dtype(DType::F32)?)?;
    }
    y.to_dtype(dtype)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{check_fused_vs_slow, randn};
    use candle_core::Device;

    fn check(dtype: DType, with_weight: bool, tol: (f64, f64)) -> Result<()> {
        let dev = Device::Cpu;
        let x = (randn(&[2, 3, 40], dtype, 1, &dev)? * 3.0)?;
        let w = (randn(&[40], dtype, 2, &dev)? + 1.0)?;
        let name = format!("rms_norm {dtype:?} weight={with_weight}");
        check_fused_vs_slow(
            &name,
            &[x, w],
            &[true, false],
            |t| rms_norm(&t[0], with_weight.then_some(&t[1]), 1e-6),
            |t| rms_norm_slow(&t[0], with_weight.then_some(&t[1]), 1e-6),
            tol,
        )
    }

    #[test]
    fn fused_matches_slow_f32() -> Result<()> {
        check(DType::F32, true, (1e-5, 1e-5))?;
        check(DType::F32, false, (1e-5, 1e-5))
    }

    #[test]
    fn fused_matches_slow_bf16() -> Result<()> {
        // one bf16 rounding (2^-8 relative) either side
        check(DType::BF16, true, (2e-2, 2e-2))?;
        check(DType::BF16, false, (2e-2, 2e-2))
    }

    #[test]
    fn weight_gets_no_gradient() -> Result<()> {
        let dev = Device::Cpu;
        let x = candle_core::Var::from_tensor(&randn(&[3, 8], DType::F32, 3, &dev)?)?;
        let w = candle_core::Var::from_tensor(&randn(&[8], DType::F32, 4, &dev)?)?;
        let g = randn(&[3, 8], DType::F32, 5, &dev)?;
        let grads = crate::backward_with_seed(&rms_norm(&x, Some(&w), 1e-6)?, &g)?;
        assert!(grads.get(&x).is_some() && grads.get(&w).is_none());
        Ok(())
    }
}
