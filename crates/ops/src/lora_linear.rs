//! A LoRA-adapted frozen linear layer as one op (`LoraLinear`):
//! `y = x·Wᵀ + scale·(drop(x)·Aᵀ)·Bᵀ` with `W (out, in)` frozen, `A (r, in)`, `B (out, r)`.
//!
//! Built from separate Candle ops, one projection records ~10 graph nodes (frozen matmul, dropout,
//! two adapter matmuls, transposes, the scale, the add), and Candle's backward zero-fills and adds a
//! gradient buffer for every argument of every node: ~6 extra passes over `(tokens, in|out)` per
//! projection (the largest item of an Nsight profile of the 12B step). As one node it costs one
//! gradient buffer for `x` and two tiny ones for `A` and `B`.
//!
//! On CUDA the forward is three cuBLAS GEMMs (the adapter product accumulates into `y` with
//! `alpha = scale, beta = 1`, no add or scale kernel) plus the dropout kernel; the backward five
//! GEMMs: `dlow = scale·g·B`, `dx = g·W (+ dlow·A, through the dropout mask)`, `dA = dlowᵀ·drop(x)`,
//! `dB = scale·gᵀ·low`, with `low = drop(x)·Aᵀ` kept from the forward (`tokens × r`) and the
//! dropout mask regenerated from its key. On the CPU both directions are the composite of Candle
//! ops ([`lora_linear_slow`]'s math), so the CPU tests check the backward formulas against autograd.
//! Numerics: fp32 accumulation in every GEMM; the adapter term is added to the rounded base output
//! inside the GEMM's epilogue (one rounding instead of the composite's three).

use crate::util::{Stash, Storable};
#[cfg(feature = "cuda")]
use candle_core::CustomOp1;
use candle_core::{bail, CpuStorage, CustomOp3, Layout, Result, Shape, Tensor};

/// Dropout of the adapter input: probability and counter-hash key ([`crate::dropout_key`]).
pub type LoraDropout = (f64, [u64; 3]);

/// The forward op on `(x (m, in), a (r, in), b (out, r))`; stashes `low = drop(x)·Aᵀ`. `a`/`b` may
/// be fp32 master weights: the GEMMs read `a_x`/`b_x`, their copies in `x`'s dtype (no graph), and
/// the backward returns `dA`/`dB` in `a`/`b`'s dtype (fp32 straight from the GEMM accumulator).
struct LoraLinearOp {
    parts: LoraParts,
    low: Stash,
}

/// The operands both directions read: frozen `w`, the adapter copies in `x`'s dtype, scale, dropout.
#[derive(Clone)]
struct LoraParts {
    w: Tensor,
    a_x: Tensor,
    b_x: Tensor,
    scale: f64,
    dropout: Option<LoraDropout>,
}

/// `drop(x)` (identity without dropout).
fn dropped(x: &Tensor, dropout: Option<LoraDropout>) -> Result<Tensor> {
    match dropout {
        Some((p, key)) => crate::lora_dropout(x, p, key),
        None => Ok(x.clone()),
    }
}

/// The composite forward on detached 2-D tensors: `(y, low)`.
fn forward_composite(
    x: &Tensor,
    w: &Tensor,
    a: &Tensor,
    b: &Tensor,
    scale: f64,
    dropout: Option<LoraDropout>,
) -> Result<(Tensor, Tensor)> {
    let low = dropped(x, dropout)?.matmul(&a.t()?)?;
    let y = (x.matmul(&w.t()?)? + (low.matmul(&b.t()?)? * scale)?)?;
    Ok((y, low))
}

/// A detached CPU tensor holding a copy of `(s, l)`.
fn cpu_tensor(s: &CpuStorage, l: &Layout, what: &str) -> Result<Tensor> {
    let op = "lora-linear";
    let dev = candle_core::Device::Cpu;
    crate::util::with_float_type!(s, op, T => {
        let v = crate::util::cpu_slice::<T>(s, l, op, what)?.to_vec();
        Tensor::from_vec(v, l.dims(), &dev)
    })
}

/// The storage of a contiguous CPU tensor.
fn cpu_storage(t: &Tensor) -> Result<CpuStorage> {
    let t = t.contiguous()?;
    let (s, l) = t.storage_and_layout();
    match &*s {
        candle_core::Storage::Cpu(cs) => {
            crate::util::with_float_type!(cs, "lora-linear", T => {
                Ok(T::storage(crate::util::cpu_slice::<T>(cs, l, "lora-linear", "output")?.to_vec()))
            })
        }
        _ => bail!("lora-linear: expected a CPU tensor"),
    }
}

