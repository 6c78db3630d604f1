//! CUDA launchers of the MoE ops (`kernels/moe.cu`); the CPU references are in `moe.rs`.

use crate::cuda::{self, cuda_module, with_cuda_float_type, Module};
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaStream, DevicePtr, LaunchConfig};
use candle_core::cuda_backend::WrapErr;
use candle_core::{bail, CudaStorage, DType, Layout, Result, Tensor};

const MODULE: Module = cuda_module!("moe");
/// The wgmma grouped GEMM (`kernels/moe_wgmma.cu`), built only for compute capability 90; other
/// builds run `kernels/moe.cu`'s mma.sync one.
#[cfg(g4ft_hopper)]
static WGMMA: Option<Module> = Some(cuda_module!("moe_wgmma"));
#[cfg(not(g4ft_hopper))]
static WGMMA: Option<Module> = None;

/// Experts the top-k kernel takes (16 per lane of a warp).
const TOPK_MAX_EXPERTS: usize = 512;
/// Experts per token the combine kernel takes.
const COMBINE_MAX_K: usize = 32;
/// Rows, columns and depth of a grouped-GEMM block tile, its pipeline stages and threads (as
/// `kernels/moe.cu`).
const GEMM_ROWS: usize = 128;
const GEMM_COLS: usize = 128;
const GEMM_DEPTH: usize = 32;
const GEMM_STAGES: usize = 4;
const GEMM_THREADS: u32 = 256;

/// Dynamic shared memory of a grouped-GEMM block (the layout `grouped_gemm` in `kernels/moe.cu`
/// carves it into): the stages' A tiles (rows of K, padded by 8) and B tiles (W rows of K with
/// `transpose_w`, else K rows of N), 16-bit elements.
fn gemm_smem(transpose_w: bool) -> usize {
    let b = if transpose_w {
        GEMM_COLS * (GEMM_DEPTH + 8)
    } else {
        GEMM_DEPTH * (GEMM_COLS + 8)
    };
    GEMM_STAGES * (GEMM_ROWS * (GEMM_DEPTH + 8) + b) * 2
}

/// Rows, output columns and depth of a wgmma grouped-GEMM block tile and its pipeline stages (as
/// `grouped_wg` in `kernels/moe_wgmma.cu`).
const WGMMA_GEMM_ROWS: usize = 128;
const WGMMA_GEMM_COLS: usize = 256;
const WGMMA_GEMM_DEPTH: usize = 64;
const WGMMA_GEMM_STAGES: usize = 4;
/// Its dynamic shared memory: the stages' A and B tiles of 16-bit elements, plus 1024 bytes to
/// align the swizzled tiles.
const WGMMA_GEMM_SMEM: usize =
    WGMMA_GEMM_STAGES * (WGMMA_GEMM_ROWS + WGMMA_GEMM_COLS) * WGMMA_GEMM_DEPTH * 2 + 1024;

/// Elements of `T` in a 16-byte pack.
fn per_pack<T>() -> usize {
    16 / std::mem::size_of::<T>()
}

/// Whether rows of `h` elements of `T` starting at the device address `addr` go in 16-byte packs
/// (the kernels' `packed`): `h` a multiple of a pack and `addr` 16-byte aligned.
fn packs<T>(h: usize, addr: u64) -> bool {
    h.is_multiple_of(per_pack::<T>()) && addr.is_multiple_of(16)
}

fn as_i32(x: usize, what: &str) -> Result<i32> {
    i32::try_from(x).map_err(|_| candle_core::Error::Msg(format!("moe: {what} = {x} exceeds i32")))
}

