//! Products with PyTorch's roundings (`kernels/scale.cu`): `x · c` as PyTorch multiplies a tensor by
//! a Python float (fp32 math, one rounding to `x`'s dtype; Candle's `affine` would round `c` to
//! bf16 first), and the chained `x · v · c` / `x · c · v` of a vector `v` over the last axis,
//! each product rounded as two PyTorch multiplies are. One launch each, where Candle needs a cast,
//! a multiply and a cast back (and a broadcast multiply for `v`). Differentiable in `x` (`v` is a
//! frozen weight): the gradient is the same product in the reverse order.

use crate::util::{cpu_slice, with_float_type, Elem, Storable};
use candle_core::{bail, CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape, Tensor};

/// Which products, in which order (the kernel's `order` argument).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Order {
    /// `x · c`.
    Scalar = 0,
    /// `(x · v) · c`.
    VectorThenScalar = 1,
    /// `(x · c) · v`.
    ScalarThenVector = 2,
}

impl Order {
    /// The order of the gradient's products (`g · c · v` for `x · v · c`).
    fn reversed(self) -> Order {
        match self {
            Order::Scalar => Order::Scalar,
            Order::VectorThenScalar => Order::ScalarThenVector,
            Order::ScalarThenVector => Order::VectorThenScalar,
        }
    }
}

/// The op: `c` in fp32, as PyTorch's opmath holds a Python float for a 16-bit tensor.
#[derive(Debug, Clone, Copy)]
struct Scale {
    c: f32,
    order: Order,
}

/// One element, in fp32 with the intermediate product rounded to `T` (the kernel's `scale_one`).
fn scale_one<T: Elem>(x: f32, v: f32, c: f32, order: Order) -> f32 {
    match order {
        Order::Scalar => x * c,
        Order::VectorThenScalar => crate::util::round::<T>(x * v) * c,
        Order::ScalarThenVector => crate::util::round::<T>(x * c) * v,
    }
}

fn scale_cpu<T: Elem>(x: &[T], v: Option<&[T]>, op: Scale) -> Vec<T> {
    match v {
        None => x
            .iter()
            .map(|&a| T::from_f32(scale_one::<T>(a.to_f32(), 0.0, op.c, op.order)))
            .collect(),
        Some(v) => x
            .chunks_exact(v.len())
            .flat_map(|row| {
                row.iter().zip(v).map(|(&a, &b)| {
                    T::from_f32(scale_one::<T>(a.to_f32(), b.to_f32(), op.c, op.order))
                })
            })
            .collect(),
    }
}

impl Scale {
    fn name(&self) -> &'static str {
        match self.order {
            Order::Scalar => "mul-scalar",
            Order::VectorThenScalar => "mul-vector-scalar",
            Order::ScalarThenVector => "mul-scalar-vector",
        }
    }

    fn cpu(
        &self,
        s: &CpuStorage,
        l: &Layout,
        v: Option<(&CpuStorage, &Layout)>,
    ) -> Result<CpuStorage> {
        with_float_type!(s, self.name(), T => {
            let x = cpu_slice::<T>(s, l, self.name(), "x")?;
            let v = match v {
                Some((vs, vl)) => Some(cpu_slice::<T>(vs, vl, self.name(), "vector")?),
                None => None,
            };
            Ok(T::storage(scale_cpu(x, v, *self)))
        })
    }
}

impl CustomOp1 for Scale {
    fn name(&self) -> &'static str {
        Scale::name(self)
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        Ok((self.cpu(s, l, None)?, l.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        Ok((cuda_impl::launch(*self, s, l, None)?, l.shape().clone()))
    }

    fn bwd(&self, _x: &Tensor, _y: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(g.contiguous()?.apply_op1(*self)?))
    }
}