impl CustomOp3 for LoraLinearOp {
    fn name(&self) -> &'static str {
        "lora-linear"
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
        let _ = (s2, l2, s3, l3); // the GEMMs read the cast copies a_x, b_x
        let x = cpu_tensor(s1, l1, "x")?;
        let p = &self.parts;
        let (y, low) = forward_composite(&x, &p.w, &p.a_x, &p.b_x, p.scale, p.dropout)?;
        self.low.put(low);
        Ok((cpu_storage(&y)?, y.shape().clone()))
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
        let _ = (s2, l2, s3, l3); // the GEMMs read the cast copies a_x, b_x
        let (y, low) = cuda_impl::forward(&self.parts, (s1, l1))?;
        let (m, out) = (l1.dims()[0], self.parts.w.dim(0)?);
        self.low.put(crate::util::tensor_from_storage(
            candle_core::Storage::Cuda(low),
            &[m, self.parts.a_x.dim(0)?],
        ));
        Ok((y, Shape::from((m, out))))
    }

    fn bwd(
        &self,
        x: &Tensor,
        a: &Tensor,
        b: &Tensor,
        _res: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let low = self.low.get(self.name())?;
        let (dx, da, db) = self.parts.backward(x, &low, g, (a.dtype(), b.dtype()))?;
        Ok((Some(dx), Some(da), Some(db)))
    }
}

impl LoraParts {
    /// `(dx (m, in), dA, dB)` of the 2-D forward on `x` that kept `low`, the adapter gradients in
    /// `grad_dtype` (those of `a` and `b`).
    fn backward(
        &self,
        x: &Tensor,
        low: &Tensor,
        g: &Tensor,
        grad_dtype: (candle_core::DType, candle_core::DType),
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let g = g.contiguous()?;
        #[cfg(feature = "cuda")]
        if x.device().is_cuda() {
            let op = LoraLinearBwd {
                parts: self.clone(),
                grad_dtype,
                g,
                low: low.clone(),
                dadb: Stash::default(),
            };
            let dx = x.apply_op1_no_bwd(&op)?;
            let dadb = op.dadb.get("lora-linear-bwd")?;
            let (r, inf, out) = (self.a_x.dim(0)?, self.a_x.dim(1)?, self.b_x.dim(0)?);
            let da = dadb.narrow(0, 0, r * inf)?.reshape((r, inf))?;
            let db = dadb.narrow(0, r * inf, out * r)?.reshape((out, r))?;
            return Ok((dx, da, db));
        }
        // The composite backward, in autograd's order: d(up) = scale·g, d(low) = d(up)·B,
        // dB = d(up)ᵀ·low, dA = d(low)ᵀ·drop(x), dx = g·W + drop'(d(low)·A).
        let dup = (&g * self.scale)?;
        let dlow = dup.matmul(&self.b_x)?;
        let db = dup.t()?.matmul(low)?.to_dtype(grad_dtype.1)?;
        let da = dlow
            .t()?
            .matmul(&dropped(x, self.dropout)?)?
            .to_dtype(grad_dtype.0)?;
        let dx = (g.matmul(&self.w)? + dropped(&dlow.matmul(&self.a_x)?, self.dropout)?)?;
        Ok((dx, da, db))
    }
}

/// The CUDA backward on `x`: returns `dx (m, in)`, stashes `[dA (r, in), dB (out, r)]`.
#[cfg(feature = "cuda")]
struct LoraLinearBwd {
    parts: LoraParts,
    /// Dtypes of the adapter gradients (those of `a` and `b`: fp32 for master weights).
    grad_dtype: (candle_core::DType, candle_core::DType),
    g: Tensor,
    low: Tensor,
    /// Packed `[dA, dB]` in `grad_dtype` (both the same dtype), written by the CUDA backward.
    dadb: Stash,
}

#[cfg(feature = "cuda")]
impl CustomOp1 for LoraLinearBwd {
    fn name(&self) -> &'static str {
        "lora-linear-bwd"
    }

    /// Not used: on the CPU [`LoraLinearOp`]'s backward is the composite of Candle ops.
    fn cpu_fwd(&self, _s: &CpuStorage, _l: &Layout) -> Result<(CpuStorage, Shape)> {
        bail!("lora-linear-bwd runs on CUDA only (the CPU backward is the composite)")
    }

    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (m, inf) = l.shape().dims2()?;
        let (r, out) = (self.parts.a_x.dim(0)?, self.parts.b_x.dim(0)?);
        let (dx, dadb) = cuda_impl::backward(self, (s, l))?;
        self.dadb.put(crate::util::tensor_from_storage(
            candle_core::Storage::Cuda(dadb),
            &[r * inf + out * r],
        ));
        Ok((dx, Shape::from((m, inf))))
    }
}

