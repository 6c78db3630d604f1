//! GeGLU `gelu_tanh(gate) · up`, fused (`kernels/geglu.cu`), rounding as PyTorch/transformers:
//! `a = r(gelu_f32(gate))` (`gelu_pytorch_tanh` is fp32 inside, one rounding), `y = r(a·up)`.
//! Backward in fp32 into one packed `(2, ...)` buffer (one kernel, both gradients):
//! `d(gate) = r(r(g·up)·gelu'(gate))`, `d(up) = r(g·a)` — the roundings autograd of the composite does.

use crate::util::{cpu_slice, round, with_float_type, Elem, Storable};
use candle_core::{
    bail, CpuStorage, CustomOp1, CustomOp2, CustomOp3, DType, Layout, Result, Shape, Tensor,
};

const SQRT_2_OVER_PI: f32 = 0.797_884_6;
const GELU_C: f32 = 0.044715;

fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + GELU_C * x * x)).tanh())
}

fn gelu_grad(x: f32) -> f32 {
    let t = (SQRT_2_OVER_PI * x * (1.0 + GELU_C * x * x)).tanh();
    0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_C * x * x)
}

/// One output element from (gate `x`, up `u`), rounded as `T` does: `r(gelu(x))·u`.
fn geglu_y<T: Elem>(x: f32, u: f32) -> T {
    T::from_f32(round::<T>(gelu(x)) * u)
}

/// `(d(gate), d(up))` of one element from `x`, `u` and the output gradient `g`.
fn geglu_d<T: Elem>(x: f32, u: f32, g: f32) -> (T, T) {
    (
        T::from_f32(round::<T>(g * u) * gelu_grad(x)),
        T::from_f32(g * round::<T>(gelu(x))),
    )
}

struct GeGlu;

/// Backward on `(gate, up, g)` → packed `(2, ...)`: `[d(gate), d(up)]`.
struct GeGluBwd;

impl CustomOp2 for GeGlu {
    fn name(&self) -> &'static str {
        "gelu-tanh-mul"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let op = self.name();
        with_float_type!(s1, op, T => {
            let gate = cpu_slice::<T>(s1, l1, op, "gate")?;
            let up = cpu_slice::<T>(s2, l2, op, "up")?;
            let y = gate
                .iter()
                .zip(up)
                .map(|(g, u)| geglu_y::<T>(g.to_f32(), u.to_f32()))
                .collect();
            Ok((T::storage(y), l1.shape().clone()))
        })
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let y = cuda_impl::launch(self.name(), (s1, l1), (s2, l2), None)?;
        Ok((y, l1.shape().clone()))
    }

    fn bwd(
        &self,
        gate: &Tensor,
        up: &Tensor,
        _res: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let packed = gate.apply_op3_no_bwd(up, &g.contiguous()?, &GeGluBwd)?;
        Ok((Some(packed.get(0)?), Some(packed.get(1)?)))
    }
}

impl CustomOp3 for GeGluBwd {
    fn name(&self) -> &'static str {
        "gelu-tanh-mul-bwd"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let op = self.name();
        with_float_type!(s1, op, T => {
            let gate = cpu_slice::<T>(s1, l1, op, "gate")?;
            let up = cpu_slice::<T>(s2, l2, op, "up")?;
            let g = cpu_slice::<T>(s3, l3, op, "grad")?;
            let mut out = vec![T::from_f32(0.0); 2 * gate.len()];
            let (dgate, dup) = out.split_at_mut(gate.len());
            for i in 0..gate.len() {
                let (x, u, gv) = (gate[i].to_f32(), up[i].to_f32(), g[i].to_f32());
                (dgate[i], dup[i]) = geglu_d::<T>(x, u, gv);
            }
            Ok((T::storage(out), packed_shape(l1)))
        })
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let y = cuda_impl::launch(self.name(), (s1, l1), (s2, l2), Some((s3, l3)))?;
        Ok((y, packed_shape(l1)))
    }
}

fn packed_shape(l: &Layout) -> Shape {
    let mut dims = vec![2];
    dims.extend_from_slice(l.dims());
    Shape::from(dims)
}

/// The backward on `(gate, up, g)` writing `d(gate)` over `gate` (and, on CUDA, `d(up)` over `up`;
/// on the CPU `d(up)` goes to `dup`).
struct GeGluBwdInPlace {
    dup: crate::util::Stash,
}

