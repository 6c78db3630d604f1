//! Row-major strided-batched GEMMs through cuBLAS on candle's handle and stream (feature `cuda`).
//!
//! Candle's `matmul` keeps the input dtype for the output; the blocked attention needs bf16 inputs
//! with fp32 outputs (scores) and fp32 accumulation into existing buffers (`beta = 1`), so it calls
//! `cublasGemmStridedBatchedEx` directly. Compute type is always fp32 (`CUBLAS_COMPUTE_32F`: tensor
//! cores for bf16/f16 inputs, plain fp32 for f32 inputs, no TF32).

use candle_core::cuda_backend::cudarc::cublas::{result, sys, CudaBlas};
use candle_core::cuda_backend::WrapErr;
use candle_core::{DType, Result};

/// One row-major operand (or output) of a batched GEMM: a device address, the leading dimension
/// (elements between rows), the stride between batch items (elements) and its dtype.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Mat {
    pub(crate) ptr: u64,
    pub(crate) ld: usize,
    pub(crate) stride: usize,
    pub(crate) dtype: DType,
}

impl Mat {
    /// The operand starting `elems` elements further (same ld, stride, dtype).
    pub(crate) fn offset(self, elems: usize) -> Mat {
        Mat {
            ptr: self.ptr + (elems * self.dtype.size_in_bytes()) as u64,
            ..self
        }
    }
}

fn cuda_type(d: DType) -> Result<sys::cudaDataType> {
    Ok(match d {
        DType::F32 => sys::cudaDataType::CUDA_R_32F,
        DType::BF16 => sys::cudaDataType::CUDA_R_16BF,
        DType::F16 => sys::cudaDataType::CUDA_R_16F,
        other => candle_core::bail!("cublas gemm: unsupported dtype {other:?}"),
    })
}

/// Shape of one row-major product `C (m×n) = alpha·op(A)·op(B) + beta·C` repeated `batch` times,
/// where `op(A)` is `m×k` (`A` stored `k×m` when `trans_a`) and `op(B)` is `k×n`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Gemm {
    pub(crate) m: usize,
    pub(crate) n: usize,
    pub(crate) k: usize,
    pub(crate) batch: usize,
    pub(crate) trans_a: bool,
    pub(crate) trans_b: bool,
    pub(crate) alpha: f32,
    pub(crate) beta: f32,
}

impl Gemm {
    /// Runs the product on the handle's stream (candle's stream).
    ///
    /// # Safety
    /// The pointers must address live device memory large enough for the given shape, leading
    /// dimensions and strides, and `c` must not overlap `a` or `b`.
    pub(crate) unsafe fn run(&self, blas: &CudaBlas, a: Mat, b: Mat, c: Mat) -> Result<()> {
        if a.dtype != b.dtype {
            candle_core::bail!("cublas gemm: A is {:?} but B is {:?}", a.dtype, b.dtype);
        }
        let op = |t: bool| {
            if t {
                sys::cublasOperation_t::CUBLAS_OP_T
            } else {
                sys::cublasOperation_t::CUBLAS_OP_N
            }
        };
        // Row-major C = op(A)·op(B) is column-major Cᵀ = op(B)ᵀ·op(A)ᵀ: swap the operands.
        let (alpha, beta) = (self.alpha, self.beta);
        // SAFETY: the caller guarantees the operands (see above); alpha/beta live on this frame.
        unsafe {
            result::gemm_strided_batched_ex(
                *blas.handle(),
                op(self.trans_b),
                op(self.trans_a),
                self.n as i32,
                self.m as i32,
                self.k as i32,
                (&alpha) as *const f32 as *const _,
                b.ptr as *const _,
                cuda_type(b.dtype)?,
                b.ld as i32,
                b.stride as i64,
                a.ptr as *const _,
                cuda_type(a.dtype)?,
                a.ld as i32,
                a.stride as i64,
                (&beta) as *const f32 as *const _,
                c.ptr as *mut _,
                cuda_type(c.dtype)?,
                c.ld as i32,
                c.stride as i64,
                self.batch as i32,
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
            .w()
        }
    }
}
