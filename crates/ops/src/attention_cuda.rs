//! CUDA path of [`super::attention`]: blocked attention on cuBLAS tensor-core GEMMs.
//!
//! The queries are processed in blocks of `bq` rows. For a block `[q0, q1)` only the keys
//! `[k0, q1)` can be visible (causal; `k0 = q0 + 1 − window` on sliding layers), so the masked-out
//! upper triangle and everything left of the window are skipped block-wise. Per block:
//!
//! - forward: `S = scale·Q·Kᵀ` (bf16 in, fp32 out), the masked softmax (`attn_softmax_rows`: P in
//!   the input dtype and the row log-sum-exp), `O = P·V`;
//! - backward: `S` again, `dP = dO·Vᵀ` (fp32), `dS = scale·P·(dP − rowsum(dO∘O))`
//!   (`attn_ds_rows`), `dQ = dS·K`, `dK += dSᵀ·Q` and `dV += Pᵀ·dO` into fp32 accumulators.
//!
//! GQA needs no copy of K/V: Q, dO and dQ are used in the grouped layout `(b, nkv, t, g, d)`
//! (`g = nh / nkv`; one `swap12` of the whole tensor each way, none when `g = 1`), where a block's
//! `g·rows` query rows of one kv head are consecutive, so every product is one strided-batched
//! GEMM over `b·nkv` items.
//! The fp32 score buffers are bounded by [`AttentionPlan::score_bytes`], so memory stays O(t·bq) instead of
//! O(t²) per layer. Numerics: fp32 scores, softmax and accumulation; P and dS are rounded to the
//! input dtype before their GEMMs (as FlashAttention does); exact fp32 for f32 inputs.
//!
//! For bf16 / f16 inputs with head dim 16, 32, 64, 128, 256 or 512 (16-byte aligned) the forward is
//! one fused kernel instead (`kernels/attention_flash.cu`, FlashAttention-2's one-pass online
//! softmax on `mma.sync`, S and P in registers, Q / O read and written in `(b, nh, t, d)` without
//! a regroup); the same numerics except that P is rounded before its normalisation.
//! [`AttentionPlan::forward`] picks it, the d-256 block shape (4 warps, or 8 with double-buffered
//! K/V), or the blocked path. In builds for compute capability 90 the fused forward and the fused
//! backward's dQ kernel at head dims 256 and 512, and its dK / dV kernel at 256, can run on
//! Hopper's warpgroup MMA instead (`kernels/attention_wgmma.cu`, [`AttentionPlan::wgmma`]): the
//! same schemes and numerics, their products read Q, K, V and dO straight from shared memory.
//!
//! The backward of bf16 / f16 inputs with head dim 256 or 512 can be fused too
//! (`kernels/attention_flash_bwd.cu`, [`AttentionPlan::backward`] picks it): after a kernel for
//! the rows' `dO·O`, one kernel keeps the fp32 dK / dV of 64 keys (32 at head dim 512) in
//! registers while it walks the query rows that see them, and another keeps the fp32 dQ of a
//! query tile while it walks the key tiles its rows see; both recompute `P` from the saved
//! log-sum-exp. No score buffers, no regroup copies, no atomics: where the dK / dV kernel splits
//! a GQA group's query heads over blocks to fill the GPU (few kv heads), each split stores its
//! partial dK / dV in fp32 buffers of its own, summed in split order by one more kernel, so every
//! run gives the same bits. Same numerics as the blocked backward (P and dS rounded to the input
//! dtype before their products, fp32 accumulation), summed in another order.
//!
//! Packed rows ([`super::KeyMask::seq_start`]): every kernel takes the `(b, t)` u32 segment starts
//! as a device pointer, 0 without segments ([`seq_start_ptr`]), and raises each query row's lower
//! key bound to its sequence start. As the starts are non-decreasing, the fused forward and dQ
//! kernels start a query block's key loop at its first row's sequence start and the dK / dV kernel
//! stops at the first query row whose sequence starts after its keys; the blocked path keeps its
//! window-only key ranges.

use super::{AttentionBackward, AttentionBwd, AttentionForward, AttentionPlan, Dims};
use crate::cublas::{Gemm, Mat};
use crate::cuda::{self, cuda_module, cuda_of, with_cuda_float_type, Module};
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{
    CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchConfig,
};
use candle_core::cuda_backend::{CudaDType, CudaDevice, WrapErr};
use candle_core::{CudaStorage, DType, Layout, Result, Tensor, WithDType};
use std::sync::Arc;