impl candle_core::InplaceOp3 for GeGluBwdInPlace {
    fn name(&self) -> &'static str {
        "gelu-tanh-mul-bwd-in-place"
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
        let Some((a, b)) = l1.contiguous_offsets() else {
            bail!("{op}: gate must be contiguous");
        };
        with_float_type!(s2, op, T => {
            let up = cpu_slice::<T>(s2, l2, op, "up")?;
            let g = cpu_slice::<T>(s3, l3, op, "grad")?;
            let gate = &mut T::slice_mut(s1, op, "gate")?[a..b];
            let mut dup = Vec::with_capacity(up.len());
            for ((x, &u), &gv) in gate.iter_mut().zip(up).zip(g) {
                let (xv, u, gv) = (x.to_f32(), u.to_f32(), gv.to_f32());
                let (dg, du) = geglu_d::<T>(xv, u, gv);
                *x = dg;
                dup.push(du);
            }
            self.dup.put(Tensor::from_vec(dup, l2.dims(), &candle_core::Device::Cpu)?);
            Ok(())
        })
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &mut candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<()> {
        cuda_impl::launch_in_place(self.name(), (s1, l1), (s2, l2), (s3, l3))
    }
}

#[cfg(feature = "cuda")]
mod cuda_impl {
    use crate::cuda::{self, cuda_module, with_cuda_float_type, Module};
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::DevicePtr;
    use candle_core::cuda_backend::WrapErr;
    use candle_core::{CudaStorage, Layout, Result};

    const MODULE: Module = cuda_module!("geglu");

    /// The backward with `d(gate)` written over `gate` and `d(up)` over `up`.
    pub(super) fn launch_in_place(
        op: &str,
        (s1, l1): (&mut CudaStorage, &Layout),
        (s2, l2): (&CudaStorage, &Layout),
        (s3, l3): (&CudaStorage, &Layout),
    ) -> Result<()> {
        let dev = s1.device().clone();
        let n = l1.shape().elem_count();
        let stream = dev.cuda_stream();
        with_cuda_float_type!(s2, op, T => {
            let up = cuda::view::<T>(s2, l2, op, "up")?;
            let g = cuda::view::<T>(s3, l3, op, "grad")?;
            let up_ptr = up.device_ptr(&stream).0;
            let gate = cuda::view::<T>(s1, l1, op, "gate")?;
            let gate_ptr = gate.device_ptr(&stream).0;
            let f = cuda::func(&dev, &MODULE, &cuda::kname::<T>("geglu_bwd"))?;
            let mut b = cuda::launch_args(&stream, &f);
            b.arg(&gate_ptr).arg(&up_ptr).arg(&g).arg(&gate_ptr).arg(&up_ptr).arg(&n);
            // SAFETY: gate, up and g hold n elements; each thread reads element i of gate and up
            // before it writes d(gate)_i and d(up)_i there (the caller owns both buffers alone).
            unsafe { b.launch(cuda::elementwise(n)) }.w()?;
            Ok(())
        })
    }

    /// The row-halves forward on `gu (m, 2·c)` or, with `grad (m, c)`, its backward `(m, 2·c)`.
    pub(super) fn launch_halves(
        op: &str,
        (s1, l1): (&CudaStorage, &Layout),
        grad: Option<(&CudaStorage, &Layout)>,
        m: usize,
        c: usize,
    ) -> Result<CudaStorage> {
        let dev = s1.device().clone();
        let cols =
            i32::try_from(c).map_err(|_| candle_core::Error::Msg(format!("{op}: {c} columns")))?;
        with_cuda_float_type!(s1, op, T => {
            let gu = cuda::view::<T>(s1, l1, op, "gu")?;
            let out_n = if grad.is_some() { 2 * m * c } else { m * c };
            // SAFETY: every element is written by the kernel.
            let y = unsafe { dev.alloc::<T>(out_n)? };
            let root = if grad.is_some() { "geglu_halves_bwd" } else { "geglu_halves_fwd" };
            let f = cuda::func(&dev, &MODULE, &cuda::kname::<T>(root))?;
            let stream = dev.cuda_stream();
            let mut b = cuda::launch_args(&stream, &f);
            b.arg(&gu);
            let g = match grad {
                Some((gs, gl)) => Some(cuda::view::<T>(gs, gl, op, "grad")?),
                None => None,
            };
            if let Some(g) = &g {
                b.arg(g);
            }
            b.arg(&y).arg(&m).arg(&cols);
            // SAFETY: gu holds m·2c elements, grad (if given) m·c, the output m·c (forward) or
            // m·2c (backward); one thread per element or 16-byte pack, grid-stride.
            unsafe { b.launch(cuda::elementwise(m * c)) }.w()?;
            Ok(cuda::wrap(y, &dev))
        })
    }

