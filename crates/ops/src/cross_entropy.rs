//! Fused, chunked linear + softcap + cross-entropy (`kernels/cross_entropy.cu`,
//! `docs/design.md`, "Candle facts"): the loss head never materialises the full (n, v) logits, in
//! any dtype. Per chunk of `chunk_rows` rows: one GEMM into a (c, v) logits buffer in the hidden
//! dtype, one kernel for the per-row loss and log-sum-exp, one kernel that overwrites the logits with
//! d(logits) in place, one GEMM back to d(hidden). So the loss and d(hidden) come out of the same
//! forward pass; the autograd backward only scales the saved d(hidden) by the upstream gradient.
//! The weight (the tied embedding) is frozen: no d(weight).
//!
//! Numerics as the composite reference (and transformers): logits in the hidden dtype (fp32-accumulated
//! GEMM, one rounding), softcap `cap·tanh(l/cap)` rounded in the logits dtype as PyTorch does
//! (`l·(1/cap)`, `tanh`, `·cap`: three roundings in bf16), then the loss in fp32. On CUDA, 16-bit
//! logits take the hardware `tanh` / `exp2` approximations (error below the bf16 rounding of the
//! capped logit that follows); fp32 logits use the exact library functions.

use crate::util::{cpu_slice, round, with_cpu_storage, with_float_type, Elem};
use candle_core::{
    bail, CpuStorage, CustomOp1, CustomOp2, DType, InplaceOp3, Layout, Result, Shape, Tensor, D,
};

/// Softcap parameters the kernels take: `cap <= 0` means none.
#[derive(Clone, Copy)]
struct Cap {
    cap: f32,
    inv: f32,
}

impl Cap {
    fn new(softcap: Option<f64>) -> Self {
        match softcap {
            Some(c) => Cap {
                cap: c as f32,
                inv: (1.0 / c) as f32,
            },
            None => Cap { cap: 0.0, inv: 0.0 },
        }
    }

    /// `(z, dz/dl)` for logit `l` of dtype `T`, rounding like the reference.
    #[inline]
    fn apply<T: Elem>(self, l: f32) -> (f32, f32) {
        if self.cap <= 0.0 {
            return (l, 1.0);
        }
        let th = round::<T>(l * self.inv).tanh();
        (round::<T>(round::<T>(th) * self.cap), 1.0 - th * th)
    }
}

/// `(logits (c, v), targets (c,) u32)` → stats (c, 2) f32: `[loss_row, lse]`.
struct CeStats(Cap);

/// In place on logits (c, v) with `(targets, stats)`: logits ← d(loss)/d(logits).
struct CeGrad(Cap);

/// Returns the precomputed summed loss; its backward is `d(hidden)·grad`.
struct LinearCeOut {
    loss: Tensor,
    dh: Option<Tensor>,
}

fn stats_cpu<T: Elem>(l: &[T], targets: &[u32], v: usize, cap: Cap) -> Result<Vec<f32>> {
    let mut stats = Vec::with_capacity(2 * targets.len());
    for (row, &t) in l.chunks_exact(v).zip(targets) {
        let z: Vec<f32> = row.iter().map(|x| cap.apply::<T>(x.to_f32()).0).collect();
        let m = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let lse = m + z.iter().map(|z| (z - m).exp()).sum::<f32>().ln();
        let loss = match t {
            u32::MAX => 0.0,
            t if t as usize >= v => bail!("linear_cross_entropy: target {t} >= vocab {v}"),
            t => lse - z[t as usize],
        };
        stats.extend([loss, lse]);
    }
    Ok(stats)
}

fn grad_cpu<T: Elem>(l: &mut [T], targets: &[u32], stats: &[f32], v: usize, cap: Cap) {
    for ((row, &t), st) in l
        .chunks_exact_mut(v)
        .zip(targets)
        .zip(stats.chunks_exact(2))
    {
        let valid = (t as usize) < v;
        for (j, x) in row.iter_mut().enumerate() {
            let (z, dz) = cap.apply::<T>(x.to_f32());
            let onehot = if j == t as usize { 1.0 } else { 0.0 };
            let d = if valid {
                ((z - st[1]).exp() - onehot) * dz
            } else {
                0.0
            };
            *x = T::from_f32(d);
        }
    }
}