const MODULE: Module = cuda_module!("attention");
const FLASH: Module = cuda_module!("attention_flash");
const FLASH_BWD: Module = cuda_module!("attention_flash_bwd");
/// The wgmma kernels (`kernels/attention_wgmma.cu`), built only for compute capability 90.
#[cfg(g4ft_hopper)]
static WGMMA: Option<Module> = Some(cuda_module!("attention_wgmma"));
#[cfg(not(g4ft_hopper))]
static WGMMA: Option<Module> = None;
/// Head dims the wgmma kernels are instantiated for.
const WGMMA_DIMS: [usize; 2] = [256, 512];

/// Head dims the fused forward kernel is instantiated for (`kernels/attention_flash.cu`).
const FUSED_FORWARD_DIMS: [usize; 6] = [16, 32, 64, 128, 256, 512];
/// Keys per shared-memory tile of the fused forward (`BC` in the kernel).
const FLASH_KEYS: usize = 64;

/// The query blocks of one call and the largest key range any block sees.
struct Blocking {
    bq: usize,
    ld_max: usize,
}

/// One query block: rows `[q0, q0 + rows)` see at most the keys `[k0, k0 + lk)` (`lk` a multiple of
/// 8 unless `t` is too short); its score rows are `ld` apart (`lk` rounded up to 8 elements).
#[derive(Clone, Copy)]
struct Block {
    q0: usize,
    rows: usize,
    k0: usize,
    lk: usize,
    ld: usize,
}

impl Blocking {
    /// Query blocks of [`AttentionPlan::blocked_rows`] rows.
    fn new(n: &Dims, plan: &AttentionPlan) -> Self {
        let bq = plan.blocked_rows(n.b, n.nh, n.t);
        let ld_max = if n.window > 0 {
            (bq + n.window - 1).min(n.t)
        } else {
            n.t
        };
        Blocking {
            bq,
            ld_max: ld_max.next_multiple_of(8),
        }
    }

    fn blocks(&self, n: Dims) -> impl Iterator<Item = Block> {
        let bq = self.bq;
        (0..n.t).step_by(bq).map(move |q0| {
            let rows = bq.min(n.t - q0);
            let lo = if n.window > 0 {
                (q0 + 1).saturating_sub(n.window)
            } else {
                0
            };
            let hi = q0 + rows;
            // Pad the key range to a multiple of 8 (inside [0, t)): the GEMMs' key extent must be
            // 16-byte aligned or cuBLAS falls back to slow `align1` kernels. The extra keys lie
            // before the window or after the last query, so the mask gives them zero weight.
            let padded = (hi - lo).next_multiple_of(8);
            let (k0, lk) = if padded <= n.t {
                let end = (lo + padded).min(n.t);
                (end - padded, padded)
            } else {
                (lo, hi - lo)
            };
            Block {
                q0,
                rows,
                k0,
                lk,
                ld: lk.next_multiple_of(8),
            }
        })
    }
}

/// The device plumbing shared by the forward and backward: candle's device and stream, sizes,
/// the element dtype, typed operand descriptors and the row-kernel launches.
struct Ctx<'a> {
    dev: &'a CudaDevice,
    stream: Arc<CudaStream>,
    n: Dims,
    dtype: DType,
}

impl<'a> Ctx<'a> {
    fn new(dev: &'a CudaDevice, n: &Dims, dtype: DType) -> Self {
        Ctx {
            dev,
            stream: dev.cuda_stream(),
            n: *n,
            dtype,
        }
    }

    fn addr<T, P: DevicePtr<T>>(&self, x: &P) -> u64 {
        x.device_ptr(&self.stream).0
    }

    fn alloc<T: DeviceRepr>(&self, len: usize) -> Result<CudaSlice<T>> {
        // SAFETY: every buffer allocated here is fully written before it is read.
        unsafe { self.dev.alloc::<T>(len) }
    }

    fn groups(&self) -> usize {
        self.n.nh / self.n.nkv
    }

    /// K/V (or their fp32 accumulators) from key `k0`: per (b, kv head) a `t×d` slab.
    fn kv(&self, ptr: u64, k0: usize, dtype: DType) -> Mat {
        let (t, d) = (self.n.t, self.n.d);
        Mat {
            ptr,
            ld: d,
            stride: t * d,
            dtype,
        }
        .offset(k0 * d)
    }

    /// A block's query-side rows (Q, dO, O, dQ in the grouped layout): per (b, kv head) the
    /// `g·rows` rows of `d` from query `q0`, in (query, group member) order.
    fn rows(&self, ptr: u64, blk: Block) -> Mat {
        let (d, g) = (self.n.d, self.groups());
        Mat {
            ptr,
            ld: d,
            stride: self.n.t * g * d,
            dtype: self.dtype,
        }
        .offset(blk.q0 * g * d)
    }