    /// Forward on `(gate, up)` or, with `grad`, the packed backward.
    pub(super) fn launch(
        op: &str,
        (s1, l1): (&CudaStorage, &Layout),
        (s2, l2): (&CudaStorage, &Layout),
        grad: Option<(&CudaStorage, &Layout)>,
    ) -> Result<CudaStorage> {
        let dev = s1.device().clone();
        let n = l1.shape().elem_count();
        with_cuda_float_type!(s1, op, T => {
            let gate = cuda::view::<T>(s1, l1, op, "gate")?;
            let up = cuda::view::<T>(s2, l2, op, "up")?;
            let g = match grad {
                Some((gs, gl)) => Some(cuda::view::<T>(gs, gl, op, "grad")?),
                None => None,
            };
            let out_n = if grad.is_some() { 2 * n } else { n };
            // SAFETY: every element is written by the kernel.
            let y = unsafe { dev.alloc::<T>(out_n)? };
            let root = if grad.is_some() { "geglu_bwd" } else { "geglu_fwd" };
            let f = cuda::func(&dev, &MODULE, &cuda::kname::<T>(root))?;
            let n_arg = n;
            let stream = dev.cuda_stream();
            let mut b = cuda::launch_args(&stream, &f);
            b.arg(&gate).arg(&up);
            let dup = y.slice(n.min(out_n - n)..);
            if let Some(g) = &g {
                b.arg(g);
            }
            b.arg(&y);
            if g.is_some() {
                b.arg(&dup);
            }
            b.arg(&n_arg);
            // SAFETY: inputs hold n elements, the output n (forward) or 2n (backward).
            unsafe { b.launch(cuda::elementwise(n)) }.w()?;
            Ok(cuda::wrap(y, &dev))
        })
    }
}

/// [`gelu_tanh_mul_backward`] that reuses the inputs' memory: `gate` and `up` (consumed; both
/// contiguous, owning their storage alone: no other tensor may view it) come back holding
/// `(d(gate), d(up))` on CUDA, with no new allocation; the CPU writes `d(gate)` over `gate` and
/// allocates `d(up)`. For explicit backward passes where the activations die here.
pub fn gelu_tanh_mul_backward_in_place(
    gate: Tensor,
    up: Tensor,
    g: &Tensor,
) -> Result<(Tensor, Tensor)> {
    let shapes_ok = gate.dims() == up.dims() && g.dims() == up.dims();
    let dtypes_ok = gate.dtype() == up.dtype() && g.dtype() == up.dtype();
    if !shapes_ok || !dtypes_ok || !gate.is_contiguous() || !up.is_contiguous() {
        bail!(
            "gelu_tanh_mul_backward_in_place: gate {:?}, up {:?} and grad {:?} must match, gate and up contiguous",
            gate.dims(),
            up.dims(),
            g.dims()
        );
    }
    let op = GeGluBwdInPlace {
        dup: crate::util::Stash::default(),
    };
    gate.inplace_op3(&up, &g.contiguous()?, &op)?;
    if gate.device().is_cuda() {
        return Ok((gate, up));
    }
    Ok((gate, op.dup.get("gelu-tanh-mul-bwd-in-place")?))
}

/// GeGLU: `gelu_tanh(gate) * up`, gelu computed in fp32 and rounded once (PyTorch's
/// `gelu_pytorch_tanh`), the product in the activation dtype. `gate` and `up` must have the same
/// shape and dtype. Fused custom op; both inputs get gradients (one backward kernel).
pub fn gelu_tanh_mul(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    if gate.dims() != up.dims() || gate.dtype() != up.dtype() {
        bail!(
            "gelu_tanh_mul: gate {:?} {:?} and up {:?} {:?} must match",
            gate.dims(),
            gate.dtype(),
            up.dims(),
            up.dtype()
        );
    }
    gate.contiguous()?.apply_op2(&up.contiguous()?, GeGlu)
}

