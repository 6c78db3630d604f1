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
//!
//! With or without dropout, the backward's two products of the output gradient, `dlow` and `dB`,
//! are one pass over it ([`grad_low_and_b`]), where two cuBLAS GEMMs read it once each.

use crate::cuda::{self, cuda_module, Module};
use crate::dropout::Keep;
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, DevicePtr, DeviceRepr, LaunchConfig};
use candle_core::cuda_backend::{CudaDType, CudaDevice, WrapErr};
use candle_core::{CudaStorage, DType, Result};

const MODULE: Module = cuda_module!("lora");

/// Rows and columns of a `lora_dx_da` stage and of an up-product block (as the kernels; 4 warps).
const DX_ROWS: usize = 64;
const DX_COLS: usize = 64;
/// `lora_dx_da` blocks to aim for when splitting the rows: four per SM of an H100 / H200.
const DXDA_BLOCKS_TARGET: usize = 528;
/// Columns of the output gradient per `lora_dlow_db` block and rows per stage (as the kernel).
const GD_COLS: usize = 256;
const GD_ROWS: usize = 64;
/// At most this many `lora_dlow_db` blocks when splitting the rows: two per SM of an H100 / H200
/// (its shared memory allows two), so that they run in one wave; more splits would also write more
/// partial sums of `dB`.
const DLOW_DB_BLOCKS_MAX: usize = 264;

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
    let mut b = cuda::launch_args(&stream, &f);
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
/// kept, 0 elsewhere; `dx` may then be `x`'s memory). `with_db`: other partial sums in `da_dtype`
/// ([`grad_low_and_b`]'s `dB`) added in the same launch as `dA`'s.
pub(crate) fn grad_x_and_a(
    dev: &CudaDevice,
    (x, dlow, a, dx, da): (u64, u64, u64, u64, u64),
    d: Dims,
    (dtype, da_dtype): (DType, DType),
    keep: Keep,
    accumulate: bool,
    with_db: Option<Partials>,
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
    let da_sums = Partials {
        _part: Some(part),
        ptr: part_ptr,
        out: da,
        splits,
        n: d.r * d.inf,
        scale: 1.0,
    };
    // SAFETY: part holds splits·r·inf floats, da r·inf elements of `da_dtype`; `with_db` as its
    // kernel wrote it, its output in the same dtype.
    unsafe { sum_splits(dev, da_dtype, &da_sums, with_db.as_ref()) }
}

/// Partial sums waiting to be added in split order: `out[i] = scale·Σ_s part[s·n + i]`, stored in
/// the output's dtype. `part` owns the sums when they come from a kernel whose caller finishes
/// them later ([`grad_low_and_b`]'s `dB`).
pub(crate) struct Partials {
    /// The sums' buffer, held until their launch is queued (then freed in stream order).
    _part: Option<CudaSlice<f32>>,
    ptr: u64,
    out: u64,
    splits: usize,
    n: usize,
    scale: f32,
}

impl Partials {
    /// Adds these sums alone, into an output of `out_dtype`.
    pub(crate) fn finish(self, dev: &CudaDevice, out_dtype: DType) -> Result<()> {
        // SAFETY: the sums and the output were sized by the kernel that wrote them.
        unsafe { sum_splits(dev, out_dtype, &self, None) }
    }
}

/// `lora_sum_splits` on `a` and, if given, `b` in one launch, both outputs in `out_dtype`.
///
/// # Safety
/// Each set's `part` must hold `splits·n` floats written by the stream before, and its `out` `n`
/// elements of `out_dtype`, alive until the stream has run the kernel.
unsafe fn sum_splits(
    dev: &CudaDevice,
    out_dtype: DType,
    a: &Partials,
    b: Option<&Partials>,
) -> Result<()> {
    let f = cuda::func(dev, &MODULE, &cuda::kname_of("lora_sum_splits", out_dtype)?)?;
    let stream = dev.cuda_stream();
    let mut l = cuda::launch_args(&stream, &f);
    let none = Partials {
        _part: None,
        ptr: 0,
        out: 0,
        splits: 0,
        n: 0,
        scale: 0.0,
    };
    let b = b.unwrap_or(&none);
    let (splits_a, splits_b) = (a.splits as i32, b.splits as i32);
    l.arg(&a.ptr)
        .arg(&a.out)
        .arg(&splits_a)
        .arg(&a.n)
        .arg(&a.scale);
    l.arg(&b.ptr)
        .arg(&b.out)
        .arg(&splits_b)
        .arg(&b.n)
        .arg(&b.scale);
    // SAFETY: the caller's contract.
    unsafe { l.launch(cuda::elementwise(a.n + b.n)) }.w()?;
    Ok(())
}

