//! The LoRA adapter's products with its input dropout fused in, on CUDA (`kernels/lora.cu`): the
//! forward's `low = drop(x)·Aᵀ`, and in the backward `dA = dlowᵀ·drop(x)` together with `dx`'s
//! adapter term `drop'(dlow·A)`. Each is one pass over `x` that regenerates the dropout mask of the
//! elements it reads ([`crate::dropout`]'s bits; the backward draws it once for both of its
//! products), where the unfused path writes `drop(x)` to a temporary with the dropout kernel and
//! reads it back in a cuBLAS GEMM (forward and `dA`), and writes `dlow·A` and adds it through the
//! mask with a second kernel (`dx`): at the 12B's shapes that path moves about three times the
//! bytes of `x` per product.
//!
//! [`crate::lora_linear`] takes this path for bf16 / f16 activations when [`applies`] holds;
//! other shapes and f32 keep the dropout kernel + cuBLAS path (f32 because the kernels multiply
//! on the bf16 / f16 tensor cores). Numerics: fp32 accumulation and one rounding per output, as
//! the GEMMs. The backward writes `dx`'s adapter term first, rounded to the element dtype (as the
//! unfused path), or adds it in fp32 to a gradient already accumulated there; the `dx` GEMM then
//! adds `g·W` (`beta = 1`), so `x`'s memory can take `dx` once the kernel has read it.

use crate::cuda::{self, cuda_module, Module};
use crate::dropout::Keep;
use candle_core::cuda_backend::cudarc::driver::{
    DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg,
};
use candle_core::cuda_backend::{CudaDType, CudaDevice, WrapErr};
use candle_core::{CudaStorage, DType, Result};

const MODULE: Module = cuda_module!("lora");

/// Rows and columns of a `lora_dx_da` stage and of an up-product block (as the kernels; 4 warps).
const DX_ROWS: usize = 64;
const DX_COLS: usize = 64;
/// `lora_dx_da` blocks to aim for when splitting the rows: four per SM of an H100 / H200.
const DXDA_BLOCKS_TARGET: usize = 528;

/// The shape of one adapted projection: `m` rows of `inf` input features, rank `r`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Dims {
    pub(crate) m: usize,
    pub(crate) inf: usize,
    pub(crate) r: usize,
}

/// Whether the fused kernels take this projection: bf16 / f16, `inf % 8 == 0`, `r % 8 == 0` and
/// `r <= 64` (16-byte rows and the kernels' rank tiles), every operand address 16-byte aligned.
pub(crate) fn applies(dtype: DType, d: Dims, ptrs: &[u64]) -> bool {
    matches!(dtype, DType::BF16 | DType::F16)
        && d.inf.is_multiple_of(8)
        && d.r.is_multiple_of(8)
        && (8..=64).contains(&d.r)
        && ptrs.iter().all(|p| p.is_multiple_of(16))
}

/// Launches `root` (instance for `dtype`) on candle's stream with the arguments of `lora_down` and
/// `lora_dx_da`: the operand addresses, `m`, `inf`, `r`, the row split (`lora_dx_da` only) and the
/// mask.
///
/// # Safety
/// The operands must hold what the kernel reads and writes for `d` (see each caller) and stay
/// alive until the stream has run it.
unsafe fn launch(
    dev: &CudaDevice,
    (root, dtype): (&str, DType),
    cfg: LaunchConfig,
    ptrs: &[u64],
    d: Dims,
    split_rows: Option<i32>,
    keep: Keep,
) -> Result<()> {
    let f = cuda::func(dev, &MODULE, &cuda::kname_of(root, dtype)?)?;
    let stream = dev.cuda_stream();
    let mut b = stream.launch_builder(&f);
    let (m, inf, r) = (d.m as i32, d.inf as i32, d.r as i32);
    for p in ptrs {
        b.arg(p);
    }
    b.arg(&m).arg(&inf).arg(&r);
    if let Some(rows) = &split_rows {
        b.arg(rows);
    }
    b.arg(&keep.kk).arg(&keep.thresh).arg(&keep.scale);
    // SAFETY: the caller's contract.
    unsafe { b.launch(cfg) }.w()?;
    Ok(())
}

/// `low (m, r) = drop(x)·Aᵀ` for `x (m, inf)` and `a (r, inf)`, all in `dtype`.
pub(crate) fn down(
    dev: &CudaDevice,
    (x, a, low): (u64, u64, u64),
    d: Dims,
    dtype: DType,
    keep: Keep,
) -> Result<()> {
    // n-tiles of 8 ranks and warps per block of the kernel's instances (as many warps as their
    // registers allow: 32, 32, 16, 8).
    let nt = d.r.div_ceil(8).next_power_of_two();
    let warps = 64 / nt.max(2);
    let cfg = LaunchConfig {
        grid_dim: (d.m.div_ceil(16).max(1) as u32, 1, 1),
        block_dim: ((warps * 32) as u32, 1, 1),
        shared_mem_bytes: (warps * 16 * 8 * nt * 4) as u32,
    };
    let root = format!("lora_down_nt{nt}");
    // SAFETY: x holds m·inf elements, a r·inf, low m·r, all of `dtype` (the caller's shapes); the
    // grid covers every 16-row tile and each block writes only its rows of low.
    unsafe { launch(dev, (&root, dtype), cfg, &[x, a, low], d, None, keep) }
}