/// The backward of [`gelu_tanh_mul`] on its own, for explicit (graph-free) backward passes:
/// `(d(gate), d(up))` from the forward inputs and the output gradient `g`. Records no graph.
pub fn gelu_tanh_mul_backward(gate: &Tensor, up: &Tensor, g: &Tensor) -> Result<(Tensor, Tensor)> {
    if gate.dims() != up.dims()
        || g.dims() != up.dims()
        || gate.dtype() != up.dtype()
        || g.dtype() != up.dtype()
    {
        bail!(
            "gelu_tanh_mul_backward: gate {:?}, up {:?} and grad {:?} must match in shape and dtype",
            gate.dims(),
            up.dims(),
            g.dims()
        );
    }
    let (dgate, dup) = GeGlu.bwd(&gate.contiguous()?, &up.contiguous()?, g, g)?;
    Ok((
        dgate.expect("gelu_tanh_mul's backward returns d(gate)"),
        dup.expect("gelu_tanh_mul's backward returns d(up)"),
    ))
}

/// [`gelu_tanh_mul`] of the two halves of each row of `gu (m, 2·c)`, `gate = gu[:, ..c]` and
/// `up = gu[:, c..]` (the MoE experts' `gate_up` product), without copying them apart: `(m, c)`.
/// Same numerics. Records no graph (explicit backward passes: [`gelu_tanh_mul_halves_backward`]).
pub fn gelu_tanh_mul_halves(gu: &Tensor) -> Result<Tensor> {
    halves_cols(gu, None, "gelu_tanh_mul_halves")?;
    gu.contiguous()?.apply_op1_no_bwd(&GeGluHalves)
}

/// The backward of [`gelu_tanh_mul_halves`]: `d(gu) (m, 2·c)`, each row `[d(gate) | d(up)]`, from
/// the forward input `gu` and the output gradient `g (m, c)`. Same numerics as
/// [`gelu_tanh_mul_backward`].
pub fn gelu_tanh_mul_halves_backward(gu: &Tensor, g: &Tensor) -> Result<Tensor> {
    halves_cols(gu, Some(g), "gelu_tanh_mul_halves_backward")?;
    gu.contiguous()?
        .apply_op2_no_bwd(&g.contiguous()?, &GeGluHalvesBwd)
}

/// `c` of a `(m, 2·c)` row-halves input, checking the gradient `(m, c)` when given.
fn halves_cols(gu: &Tensor, g: Option<&Tensor>, op: &str) -> Result<usize> {
    let (m, two_c) = gu.dims2()?;
    let c = two_c / 2;
    let g_ok = g.is_none_or(|g| g.dims() == [m, c] && g.dtype() == gu.dtype());
    if two_c % 2 != 0 || !g_ok {
        bail!(
            "{op}: gu {:?} must be (m, 2·c) and the gradient {:?} (m, c) of its dtype",
            gu.dims(),
            g.map(Tensor::dims)
        );
    }
    Ok(c)
}

/// `gu (m, 2·c)` → `(m, c)`: `r(r(gelu(gu[:, j]))·gu[:, c + j])`.
struct GeGluHalves;

/// `(gu (m, 2·c), g (m, c))` → `d(gu) (m, 2·c)`.
struct GeGluHalvesBwd;

impl CustomOp1 for GeGluHalves {
    fn name(&self) -> &'static str {
        "gelu-tanh-mul-halves"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let op = self.name();
        let (m, two_c) = l.shape().dims2()?;
        let c = two_c / 2;
        with_float_type!(s, op, T => {
            let gu = cpu_slice::<T>(s, l, op, "gu")?;
            let y = gu
                .chunks(two_c)
                .flat_map(|row| {
                    let (gate, up) = row.split_at(c);
                    gate.iter().zip(up).map(|(g, u)| geglu_y::<T>(g.to_f32(), u.to_f32()))
                })
                .collect();
            Ok((T::storage(y), Shape::from((m, c))))
        })
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (m, two_c) = l.shape().dims2()?;
        let y = cuda_impl::launch_halves(self.name(), (s, l), None, m, two_c / 2)?;
        Ok((y, Shape::from((m, two_c / 2))))
    }
}