/// `x·Wᵀ + scale·(drop(x)·Aᵀ)·Bᵀ` as one op (see the module doc). `x`: `(..., in)`; `w`: frozen
/// `(out, in)` in `x`'s dtype (never gets a gradient); `a`: `(r, in)`; `b`: `(out, r)`, both in one
/// float dtype (typically fp32 master weights): the products use copies in `x`'s dtype, as PEFT
/// under autocast, and `a`/`b` get their gradients in their own dtype.
/// `dropout`: `Some((p, key))` with `0 < p < 1` applies [`crate::lora_dropout`] to the adapter
/// input. Returns `(..., out)`. Gradients for `x`, `a` and `b`.
pub fn lora_linear(
    x: &Tensor,
    w: &Tensor,
    a: &Tensor,
    b: &Tensor,
    scale: f64,
    dropout: Option<LoraDropout>,
) -> Result<Tensor> {
    let (op, x2, out_dims) = prepare(x, w, a, b, scale, dropout)?;
    x2.apply_op3(&a.contiguous()?, &b.contiguous()?, op)?
        .reshape(out_dims)
}

/// What [`LoraLinearSaved::backward`] reads: the operands, the 2-D input and `low = drop(x)·Aᵀ`.
pub struct LoraLinearSaved {
    parts: LoraParts,
    x: Tensor,
    low: Tensor,
    grad_dtype: (candle_core::DType, candle_core::DType),
    x_dims: Vec<usize>,
}

impl LoraLinearSaved {
    /// `(dx, dA, dB)` from the output gradient `g` (the GEMMs autograd runs): `dx` in `x`'s
    /// shape and dtype, `dA`/`dB` in `a`/`b`'s dtype. Records no graph.
    pub fn backward(&self, g: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
        let (m, inf) = self.x.dims2()?;
        let out = self.parts.w.dim(0)?;
        if g.elem_count() != m * out || g.dtype() != self.x.dtype() {
            bail!(
                "lora_linear backward: grad {:?} {:?} does not fit the forward's output ({m} rows of {out}, {:?})",
                g.dims(),
                g.dtype(),
                self.x.dtype()
            );
        }
        let g = g.reshape((m, out))?;
        let (dx, da, db) = self
            .parts
            .backward(&self.x, &self.low, &g, self.grad_dtype)?;
        debug_assert_eq!(dx.dims(), [m, inf]);
        Ok((dx.reshape(self.x_dims.as_slice())?, da, db))
    }
}

/// [`lora_linear`] without a graph, for explicit backward passes: the output and what
/// [`LoraLinearSaved::backward`] needs (same arguments and numerics as [`lora_linear`]).
pub fn lora_linear_saved(
    x: &Tensor,
    w: &Tensor,
    a: &Tensor,
    b: &Tensor,
    scale: f64,
    dropout: Option<LoraDropout>,
) -> Result<(Tensor, LoraLinearSaved)> {
    let (op, x2, out_dims) = prepare(x, w, a, b, scale, dropout)?;
    let y = x2
        .apply_op3_no_bwd(&a.detach().contiguous()?, &b.detach().contiguous()?, &op)?
        .reshape(out_dims)?;
    let saved = LoraLinearSaved {
        low: op.low.get("lora-linear")?,
        parts: op.parts,
        x: x2,
        grad_dtype: (a.dtype(), b.dtype()),
        x_dims: x.dims().to_vec(),
    };
    Ok((y, saved))
}