impl CustomOp2 for CeStats {
    fn name(&self) -> &'static str {
        "cross-entropy-stats"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (c, v) = l1.shape().dims2()?;
        let op = self.name();
        let targets = cpu_slice::<u32>(s2, l2, op, "targets")?;
        with_float_type!(s1, op, T => {
            let l = cpu_slice::<T>(s1, l1, op, "logits")?;
            Ok((CpuStorage::F32(stats_cpu(l, targets, v, self.0)?), Shape::from((c, 2))))
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
        let (c, _) = l1.shape().dims2()?;
        Ok((
            cuda_impl::stats(self.name(), s1, l1, s2, l2, self.0)?,
            Shape::from((c, 2)),
        ))
    }
}

impl InplaceOp3 for CeGrad {
    fn name(&self) -> &'static str {
        "cross-entropy-grad"
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
        let (_, v) = l1.shape().dims2()?;
        let op = self.name();
        let targets = cpu_slice::<u32>(s2, l2, op, "targets")?;
        let stats = cpu_slice::<f32>(s3, l3, op, "stats")?;
        let Some((a, b)) = l1.contiguous_offsets() else {
            bail!("{op}: logits must be contiguous");
        };
        match s1 {
            CpuStorage::F32(l) => grad_cpu::<f32>(&mut l[a..b], targets, stats, v, self.0),
            CpuStorage::BF16(l) => grad_cpu::<half::bf16>(&mut l[a..b], targets, stats, v, self.0),
            CpuStorage::F16(l) => grad_cpu::<half::f16>(&mut l[a..b], targets, stats, v, self.0),
            _ => bail!("{op}: logits must be f32, bf16 or f16"),
        }
        Ok(())
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
        cuda_impl::grad(self.name(), s1, l1, (s2, l2), (s3, l3), self.0)
    }
}

impl CustomOp1 for LinearCeOut {
    fn name(&self) -> &'static str {
        "linear-cross-entropy"
    }

    fn cpu_fwd(&self, _s: &CpuStorage, _l: &Layout) -> Result<(CpuStorage, Shape)> {
        with_cpu_storage(&self.loss, self.name(), "loss", |s, _| {
            Ok((s.clone(), Shape::from(())))
        })
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        _s: &candle_core::CudaStorage,
        _l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use candle_core::backend::BackendStorage;
        crate::cuda::with_cuda_storage(&self.loss, self.name(), "loss", |s, l| {
            Ok((s.try_clone(l)?, Shape::from(())))
        })
    }

    fn bwd(&self, _h: &Tensor, _res: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        let Some(dh) = &self.dh else {
            bail!(
                "linear_cross_entropy: backward through a loss computed from an untracked hidden"
            );
        };
        // scale in fp32 (grad_res is e.g. 1/n_valid, not representable in bf16), round once
        let scaled = dh
            .to_dtype(DType::F32)?
            .broadcast_mul(&g.to_dtype(DType::F32)?)?;
        Ok(Some(scaled.to_dtype(dh.dtype())?))
    }
}

#[cfg(feature = "cuda")]
mod cuda_impl {
    use super::Cap;
    use crate::cuda::{self, cuda_module, with_cuda_float_type, Module};
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::WrapErr;
    use candle_core::{CudaStorage, Layout, Result};

    const MODULE: Module = cuda_module!("cross_entropy");

    pub(super) fn stats(
        op: &str,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
        cap: Cap,
    ) -> Result<CudaStorage> {
        let dev = s1.device().clone();
        let (c, v) = l1.shape().dims2()?;
        let targets = cuda::view::<u32>(s2, l2, op, "targets")?;
        with_cuda_float_type!(s1, op, T => {
            let logits = cuda::view::<T>(s1, l1, op, "logits")?;
            // SAFETY: every element is written by the kernel.
            let stats = unsafe { dev.alloc::<f32>(2 * c)? };
            let f = cuda::func(&dev, &MODULE, &cuda::kname::<T>("ce_stats"))?;
            let v_i = v as i32;
            let stream = dev.cuda_stream();
            let mut b = cuda::launch_args(&stream, &f);
            b.arg(&logits).arg(&targets).arg(&stats).arg(&v_i).arg(&cap.cap).arg(&cap.inv);
            // SAFETY: logits (c, v), targets (c,), stats (c, 2).
            unsafe { b.launch(cuda::per_row(c, cuda::row_threads(v).min(1024))) }.w()?;
            Ok(cuda::wrap(stats, &dev))
        })
    }

