//! Attention's per-head input transform in one pass, for the explicit (graph-free) layer backward:
//! RMSNorm over each head row of a raw projection `(b, t, n, d)`, the move to attention's
//! `(b, n, t, d)` layout, and RoPE (q and k; v takes neither RoPE nor a norm weight), and the
//! backward of the three.
//!
//! Defined as the composite [`rope`]`(`[`swap_dims12`]`(`[`rms_norm`]`(raw)))`, which is what runs
//! on the CPU, and on CUDA where the kernel does not apply (f32, `d` odd or above 1024). For bf16 /
//! f16 on CUDA one kernel per call (`kernels/heads_norm.cu`, a warp per head row, staged in
//! shared memory between the norm and the rotation) replaces the three kernels and their two
//! intermediate tensors. It runs the same row arithmetic in the same order and the same roundings
//! (`rms_norm_row.cuh`, `rope_rotate.cuh`), so it stores the same bits as the composite (the CUDA
//! test rows assert equality).

use crate::{rms_norm, rms_norm_backward, rope, rope_backward, swap_dims12};
use candle_core::{bail, Result, Tensor};

/// RoPE tables `(cos, sin)`, each `(b or 1, t, d)` in the activation dtype.
pub type RopeTables<'a> = (&'a Tensor, &'a Tensor);

/// The operands the fused forward and backward share.
#[cfg(feature = "cuda")]
#[derive(Clone, Copy)]
struct Heads<'a> {
    raw: &'a Tensor,
    weight: Option<&'a Tensor>,
    rope_tables: Option<RopeTables<'a>>,
    eps: f32,
}

#[cfg(feature = "cuda")]
impl<'a> Heads<'a> {
    fn new(
        raw: &'a Tensor,
        weight: Option<&'a Tensor>,
        rope_tables: Option<RopeTables<'a>>,
        eps: f64,
    ) -> Self {
        let eps = eps as f32;
        Heads {
            raw,
            weight,
            rope_tables,
            eps,
        }
    }
}

/// `rope(swap_dims12(rms_norm(raw, weight, eps)))` (without `rope`: no rotation) for a raw
/// projection `raw (b, t, n, d)`: `(b, n, t, d)`. `weight` `(d,)` is frozen. Records no graph.
pub fn heads_norm_rope(
    raw: &Tensor,
    weight: Option<&Tensor>,
    rope_tables: Option<RopeTables>,
    eps: f64,
) -> Result<Tensor> {
    check(raw, None, None, rope_tables)?;
    #[cfg(feature = "cuda")]
    if let Some(y) = cuda_impl::forward(Heads::new(raw, weight, rope_tables, eps))? {
        return Ok(y);
    }
    let normed = swap_dims12(&rms_norm(&raw.detach(), weight, eps)?)?;
    match rope_tables {
        Some((cos, sin)) => rope(&normed, cos, sin),
        None => Ok(normed),
    }
}

/// The backward of [`heads_norm_rope`]: `d(raw) (b, t, n, d)` from `dy (b, n, t, d)`, plus `extra`
/// (another gradient of `raw`, added like a separate add, as in [`rms_norm_backward`]).
/// Records no graph.
pub fn heads_norm_rope_backward(
    raw: &Tensor,
    weight: Option<&Tensor>,
    rope_tables: Option<RopeTables>,
    dy: &Tensor,
    eps: f64,
    extra: Option<&Tensor>,
) -> Result<Tensor> {
    check(raw, Some(dy), extra, rope_tables)?;
    #[cfg(feature = "cuda")]
    if let Some(dx) = cuda_impl::backward(Heads::new(raw, weight, rope_tables, eps), dy, extra)? {
        return Ok(dx);
    }
    let dn = match rope_tables {
        Some((cos, sin)) => rope_backward(dy, cos, sin)?,
        None => dy.detach(),
    };
    rms_norm_backward(raw, weight, &swap_dims12(&dn)?, eps, extra)
}

