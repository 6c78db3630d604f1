//! Softmax over the last axis, fused (`kernels/softmax.cu`): fp32 math, result rounded to the input
//! dtype (transformers' `softmax(..., dtype=float32).to(dtype)`). The backward uses the saved
//! output `y`: `dx = y·(g − Σ g·y)`, in fp32, one rounding.

use crate::util::{cpu_slice, with_float_type, Elem, Storable};
use candle_core::{CpuStorage, CustomOp1, CustomOp2, DType, Layout, Result, Shape, Tensor, D};

struct Softmax;

/// Backward on `(y, g)` → `dx`.
struct SoftmaxBwd;

fn fwd_cpu<T: Elem>(x: &[T], d: usize) -> Vec<T> {
    let mut y = Vec::with_capacity(x.len());
    for row in x.chunks_exact(d) {
        let m = row
            .iter()
            .map(|v| v.to_f32())
            .fold(f32::NEG_INFINITY, f32::max);
        let s: f32 = row.iter().map(|v| (v.to_f32() - m).exp()).sum();
        y.extend(row.iter().map(|v| T::from_f32((v.to_f32() - m).exp() / s)));
    }
    y
}

fn bwd_cpu<T: Elem>(y: &[T], g: &[T], d: usize) -> Vec<T> {
    let mut dx = Vec::with_capacity(y.len());
    for (yr, gr) in y.chunks_exact(d).zip(g.chunks_exact(d)) {
        let dot: f32 = yr
            .iter()
            .zip(gr)
            .map(|(a, b)| a.to_f32() * b.to_f32())
            .sum();
        dx.extend(
            yr.iter()
                .zip(gr)
                .map(|(a, b)| T::from_f32(a.to_f32() * (b.to_f32() - dot))),
        );
    }
    dx
}

fn last_dim(l: &Layout) -> usize {
    l.dims().last().copied().unwrap_or(1)
}

impl CustomOp1 for Softmax {
    fn name(&self) -> &'static str {
        "softmax-last-dim"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        with_float_type!(s, self.name(), T => {
            let x = cpu_slice::<T>(s, l, self.name(), "x")?;
            Ok((T::storage(fwd_cpu(x, last_dim(l))), l.shape().clone()))
        })
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        Ok((
            cuda_impl::launch(self.name(), s, l, None)?,
            l.shape().clone(),
        ))
    }

    fn bwd(&self, _x: &Tensor, y: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(y.apply_op2_no_bwd(&g.contiguous()?, &SoftmaxBwd)?))
    }
}

impl CustomOp2 for SoftmaxBwd {
    fn name(&self) -> &'static str {
        "softmax-last-dim-bwd"
    }

    fn cpu_fwd(
        &self,
        s: &CpuStorage,
        l: &Layout,
        gs: &CpuStorage,
        gl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        with_float_type!(s, self.name(), T => {
            let y = cpu_slice::<T>(s, l, self.name(), "y")?;
            let g = cpu_slice::<T>(gs, gl, self.name(), "grad")?;
            Ok((T::storage(bwd_cpu(y, g, last_dim(l))), l.shape().clone()))
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
        Ok((
            cuda_impl::launch(self.name(), s, l, Some((gs, gl)))?,
            l.shape().clone(),
        ))
    }
}

#[cfg(feature = "cuda")]
mod cuda_impl {
    use crate::cuda::{self, cuda_module, with_cuda_float_type, Module};
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::WrapErr;
    use candle_core::{CudaStorage, Layout, Result};

    const MODULE: Module = cuda_module!("softmax");

    /// Forward on `x` (`grad = None`) or backward on `(y, grad)`, one block per row.
    pub(super) fn launch(
        op: &str,
        s: &CudaStorage,
        l: &Layout,
        grad: Option<(&CudaStorage, &Layout)>,
    ) -> Result<CudaStorage> {
        let dev = s.device().clone();
        let d = super::last_dim(l);
        let rows = l.shape().elem_count() / d.max(1);
        with_cuda_float_type!(s, op, T => {
            let x = cuda::view::<T>(s, l, op, "input")?;
            let g = match grad {
                Some((gs, gl)) => Some(cuda::view::<T>(gs, gl, op, "grad")?),
                None => None,
            };
            // SAFETY: every element is written by the kernel.
            let y = unsafe { dev.alloc::<T>(rows * d)? };
            let root = if grad.is_some() { "softmax_bwd" } else { "softmax_fwd" };
            let f = cuda::func(&dev, &MODULE, &cuda::kname::<T>(root))?;
            let d_i = d as i32;
            let stream = dev.cuda_stream();
            let mut b = cuda::launch_args(&stream, &f);
            b.arg(&x);
            if let Some(g) = &g {
                b.arg(g);
            }
            b.arg(&y).arg(&d_i);
            // SAFETY: all buffers hold rows·d elements of T.
            unsafe { b.launch(cuda::per_row(rows, cuda::row_threads(d).min(512))) }.w()?;
            Ok(cuda::wrap(y, &dev))
        })
    }
}

/// Softmax over the last axis in fp32, result rounded to `x`'s dtype (transformers'
/// `softmax(..., dtype=float32).to(dtype)`). Fused custom op with a backward.
pub fn softmax_last_dim(x: &Tensor) -> Result<Tensor> {
    x.contiguous()?.apply_op1(Softmax)
}

/// Composite reference for [`softmax_last_dim`].
pub fn softmax_last_dim_slow(x: &Tensor) -> Result<Tensor> {
    let dtype = x.dtype();
    let xf = x.to_dtype(DType::F32)?;
    let max = xf.max_keepdim(D::Minus1)?;
    let e = xf.broadcast_sub(&max)?.exp()?;
    let s = e.sum_keepdim(D::Minus1)?;
    e.broadcast_div(&s)?.to_dtype(dtype)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{check_fused_vs_slow, randn};
    use candle_core::Device;

    #[test]
    fn fused_matches_slow() -> Result<()> {
        for (dtype, tol) in [(DType::F32, (1e-6, 1e-5)), (DType::BF16, (1e-2, 1e-2))] {
            let x = (randn(&[2, 3, 33], dtype, 1, &Device::Cpu)? * 4.0)?;
            check_fused_vs_slow(
                &format!("softmax {dtype:?}"),
                &[x],
                &[true],
                |t| softmax_last_dim(&t[0]),
                |t| softmax_last_dim_slow(&t[0]),
                tol,
            )?;
        }
        Ok(())
    }
}