/// Top-k indices `(n, k)` u32 of the probabilities `(n, e)` f32.
pub(super) fn topk(
    s: &CudaStorage,
    l: &Layout,
    n: usize,
    e: usize,
    k: usize,
) -> Result<CudaStorage> {
    if e > TOPK_MAX_EXPERTS || k > 32 {
        bail!("moe_topk: at most {TOPK_MAX_EXPERTS} experts and k <= 32 on CUDA, got {e} and {k}");
    }
    let dev = s.device().clone();
    let probs = cuda::view::<f32>(s, l, "moe_topk", "probs")?;
    // SAFETY: every (row, choice) is written by the kernel.
    let idx = unsafe { dev.alloc::<u32>(n * k)? };
    let f = cuda::func(&dev, &MODULE, "moe_topk")?;
    let stream = dev.cuda_stream();
    let mut b = cuda::launch_args(&stream, &f);
    let (n_, e_, k_) = (as_i32(n, "tokens")?, as_i32(e, "experts")?, as_i32(k, "k")?);
    b.arg(&probs).arg(&idx).arg(&n_).arg(&e_).arg(&k_);
    // SAFETY: probs holds n·e floats, idx n·k; one warp per row.
    unsafe { b.launch(cuda::warp_per_row(n)) }.w()?;
    Ok(cuda::wrap(idx, &dev))
}

