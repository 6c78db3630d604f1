//! Rotary embedding, half-split (`rotate_half`) layout, fused (`kernels/rope.cu`).
//!
//! Forward, rounding like transformers in the activation dtype (three roundings in bf16):
//! `y1 = r(r(x1·c1) + r(−x2·s1))`, `y2 = r(r(x2·c2) + r(x1·s2))`. The rotation is linear, so the
//! backward is its transpose: `dx1 = g1·c1 + g2·s2`, `dx2 = g2·c2 − g1·s1` (= RoPE with `−sin` when
//! both halves of `sin` are equal, as in Gemma's `concat(freqs, freqs)`). cos/sin get no gradient.

use crate::util::{cpu_slice, round, with_cpu_storage, with_float_type, Elem, Storable};
use candle_core::{bail, CpuStorage, CustomOp1, Layout, Result, Shape, Tensor, D};

/// RoPE on `x` (b, h, t, d) with `cos`/`sin` (bc, t, d), bc ∈ {1, b}; `backward` applies the transpose.
struct Rope {
    cos: Tensor,
    sin: Tensor,
    backward: bool,
}

struct Dims {
    h: usize,
    t: usize,
    d: usize,
    cos_b: usize,
}

impl Rope {
    fn dims(&self, l: &Layout) -> Result<Dims> {
        let (b, h, t, d) = l.shape().dims4()?;
        let (cos_b, ct, cd) = self.cos.dims3()?;
        if ct != t || cd != d || (cos_b != b && cos_b != 1) || d % 2 != 0 {
            bail!(
                "rope: x is (b, h, t, d) = {:?}, cos/sin must be ({b} or 1, {t}, {d}) with d even, got {:?}",
                l.dims(),
                self.cos.dims()
            );
        }
        Ok(Dims { h, t, d, cos_b })
    }
}

fn rope_cpu<T: Elem>(x: &[T], cos: &[T], sin: &[T], n: &Dims, backward: bool) -> Vec<T> {
    let half = n.d / 2;
    let mut y = vec![T::from_f32(0.0); x.len()];
    for (row, (xr, yr)) in x.chunks_exact(n.d).zip(y.chunks_exact_mut(n.d)).enumerate() {
        let (ti, bi) = (row % n.t, row / (n.t * n.h));
        let cs = ((if n.cos_b == 1 { 0 } else { bi }) * n.t + ti) * n.d;
        for k in 0..half {
            let (c1, c2) = (cos[cs + k].to_f32(), cos[cs + k + half].to_f32());
            let (s1, s2) = (sin[cs + k].to_f32(), sin[cs + k + half].to_f32());
            let (x1, x2) = (xr[k].to_f32(), xr[k + half].to_f32());
            let (y1, y2) = if backward {
                (
                    round::<T>(x1 * c1) + round::<T>(x2 * s2),
                    round::<T>(x2 * c2) + round::<T>(-x1 * s1),
                )
            } else {
                (
                    round::<T>(x1 * c1) + round::<T>(-x2 * s1),
                    round::<T>(x2 * c2) + round::<T>(x1 * s2),
                )
            };
            yr[k] = T::from_f32(y1);
            yr[k + half] = T::from_f32(y2);
        }
    }
    y
}

impl CustomOp1 for Rope {
    fn name(&self) -> &'static str {
        if self.backward {
            "rope-bwd"
        } else {
            "rope"
        }
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let n = self.dims(l)?;
        let op = self.name();
        with_float_type!(s, op, T => {
            let x = cpu_slice::<T>(s, l, op, "x")?;
            let y = with_cpu_storage(&self.cos, op, "cos", |cs, cl| {
                let cos = cpu_slice::<T>(cs, cl, op, "cos")?;
                with_cpu_storage(&self.sin, op, "sin", |ss, sl| {
                    Ok(rope_cpu(x, cos, cpu_slice::<T>(ss, sl, op, "sin")?, &n, self.backward))
                })
            })?;
            Ok((T::storage(y), l.shape().clone()))
        })
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use crate::cuda::{self, cuda_module, with_cuda_float_type, Module};
        use candle_core::backend::BackendStorage;
        use candle_core::cuda_backend::WrapErr;
        const MODULE: Module = cuda_module!("rope");