/// The backward's adapter terms for `x (m, inf)`, `dlow (m, r)` and `a (r, inf)` in `dtype`, in one
/// pass over `x`: `da (r, inf) = dlowᵀ·drop(x)` in `da_dtype` (f32 or `dtype`; partial sums over row
/// splits in fp32, then their sum in split order: deterministic, no atomics), and `dx (m, inf)`'s
/// term `drop'(dlow·A)`, added to `dx` when `accumulate` (`dx = r(dx + (dlow·A)·1/(1−p))` where the
/// mask keeps an element, unchanged elsewhere), else written over it (`r((dlow·A)·1/(1−p))` where
/// kept, 0 elsewhere; `dx` may then be `x`'s memory).
pub(crate) fn grad_x_and_a(
    dev: &CudaDevice,
    (x, dlow, a, dx, da): (u64, u64, u64, u64, u64),
    d: Dims,
    (dtype, da_dtype): (DType, DType),
    keep: Keep,
    accumulate: bool,
) -> Result<()> {
    let tiles = d.inf.div_ceil(DX_COLS);
    let stages = d.m.div_ceil(DX_ROWS).max(1);
    let want = DXDA_BLOCKS_TARGET.div_ceil(tiles).clamp(1, stages);
    let split_rows = stages.div_ceil(want) * DX_ROWS;
    let splits = d.m.div_ceil(split_rows).max(1);
    // SAFETY: every split's r × inf slice is written whole by its blocks before the sum reads it.
    let part = unsafe { dev.alloc::<f32>(splits * d.r * d.inf)? };
    let stream = dev.cuda_stream();
    let part_ptr = part.device_ptr(&stream).0;
    let cfg = LaunchConfig {
        grid_dim: (tiles as u32, splits as u32, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: 0,
    };
    let mode = if accumulate { "add" } else { "set" };
    let root = format!("lora_dx_da_ks{}_{mode}", d.r.div_ceil(16));
    // SAFETY: x and dx hold m·inf elements, dlow m·r and a r·inf of `dtype`, part splits·r·inf
    // floats; block (tile, split) writes the columns of its tile in its split's slice and its rows
    // of dx, each element after reading x's.
    unsafe {
        launch(
            dev,
            (&root, dtype),
            cfg,
            &[x, dlow, a, dx, part_ptr],
            d,
            Some(split_rows as i32),
            keep,
        )
    }?;
    let n = d.r * d.inf;
    let f = cuda::func(dev, &MODULE, &cuda::kname_of("lora_da_finish", da_dtype)?)?;
    let mut b = stream.launch_builder(&f);
    let splits = splits as i32;
    b.arg(&part_ptr).arg(&da).arg(&splits).arg(&n);
    // SAFETY: part holds splits·n floats, da n elements of `da_dtype`.
    unsafe { b.launch(cuda::elementwise(n)) }.w()?;
    Ok(())
}

/// One adapter's up product `scale·low·Bᵀ` for `lora_up_add` / `lora_up_geglu`: the device
/// addresses of `low (m, r)` and `B (n, r)`, and the scale.
#[derive(Clone, Copy)]
pub(crate) struct UpTerm {
    pub(crate) low: u64,
    pub(crate) b: u64,
    pub(crate) scale: f32,
}

/// `(m, n, r)` of an up product: `m` rows of `n` outputs, rank `r`.
pub(crate) type UpDims = (usize, usize, usize);

/// Whether `lora_up_add` / `lora_up_geglu` take these operands: bf16 / f16, `n % 8 == 0` and the
/// outputs (`outs`) 16-byte aligned (16-byte row chunks), `r % 8 == 0` and `r <= 64` (the rank
/// steps), `low` and `B` 16-byte aligned, `m` and `n` within `i32`.
pub(crate) fn up_applies(dtype: DType, (m, n, r): UpDims, outs: &[u64], terms: &[UpTerm]) -> bool {
    let ptrs = outs.iter().chain(terms.iter().flat_map(|t| [&t.low, &t.b]));
    matches!(dtype, DType::BF16 | DType::F16)
        && n.is_multiple_of(8)
        && r.is_multiple_of(8)
        && (8..=64).contains(&r)
        && i32::try_from(m.max(n)).is_ok()
        && ptrs.into_iter().all(|p| p.is_multiple_of(16))
}

/// The grid of the up-product kernels (64 × 64 tiles, 4 warps), its kernel name for `r` and the
/// shape arguments.
fn up_launch(
    root: &str,
    dtype: DType,
    (m, n, r): UpDims,
) -> Result<(String, LaunchConfig, [i32; 3])> {
    let cfg = LaunchConfig {
        grid_dim: (n.div_ceil(DX_COLS) as u32, m.div_ceil(DX_ROWS) as u32, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: 0,
    };
    let name = cuda::kname_of(&format!("{root}_ks{}", r.div_ceil(16)), dtype)?;
    Ok((name, cfg, [m as i32, n as i32, r as i32]))
}

/// `y (m, n) = r(y + scale·low·Bᵀ)` in place, in `dtype`.
///
/// # Safety
/// The addresses must hold `(m, n)`, `(m, r)` and `(n, r)` elements of `dtype` ([`up_applies`]
/// holds), stay alive until the stream has run the kernel, and nothing else may read `y` before.
pub(crate) unsafe fn up_add(
    dev: &CudaDevice,
    dtype: DType,
    y: u64,
    t: UpTerm,
    d: UpDims,
) -> Result<()> {
    if d.0 == 0 || d.1 == 0 {
        return Ok(());
    }
    let (name, cfg, [m, n, r]) = up_launch("lora_up_add", dtype, d)?;
    let f = cuda::func(dev, &MODULE, &name)?;
    let stream = dev.cuda_stream();
    let mut b = stream.launch_builder(&f);
    b.arg(&y)
        .arg(&t.low)
        .arg(&t.b)
        .arg(&m)
        .arg(&n)
        .arg(&r)
        .arg(&t.scale);
    // SAFETY: the caller's contract.
    unsafe { b.launch(cfg) }.w()?;
    Ok(())
}

/// Adds `gate_t`'s term to `gate` and `up_t`'s to `up` (both `(m, n)`) in place and returns
/// `gelu_tanh(gate)·up` `(m, n)` in `dtype` (a new buffer).
///
/// # Safety
/// As [`up_add`] for each of gate and up with its term.
pub(crate) unsafe fn up_geglu(
    dev: &CudaDevice,
    dtype: DType,
    outs: (u64, u64),
    terms: (UpTerm, UpTerm),
    d: UpDims,
) -> Result<CudaStorage> {
    let n_out = d.0 * d.1;
    // SAFETY: every element is written by the kernel (its grid covers the (m, n) tiles).
    let (act, act_ptr) = match dtype {
        DType::BF16 => unsafe { alloc_out::<half::bf16>(dev, n_out) }?,
        DType::F16 => unsafe { alloc_out::<half::f16>(dev, n_out) }?,
        other => candle_core::bail!("lora_up_geglu: {other:?} (expected bf16 or f16)"),
    };
    // SAFETY: the caller's contract; act holds m·n elements.
    unsafe { launch_up_geglu(dev, dtype, outs, act_ptr, true, terms, d) }?;
    Ok(act)
}

/// `gelu_tanh(gate + gate_t's term)·(up + up_t's term)` written over `gate` (both `(m, n)`), the
/// sums themselves written nowhere: `up` is left as it was.
///
/// # Safety
/// As [`up_add`] for each of gate and up with its term.
pub(crate) unsafe fn up_geglu_over_gate(
    dev: &CudaDevice,
    dtype: DType,
    outs: (u64, u64),
    terms: (UpTerm, UpTerm),
    d: UpDims,
) -> Result<()> {
    // SAFETY: the caller's contract; gate holds m·n elements.
    unsafe { launch_up_geglu(dev, dtype, outs, outs.0, false, terms, d) }
}

/// `lora_up_geglu` on `(gate, up)` into `act`, the sums written back when `store_sums`.
///
/// # Safety
/// As [`up_add`] for each of gate and up with its term; `act` holds `m·n` elements (it may be
/// `gate` without `store_sums`).
unsafe fn launch_up_geglu(
    dev: &CudaDevice,
    dtype: DType,
    (gate, up): (u64, u64),
    act: u64,
    store_sums: bool,
    (gate_t, up_t): (UpTerm, UpTerm),
    d: UpDims,
) -> Result<()> {
    if d.0 * d.1 == 0 {
        return Ok(());
    }
    let (name, cfg, [m, n, r]) = up_launch("lora_up_geglu", dtype, d)?;
    let f = cuda::func(dev, &MODULE, &name)?;
    let stream = dev.cuda_stream();
    let mut b = stream.launch_builder(&f);
    b.arg(&gate).arg(&up).arg(&act);
    b.arg(&gate_t.low)
        .arg(&gate_t.b)
        .arg(&up_t.low)
        .arg(&up_t.b);
    let store = store_sums as i32;
    b.arg(&m)
        .arg(&n)
        .arg(&r)
        .arg(&gate_t.scale)
        .arg(&up_t.scale)
        .arg(&store);
    // SAFETY: the caller's contract.
    unsafe { b.launch(cfg) }.w()?;
    Ok(())
}

/// A new `n`-element buffer of `T` and its address.
///
/// # Safety
/// Uninitialised: every element must be written before it is read.
unsafe fn alloc_out<T: CudaDType + DeviceRepr>(
    dev: &CudaDevice,
    n: usize,
) -> Result<(CudaStorage, u64)> {
    // SAFETY: the caller's contract.
    let s = unsafe { dev.alloc::<T>(n)? };
    let ptr = s.device_ptr(&dev.cuda_stream()).0;
    Ok((cuda::wrap(s, dev), ptr))
}