/// `[order | token | slot_pos | offsets]` of the `(n, k)` indices (`m = n·k` of them).
pub(super) fn group(
    s: &CudaStorage,
    l: &Layout,
    m: usize,
    e: usize,
    k: usize,
) -> Result<CudaStorage> {
    let dev = s.device().clone();
    let idx = cuda::view::<u32>(s, l, "moe_group", "indices")?;
    // SAFETY: every element is written: each slot once in each of the three tables, each offset once.
    let out = unsafe { dev.alloc::<u32>(3 * m + e + 1)? };
    let f = cuda::func(&dev, &MODULE, "moe_group")?;
    let stream = dev.cuda_stream();
    let mut b = cuda::launch_args(&stream, &f);
    let (m_, e_, k_) = (as_i32(m, "slots")?, as_i32(e, "experts")?, as_i32(k, "k")?);
    b.arg(&idx).arg(&out).arg(&m_).arg(&e_).arg(&k_);
    let cfg = LaunchConfig {
        grid_dim: (e as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: idx holds m indices < e (checked by the kernel's consumers: an index >= e is never
    // placed, see the CPU reference's check), out 3m + e + 1 words.
    unsafe { b.launch(cfg) }.w()?;
    Ok(cuda::wrap(out, &dev))
}

/// `y (m, n)` of the grouped matmul of `x (m, k)` with the stacked weights `w`.
pub(super) fn grouped_matmul(
    (sx, lx): (&CudaStorage, &Layout),
    (so, lo): (&CudaStorage, &Layout),
    w: &Tensor,
    m: usize,
    n: usize,
    k: usize,
    transpose_w: bool,
) -> Result<CudaStorage> {
    let op = "grouped_matmul";
    let dev = sx.device().clone();
    let offsets = cuda::view::<u32>(so, lo, op, "offsets")?;
    let e = lo.shape().elem_count() - 1;
    let stream = dev.cuda_stream();
    let (e_, m_, n_, k_) = (
        as_i32(e, "experts")?,
        as_i32(m, "rows")?,
        as_i32(n, "columns")?,
        as_i32(k, "depth")?,
    );
    cuda::with_cuda_storage(w, op, "w", |sw, lw| {
        with_cuda_float_type!(sx, op, T => {
            let x = cuda::view::<T>(sx, lx, op, "x")?;
            let wv = cuda::view::<T>(sw, lw, op, "w")?;
            // SAFETY: every row of every segment is written (the segments cover 0..m).
            let y = unsafe { dev.alloc::<T>(m * n)? };
            let aligned = x.device_ptr(&stream).0 % 16 == 0 && wv.device_ptr(&stream).0 % 16 == 0;
            let tiled = sx.dtype() != DType::F32 && k.is_multiple_of(8) && n.is_multiple_of(8) && aligned;
            if tiled {
                let (module, root, (rows, cols), smem) = match WGMMA.as_ref() {
                    Some(module) => {
                        let root = if transpose_w { "grouped_wgmma_nt" } else { "grouped_wgmma_nn" };
                        (module, root, (WGMMA_GEMM_ROWS, WGMMA_GEMM_COLS), WGMMA_GEMM_SMEM)
                    }
                    None => {
                        let root = if transpose_w { "grouped_gemm_nt" } else { "grouped_gemm_nn" };
                        (&MODULE, root, (GEMM_ROWS, GEMM_COLS), gemm_smem(transpose_w))
                    }
                };
                let f = cuda::func_smem(&dev, module, &cuda::kname::<T>(root), smem)?;
                let cfg = LaunchConfig {
                    grid_dim: (n.div_ceil(cols) as u32, (m.div_ceil(rows) + e) as u32, 1),
                    block_dim: (GEMM_THREADS, 1, 1),
                    shared_mem_bytes: smem as u32,
                };
                let mut b = cuda::launch_args(&stream, &f);
                b.arg(&x).arg(&wv).arg(&offsets).arg(&y).arg(&e_).arg(&n_).arg(&k_);
                // SAFETY: x holds m·k elements, w e·n·k, offsets e + 1 nondecreasing words ending
                // at m, y m·n; K and N are multiples of 8 and the rows 16-byte aligned.
                unsafe { b.launch(cfg) }.w()?;
            } else {
                let f = cuda::func(&dev, &MODULE, &cuda::kname::<T>("grouped_gemm_simple"))?;
                let nt = i32::from(transpose_w);
                let mut b = cuda::launch_args(&stream, &f);
                b.arg(&x).arg(&wv).arg(&offsets).arg(&y).arg(&e_).arg(&m_).arg(&n_).arg(&k_).arg(&nt);
                // SAFETY: as above; one thread per output element in a grid-stride loop.
                unsafe { b.launch(cuda::elementwise(m * n)) }.w()?;
            }
            Ok(cuda::wrap(y, &dev))
        })
    })
}

/// `out (m, h)`: the rows of `x` in grouped order, times the grouped weights `w` if given (the
/// experts' input; the combine's backward). 16-byte packs when the rows allow.
pub(super) fn gather(
    (sx, lx): (&CudaStorage, &Layout),
    w: Option<&Tensor>,
    (st, lt): (&CudaStorage, &Layout),
    m: usize,
    h: usize,
) -> Result<CudaStorage> {
    let op = "moe_gather_scaled";
    let dev = sx.device().clone();
    let stream = dev.cuda_stream();
    let token = cuda::view::<u32>(st, lt, op, "token")?;
    let (m_, h_) = (as_i32(m, "rows")?, as_i32(h, "hidden")?);
    let launch = |w_ptr: u64| -> Result<CudaStorage> {
        with_cuda_float_type!(sx, op, T => {
            let x = cuda::view::<T>(sx, lx, op, "x")?;
            let packed = packs::<T>(h, x.device_ptr(&stream).0);
            // SAFETY: every element is written.
            let out = unsafe { dev.alloc::<T>(m * h)? };
            let f = cuda::func(&dev, &MODULE, &cuda::kname::<T>(op))?;
            let packed_ = i32::from(packed);
            let mut b = cuda::launch_args(&stream, &f);
            b.arg(&x).arg(&w_ptr).arg(&token).arg(&out).arg(&m_).arg(&h_).arg(&packed_);
            let threads = if packed { m * h / per_pack::<T>() } else { m * h };
            // SAFETY: x holds n·h elements with every token < n, w (if not null) and token m,
            // out m·h; with `packed` the rows are 16-byte multiples and x 16-byte aligned.
            unsafe { b.launch(cuda::elementwise(threads)) }.w()?;
            Ok(cuda::wrap(out, &dev))
        })
    };
    with_weights_ptr(w, op, &stream, launch)
}

/// `dw (m,)` f32: each grouped row's dot product with its token's output gradient.
pub(super) fn gather_dot(
    (sy, ly): (&CudaStorage, &Layout),
    (sg, lg): (&CudaStorage, &Layout),
    (st, lt): (&CudaStorage, &Layout),
    m: usize,
    h: usize,
) -> Result<CudaStorage> {
    let op = "moe_gather_dot";
    let dev = sy.device().clone();
    let token = cuda::view::<u32>(st, lt, op, "token")?;
    let (m_, h_) = (as_i32(m, "rows")?, as_i32(h, "hidden")?);
    with_cuda_float_type!(sy, op, T => {
        let y = cuda::view::<T>(sy, ly, op, "y")?;
        let g = cuda::view::<T>(sg, lg, op, "g")?;
        // SAFETY: every row's sum is written.
        let dw = unsafe { dev.alloc::<f32>(m)? };
        let f = cuda::func(&dev, &MODULE, &cuda::kname::<T>(op))?;
        let stream = dev.cuda_stream();
        let mut b = cuda::launch_args(&stream, &f);
        b.arg(&y).arg(&g).arg(&token).arg(&dw).arg(&m_).arg(&h_);
        // SAFETY: y holds m·h elements, g n·h with every token < n, dw m floats; a warp per row.
        unsafe { b.launch(cuda::warp_per_row(m)) }.w()?;
        Ok(cuda::wrap(dw, &dev))
    })
}

/// `out (n, h)`: the grouped rows `y` summed back per token (weighted by `w` if given).
pub(super) fn combine(
    (sy, ly): (&CudaStorage, &Layout),
    (sp, lp): (&CudaStorage, &Layout),
    w: Option<&Tensor>,
    n: usize,
    h: usize,
    k: usize,
) -> Result<CudaStorage> {
    let op = "moe_combine";
    if k > COMBINE_MAX_K {
        bail!("{op}: at most {COMBINE_MAX_K} experts per token on CUDA, got {k}");
    }
    let dev = sy.device().clone();
    let stream = dev.cuda_stream();
    let slot_pos = cuda::view::<u32>(sp, lp, op, "slot_pos")?;
    let (h_, k_) = (as_i32(h, "hidden")?, as_i32(k, "k")?);
    let launch = |w_ptr: u64| -> Result<CudaStorage> {
        with_cuda_float_type!(sy, op, T => {
            let y = cuda::view::<T>(sy, ly, op, "y")?;
            // SAFETY: every element is written.
            let out = unsafe { dev.alloc::<T>(n * h)? };
            let f = cuda::func(&dev, &MODULE, &cuda::kname::<T>(op))?;
            let packed = packs::<T>(h, y.device_ptr(&stream).0);
            let packed_ = i32::from(packed);
            let mut b = cuda::launch_args(&stream, &f);
            b.arg(&y).arg(&slot_pos).arg(&w_ptr).arg(&out).arg(&h_).arg(&k_).arg(&packed_);
            // SAFETY: y holds n·k·h elements, slot_pos n·k positions < n·k, w (if not null)
            // n·k floats, out n·h; one block per token; with `packed` the rows are 16-byte
            // multiples and y 16-byte aligned (out, a fresh allocation, is).
            unsafe { b.launch(cuda::per_row(n, 256)) }.w()?;
            Ok(cuda::wrap(out, &dev))
        })
    };
    with_weights_ptr(w, op, &stream, launch)
}

/// `launch` given the device address of the optional f32 weights `w` (0 without them).
fn with_weights_ptr<R>(
    w: Option<&Tensor>,
    op: &str,
    stream: &CudaStream,
    launch: impl FnOnce(u64) -> Result<R>,
) -> Result<R> {
    match w {
        Some(w) => cuda::with_cuda_storage(w, op, "w", |sw, lw| {
            let wv = cuda::view::<f32>(sw, lw, op, "w")?;
            let ptr = wv.device_ptr(stream).0;
            launch(ptr)
        }),
        None => launch(0),
    }
}