/// Whether [`grad_low_and_b`] takes a projection of `m` rows, `out` outputs and rank `r`: bf16 /
/// f16, `out % 8 == 0` (16-byte rows of the gradient), `r % 8 == 0` and `r <= 32` (the kernel's
/// two rank instances), `m` and `out` positive and within `i32`, the gradient, `B` and `low`
/// 16-byte aligned.
pub(crate) fn grad_out_applies(
    dtype: DType,
    (m, out, r): (usize, usize, usize),
    (g, b, low): (u64, u64, u64),
) -> bool {
    matches!(dtype, DType::BF16 | DType::F16)
        && out.is_multiple_of(8)
        && r.is_multiple_of(8)
        && (8..=32).contains(&r)
        && m.min(out) > 0
        && i32::try_from(m.max(out)).is_ok()
        && [g, b, low].iter().all(|p| p.is_multiple_of(16))
}

/// The backward's two products of the output gradient `g (m, out)` in one pass over it:
/// `dlow (m, r) = scale·g·B` in `dtype`, and `dB (out, r) = scale·gᵀ·low` for `db`, for
/// `b (out, r)` and `low (m, r)` in `dtype`. The kernel writes fp32 partial sums, of `dlow` over
/// chunks of 256 columns and of `dB` over splits of the rows; `dlow`'s are added here, `dB`'s are
/// returned for the caller to add ([`Partials::finish`], or with `dA`'s in [`grad_x_and_a`]). Each
/// sum runs in order (deterministic, no atomics), scaled and rounded once, as a GEMM with
/// `alpha = scale`. Where cuBLAS reads `g` once per product, this reads it once for both.
pub(crate) fn grad_low_and_b(
    dev: &CudaDevice,
    (g, b, low, dlow, db): (u64, u64, u64, u64, u64),
    (m, out, r): (usize, usize, usize),
    dtype: DType,
    scale: f32,
) -> Result<Partials> {
    if m == 0 || out == 0 {
        candle_core::bail!("lora_dlow_db: empty gradient ({m} rows of {out})");
    }
    let chunks = out.div_ceil(GD_COLS);
    let stages = m.div_ceil(GD_ROWS);
    let want = (DLOW_DB_BLOCKS_MAX / chunks).clamp(1, stages);
    let split_rows = stages.div_ceil(want) * GD_ROWS;
    let splits = m.div_ceil(split_rows);
    // SAFETY: every chunk's m × r slice is written whole by the kernel before the sum reads it.
    let pdlow = unsafe { dev.alloc::<f32>(chunks * m * r)? };
    // SAFETY: every split's out × r slice is written whole by the kernel before the sum reads it.
    let pdb = unsafe { dev.alloc::<f32>(splits * out * r)? };
    let stream = dev.cuda_stream();
    let (pdlow_ptr, pdb_ptr) = (pdlow.device_ptr(&stream).0, pdb.device_ptr(&stream).0);
    let np = r.div_ceil(16);
    let smem = (2 * GD_ROWS * (GD_COLS + 8) + (GD_COLS + 2 * GD_ROWS) * (16 * np + 8)) * 2;
    let name = cuda::kname_of(&format!("lora_dlow_db_np{np}"), dtype)?;
    let f = cuda::func_smem(dev, &MODULE, &name, smem)?;
    let cfg = LaunchConfig {
        grid_dim: (chunks as u32, splits as u32, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: smem as u32,
    };
    let mut l = cuda::launch_args(&stream, &f);
    let (mi, outi, ri, rows) = (m as i32, out as i32, r as i32, split_rows as i32);
    l.arg(&g).arg(&b).arg(&low).arg(&pdlow_ptr).arg(&pdb_ptr);
    l.arg(&mi).arg(&outi).arg(&ri).arg(&rows);
    // SAFETY: g holds m·out elements, b out·r and low m·r of `dtype` (the caller's shapes, checked
    // by grad_out_applies); block (chunk, split) writes its chunk's rows of the split in pdlow and
    // its chunk's columns in the split's slice of pdb.
    unsafe { l.launch(cfg) }.w()?;
    let dlow_sums = Partials {
        _part: Some(pdlow),
        ptr: pdlow_ptr,
        out: dlow,
        splits: chunks,
        n: m * r,
        scale,
    };
    // SAFETY: pdlow holds chunks·m·r floats, dlow m·r elements of `dtype`.
    unsafe { sum_splits(dev, dtype, &dlow_sums, None) }?;
    Ok(Partials {
        _part: Some(pdb),
        ptr: pdb_ptr,
        out: db,
        splits,
        n: out * r,
        scale,
    })
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
    let mut b = cuda::launch_args(&stream, &f);
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
    let mut b = cuda::launch_args(&stream, &f);
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