impl CustomOp2 for Scale {
    fn name(&self) -> &'static str {
        Scale::name(self)
    }

    fn cpu_fwd(
        &self,
        s: &CpuStorage,
        l: &Layout,
        vs: &CpuStorage,
        vl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        Ok((self.cpu(s, l, Some((vs, vl)))?, l.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
        vs: &candle_core::CudaStorage,
        vl: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        Ok((
            cuda_impl::launch(*self, s, l, Some((vs, vl)))?,
            l.shape().clone(),
        ))
    }

    fn bwd(
        &self,
        _x: &Tensor,
        v: &Tensor,
        _y: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let back = Scale {
            c: self.c,
            order: self.order.reversed(),
        };
        Ok((Some(g.contiguous()?.apply_op2_no_bwd(v, &back)?), None))
    }
}

#[cfg(feature = "cuda")]
mod cuda_impl {
    use super::Scale;
    use crate::cuda::{self, cuda_module, with_cuda_float_type, Module};
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::WrapErr;
    use candle_core::{CudaStorage, Layout, Result};

    const MODULE: Module = cuda_module!("scale");

    /// `x` times `c`, and times `v (d,)` where given, as `op.order` says.
    pub(super) fn launch(
        op: Scale,
        s: &CudaStorage,
        l: &Layout,
        v: Option<(&CudaStorage, &Layout)>,
    ) -> Result<CudaStorage> {
        let dev = s.device().clone();
        let n = l.shape().elem_count();
        let d = l.dims().last().copied().unwrap_or(1).max(1);
        let d_i = i32::try_from(d)
            .map_err(|_| candle_core::Error::Msg(format!("{}: rows of {d}", op.name())))?;
        with_cuda_float_type!(s, op.name(), T => {
            let x = cuda::view::<T>(s, l, op.name(), "x")?;
            let vec = match v {
                Some((vs, vl)) => Some(cuda::view::<T>(vs, vl, op.name(), "vector")?),
                None => None,
            };
            // SAFETY: every element is written by the kernel.
            let y = unsafe { dev.alloc::<T>(n)? };
            let f = cuda::func(&dev, &MODULE, &cuda::kname::<T>("scale"))?;
            let order = op.order as i32;
            let stream = dev.cuda_stream();
            let mut b = cuda::launch_args(&stream, &f);
            // Without a vector the kernel never reads its `v` argument; x stands in.
            b.arg(&x).arg(vec.as_ref().unwrap_or(&x)).arg(&y).arg(&op.c).arg(&n).arg(&d_i).arg(&order);
            // SAFETY: x and y hold n elements, v (when read) d; y is a new buffer.
            unsafe { b.launch(cuda::elementwise(n)) }.w()?;
            Ok(cuda::wrap(y, &dev))
        })
    }
}

/// Checks that `v` is a vector over `x`'s last axis of `x`'s dtype.
fn check_vector(op: &str, x: &Tensor, v: &Tensor) -> Result<()> {
    let d = x.dims().last().copied().unwrap_or(1);
    if v.dims() != [d] || v.dtype() != x.dtype() {
        bail!(
            "{op}: the vector must be ({d},) {:?} to scale {:?} {:?}, got {:?} {:?}",
            x.dtype(),
            x.dims(),
            x.dtype(),
            v.dims(),
            v.dtype()
        );
    }
    Ok(())
}

/// `x · c` as PyTorch computes `tensor * python_float`: fp32 math, one rounding to `x`'s dtype.
pub fn mul_scalar(x: &Tensor, c: f64) -> Result<Tensor> {
    let op = Scale {
        c: c as f32,
        order: Order::Scalar,
    };
    x.contiguous()?.apply_op1(op)
}

/// `x · v · c` as PyTorch computes `x * v * python_float` for a vector `v` over the last axis of
/// `x` (same dtype): `x · v` rounded to the dtype, then times `c` in fp32 and rounded again.
pub fn mul_vector_scalar(x: &Tensor, v: &Tensor, c: f64) -> Result<Tensor> {
    check_vector("mul_vector_scalar", x, v)?;
    let op = Scale {
        c: c as f32,
        order: Order::VectorThenScalar,
    };
    x.contiguous()?.apply_op2(&v.contiguous()?, op)
}

/// `x · c · v` (PyTorch's `x * python_float * v`): the two products of [`mul_vector_scalar`] in
/// the other order, each rounded to the dtype.
pub fn mul_scalar_vector(x: &Tensor, c: f64, v: &Tensor) -> Result<Tensor> {
    check_vector("mul_scalar_vector", x, v)?;
    let op = Scale {
        c: c as f32,
        order: Order::ScalarThenVector,
    };
    x.contiguous()?.apply_op2(&v.contiguous()?, op)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{check_fused_vs_slow, randn};
    use candle_core::{DType, Device};

    /// PyTorch's roundings spelled with Candle's ops: a product in fp32, rounded to the dtype.
    fn times_scalar(x: &Tensor, c: f64) -> Result<Tensor> {
        (x.to_dtype(DType::F32)? * c)?.to_dtype(x.dtype())
    }

    #[test]
    fn products_match_candle_ops_to_the_bit() -> Result<()> {
        let dev = Device::Cpu;
        let c = 2816f64.powf(-0.5);
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            let x = (randn(&[3, 5, 40], dtype, 1, &dev)? * 3.0)?;
            let v = randn(&[40], dtype, 2, &dev)?;
            let tol = (0.0, 0.0);
            check_fused_vs_slow(
                &format!("mul_scalar {dtype:?}"),
                std::slice::from_ref(&x),
                &[true],
                |t| mul_scalar(&t[0], c),
                |t| times_scalar(&t[0], c),
                tol,
            )?;
            check_fused_vs_slow(
                &format!("mul_vector_scalar {dtype:?}"),
                &[x.clone(), v.clone()],
                &[true, false],
                |t| mul_vector_scalar(&t[0], &t[1], c),
                |t| times_scalar(&t[0].broadcast_mul(&t[1])?, c),
                tol,
            )?;
            check_fused_vs_slow(
                &format!("mul_scalar_vector {dtype:?}"),
                &[x.clone(), v.clone()],
                &[true, false],
                |t| mul_scalar_vector(&t[0], c, &t[1]),
                |t| times_scalar(&t[0], c)?.broadcast_mul(&t[1]),
                tol,
            )?;
        }
        Ok(())
    }

    #[test]
    fn a_vector_of_the_wrong_length_or_dtype_is_named() -> Result<()> {
        let x = Tensor::zeros((2, 4), DType::F32, &Device::Cpu)?;
        let short = Tensor::zeros(3, DType::F32, &Device::Cpu)?;
        let err = mul_vector_scalar(&x, &short, 1.0).unwrap_err().to_string();
        assert!(err.contains("(4,)") && err.contains("[3]"), "{err}");
        let half = Tensor::zeros(4, DType::BF16, &Device::Cpu)?;
        let err = mul_scalar_vector(&x, 1.0, &half).unwrap_err().to_string();
        assert!(err.contains("BF16"), "{err}");
        Ok(())
    }
}