    /// Whether the `(b, nh, t, d)` query-side tensors need a copy in the grouped layout.
    fn regroups(&self) -> bool {
        self.groups() > 1
    }

    /// `(b, nh, t, d)` → grouped `(b, nkv, t, g, d)` (`to_grouped`) or back, into `dst`.
    fn regroup(&self, src: u64, dst: u64, to_grouped: bool) -> Result<()> {
        let (g, n) = (self.groups(), &self.n);
        let (a, c) = if to_grouped { (g, n.t) } else { (n.t, g) };
        // SAFETY: both buffers hold the b·nh·t·d query-side elements and are distinct.
        unsafe {
            crate::transpose::cuda_swap12(
                self.dev,
                (src, dst),
                [n.b * n.nkv, a, c, n.d],
                self.dtype,
            )
        }
    }

    /// The grouped copy of a `(b, nh, t, d)` tensor at `src` (`None`: `src` is already grouped).
    fn grouped<T: DeviceRepr>(&self, src: u64) -> Result<Option<CudaSlice<T>>> {
        if !self.regroups() {
            return Ok(None);
        }
        let buf = self.alloc::<T>(self.n.q_elems())?;
        self.regroup(src, self.addr(&buf), true)?;
        Ok(Some(buf))
    }

    /// A block's scores-like matrices (S, dP, P, dS): per (b, kv head) `g·rows` rows of `lk`.
    fn scores(&self, ptr: u64, blk: Block, dtype: DType) -> Mat {
        Mat {
            ptr,
            ld: blk.ld,
            stride: self.groups() * blk.rows * blk.ld,
            dtype,
        }
    }

    /// `(b·nkv)`-batched GEMM on candle's cuBLAS handle.
    #[allow(clippy::too_many_arguments)]
    fn gemm(
        &self,
        (m, n, k): (usize, usize, usize),
        trans: (bool, bool),
        (alpha, beta): (f32, f32),
        a: Mat,
        b: Mat,
        c: Mat,
    ) -> Result<()> {
        let g = Gemm {
            m,
            n,
            k,
            batch: self.n.b * self.n.nkv,
            trans_a: trans.0,
            trans_b: trans.1,
            alpha,
            beta,
        };
        // SAFETY: every operand is sized from `Dims` and the block bounds by the callers below.
        unsafe { g.run(&self.dev.cublas_handle(), a, b, c) }
    }

    /// `S = scale·Q·Kᵀ` (fp32) for one block.
    fn scores_gemm(&self, q: u64, k: u64, s: u64, blk: Block) -> Result<()> {
        let g = self.groups() * blk.rows;
        let (a, b, c) = (
            self.rows(q, blk),
            self.kv(k, blk.k0, self.dtype),
            self.scores(s, blk, DType::F32),
        );
        self.gemm(
            (g, blk.lk, self.n.d),
            (false, true),
            (self.n.scale, 0.0),
            a,
            b,
            c,
        )
    }

    fn func(&self, root: &str) -> Result<candle_core::cuda_backend::cudarc::driver::CudaFunction> {
        self.func_of(&MODULE, root)
    }

    fn func_of(
        &self,
        m: &Module,
        root: &str,
    ) -> Result<candle_core::cuda_backend::cudarc::driver::CudaFunction> {
        cuda::func(self.dev, m, &cuda::kname_of(root, self.dtype)?)
    }

    /// Launches `f` on the call's stream with the argument order of every attention kernel:
    /// the device pointers `ptrs`, then `scale` when given, then the integers `ints`.
    ///
    /// # Safety
    /// `f` takes exactly those parameters in that order, and every buffer behind `ptrs` is as
    /// large as the kernel reads and writes for `cfg`.
    unsafe fn launch(
        &self,
        f: &candle_core::cuda_backend::cudarc::driver::CudaFunction,
        ptrs: &[u64],
        scale: Option<f32>,
        ints: &[i32],
        cfg: LaunchConfig,
    ) -> Result<()> {
        let mut b = cuda::launch_args(&self.stream, f);
        for p in ptrs {
            b.arg(p);
        }
        if let Some(scale) = &scale {
            b.arg(scale);
        }
        for i in ints {
            b.arg(i);
        }
        // SAFETY: the caller's contract above.
        unsafe { b.launch(cfg) }.w()?;
        Ok(())
    }