    pub(super) fn grad(
        op: &str,
        s1: &mut CudaStorage,
        l1: &Layout,
        (s2, l2): (&CudaStorage, &Layout),
        (s3, l3): (&CudaStorage, &Layout),
        cap: Cap,
    ) -> Result<()> {
        let dev = s1.device().clone();
        let (c, v) = l1.shape().dims2()?;
        let targets = cuda::view::<u32>(s2, l2, op, "targets")?;
        let stats = cuda::view::<f32>(s3, l3, op, "stats")?;
        let Some((a, b_off)) = l1.contiguous_offsets() else {
            candle_core::bail!("{op}: logits must be contiguous");
        };
        with_cuda_float_type!(s1, op, T => {
            let mut logits = s1.as_cuda_slice_mut::<T>()?.slice_mut(a..b_off);
            let f = cuda::func(&dev, &MODULE, &cuda::kname::<T>("ce_grad"))?;
            let v_i = v as i32;
            let stream = dev.cuda_stream();
            let mut b = cuda::launch_args(&stream, &f);
            b.arg(&mut logits).arg(&targets).arg(&stats).arg(&v_i).arg(&cap.cap).arg(&cap.inv);
            // SAFETY: logits (c, v), targets (c,), stats (c, 2).
            unsafe { b.launch(cuda::per_row(c, cuda::row_threads(v).min(1024))) }.w()?;
            Ok(())
        })
    }
}

/// Summed token cross-entropy of `hidden @ weightᵀ` (optionally softcapped), chunked over rows.
///
/// `hidden`: (n, h); `weight`: (v, h), same dtype (the frozen tied embedding); `targets`: (n,) `u32`
/// with `u32::MAX` = ignore (a target `>= v` is an error on the CPU and ignored on the GPU);
/// `softcap`: `Some(cap)` for `cap·tanh(l/cap)` in the logits dtype; `chunk_rows` ≥ 1 rows per chunk
/// (working set `chunk_rows × v` in the hidden dtype). Returns the summed loss as a scalar f32 tensor;
/// divide by the valid-token count yourself. If `hidden` is tracked, d(hidden) is computed in the
/// same pass (held until the backward, (n, h) in the hidden dtype); the weight gets no gradient.
pub fn linear_cross_entropy(
    hidden: &Tensor,
    weight: &Tensor,
    targets: &Tensor,
    softcap: Option<f64>,
    chunk_rows: usize,
) -> Result<Tensor> {
    let (n, h) = hidden.dims2()?;
    let (_, wh) = weight.dims2()?;
    if wh != h || weight.dtype() != hidden.dtype() {
        bail!(
            "linear_cross_entropy: weight {:?} {:?} must be (v, {h}) in hidden's dtype {:?}",
            weight.dims(),
            weight.dtype(),
            hidden.dtype()
        );
    }
    if targets.dims() != [n] || targets.dtype() != DType::U32 {
        bail!(
            "linear_cross_entropy: targets must be ({n},) u32, got {:?} {:?}",
            targets.dims(),
            targets.dtype()
        );
    }
    if chunk_rows == 0 {
        bail!("linear_cross_entropy: chunk_rows must be at least 1");
    }
    let cap = Cap::new(softcap);
    let need_grad = hidden.track_op();
    let (hd, wd, targets) = (hidden.detach(), weight.detach(), targets.contiguous()?);
    let mut loss = Tensor::zeros((), DType::F32, hidden.device())?;
    let mut dh = (need_grad && n > chunk_rows)
        .then(|| Tensor::zeros((n, h), hidden.dtype(), hidden.device()))
        .transpose()?;
    for start in (0..n).step_by(chunk_rows) {
        let len = chunk_rows.min(n - start);
        let hc = hd.narrow(0, start, len)?;
        let tc = targets.narrow(0, start, len)?;
        let logits = hc.matmul(&wd.t()?)?; // (len, v), hidden dtype
        let stats = logits.apply_op2_no_bwd(&tc, &CeStats(cap))?; // (len, 2) f32
        loss = (loss + stats.narrow(1, 0, 1)?.sum_all()?)?;
        if need_grad {
            logits.inplace_op3(&tc, &stats, &CeGrad(cap))?; // logits now hold d(logits)
            let dhc = logits.matmul(&wd)?; // (len, h)
            match &dh {
                Some(dh) => dh.slice_set(&dhc, 0, start)?,
                None => dh = Some(dhc),
            }
        }
    }
    hidden.apply_op1(LinearCeOut { loss, dh })
}

/// Composite reference for [`linear_cross_entropy`]: `linear_frozen` → [`softcap`] →
/// [`cross_entropy_sum`], materialising the full logits.
pub fn linear_cross_entropy_slow(
    hidden: &Tensor,
    weight: &Tensor,
    targets: &Tensor,
    softcap_value: Option<f64>,
) -> Result<Tensor> {
    let mut logits = crate::linear_frozen(hidden, weight)?;
    if let Some(cap) = softcap_value {
        logits = softcap(&logits, cap)?;
    }
    cross_entropy_sum(&logits, targets)
}