/// Checks the operands of [`lora_linear`]; returns the op, `x` as a contiguous `(m, in)` tensor
/// and the output dims.
fn prepare(
    x: &Tensor,
    w: &Tensor,
    a: &Tensor,
    b: &Tensor,
    scale: f64,
    dropout: Option<LoraDropout>,
) -> Result<(LoraLinearOp, Tensor, Vec<usize>)> {
    let (out, inf) = w.dims2()?;
    let (r, ain) = a.dims2()?;
    let (bout, br) = b.dims2()?;
    let dims = x.dims();
    let Some((&last, lead)) = dims.split_last() else {
        bail!("lora_linear: x must have at least one dimension");
    };
    if last != inf || ain != inf || bout != out || br != r {
        bail!(
            "lora_linear: x {dims:?}, w {:?} (out, in), a {:?} (r, in), b {:?} (out, r) do not fit",
            w.dims(),
            a.dims(),
            b.dims()
        );
    }
    if w.dtype() != x.dtype() || a.dtype() != b.dtype() {
        bail!(
            "lora_linear: w {:?} must have x's dtype {:?}, and a {:?} and b {:?} one dtype",
            w.dtype(),
            x.dtype(),
            a.dtype(),
            b.dtype()
        );
    }
    if let Some((p, _)) = dropout {
        if !(p > 0.0 && p < 1.0) {
            bail!("lora_linear: dropout p must be in (0, 1), got {p} (pass None for no dropout)");
        }
    }
    let m: usize = lead.iter().product();
    let cast = |t: &Tensor| t.detach().to_dtype(x.dtype())?.contiguous();
    let op = LoraLinearOp {
        parts: LoraParts {
            w: w.detach().contiguous()?,
            a_x: cast(a)?,
            b_x: cast(b)?,
            scale,
            dropout,
        },
        low: Stash::default(),
    };
    let mut out_dims = lead.to_vec();
    out_dims.push(out);
    Ok((op, x.reshape((m, inf))?.contiguous()?, out_dims))
}

/// Composite reference for [`lora_linear`]: frozen matmul, dropout, two adapter matmuls, scale,
/// add, each a Candle op with autograd's backward.
pub fn lora_linear_slow(
    x: &Tensor,
    w: &Tensor,
    a: &Tensor,
    b: &Tensor,
    scale: f64,
    dropout: Option<LoraDropout>,
) -> Result<Tensor> {
    let base = crate::linear_frozen(x, w)?;
    let (a, b) = (a.to_dtype(x.dtype())?, b.to_dtype(x.dtype())?);
    let low = dropped(x, dropout)?.broadcast_matmul(&a.t()?)?;
    base + (low.broadcast_matmul(&b.t()?)? * scale)?
}

#[cfg(feature = "cuda")]
mod cuda_impl {
    use super::{LoraLinearBwd, LoraParts};
    use crate::cublas::{Gemm, Mat};
    use crate::cuda::{self, cuda_of, with_cuda_float_type};
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::DevicePtr;
    use candle_core::cuda_backend::CudaDevice;
    use candle_core::{CudaStorage, DType, Layout, Result, Tensor};

    /// A row-major matrix operand: `rows × ld` at `ptr`.
    fn mat(ptr: u64, ld: usize, dtype: DType) -> Mat {
        Mat {
            ptr,
            ld,
            stride: 0,
            dtype,
        }
    }

    fn gemm(
        dev: &CudaDevice,
        (m, n, k): (usize, usize, usize),
        (trans_a, trans_b): (bool, bool),
        (alpha, beta): (f32, f32),
        (a, b, c): (Mat, Mat, Mat),
    ) -> Result<()> {
        let g = Gemm {
            m,
            n,
            k,
            batch: 1,
            trans_a,
            trans_b,
            alpha,
            beta,
        };
        // SAFETY: the callers size every operand from the checked shapes of `lora_linear`.
        unsafe { g.run(&dev.cublas_handle(), a, b, c) }
    }

    /// Device address of a contiguous tensor of element type `T`.
    fn addr<T: candle_core::cuda_backend::CudaDType>(
        t: &Tensor,
        op: &str,
        what: &str,
    ) -> Result<u64> {
        let (s, l) = t.storage_and_layout();
        let cs = cuda_of(&s, op, what)?;
        let stream = cs.device().cuda_stream();
        let ptr = cuda::view::<T>(cs, l, op, what)?.device_ptr(&stream).0;
        Ok(ptr)
    }