    /// The integer arguments both row kernels take: `nh, g, t`, then `extra`, then the block's
    /// `rows, lk, ld, q0, k0`, the window and the number of score rows `nrows`.
    fn row_args<const E: usize>(&self, extra: [usize; E], blk: Block, nrows: usize) -> Vec<i32> {
        let n = &self.n;
        let geometry = [blk.rows, blk.lk, blk.ld, blk.q0, blk.k0, n.window, nrows];
        [n.nh, self.groups(), n.t]
            .into_iter()
            .chain(extra)
            .chain(geometry)
            .map(|v| v as i32)
            .collect()
    }

    /// Masked softmax of a block's score rows: P and the rows' log-sum-exp.
    fn softmax_rows(&self, [s, p, lse, mask, seq_start]: [u64; 5], blk: Block) -> Result<()> {
        let n = &self.n;
        let f = self.func("attn_softmax_rows")?;
        let nrows = n.b * n.nh * blk.rows;
        let ints = self.row_args([], blk, nrows);
        let ptrs = [s, p, lse, mask, seq_start];
        // SAFETY: one warp per score row; s/p hold b·nh·rows rows of lk, lse b·nh·t floats.
        unsafe { self.launch(&f, &ptrs, None, &ints, cuda::warp_per_row(nrows)) }
    }

    /// `dS` and `P` (input dtype) of a block from `S`, `dP`, `O`, `dO` and the log-sum-exp.
    fn ds_rows(
        &self,
        [s, dp, o, dout, lse, mask, seq_start, ds, p]: [u64; 9],
        blk: Block,
    ) -> Result<()> {
        let n = &self.n;
        let f = self.func("attn_ds_rows")?;
        let nrows = n.b * n.nh * blk.rows;
        let ints = self.row_args([n.d], blk, nrows);
        let ptrs = [s, dp, o, dout, lse, mask, seq_start, ds, p];
        // SAFETY: one warp per score row, buffers sized as in `softmax_rows`.
        unsafe { self.launch(&f, &ptrs, Some(n.scale), &ints, cuda::warp_per_row(nrows)) }
    }

    /// Whether `plan` asks for the fused forward kernel and it covers this call (16-bit inputs, an
    /// instantiated head dim).
    fn flash(&self, plan: &AttentionPlan) -> bool {
        plan.forward != AttentionForward::Blocked
            && super::fused_covers(&FUSED_FORWARD_DIMS, self.dtype, self.n.d)
            && self.n.scale > 0.0 // the kernel takes row maxima of unscaled scores
    }