/// `raw` is 4-D; `dy`, if given, is its `(b, n, t, d)` swap in its dtype, `extra` its shape and
/// dtype; the RoPE tables are `(b or 1, t, d)` in its dtype.
fn check(
    raw: &Tensor,
    dy: Option<&Tensor>,
    extra: Option<&Tensor>,
    rope_tables: Option<RopeTables>,
) -> Result<()> {
    let (b, t, n, d) = raw.dims4()?;
    if let Some(e) = extra {
        if e.dims() != raw.dims() || e.dtype() != raw.dtype() {
            bail!(
                "heads_norm_rope_backward: extra {:?} {:?} must match raw {:?} {:?}",
                e.dims(),
                e.dtype(),
                raw.dims(),
                raw.dtype()
            );
        }
    }
    if let Some(dy) = dy {
        if dy.dims() != [b, n, t, d] || dy.dtype() != raw.dtype() {
            bail!(
                "heads_norm_rope_backward: dy must be (b, n, t, d) = ({b}, {n}, {t}, {d}) {:?}, got {:?} {:?}",
                raw.dtype(),
                dy.dims(),
                dy.dtype()
            );
        }
    }
    if let Some((cos, sin)) = rope_tables {
        for (what, tab) in [("cos", cos), ("sin", sin)] {
            let ok =
                matches!(tab.dims(), &[tb, tt, td] if (tb == b || tb == 1) && tt == t && td == d);
            if !ok || tab.dtype() != raw.dtype() {
                bail!(
                    "heads_norm_rope: {what} must be ({b} or 1, {t}, {d}) {:?}, got {:?} {:?}",
                    raw.dtype(),
                    tab.dims(),
                    tab.dtype()
                );
            }
        }
    }
    Ok(())
}

#[cfg(feature = "cuda")]
mod cuda_impl {
    use super::{Heads, RopeTables};
    use crate::cuda::{self, cuda_module, Module};
    use crate::util::tensor_from_storage;
    use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
    use candle_core::cuda_backend::{CudaDevice, WrapErr};
    use candle_core::{DType, Result, Storage, Tensor};

    const MODULE: Module = cuda_module!("heads_norm");
    /// Head rows (warps) per block, as the kernel assumes.
    const ROWS_PER_BLOCK: usize = 8;

    /// The device address of `t` (made contiguous by the caller).
    fn addr(t: &Tensor, what: &str) -> Result<u64> {
        cuda::addr_of(t, "heads_norm_rope", what)
    }

    /// The CUDA device of `raw` when the kernel takes it: bf16 / f16 (in f32 the fma contraction
    /// of one fused kernel may differ from the separate ones' by an ulp), `d` even and at most
    /// 1024 (a warp per row, as `rms_norm`'s warp kernels).
    fn device_for(raw: &Tensor) -> Option<CudaDevice> {
        let d = raw.dims().last().copied().unwrap_or(0);
        let half_float = matches!(raw.dtype(), DType::BF16 | DType::F16);
        match raw.device() {
            candle_core::Device::Cuda(dev) if half_float && d % 2 == 0 && d <= 1024 => {
                Some(dev.clone())
            }
            _ => None,
        }
    }

    /// One launch of `root` over the head rows of `raw`; `ptrs` are the kernel's pointer
    /// arguments (0 for the absent ones).
    fn launch(
        dev: &CudaDevice,
        root: &str,
        raw: &Tensor,
        ptrs: &[u64],
        cos_b: usize,
        eps: f32,
    ) -> Result<()> {
        let (_, t, n, d) = raw.dims4()?;
        let rows = raw.elem_count() / d;
        let f = cuda::func(dev, &MODULE, &cuda::kname_of(root, raw.dtype())?)?;
        let ints = [rows, t, n, d, cos_b].map(|v| v as i32);
        let stream = dev.cuda_stream();
        let mut b = cuda::launch_args(&stream, &f);
        for p in ptrs {
            b.arg(p);
        }
        for v in &ints {
            b.arg(v);
        }
        b.arg(&eps);
        let cfg = LaunchConfig {
            grid_dim: (rows.div_ceil(ROWS_PER_BLOCK).max(1) as u32, 1, 1),
            block_dim: ((ROWS_PER_BLOCK * 32) as u32, 1, 1),
            shared_mem_bytes: (ROWS_PER_BLOCK * d * raw.dtype().size_in_bytes()) as u32,
        };
        // SAFETY: the caller's pointers hold what the kernel reads and writes for these sizes
        // (raw / dx: rows·d, y / dy: rows·d, cos / sin: cos_b·t·d, weight: d), all contiguous.
        unsafe { b.launch(cfg) }.w()?;
        Ok(())
    }