impl CustomOp2 for GeGluHalvesBwd {
    fn name(&self) -> &'static str {
        "gelu-tanh-mul-halves-bwd"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let op = self.name();
        let (m, two_c) = l1.shape().dims2()?;
        let c = two_c / 2;
        with_float_type!(s1, op, T => {
            let gu = cpu_slice::<T>(s1, l1, op, "gu")?;
            let g = cpu_slice::<T>(s2, l2, op, "grad")?;
            let mut out = vec![T::from_f32(0.0); m * two_c];
            for ((row, grow), orow) in gu.chunks(two_c).zip(g.chunks(c)).zip(out.chunks_mut(two_c)) {
                let (dgate, dup) = orow.split_at_mut(c);
                for j in 0..c {
                    let (x, u, gv) = (row[j].to_f32(), row[c + j].to_f32(), grow[j].to_f32());
                    (dgate[j], dup[j]) = geglu_d::<T>(x, u, gv);
                }
            }
            Ok((T::storage(out), l1.shape().clone()))
        })
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (m, two_c) = l1.shape().dims2()?;
        let y = cuda_impl::launch_halves(self.name(), (s1, l1), Some((s2, l2)), m, two_c / 2)?;
        Ok((y, l1.shape().clone()))
    }
}

/// Composite reference for [`gelu_tanh_mul`].
pub fn gelu_tanh_mul_slow(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    let act = gelu_tanh(gate)?;
    act * up
}

/// `gelu_pytorch_tanh`: `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))` in fp32, rounded once
/// (composite; the model's MLP uses the fused [`gelu_tanh_mul`]).
pub fn gelu_tanh(x: &Tensor) -> Result<Tensor> {
    let dtype = x.dtype();
    x.to_dtype(DType::F32)?.gelu()?.to_dtype(dtype)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{check_fused_vs_slow, randn};
    use candle_core::Device;

    #[test]
    fn fused_matches_slow() -> Result<()> {
        // candle's gelu backward uses 6-digit constants: 1e-5 relative in f32
        for (dtype, tol) in [(DType::F32, (1e-5, 1e-4)), (DType::BF16, (1e-2, 2e-2))] {
            let gate = (randn(&[3, 50], dtype, 1, &Device::Cpu)? * 2.0)?;
            let up = randn(&[3, 50], dtype, 2, &Device::Cpu)?;
            check_fused_vs_slow(
                &format!("gelu_tanh_mul {dtype:?}"),
                &[gate, up],
                &[true, true],
                |t| gelu_tanh_mul(&t[0], &t[1]),
                |t| gelu_tanh_mul_slow(&t[0], &t[1]),
                tol,
            )?;
        }
        Ok(())
    }
    #[test]
    fn halves_equal_the_split_form_to_the_bit() -> Result<()> {
        for (rows, c) in [(3, 24), (5, 7)] {
            let gu = (randn(&[rows, 2 * c], DType::BF16, 3, &Device::Cpu)? * 2.0)?;
            let g = randn(&[rows, c], DType::BF16, 4, &Device::Cpu)?;
            let (gate, up) = (gu.narrow(1, 0, c)?, gu.narrow(1, c, c)?);
            let bits = |t: &Tensor| t.to_vec2::<half::bf16>();
            assert_eq!(
                bits(&gelu_tanh_mul_halves(&gu)?)?,
                bits(&gelu_tanh_mul(&gate, &up)?)?
            );
            let (dgate, dup) = gelu_tanh_mul_backward(&gate, &up, &g)?;
            let want = Tensor::cat(&[&dgate, &dup], 1)?;
            assert_eq!(
                bits(&gelu_tanh_mul_halves_backward(&gu, &g)?)?,
                bits(&want)?
            );
        }
        let odd = Tensor::zeros((2, 5), DType::BF16, &Device::Cpu)?;
        assert!(gelu_tanh_mul_halves(&odd).is_err());
        let gu = Tensor::zeros((2, 6), DType::BF16, &Device::Cpu)?;
        let bad_g = Tensor::zeros((2, 6), DType::BF16, &Device::Cpu)?;
        assert!(gelu_tanh_mul_halves_backward(&gu, &bad_g).is_err());
        Ok(())
    }
}
