//! Backward from an upstream gradient (`SeedGrad`): Candle's `Tensor::backward` always seeds the root
//! with ones and has no seed argument, so the layer-wise backward applies this op to a layer's output
//! and calls `backward` on the 1-element result (`docs/design.md`, "Candle facts").

use crate::util::with_float_type;
use candle_core::backprop::GradStore;
use candle_core::{bail, CpuStorage, CustomOp1, Layout, Result, Shape, Tensor};

/// Forward: a 1-element zero (the value is irrelevant); backward: the stored seed `grad`.
struct SeedGrad {
    grad: Tensor,
}

impl CustomOp1 for SeedGrad {
    fn name(&self) -> &'static str {
        "seed-grad"
    }

    fn cpu_fwd(&self, s: &CpuStorage, _l: &Layout) -> Result<(CpuStorage, Shape)> {
        with_float_type!(s, self.name(), T => {
            use crate::util::Storable;
            Ok((T::storage(vec![<T as crate::util::Elem>::from_f32(0.0)]), Shape::from(())))
        })
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        _l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use candle_core::backend::BackendStorage;
        let dev = s.device();
        crate::cuda::with_cuda_float_type!(s, self.name(), T => {
            let z = dev.alloc_zeros::<T>(1)?;
            Ok((crate::cuda::wrap(z, dev), Shape::from(())))
        })
    }

    /// `grad_res` is the ones seed of `backward()` on the scalar: the argument's gradient is the seed.
    fn bwd(&self, _arg: &Tensor, _res: &Tensor, _grad_res: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(self.grad.clone()))
    }
}

/// Backward pass of the graph behind `out`, seeded with `d(loss)/d(out) = grad` instead of ones.
///
/// Returns the [`GradStore`] of every tracked leaf (`Var`s, e.g. the layer input and the LoRA
/// weights). `grad` must have `out`'s shape and dtype; it is detached first, so no graph reaches back
/// through it. Costs what `or_insert` costs (a zeros + add of `out`'s size), unlike the
/// `(out * grad).sum().backward()` trick. Errors on a shape or dtype mismatch.
pub fn backward_with_seed(out: &Tensor, grad: &Tensor) -> Result<GradStore> {
    if out.dims() != grad.dims() {
        bail!(
            "backward_with_seed: grad shape {:?} does not match out shape {:?}",
            grad.dims(),
            out.dims()
        );
    }
    if out.dtype() != grad.dtype() {
        bail!(
            "backward_with_seed: grad dtype {:?} does not match out dtype {:?}",
            grad.dtype(),
            out.dtype()
        );
    }
    if out.device().location() != grad.device().location() {
        bail!("backward_with_seed: grad and out are on different devices");
    }
    out.apply_op1(SeedGrad {
        grad: grad.detach(),
    })?
    .backward()
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    #[test]
    fn seed_matches_mul_sum_trick() -> Result<()> {
        let dev = Device::Cpu;
        let x = Var::from_tensor(&Tensor::arange(0f32, 12., &dev)?.reshape((3, 4))?)?;
        let w = Tensor::arange(1f32, 5., &dev)?.reshape((4, 1))?;
        let out = (x.sqr()?.broadcast_mul(&w.t()?)? * 0.5)?; // (3, 4)
        let g = Tensor::arange(-6f32, 6., &dev)?.reshape((3, 4))?;
        let want = (out.clone() * &g)?.sum_all()?.backward()?;
        let got = backward_with_seed(&out, &g)?;
        let d = (want.get(&x).expect("x grad") - got.get(&x).expect("x grad"))?
            .abs()?
            .max_all()?
            .to_scalar::<f32>()?;
        assert_eq!(d, 0.0);
        Ok(())
    }

    #[test]
    fn seed_shape_mismatch_is_an_error() -> Result<()> {
        let dev = Device::Cpu;
        let x = Var::new(&[1f32, 2.], &dev)?;
        let out = x.sqr()?;
        let g = Tensor::new(&[1f32, 2., 3.], &dev)?;
        assert!(backward_with_seed(&out, &g).is_err());
        Ok(())
    }
}