        let n = self.dims(l)?;
        let op = self.name();
        let dev = s.device().clone();
        let (cg, cl) = self.cos.storage_and_layout();
        let (sg, sl) = self.sin.storage_and_layout();
        with_cuda_float_type!(s, op, T => {
            let x = cuda::view::<T>(s, l, op, "x")?;
            let cos = cuda::view::<T>(cuda::cuda_of(&cg, op, "cos")?, cl, op, "cos")?;
            let sin = cuda::view::<T>(cuda::cuda_of(&sg, op, "sin")?, sl, op, "sin")?;
            let el = l.shape().elem_count();
            // SAFETY: every element is written by the kernel.
            let y = unsafe { dev.alloc::<T>(el)? };
            let f = cuda::func(&dev, &MODULE, &cuda::kname::<T>("rope"))?;
            let args = [l.dims()[0], n.h, n.t, n.d, n.cos_b].map(|v| v as i32);
            let bwd = self.backward as i32;
            // 32-bit index math when every element index fits.
            let small = i32::from(el <= u32::MAX as usize);
            let stream = dev.cuda_stream();
            let mut b = cuda::launch_args(&stream, &f);
            b.arg(&x).arg(&cos).arg(&sin).arg(&y);
            for a in &args {
                b.arg(a);
            }
            b.arg(&bwd).arg(&small);
            // SAFETY: sizes as checked in `dims`; a thread per unit of rotated pairs, grid-stride.
            unsafe { b.launch(cuda::elementwise(el / 2)) }.w()?;
            Ok((cuda::wrap(y, &dev), l.shape().clone()))
        })
    }

    fn bwd(&self, _x: &Tensor, _res: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        let op = Rope {
            cos: self.cos.clone(),
            sin: self.sin.clone(),
            backward: !self.backward,
        };
        Ok(Some(g.contiguous()?.apply_op1(op)?))
    }
}

/// Rotary embedding, half-split (`rotate_half`) layout: `x·cos + rotate_half(x)·sin`.
/// `x`: (b, h, t, d); `cos`, `sin`: (b, t, d) (or (1, t, d), shared by the batch) in `x`'s dtype.
/// Products in the activation dtype. Fused custom op; `x` gets a gradient, cos/sin none.
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    rope_op(x, cos, sin, false)
}

/// The backward of [`rope`] on its own, for explicit (graph-free) backward passes: `dx` from the
/// output gradient `g` (the transposed rotation). Records no graph.
pub fn rope_backward(g: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    rope_op(&g.detach(), cos, sin, true)
}

/// [`rope`] (`backward = false`) or its transpose.
fn rope_op(x: &Tensor, cos: &Tensor, sin: &Tensor, backward: bool) -> Result<Tensor> {
    if cos.dtype() != x.dtype() || sin.dtype() != x.dtype() || cos.dims() != sin.dims() {
        bail!(
            "rope: cos {:?} {:?} and sin {:?} {:?} must match each other and x's dtype {:?}",
            cos.dims(),
            cos.dtype(),
            sin.dims(),
            sin.dtype(),
            x.dtype()
        );
    }
    x.contiguous()?.apply_op1(Rope {
        cos: cos.detach().contiguous()?,
        sin: sin.detach().contiguous()?,
        backward,
    })
}

/// Composite reference for [`rope`].
pub fn rope_slow(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let d = x.dim(D::Minus1)?;
    let x1 = x.narrow(D::Minus1, 0, d / 2)?;
    let x2 = x.narrow(D::Minus1, d / 2, d / 2)?;
    let rotated = Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?;
    let cos = cos.unsqueeze(1)?;
    let sin = sin.unsqueeze(1)?;
    x.broadcast_mul(&cos)? + rotated.broadcast_mul(&sin)?
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{check_fused_vs_slow, randn};
    use candle_core::{DType, Device};

    fn check(dtype: DType, cos_b: usize, tol: (f64, f64)) -> Result<()> {
        let dev = Device::Cpu;
        let (b, h, t, d) = (2, 3, 5, 8);
        let x = randn(&[b, h, t, d], dtype, 1, &dev)?;
        // angles with different halves, so the transpose (not rope(-sin)) is what is tested
        let ang = randn(&[cos_b, t, d], DType::F32, 2, &dev)?;
        let (cos, sin) = (ang.cos()?.to_dtype(dtype)?, ang.sin()?.to_dtype(dtype)?);
        check_fused_vs_slow(
            &format!("rope {dtype:?} cos_b={cos_b}"),
            &[x, cos, sin],
            &[true, false, false],
            |t| rope(&t[0], &t[1], &t[2]),
            |t| rope_slow(&t[0], &t[1], &t[2]),
            tol,
        )
    }

    #[test]
    fn fused_matches_slow() -> Result<()> {
        check(DType::F32, 2, (1e-6, 1e-6))?;
        check(DType::F32, 1, (1e-6, 1e-6))?;
        // forward roundings are the reference's, so bf16 forward is exact; grads within an ulp
        check(DType::BF16, 2, (1e-2, 1e-2))
    }
}