    /// `(y (m, out), low (m, r))`.
    pub(super) fn forward(
        op: &LoraParts,
        (s1, l1): (&CudaStorage, &Layout),
    ) -> Result<(CudaStorage, CudaStorage)> {
        let name = "lora-linear";
        let dev = s1.device().clone();
        let stream = dev.cuda_stream();
        let (m, inf) = l1.shape().dims2()?;
        let (r, out) = (op.a_x.dim(0)?, op.w.dim(0)?);
        with_cuda_float_type!(s1, name, T => {
            let dt = <T as candle_core::WithDType>::DTYPE;
            let x = cuda::view::<T>(s1, l1, name, "x")?.device_ptr(&stream).0;
            let (w, a, b) = (addr::<T>(&op.w, name, "w")?, addr::<T>(&op.a_x, name, "a")?, addr::<T>(&op.b_x, name, "b")?);
            // SAFETY: y and low are fully written by the GEMMs below (beta = 0 first).
            let y = unsafe { dev.alloc::<T>(m * out)? };
            let low = unsafe { dev.alloc::<T>(m * r)? };
            let (yp, lowp) = (y.device_ptr(&stream).0, low.device_ptr(&stream).0);
            gemm(&dev, (m, out, inf), (false, true), (1.0, 0.0), (mat(x, inf, dt), mat(w, inf, dt), mat(yp, out, dt)))?;
            let xd_buf = match op.dropout {
                Some((pr, key)) => {
                    // SAFETY: written whole by the dropout kernel.
                    let buf = unsafe { dev.alloc::<T>(m * inf)? };
                    crate::dropout::cuda_dropout_into(&dev, x, buf.device_ptr(&stream).0, m * inf, dt, pr, key)?;
                    Some(buf)
                }
                None => None,
            };
            let xd = xd_buf.as_ref().map_or(x, |b| b.device_ptr(&stream).0);
            gemm(&dev, (m, r, inf), (false, true), (1.0, 0.0), (mat(xd, inf, dt), mat(a, inf, dt), mat(lowp, r, dt)))?;
            gemm(&dev, (m, out, r), (false, true), (op.scale as f32, 1.0), (mat(lowp, r, dt), mat(b, r, dt), mat(yp, out, dt)))?;
            drop(xd_buf);
            Ok((cuda::wrap(y, &dev), cuda::wrap(low, &dev)))
        })
    }