    /// Contiguous copies of the weight and the tables, their addresses and the tables' batch.
    fn operands(
        weight: Option<&Tensor>,
        rope_tables: Option<RopeTables>,
    ) -> Result<(Vec<Tensor>, [u64; 3], usize)> {
        let mut held = Vec::new();
        let mut ptrs = [0u64; 3];
        let mut cos_b = 1;
        if let Some(w) = weight {
            let w = w.detach().contiguous()?;
            ptrs[0] = addr(&w, "weight")?;
            held.push(w);
        }
        if let Some((cos, sin)) = rope_tables {
            cos_b = cos.dims()[0];
            for (i, (tab, what)) in [(cos, "cos"), (sin, "sin")].into_iter().enumerate() {
                let tab = tab.detach().contiguous()?;
                ptrs[1 + i] = addr(&tab, what)?;
                held.push(tab);
            }
        }
        Ok((held, ptrs, cos_b))
    }

    /// A new `(dims)` tensor of `raw`'s dtype on `dev` (uninitialised; the kernel writes it all).
    fn output(dev: &CudaDevice, raw: &Tensor, dims: &[usize]) -> Result<Tensor> {
        let n = raw.elem_count();
        let storage = match raw.dtype() {
            // SAFETY (both arms): every element is written by the kernel before any read.
            DType::BF16 => cuda::wrap(unsafe { dev.alloc::<half::bf16>(n)? }, dev),
            DType::F16 => cuda::wrap(unsafe { dev.alloc::<half::f16>(n)? }, dev),
            other => candle_core::bail!("heads_norm_rope: unsupported dtype {other:?}"),
        };
        Ok(tensor_from_storage(Storage::Cuda(storage), dims))
    }

    /// The fused forward, or `None` where it does not apply.
    pub(super) fn forward(h: Heads) -> Result<Option<Tensor>> {
        let Some(dev) = device_for(h.raw) else {
            return Ok(None);
        };
        let (b, t, n, d) = h.raw.dims4()?;
        let raw = h.raw.detach().contiguous()?;
        let (_held, [w, cos, sin], cos_b) = operands(h.weight, h.rope_tables)?;
        let y = output(&dev, &raw, &[b, n, t, d])?;
        let ptrs = [addr(&raw, "raw")?, w, cos, sin, addr(&y, "y")?];
        launch(&dev, "heads_norm_rope_fwd", &raw, &ptrs, cos_b, h.eps)?;
        Ok(Some(y))
    }

    /// The fused backward, or `None` where it does not apply.
    pub(super) fn backward(
        h: Heads,
        dy: &Tensor,
        extra: Option<&Tensor>,
    ) -> Result<Option<Tensor>> {
        let Some(dev) = device_for(h.raw) else {
            return Ok(None);
        };
        let raw = h.raw.detach().contiguous()?;
        let dy = dy.detach().contiguous()?;
        let extra = extra.map(|e| e.detach().contiguous()).transpose()?;
        let (_held, [w, cos, sin], cos_b) = operands(h.weight, h.rope_tables)?;
        let dx = output(&dev, &raw, raw.dims())?;
        let res = match &extra {
            Some(e) => addr(e, "extra")?,
            None => 0,
        };
        let ptrs = [
            addr(&raw, "raw")?,
            w,
            cos,
            sin,
            addr(&dy, "dy")?,
            res,
            addr(&dx, "dx")?,
        ];
        launch(&dev, "heads_norm_rope_bwd", &raw, &ptrs, cos_b, h.eps)?;
        Ok(Some(dx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::randn;
    use candle_core::{DType, Device};

    #[test]
    fn rejects_mismatched_operands() -> Result<()> {
        let dev = Device::Cpu;
        let raw = randn(&[1, 4, 2, 8], DType::F32, 1, &dev)?;
        let cos = randn(&[1, 4, 8], DType::F32, 2, &dev)?;
        let short = randn(&[1, 3, 8], DType::F32, 2, &dev)?;
        assert!(heads_norm_rope(&raw, None, Some((&cos, &short)), 1e-6).is_err());
        let dy = randn(&[1, 4, 2, 8], DType::F32, 3, &dev)?; // not swapped
        assert!(heads_norm_rope_backward(&raw, None, Some((&cos, &cos)), &dy, 1e-6, None).is_err());
        Ok(())
    }
}