    /// The fused forward: `o` and `lse` from `q`, `k`, `v` and the key mask in one launch.
    fn flash_fwd(
        &self,
        plan: &AttentionPlan,
        [q, k, v, mask, seq_start, o, lse]: [u64; 7],
    ) -> Result<()> {
        let n = &self.n;
        // (kernel, threads, query rows per block, dynamic shared memory), as the kernels' entry
        // points. wgmma: 2 warpgroups, K/V double-buffered at head dim 256, 1024 bytes to align
        // the swizzled tiles. mma.sync: head dim 512 splits O's columns over two warps per 16
        // rows; (warps, K/V stages, rows).
        let (f, threads, rows, smem) = match self.wgmma(plan) {
            Some(m) => {
                let (rows, stages) = if n.d == 256 { (128, 2) } else { (64, 1) };
                let smem = (rows + 2 * stages * FLASH_KEYS) * n.d * 2 + 1024 + wgmma_halves(n.d);
                let f = self.flash_func(m, &format!("attn_wgmma_fwd_d{}", n.d), smem)?;
                (f, 256, rows, smem)
            }
            _ => {
                let (warps, stages, rows) = match (n.d, plan.forward) {
                    (512, _) => (8, 1, 64),
                    (256, AttentionForward::FusedW8) => (8, 2, 128),
                    _ => (4, 1, 64),
                };
                let smem = (rows + 2 * FLASH_KEYS * stages) * (n.d + 8) * 2;
                let name = format!("attn_flash_fwd_d{}_w{warps}", n.d);
                (
                    self.flash_func(&FLASH, &name, smem)?,
                    warps * 32,
                    rows,
                    smem,
                )
            }
        };
        let cfg = LaunchConfig {
            grid_dim: (
                (n.t * self.groups()).div_ceil(rows) as u32,
                (n.b * n.nkv) as u32,
                1,
            ),
            block_dim: (threads as u32, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        let ints = [n.nh, self.groups(), n.t, n.window].map(|x| x as i32);
        let ptrs = [q, k, v, mask, seq_start, o, lse];
        // SAFETY: q/o hold b·nh·t·d elements, k/v b·nkv·t·d, mask b·t bytes, seq_start b·t u32 (or
        // is 0), lse b·nh·t floats; the grid covers the t·g grouped rows of each of the b·nkv slabs.
        unsafe { self.launch(&f, &ptrs, Some(n.scale), &ints, cfg) }
    }

    /// The wgmma module when `plan` asks for it, this build has it and it covers the head dim.
    fn wgmma(&self, plan: &AttentionPlan) -> Option<&'static Module> {
        WGMMA
            .as_ref()
            .filter(|_| plan.wgmma && WGMMA_DIMS.contains(&self.n.d))
    }

    /// Whether `plan` runs the fused backward kernels for this call
    /// ([`AttentionPlan::backward_for`]).
    fn flash_backward(&self, plan: &AttentionPlan) -> bool {
        let n = &self.n;
        plan.backward_for(self.dtype, (n.b, n.nh, n.t, n.d)) == AttentionBackward::Fused
    }

    /// The fused backward into `packed` (`[dq, dk, dv]` in the element dtype): the rows' `dO·O`,
    /// then the dK / dV kernel and the dQ kernel (each recomputes P), then, when the dK / dV
    /// kernel splits a GQA group's heads over blocks, the rounding of their fp32 sums.
    fn flash_bwd(
        &self,
        plan: &AttentionPlan,
        [q, k, v, o, dout, lse, mask, seq_start]: [u64; 8],
        packed: u64,
    ) -> Result<()> {
        let n = &self.n;
        let rows = n.b * n.nh * n.t;
        let dd = self.alloc::<f32>(rows)?;
        let dd_ = self.addr(&dd);
        let f = self.func_of(&FLASH_BWD, "attn_flash_bwd_dot")?;
        let dims = [n.d as i32, rows as i32];
        // SAFETY: o / dout hold `rows` rows of d elements, dd `rows` floats; one warp per row.
        unsafe { self.launch(&f, &[o, dout, dd_], None, &dims, cuda::warp_per_row(rows)) }?;

        let elem = self.dtype.size_in_bytes() as u64;
        let dk = packed + n.q_elems() as u64 * elem;
        let dv = dk + n.kv_elems() as u64 * elem;
        let ints = [n.nh, self.groups(), n.t, n.window].map(|x| x as i32);
        // (keys per block, query rows per tile) of the dK / dV kernel and (keys per tile, query
        // rows per block) of the dQ kernel, as the entry points.
        let ((bc, br), (qbc, qbr)) = if n.d == 512 {
            ((32, 64), (32, 64))
        } else {
            ((64, 64), (64, 128))
        };
        let key_blocks = n.t.div_ceil(bc) * n.b * n.nkv;
        let hsplit = head_split(key_blocks, self.groups());
        let sums = if hsplit > 1 {
            Some([
                self.dev.alloc_zeros::<f32>(hsplit * n.kv_elems())?,
                self.dev.alloc_zeros::<f32>(hsplit * n.kv_elems())?,
            ])
        } else {
            None
        };
        let [dk32, dv32] = sums
            .as_ref()
            .map_or([0, 0], |[a, b]| [self.addr(a), self.addr(b)]);
        // The dK / dV kernel on wgmma (head dim 256; K, V, two Q / dO stages, the Pᵀ hand-over
        // between its warpgroups, the row values of two stages, 1024 bytes of alignment) or on
        // mma.sync.
        let (f, smem) = match self.wgmma(plan).filter(|_| n.d == 256) {
            Some(m) => {
                let smem = 6 * 64 * n.d * 2 + 32 * 128 * 4 + 2 * 4 * 64 * 4 + 1024;
                (self.flash_func(m, "attn_wgmma_bwd_kv_d256", smem)?, smem)
            }
            None => {
                let smem = (2 * bc + 2 * br) * (n.d + 8) * 2 + 2 * bc * (br + 8) * 2 + 16 * br;
                let name = format!("attn_flash_bwd_kv_d{}", n.d);
                (self.flash_func(&FLASH_BWD, &name, smem)?, smem)
            }
        };
        let cfg = LaunchConfig {
            grid_dim: (n.t.div_ceil(bc) as u32, (n.b * n.nkv) as u32, hsplit as u32),
            block_dim: (256, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        let ptrs = [q, k, v, dout, lse, dd_, mask, seq_start, dk, dv, dk32, dv32];
        // SAFETY: q/dout hold b·nh·t·d elements, k/v and dk/dv b·nkv·t·d, lse/dd b·nh·t floats,
        // mask b·t bytes, seq_start b·t u32 (or is 0), dk32/dv32 (when split) hsplit partials of
        // b·nkv·t·d zeroed floats; the grid covers every key tile of each slab, and a block writes
        // only its own keys' rows of its own split's partial.
        unsafe { self.launch(&f, &ptrs, Some(n.scale), &ints, cfg) }?;

        // The dQ kernel on wgmma (the same block shape; unpadded swizzled tiles aligned to 1024
        // bytes) or on mma.sync.
        let (f, smem) = match self.wgmma(plan) {
            Some(m) => {
                // Two K buffers at head dim 256, one at 512 (where the S and dP halves need room).
                let k_buffers = if n.d == 256 { 2 } else { 1 };
                let smem = (2 * qbr + (k_buffers + 1) * qbc) * n.d * 2 + 1024 + wgmma_halves(n.d);
                let f = self.flash_func(m, &format!("attn_wgmma_bwd_q_d{}", n.d), smem)?;
                (f, smem)
            }
            None => {
                let smem = (2 * qbr + 2 * qbc) * (n.d + 8) * 2;
                let name = format!("attn_flash_bwd_q_d{}", n.d);
                (self.flash_func(&FLASH_BWD, &name, smem)?, smem)
            }
        };
        let cfg = LaunchConfig {
            grid_dim: (
                (n.t * self.groups()).div_ceil(qbr) as u32,
                (n.b * n.nkv) as u32,
                1,
            ),
            block_dim: (256, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        let ptrs = [q, k, v, dout, lse, dd_, mask, seq_start, packed];
        // SAFETY: as above; dq (the packed output's first b·nh·t·d elements) gets each query row
        // from the one block that owns it.
        unsafe { self.launch(&f, &ptrs, Some(n.scale), &ints, cfg) }?;
        if hsplit > 1 {
            self.round(dk32, dk, n.kv_elems(), hsplit)?;
            self.round(dv32, dv, n.kv_elems(), hsplit)?;
        }
        Ok(())
    }

    /// A fused-attention kernel of `m` allowed `smem` bytes of dynamic shared memory.
    fn flash_func(
        &self,
        m: &Module,
        name: &str,
        smem: usize,
    ) -> Result<candle_core::cuda_backend::cudarc::driver::CudaFunction> {
        cuda::func_smem(self.dev, m, &cuda::kname_of(name, self.dtype)?, smem)
    }

    /// `y` = the sum of `x`'s `parts` partials of `len` floats, added in order and rounded to the
    /// element dtype.
    fn round(&self, x: u64, y: u64, len: usize, parts: usize) -> Result<()> {
        let f = self.func("attn_round")?;
        let mut b = cuda::launch_args(&self.stream, &f);
        let parts = parts as i32;
        b.arg(&x).arg(&y).arg(&len).arg(&parts);
        // SAFETY: x holds parts·len f32, y len elements.
        unsafe { b.launch(cuda::elementwise(len)) }.w()?;
        Ok(())
    }
}

fn fwd<T: CudaDType + DeviceRepr + WithDType>(
    dev: &CudaDevice,
    n: &Dims,
    plan: &AttentionPlan,
    [q, k, v, mask, seq_start]: [u64; 5],
) -> Result<(CudaSlice<T>, CudaSlice<f32>)> {
    let cx = Ctx::new(dev, n, T::DTYPE);
    let o = cx.alloc::<T>(n.q_elems())?;
    let lse = cx.alloc::<f32>(n.b * n.nh * n.t)?;
    if cx.flash(plan) && [q, k, v].iter().all(|p| p % 16 == 0) {
        cx.flash_fwd(plan, [q, k, v, mask, seq_start, cx.addr(&o), cx.addr(&lse)])?;
        return Ok((o, lse));
    }
    let bl = Blocking::new(n, plan);
    let rows_max = n.b * n.nh * bl.bq;
    let s = cx.alloc::<f32>(rows_max * bl.ld_max)?;
    let p = cx.alloc::<T>(rows_max * bl.ld_max)?;
    let [o_, lse_, s_, p_] = [cx.addr(&o), cx.addr(&lse), cx.addr(&s), cx.addr(&p)];
    // Q in the grouped layout (a copy only when g > 1); a block's O rows are then written over
    // its Q rows, which only that block's score GEMM reads.
    let qg = cx.grouped::<T>(q)?;
    let qs = qg.as_ref().map_or(q, |b| cx.addr(b));
    let os = qg.as_ref().map_or(o_, |b| cx.addr(b));
    for blk in bl.blocks(*n) {
        let g = cx.groups() * blk.rows;
        cx.scores_gemm(qs, k, s_, blk)?;
        cx.softmax_rows([s_, p_, lse_, mask, seq_start], blk)?;
        let (a, b, c) = (
            cx.scores(p_, blk, T::DTYPE),
            cx.kv(v, blk.k0, T::DTYPE),
            cx.rows(os, blk),
        );
        cx.gemm((g, n.d, blk.lk), (false, false), (1.0, 0.0), a, b, c)?;
    }
    if qg.is_some() {
        cx.regroup(os, o_, false)?;
    }
    Ok((o, lse))
}

fn bwd<T: CudaDType + DeviceRepr + WithDType>(
    dev: &CudaDevice,
    n: &Dims,
    plan: &AttentionPlan,
    [q, k, v, o, dout, lse, mask, seq_start]: [u64; 8],
) -> Result<CudaSlice<T>> {
    let cx = Ctx::new(dev, n, T::DTYPE);
    let (nq, nkv) = (n.q_elems(), n.kv_elems());
    let packed = cx.alloc::<T>(nq + 2 * nkv)?;
    if cx.flash_backward(plan) && [q, k, v, o, dout].iter().all(|p| p % 16 == 0) {
        cx.flash_bwd(
            plan,
            [q, k, v, o, dout, lse, mask, seq_start],
            cx.addr(&packed),
        )?;
        return Ok(packed);
    }
    let bl = Blocking::new(n, plan);
    let rows_max = n.b * n.nh * bl.bq;
    let dk32 = dev.alloc_zeros::<f32>(nkv)?;
    let dv32 = dev.alloc_zeros::<f32>(nkv)?;
    let s = cx.alloc::<f32>(rows_max * bl.ld_max)?;
    let dp = cx.alloc::<f32>(rows_max * bl.ld_max)?;
    let ds = cx.alloc::<T>(rows_max * bl.ld_max)?;
    let p = cx.alloc::<T>(rows_max * bl.ld_max)?;
    let elem = std::mem::size_of::<T>() as u64;
    let dq = cx.addr(&packed);
    let [dk32_, dv32_, s_, dp_, ds_, p_] = [
        cx.addr(&dk32),
        cx.addr(&dv32),
        cx.addr(&s),
        cx.addr(&dp),
        cx.addr(&ds),
        cx.addr(&p),
    ];
    // Q and dO in the grouped layout (copies only when g > 1): dO in the output's dQ slot (free
    // until the end), and a block's dQ rows over its Q rows once its dK product (their last
    // reader) is queued; the final regroup of dQ then overwrites the grouped dO.
    let qg = cx.grouped::<T>(q)?;
    if qg.is_some() {
        cx.regroup(dout, dq, true)?;
    }
    let qs = qg.as_ref().map_or(q, |b| cx.addr(b));
    let dos = if qg.is_some() { dq } else { dout };
    let dqs = qg.as_ref().map_or(dq, |b| cx.addr(b));
    for blk in bl.blocks(*n) {
        let g = cx.groups() * blk.rows;
        cx.scores_gemm(qs, k, s_, blk)?;
        let (a, b, c) = (
            cx.rows(dos, blk),
            cx.kv(v, blk.k0, T::DTYPE),
            cx.scores(dp_, blk, DType::F32),
        );
        cx.gemm((g, blk.lk, n.d), (false, true), (1.0, 0.0), a, b, c)?;
        cx.ds_rows([s_, dp_, o, dout, lse, mask, seq_start, ds_, p_], blk)?;
        let (dsm, pm) = (cx.scores(ds_, blk, T::DTYPE), cx.scores(p_, blk, T::DTYPE));
        cx.gemm(
            (blk.lk, n.d, g),
            (true, false),
            (1.0, 1.0),
            dsm,
            cx.rows(qs, blk),
            cx.kv(dk32_, blk.k0, DType::F32),
        )?;
        cx.gemm(
            (blk.lk, n.d, g),
            (true, false),
            (1.0, 1.0),
            pm,
            cx.rows(dos, blk),
            cx.kv(dv32_, blk.k0, DType::F32),
        )?;
        cx.gemm(
            (g, n.d, blk.lk),
            (false, false),
            (1.0, 0.0),
            dsm,
            cx.kv(k, blk.k0, T::DTYPE),
            cx.rows(dqs, blk),
        )?;
    }
    if qg.is_some() {
        cx.regroup(dqs, dq, false)?;
    }
    cx.round(dk32_, dq + nq as u64 * elem, nkv, 1)?;
    cx.round(dv32_, dq + (nq + nkv) as u64 * elem, nkv, 1)?;
    Ok(packed)
}

/// Blocks the fused dK / dV kernel should have at least: about four per SM of an H100 / H200
/// (one runs at a time), so that the causal imbalance between key tiles evens out.
const KV_BLOCKS_TARGET: usize = 512;

/// Shared memory the wgmma forward and dQ kernels add at head dim 512 (bytes), where their two
/// warpgroups hand each other the halves of S (and dP) over the head dim: 32,768.
fn wgmma_halves(d: usize) -> usize {
    if d == 512 {
        32 * 1024
    } else {
        0
    }
}

/// Over how many blocks the dK / dV kernel splits the `g` query heads of a GQA group: the smallest
/// divisor of `g` that brings `key_blocks` (key tiles × slabs) to [`KV_BLOCKS_TARGET`], or `g`.
fn head_split(key_blocks: usize, g: usize) -> usize {
    (1..=g)
        .find(|&h| g.is_multiple_of(h) && key_blocks * h >= KV_BLOCKS_TARGET)
        .unwrap_or(g)
}

/// The kernels' `seq_start` argument: the device address of the `(b, t)` u32 segment starts, or 0
/// for rows that hold one sequence each.
fn seq_start_ptr(seq_start: Option<&Tensor>, stream: &CudaStream, op: &str) -> Result<u64> {
    seq_start.map_or(Ok(0), |t| {
        cuda::with_cuda_storage(t, op, "seq_start", |s, l| {
            Ok(cuda::view::<u32>(s, l, op, "seq_start")?
                .device_ptr(stream)
                .0)
        })
    })
}

/// Forward on candle's CUDA storages: `(o, lse)`.
#[allow(clippy::too_many_arguments)]
pub(super) fn forward(
    op: &str,
    n: &Dims,
    plan: &AttentionPlan,
    (s1, l1): (&CudaStorage, &Layout),
    (s2, l2): (&CudaStorage, &Layout),
    (s3, l3): (&CudaStorage, &Layout),
    mask: &Tensor,
    seq_start: Option<&Tensor>,
) -> Result<(CudaStorage, CudaStorage)> {
    let dev = s1.device().clone();
    let stream = dev.cuda_stream();
    let (mg, ml) = mask.storage_and_layout();
    let m = cuda::view::<u8>(cuda_of(&mg, op, "key_mask")?, ml, op, "key_mask")?;
    let mask = m.device_ptr(&stream).0;
    let seq_start = seq_start_ptr(seq_start, &stream, op)?;
    with_cuda_float_type!(s1, op, T => {
        let addr = |s, l, what| -> Result<u64> { Ok(cuda::view::<T>(s, l, op, what)?.device_ptr(&stream).0) };
        let ptrs = [addr(s1, l1, "q")?, addr(s2, l2, "k")?, addr(s3, l3, "v")?, mask, seq_start];
        let (o, lse) = fwd::<T>(&dev, n, plan, ptrs)?;
        Ok((cuda::wrap(o, &dev), cuda::wrap(lse, &dev)))
    })
}

/// Backward on candle's CUDA storage of `q`: packed `[dq, dk, dv]`.
pub(super) fn backward(a: &AttentionBwd, (s, l): (&CudaStorage, &Layout)) -> Result<CudaStorage> {
    let op = "attention-bwd";
    let dev = s.device().clone();
    let stream = dev.cuda_stream();
    let guards = [&a.k, &a.v, &a.o, &a.dout, &a.lse, &a.mask].map(|t| t.storage_and_layout());
    let st = |i: usize, what: &str| cuda_of(&guards[i].0, op, what).map(|s| (s, guards[i].1));
    let (ms, ml) = st(5, "key_mask")?;
    let mask = cuda::view::<u8>(ms, ml, op, "key_mask")?
        .device_ptr(&stream)
        .0;
    let (ls, ll) = st(4, "lse")?;
    let lse = cuda::view::<f32>(ls, ll, op, "lse")?.device_ptr(&stream).0;
    let seq_start = seq_start_ptr(a.seq_start.as_ref(), &stream, op)?;
    with_cuda_float_type!(s, op, T => {
        let addr = |(s, l): (&CudaStorage, &Layout), what| -> Result<u64> {
            Ok(cuda::view::<T>(s, l, op, what)?.device_ptr(&stream).0)
        };
        let ptrs = [
            addr((s, l), "q")?,
            addr(st(0, "k")?, "k")?,
            addr(st(1, "v")?, "v")?,
            addr(st(2, "o")?, "o")?,
            addr(st(3, "grad")?, "grad")?,
            lse,
            mask,
            seq_start,
        ];
        Ok(cuda::wrap(bwd::<T>(&dev, &a.n, &a.plan, ptrs)?, &dev))
    })
}