    /// `(dx (m, in) in x's dtype, [dA, dB] packed in the adapter's dtype)`.
    pub(super) fn backward(
        op: &LoraLinearBwd,
        (s, l): (&CudaStorage, &Layout),
    ) -> Result<(CudaStorage, CudaStorage)> {
        let name = "lora-linear-bwd";
        let dev = s.device().clone();
        let stream = dev.cuda_stream();
        let (m, inf) = l.shape().dims2()?;
        let (p, gdt) = (&op.parts, op.grad_dtype.0);
        let (r, out) = (p.a_x.dim(0)?, p.b_x.dim(0)?);
        if op.grad_dtype.1 != gdt || !(gdt == DType::F32 || gdt == s.dtype()) {
            candle_core::bail!(
                "{name}: adapter gradients in {:?} (x is {:?}); expected f32 or x's dtype",
                op.grad_dtype,
                s.dtype()
            );
        }
        with_cuda_float_type!(s, name, T => {
            let dt = <T as candle_core::WithDType>::DTYPE;
            let x = cuda::view::<T>(s, l, name, "x")?.device_ptr(&stream).0;
            let [w, a, b, g, low] = [(&p.w, "w"), (&p.a_x, "a"), (&p.b_x, "b"), (&op.g, "grad"), (&op.low, "low")]
                .map(|(t, what)| addr::<T>(t, name, what));
            let (w, a, b, g, low) = (w?, a?, b?, g?, low?);
            // SAFETY: dx, dA, dB and dlow are fully written by the GEMMs below (beta = 0 first).
            let dx_buf = unsafe { dev.alloc::<T>(m * inf)? };
            let dlow_buf = unsafe { dev.alloc::<T>(m * r)? };
            let n_ab = r * inf + out * r;
            let dadb = if gdt == DType::F32 {
                cuda::wrap(unsafe { dev.alloc::<f32>(n_ab)? }, &dev)
            } else {
                cuda::wrap(unsafe { dev.alloc::<T>(n_ab)? }, &dev)
            };
            let da = if gdt == DType::F32 {
                dadb.as_cuda_slice::<f32>()?.device_ptr(&stream).0
            } else {
                dadb.as_cuda_slice::<T>()?.device_ptr(&stream).0
            };
            let db = da + (r * inf * gdt.size_in_bytes()) as u64;
            let dx = dx_buf.device_ptr(&stream).0;
            let dlow = dlow_buf.device_ptr(&stream).0;
            let scale = p.scale as f32;
            // d(low) = scale·g·B; dB = scale·gᵀ·low (accumulated in fp32, stored in gdt); dx = g·W.
            gemm(&dev, (m, r, out), (false, false), (scale, 0.0), (mat(g, out, dt), mat(b, r, dt), mat(dlow, r, dt)))?;
            gemm(&dev, (out, r, m), (true, false), (scale, 0.0), (mat(g, out, dt), mat(low, r, dt), mat(db, r, gdt)))?;
            gemm(&dev, (m, inf, out), (false, false), (1.0, 0.0), (mat(g, out, dt), mat(w, inf, dt), mat(dx, inf, dt)))?;
            let xd = match p.dropout {
                None => {
                    // dx += d(low)·A; dA = d(low)ᵀ·x.
                    gemm(&dev, (m, inf, r), (false, false), (1.0, 1.0), (mat(dlow, r, dt), mat(a, inf, dt), mat(dx, inf, dt)))?;
                    None
                }
                Some((pr, key)) => {
                    // t = d(low)·A, dx += drop'(t); then the same buffer holds drop(x) for dA.
                    // SAFETY: written whole by the GEMM, then by the dropout kernel.
                    let t = unsafe { dev.alloc::<T>(m * inf)? };
                    let tp = t.device_ptr(&stream).0;
                    gemm(&dev, (m, inf, r), (false, false), (1.0, 0.0), (mat(dlow, r, dt), mat(a, inf, dt), mat(tp, inf, dt)))?;
                    crate::dropout::cuda_dropout_acc(&dev, tp, dx, m * inf, dt, pr, key)?;
                    crate::dropout::cuda_dropout_into(&dev, x, tp, m * inf, dt, pr, key)?;
                    Some(t)
                }
            };
            let xdp = xd.as_ref().map_or(x, |t| t.device_ptr(&stream).0);
            gemm(&dev, (r, inf, m), (true, false), (1.0, 0.0), (mat(dlow, r, dt), mat(xdp, inf, dt), mat(da, inf, gdt)))?;
            drop(xd);
            drop(dlow_buf);
            Ok((cuda::wrap(dx_buf, &dev), dadb))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{check_fused_vs_slow, randn};
    use candle_core::{DType, Device};

    /// `x` and `w` in `dtype`, the adapter in `adapter` (fp32 master weights with bf16 `x`).
    fn check(
        (dtype, adapter): (DType, DType),
        dropout: Option<LoraDropout>,
        tol: (f64, f64),
    ) -> Result<()> {
        let dev = Device::Cpu;
        let (b, t, inf, out, r) = (2, 5, 12, 7, 4);
        let w = randn(&[out, inf], dtype, 4, &dev)?;
        check_fused_vs_slow(
            &format!("lora_linear {dtype:?} adapter {adapter:?} dropout={dropout:?}"),
            &[
                randn(&[b, t, inf], dtype, 1, &dev)?,
                randn(&[r, inf], adapter, 2, &dev)?,
                randn(&[out, r], adapter, 3, &dev)?,
            ],
            &[true, true, true],
            |x| lora_linear(&x[0], &w, &x[1], &x[2], 2.0, dropout),
            |x| lora_linear_slow(&x[0], &w, &x[1], &x[2], 2.0, dropout),
            tol,
        )
    }

    #[test]
    fn fused_matches_slow() -> Result<()> {
        let key = crate::dropout_key(7, 3, "layers.0.mlp.up_proj");
        let (f32_, bf16) = (DType::F32, DType::BF16);
        check((f32_, f32_), None, (1e-5, 1e-5))?;
        check((f32_, f32_), Some((0.25, key)), (1e-5, 1e-5))?;
        check((bf16, bf16), Some((0.25, key)), (5e-2, 2e-2))?;
        check((bf16, f32_), Some((0.25, key)), (5e-2, 2e-2))
    }

    #[test]
    fn rejects_bad_shapes_and_dropout() -> Result<()> {
        let dev = Device::Cpu;
        let x = Tensor::zeros((3, 8), DType::F32, &dev)?;
        let w = Tensor::zeros((5, 8), DType::F32, &dev)?;
        let a = Tensor::zeros((2, 8), DType::F32, &dev)?;
        let b = Tensor::zeros((5, 2), DType::F32, &dev)?;
        assert!(lora_linear(&x, &w, &a, &b.t()?, 1.0, None).is_err());
        let e = lora_linear(&x, &w, &a, &b, 1.0, Some((0.0, [0; 3]))).unwrap_err();
        assert!(e.to_string().contains("dropout p"), "{e}");
        Ok(())
    }
}
