//! `x @ wᵀ` for a frozen weight (`FrozenMatmul`, `docs/design.md`, "Candle facts"): Candle's matmul
//! backward always computes a weight-sized `d(w) = xᵀ·g` and keeps it in the `GradStore`; this op's
//! backward returns only `d(x) = g·w`, halving the base model's backward GEMMs.

use candle_core::backend::BackendStorage;
use candle_core::{bail, CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};

/// `(m, k) @ (n, k)ᵀ -> (m, n)` through the backend's own GEMM (cuBLAS / gemm), `w` read transposed
/// in place (no copy).
struct FrozenMatmul;

impl FrozenMatmul {
    fn dims(l1: &Layout, l2: &Layout) -> Result<(usize, usize, usize, Layout)> {
        let (m, k) = l1.shape().dims2()?;
        let (n, k2) = l2.shape().dims2()?;
        if k != k2 {
            bail!("linear_frozen: x has {k} input features, weight (out, in) is ({n}, {k2})");
        }
        Ok((m, n, k, l2.transpose(0, 1)?))
    }
}

impl CustomOp2 for FrozenMatmul {
    fn name(&self) -> &'static str {
        "linear-frozen"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (m, n, k, l2t) = Self::dims(l1, l2)?;
        Ok((s1.matmul(s2, (1, m, n, k), l1, &l2t)?, Shape::from((m, n))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (m, n, k, l2t) = Self::dims(l1, l2)?;
        Ok((s1.matmul(s2, (1, m, n, k), l1, &l2t)?, Shape::from((m, n))))
    }

    /// Only `d(x) = g·w`; the frozen weight gets `None` (nothing computed, nothing stored).
    fn bwd(
        &self,
        _x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        Ok((Some(g.matmul(w)?), None))
    }
}

/// `x @ wᵀ` for a frozen weight `w` of shape (out, in): the backward produces only d(x), never a
/// weight-sized d(w). `x`: (..., in) → (..., out), same dtype as `w`. `w` is detached: a `Var`
/// passed here gets no gradient either. Errors on a feature-count or dtype mismatch.
pub fn linear_frozen(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let (out_f, in_f) = w.dims2()?;
    let dims = x.dims();
    let Some((&last, lead)) = dims.split_last() else {
        bail!("linear_frozen: x must have at least one dimension");
    };
    if last != in_f {
        bail!("linear_frozen: x {dims:?} has {last} input features, weight is ({out_f}, {in_f})");
    }
    let m: usize = lead.iter().product();
    let y = x.reshape((m, in_f))?.apply_op2(&w.detach(), FrozenMatmul)?;
    let mut out_dims = lead.to_vec();
    out_dims.push(out_f);
    y.reshape(out_dims)
}

/// The backward of [`linear_frozen`] on its own, for explicit (graph-free) backward passes:
/// `d(x) = g · w` from the output gradient `g (..., out)` and the weight `(out, in)`; `(..., in)`.
pub fn linear_frozen_backward(g: &Tensor, w: &Tensor) -> Result<Tensor> {
    let (out_f, in_f) = w.dims2()?;
    let dims = g.dims();
    let Some((&last, lead)) = dims.split_last() else {
        bail!("linear_frozen_backward: g must have at least one dimension");
    };
    if last != out_f {
        bail!(
            "linear_frozen_backward: g {dims:?} has {last} features, weight is ({out_f}, {in_f})"
        );
    }
    let m: usize = lead.iter().product();
    let dx = g.reshape((m, out_f))?.matmul(&w.detach())?;
    let mut in_dims = lead.to_vec();
    in_dims.push(in_f);
    dx.reshape(in_dims)
}

/// Composite reference for [`linear_frozen`]: Candle's matmul (its backward also computes d(w)
/// when `w` is tracked).
pub fn linear_frozen_slow(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    x.broadcast_matmul(&w.t()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{assert_close, randn};
    use candle_core::{DType, Device, Var};

    #[test]
    fn forward_matches_matmul() -> Result<()> {
        let dev = Device::Cpu;
        let x = randn(&[2, 3, 5], DType::F32, 1, &dev)?;
        let w = randn(&[4, 5], DType::F32, 2, &dev)?;
        assert_close(
            "y",
            &linear_frozen(&x, &w)?,
            &linear_frozen_slow(&x, &w)?,
            1e-6,
            1e-6,
        )
    }

    #[test]
    fn backward_gives_dx_and_no_weight_gradient() -> Result<()> {
        let dev = Device::Cpu;
        let x = Var::from_tensor(&randn(&[2, 3, 5], DType::F32, 3, &dev)?)?;
        // A Var weight: the slow path computes and keeps d(w), the fused one must not.
        let w = Var::from_tensor(&randn(&[4, 5], DType::F32, 4, &dev)?)?;
        let g = randn(&[2, 3, 4], DType::F32, 5, &dev)?;
        let slow = crate::backward_with_seed(&linear_frozen_slow(&x, &w)?, &g)?;
        let fast = crate::backward_with_seed(&linear_frozen(&x, &w)?, &g)?;
        assert_close(
            "dx",
            fast.get(&x).expect("dx"),
            slow.get(&x).expect("dx"),
            1e-6,
            1e-6,
        )?;
        assert!(
            slow.get(&w).is_some(),
            "the reference keeps a d(w): the check below can fail"
        );
        assert!(fast.get(&w).is_none());
        for id in fast.get_ids() {
            let t = fast.get_id(*id).expect("listed id");
            assert_ne!(
                t.dims(),
                w.dims(),
                "weight-shaped gradient left in the store"
            );
        }
        Ok(())
    }
}
