//! The CUDA side of [`crate::lora_linear`]: the frozen product and the adapter terms through
//! cuBLAS and the fused adapter kernels (`kernels/lora.cu`), in row chunks of bounded
//! temporaries.

use super::LoraParts;
use crate::adapter_cuda::{self, Dims, UpTerm};
use crate::cublas::{Gemm, Mat};
use crate::cuda::{self, cuda_of, with_cuda_float_type};
use crate::dropout::Keep;
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

/// Rows per chunk of the dropout temporaries: at most `CHUNK_ELEMS` elements of `x`'s shape,
/// an even element count (dropout pairs), so `drop(x)` never takes a full `(m, in)` buffer
/// (16 MiB in bf16: one chunk for the 12B q/k/v/gate/up inputs, two for a full layer's o_proj,
/// four for down_proj;
/// smaller chunks cost more dropout and split-K launches than the memory they save).
fn chunk_rows(m: usize, inf: usize) -> usize {
    const CHUNK_ELEMS: usize = 8 << 20;
    let rows = (CHUNK_ELEMS / inf.max(1)).clamp(1, m.max(1));
    if inf % 2 == 1 && rows % 2 == 1 && rows < m {
        rows + 1
    } else {
        rows
    }
}

/// `(y (m, out), low (m, r))`, `low` `None` when `kept` is given (then the up term reads it).
pub(super) fn forward(
    op: &LoraParts,
    (s1, l1): (&CudaStorage, &Layout),
    kept: Option<&Tensor>,
) -> Result<(CudaStorage, Option<CudaStorage>)> {
    let name = "lora-linear";
    let dev = s1.device().clone();
    let stream = dev.cuda_stream();
    let (m, inf) = l1.shape().dims2()?;
    let (r, out) = (op.a_x.dim(0)?, op.w.dim(0)?);
    with_cuda_float_type!(s1, name, T => {
        let dt = <T as candle_core::WithDType>::DTYPE;
        let x = cuda::view::<T>(s1, l1, name, "x")?.device_ptr(&stream).0;
        let (w, b) = (cuda::addr::<T>(&op.w, name, "w")?, cuda::addr::<T>(&op.b_x, name, "b")?);
        // SAFETY: y is fully written by the GEMM below (beta = 0).
        let y = unsafe { dev.alloc::<T>(m * out)? };
        let yp = y.device_ptr(&stream).0;
        gemm(&dev, (m, out, inf), (false, true), (1.0, 0.0), (mat(x, inf, dt), mat(w, inf, dt), mat(yp, out, dt)))?;
        let (low, lowp) = match kept {
            Some(kept) => (None, cuda::addr::<T>(kept, name, "kept low")?),
            None => {
                let new = low(op, (s1, l1))?;
                let p = new.as_cuda_slice::<T>()?.device_ptr(&stream).0;
                (Some(new), p)
            }
        };
        if !op.defer_up {
            let term = UpTerm { low: lowp, b, scale: op.scale as f32 };
            // SAFETY: y holds m·out elements, low m·r and b out·r, all of `dt`, alive here.
            unsafe { add_up_term(&dev, dt, yp, term, (m, out, r)) }?;
        }
        Ok((cuda::wrap(y, &dev), low))
    })
}

/// `low (m, r) = drop(x)·Aᵀ` of the 2-D `x`.
pub(super) fn low(op: &LoraParts, (s1, l1): (&CudaStorage, &Layout)) -> Result<CudaStorage> {
    let name = "lora-linear";
    let dev = s1.device().clone();
    let stream = dev.cuda_stream();
    let (m, inf) = l1.shape().dims2()?;
    let r = op.a_x.dim(0)?;
    with_cuda_float_type!(s1, name, T => {
        let dt = <T as candle_core::WithDType>::DTYPE;
        let es = dt.size_in_bytes() as u64;
        let x = cuda::view::<T>(s1, l1, name, "x")?.device_ptr(&stream).0;
        let a = cuda::addr::<T>(&op.a_x, name, "a")?;
        // SAFETY: low is fully written below (beta = 0 GEMMs or the down kernel).
        let low = unsafe { dev.alloc::<T>(m * r)? };
        let lowp = low.device_ptr(&stream).0;
        let dims = Dims { m, inf, r };
        match op.dropout {
            None => gemm(&dev, (m, r, inf), (false, true), (1.0, 0.0), (mat(x, inf, dt), mat(a, inf, dt), mat(lowp, r, dt)))?,
            Some((pr, key)) if adapter_cuda::applies(dt, dims, &[x, a, lowp]) => {
                adapter_cuda::down(&dev, (x, a, lowp), dims, dt, Keep::new(pr, key)?)?;
            }
            Some((pr, key)) => {
                // low = drop(x)·Aᵀ, a chunk of rows at a time through one temporary.
                let rows = chunk_rows(m, inf);
                // SAFETY: each chunk of it is written whole by the dropout kernel before use.
                let buf = unsafe { dev.alloc::<T>(rows * inf)? };
                let xd = buf.device_ptr(&stream).0;
                for r0 in (0..m).step_by(rows) {
                    let n = rows.min(m - r0);
                    let off = (r0 * inf) as u64 * es;
                    crate::dropout::cuda_dropout_into(&dev, (x + off, xd), (r0 * inf, n * inf), dt, pr, key)?;
                    gemm(&dev, (n, r, inf), (false, true), (1.0, 0.0), (mat(xd, inf, dt), mat(a, inf, dt), mat(lowp + (r0 * r) as u64 * es, r, dt)))?;
                }
            }
        }
        Ok(cuda::wrap(low, &dev))
    })
}