/// Final-logit softcap `cap·tanh(x/cap)` in the logits dtype, rounding as PyTorch does on bf16
/// tensors: `r(x·(1/cap))` (ATen multiplies by the reciprocal of a scalar divisor), `r(tanh)`,
/// `r(·cap)`, each computed in fp32 (composite: used by the reference path).
pub fn softcap(logits: &Tensor, cap: f64) -> Result<Tensor> {
    let dt = logits.dtype();
    let a = (logits.to_dtype(DType::F32)? * (1.0 / cap))?.to_dtype(dt)?;
    let b = a.to_dtype(DType::F32)?.tanh()?.to_dtype(dt)?;
    (b.to_dtype(DType::F32)? * cap)?.to_dtype(dt)
}

/// Sum of token cross-entropies over rows of `logits` (n, v) whose target is not ignored.
/// `targets`: (n,) `u32`; `u32::MAX` marks an ignored position (-100 in PyTorch).
/// Logits are upcast to fp32 first (transformers' `logits.float()`). Returns a scalar f32 tensor.
pub fn cross_entropy_sum(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    let lf = logits.to_dtype(DType::F32)?;
    let max = lf.max_keepdim(D::Minus1)?;
    let shifted = lf.broadcast_sub(&max)?;
    let lse = shifted.exp()?.sum_keepdim(D::Minus1)?.log()?;
    let logp = shifted.broadcast_sub(&lse)?;
    // gather returns 0 for the u32::MAX index, so ignored rows contribute nothing.
    let picked = logp.gather(&targets.unsqueeze(1)?, 1)?;
    picked.sum_all()?.neg()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{assert_close, randn};
    use candle_core::{Device, Var};

    fn check(dtype: DType, cap: Option<f64>, chunk: usize, tol: (f64, f64)) -> Result<()> {
        let dev = Device::Cpu;
        let (n, h, v) = (7, 6, 11);
        let hidden = Var::from_tensor(&randn(&[n, h], dtype, 1, &dev)?)?;
        let w = (randn(&[v, h], dtype, 2, &dev)? * 3.0)?;
        let t: Vec<u32> = vec![3, u32::MAX, 0, 10, 5, u32::MAX, 7];
        let targets = Tensor::new(t.as_slice(), &dev)?;
        let fast = linear_cross_entropy(&hidden, &w, &targets, cap, chunk)?;
        let slow = linear_cross_entropy_slow(&hidden, &w, &targets, cap)?;
        let name = format!("lce {dtype:?} cap={cap:?} chunk={chunk}");
        assert_close(&format!("{name} loss"), &fast, &slow, tol.0, tol.1)?;
        // scale the loss like the model does (mean over valid tokens), so grad_res != 1
        let gf = (fast / 5.0)?.backward()?;
        let gs = (slow / 5.0)?.backward()?;
        let (a, b) = (gf.get(&hidden).expect("dh"), gs.get(&hidden).expect("dh"));
        assert_close(&format!("{name} d(hidden)"), a, b, tol.0, tol.1)?;
        // ignored rows get exactly zero gradient
        assert_eq!(
            a.get(1)?
                .abs()?
                .sum_all()?
                .to_dtype(DType::F32)?
                .to_scalar::<f32>()?,
            0.0
        );
        Ok(())
    }

    #[test]
    fn fused_matches_slow_f32() -> Result<()> {
        for chunk in [1, 3, 7, 100] {
            check(DType::F32, Some(2.0), chunk, (1e-5, 1e-5))?;
        }
        check(DType::F32, None, 3, (1e-5, 1e-5))
    }

    #[test]
    fn fused_matches_slow_bf16() -> Result<()> {
        // same roundings forward; the reference's backward runs its bf16 autograd (looser)
        check(DType::BF16, Some(2.0), 3, (2e-2, 3e-2))
    }

    #[test]
    fn untracked_hidden_gives_loss_only() -> Result<()> {
        let dev = Device::Cpu;
        let hidden = randn(&[4, 6], DType::F32, 1, &dev)?;
        let w = randn(&[9, 6], DType::F32, 2, &dev)?;
        let targets = Tensor::new(&[1u32, 2, 3, 8], &dev)?;
        let fast = linear_cross_entropy(&hidden, &w, &targets, Some(30.0), 2)?;
        let slow = linear_cross_entropy_slow(&hidden, &w, &targets, Some(30.0))?;
        assert_close("loss", &fast, &slow, 1e-5, 1e-5)
    }

    #[test]
    fn bad_target_is_an_error_on_cpu() -> Result<()> {
        let dev = Device::Cpu;
        let hidden = randn(&[2, 6], DType::F32, 1, &dev)?;
        let w = randn(&[9, 6], DType::F32, 2, &dev)?;
        let targets = Tensor::new(&[1u32, 9], &dev)?;
        assert!(linear_cross_entropy(&hidden, &w, &targets, None, 2).is_err());
        Ok(())
    }
}