/// `y (m, out) = r(y + scale·low·Bᵀ)` in place for the term's `low (m, r)` and `B (out, r)` in
/// `dt`: the `lora_up_add` kernel where it applies, else a cuBLAS GEMM with `beta = 1` (whose
/// epilogue rounds differently: up to one bf16 step in about a fifth of the elements at the
/// 12B's MLP shape, `docs/benchmarks.md` §4).
///
/// # Safety
/// The addresses must hold those elements, stay alive until the stream has run the work, and
/// nothing else may read `y` before.
pub(crate) unsafe fn add_up_term(
    dev: &CudaDevice,
    dt: DType,
    y: u64,
    term: UpTerm,
    (m, out, r): (usize, usize, usize),
) -> Result<()> {
    if adapter_cuda::up_applies(dt, (m, out, r), &[y], &[term]) {
        // SAFETY: the caller's contract.
        return unsafe { adapter_cuda::up_add(dev, dt, y, term, (m, out, r)) };
    }
    let (low, b) = (term.low, term.b);
    gemm(
        dev,
        (m, out, r),
        (false, true),
        (term.scale, 1.0),
        (mat(low, r, dt), mat(b, r, dt), mat(y, out, dt)),
    )
}

/// `(dx (m, in) in x's dtype, or None when it was written into `into`'s tensor; [dA, dB]
/// packed in the adapter's dtype)`. `into = (t, accumulate)`: `dx` goes into `t`'s memory,
/// added to it if `accumulate`, else over it (then `t` may be `x`: `dA` reads `x` first).
pub(super) fn backward(
    p: &LoraParts,
    (x_t, low_t, g_t): (&Tensor, &Tensor, &Tensor),
    (gdt, gdt_b): (DType, DType),
    into: Option<(&Tensor, bool)>,
) -> Result<(Option<CudaStorage>, CudaStorage)> {
    let name = "lora-linear-bwd";
    let (m, inf) = x_t.dims2()?;
    let (r, out) = (p.a_x.dim(0)?, p.b_x.dim(0)?);
    let (xs, xl) = x_t.storage_and_layout();
    let s = cuda_of(&xs, name, "x")?;
    let dev = s.device().clone();
    let stream = dev.cuda_stream();
    if gdt_b != gdt || !(gdt == DType::F32 || gdt == s.dtype()) {
        candle_core::bail!(
            "{name}: adapter gradients in {:?}/{:?} (x is {:?}); expected f32 or x's dtype",
            gdt,
            gdt_b,
            s.dtype()
        );
    }
    with_cuda_float_type!(s, name, T => {
        let dt = <T as candle_core::WithDType>::DTYPE;
        let es = dt.size_in_bytes() as u64;
        let x = cuda::view::<T>(s, xl, name, "x")?.device_ptr(&stream).0;
        let [w, a, b, g, low] = [(&p.w, "w"), (&p.a_x, "a"), (&p.b_x, "b"), (g_t, "grad"), (low_t, "low")]
            .map(|(t, what)| cuda::addr::<T>(t, name, what));
        let (w, a, b, g, low) = (w?, a?, b?, g?, low?);
        // SAFETY: dx (unless accumulated), dA, dB and dlow are fully written by the GEMMs
        // below (beta = 0 first).
        let dx_buf = match into {
            Some(_) => None,
            None => Some(unsafe { dev.alloc::<T>(m * inf)? }),
        };
        let (dx, dx_beta) = match (&dx_buf, into) {
            (Some(buf), _) => (buf.device_ptr(&stream).0, 0.0),
            (None, Some((t, acc))) => (cuda::addr::<T>(t, name, "dx target")?, if acc { 1.0 } else { 0.0 }),
            (None, None) => unreachable!("a buffer is allocated when there is no target"),
        };
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
        let dlow = dlow_buf.device_ptr(&stream).0;
        let scale = p.scale as f32;
        // d(low) = scale·g·B; dB = scale·gᵀ·low (accumulated in fp32, stored in gdt): one pass
        // over g where the kernel applies, else a GEMM each.
        // dB's partial sums from the kernel are added with dA's where the dA kernel runs.
        let db_sums = if adapter_cuda::grad_out_applies(dt, (m, out, r), (g, b, low)) {
            Some(adapter_cuda::grad_low_and_b(&dev, (g, b, low, dlow, db), (m, out, r), dt, scale)?)
        } else {
            gemm(&dev, (m, r, out), (false, false), (scale, 0.0), (mat(g, out, dt), mat(b, r, dt), mat(dlow, r, dt)))?;
            gemm(&dev, (out, r, m), (true, false), (scale, 0.0), (mat(g, out, dt), mat(low, r, dt), mat(db, r, gdt)))?;
            None
        };
        let finish_db = |sums: Option<adapter_cuda::Partials>| sums.map_or(Ok(()), |p| p.finish(&dev, gdt));
        // dA = d(low)ᵀ·drop(x) before dx is written (dx may take x's memory), and
        // dx (+)= g·W + drop'(d(low)·A).
        match p.dropout {
            None => {
                finish_db(db_sums)?;
                gemm(&dev, (r, inf, m), (true, false), (1.0, 0.0), (mat(dlow, r, dt), mat(x, inf, dt), mat(da, inf, gdt)))?;
                gemm(&dev, (m, inf, out), (false, false), (1.0, dx_beta), (mat(g, out, dt), mat(w, inf, dt), mat(dx, inf, dt)))?;
                gemm(&dev, (m, inf, r), (false, false), (1.0, 1.0), (mat(dlow, r, dt), mat(a, inf, dt), mat(dx, inf, dt)))?;
            }
            Some((pr, key)) if adapter_cuda::applies(dt, Dims { m, inf, r }, &[x, a, dlow, dx]) => {
                // One pass over x for dA and dx's adapter term (written over dx, or added to
                // the accumulated one), then the frozen product added by the GEMM.
                let (dims, keep) = (Dims { m, inf, r }, Keep::new(pr, key)?);
                adapter_cuda::grad_x_and_a(&dev, (x, dlow, a, dx, da), dims, (dt, gdt), keep, dx_beta != 0.0, db_sums)?;
                gemm(&dev, (m, inf, out), (false, false), (1.0, 1.0), (mat(g, out, dt), mat(w, inf, dt), mat(dx, inf, dt)))?;
            }
            Some((pr, key)) => {
                finish_db(db_sums)?;
                // Chunks of rows through one temporary t (fp32 accumulation of dA across them).
                let rows = chunk_rows(m, inf);
                // SAFETY: each chunk of it is written whole (dropout kernel, GEMM) before use.
                let t = unsafe { dev.alloc::<T>(rows * inf)? };
                let tp = t.device_ptr(&stream).0;
                let chunks = || (0..m).step_by(rows).map(move |r0| (r0, rows.min(m - r0)));
                for (r0, n) in chunks() {
                    let dlow_c = dlow + (r0 * r) as u64 * es;
                    crate::dropout::cuda_dropout_into(&dev, (x + (r0 * inf) as u64 * es, tp), (r0 * inf, n * inf), dt, pr, key)?;
                    let beta = if r0 == 0 { 0.0 } else { 1.0 };
                    gemm(&dev, (r, inf, n), (true, false), (1.0, beta), (mat(dlow_c, r, dt), mat(tp, inf, dt), mat(da, inf, gdt)))?;
                }
                gemm(&dev, (m, inf, out), (false, false), (1.0, dx_beta), (mat(g, out, dt), mat(w, inf, dt), mat(dx, inf, dt)))?;
                for (r0, n) in chunks() {
                    let dlow_c = dlow + (r0 * r) as u64 * es;
                    gemm(&dev, (n, inf, r), (false, false), (1.0, 0.0), (mat(dlow_c, r, dt), mat(a, inf, dt), mat(tp, inf, dt)))?;
                    crate::dropout::cuda_dropout_acc(&dev, (tp, dx + (r0 * inf) as u64 * es), (r0 * inf, n * inf), dt, pr, key)?;
                }
            }
        }
        drop(dlow_buf);
        Ok((dx_buf.map(|b| cuda::wrap(b, &dev)), dadb))
    })
}
