//! LoRA dropout with a counter-based mask (`kernels/dropout.cu`) that replays exactly: element `i`
//! of a tensor is kept iff `(mix(k0 ^ mix(k1 ^ mix(k2 ^ mix(i)))) >> 40) >= round(p·2²⁴)`, `mix` =
//! SplitMix64's finaliser, key `[seed, micro_step, module id]`. No RNG state: the per-layer
//! recompute and the backward regenerate the same mask from the key (nothing is stored), and the
//! CPU and CUDA produce identical bits. Kept elements are scaled by `1/(1−p)` (fp32, one rounding),
//! as `torch.nn.Dropout`; the random stream itself cannot match PyTorch's.

use crate::util::{cpu_slice, with_float_type, Elem, Storable};
use candle_core::{
    bail, CpuStorage, CustomOp1, DType, Device, InplaceOp1, Layout, Result, Shape, Tensor,
};

/// SplitMix64's output function.
fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Mask parameters shared by the mask fill and the apply op.
#[derive(Clone, Copy)]
struct Keep {
    key: [u64; 3],
    thresh: u32,
    scale: f32,
}

impl Keep {
    fn new(p: f64, key: [u64; 3]) -> Result<Self> {
        if !(0.0..1.0).contains(&p) {
            bail!("lora_dropout: p must be in [0, 1), got {p}");
        }
        Ok(Keep {
            key,
            thresh: (p * (1u64 << 24) as f64).round() as u32,
            scale: (1.0 / (1.0 - p)) as f32,
        })
    }

    #[inline]
    fn keep(&self, i: u64) -> bool {
        let [k0, k1, k2] = self.key;
        (mix64(k0 ^ mix64(k1 ^ mix64(k2 ^ mix64(i)))) >> 40) as u32 >= self.thresh
    }
}

/// Fills a u8 tensor with the keep mask.
struct MaskFill(Keep);

/// `y = keep ? r(x·scale) : 0`; its backward is itself applied to the gradient.
struct Dropout(Keep);

impl InplaceOp1 for MaskFill {
    fn name(&self) -> &'static str {
        "dropout-mask"
    }

    fn cpu_fwd(&self, s: &mut CpuStorage, l: &Layout) -> Result<()> {
        let (CpuStorage::U8(m), Some((a, b))) = (s, l.contiguous_offsets()) else {
            bail!("dropout-mask: mask must be contiguous u8");
        };
        for (i, x) in m[a..b].iter_mut().enumerate() {
            *x = self.0.keep(i as u64) as u8;
        }
        Ok(())
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, s: &mut candle_core::CudaStorage, l: &Layout) -> Result<()> {
        cuda_impl::mask(s, l, self.0)
    }
}

impl CustomOp1 for Dropout {
    fn name(&self) -> &'static str {
        "lora-dropout"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        with_float_type!(s, self.name(), T => {
            let x = cpu_slice::<T>(s, l, self.name(), "x")?;
            let y = x
                .iter()
                .enumerate()
                .map(|(i, v)| T::from_f32(if self.0.keep(i as u64) { v.to_f32() * self.0.scale } else { 0.0 }))
                .collect();
            Ok((T::storage(y), l.shape().clone()))
        })
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        Ok((cuda_impl::apply(s, l, self.0)?, l.shape().clone()))
    }

    fn bwd(&self, _x: &Tensor, _res: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(g.contiguous()?.apply_op1(Dropout(self.0))?))
    }
}

#[cfg(feature = "cuda")]
mod cuda_impl {
    use super::Keep;
    use crate::cuda::{self, cuda_module, with_cuda_float_type, Module};
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::{LaunchArgs, PushKernelArg};
    use candle_core::cuda_backend::WrapErr;
    use candle_core::{CudaStorage, Layout, Result};

    const MODULE: Module = cuda_module!("dropout");

    fn push_key<'a>(b: &mut LaunchArgs<'a>, k: &'a Keep) {
        b.arg(&k.key[0])
            .arg(&k.key[1])
            .arg(&k.key[2])
            .arg(&k.thresh);
    }

    pub(super) fn mask(s: &mut CudaStorage, l: &Layout, k: Keep) -> Result<()> {
        let dev = s.device().clone();
        let Some((a, b_off)) = l.contiguous_offsets() else {
            candle_core::bail!("dropout-mask: mask must be contiguous");
        };
        let n = b_off - a;
        let mut out = s.as_cuda_slice_mut::<u8>()?.slice_mut(a..b_off);
        let f = cuda::func(&dev, &MODULE, "dropout_mask")?;
        let stream = dev.cuda_stream();
        let mut b = stream.launch_builder(&f);
        b.arg(&mut out).arg(&n);
        push_key(&mut b, &k);
        // SAFETY: out holds n bytes.
        unsafe { b.launch(cuda::elementwise(n)) }.w()?;
        Ok(())
    }

    pub(super) fn apply(s: &CudaStorage, l: &Layout, k: Keep) -> Result<CudaStorage> {
        let dev = s.device().clone();
        let n = l.shape().elem_count();
        with_cuda_float_type!(s, "lora-dropout", T => {
            let x = cuda::view::<T>(s, l, "lora-dropout", "x")?;
            // SAFETY: every element is written by the kernel.
            let y = unsafe { dev.alloc::<T>(n)? };
            let f = cuda::func(&dev, &MODULE, &cuda::kname::<T>("dropout"))?;
            let stream = dev.cuda_stream();
            let mut b = stream.launch_builder(&f);
            b.arg(&x).arg(&y).arg(&n);
            push_key(&mut b, &k);
            b.arg(&k.scale);
            // SAFETY: x and y hold n elements of T.
            unsafe { b.launch(cuda::elementwise(n)) }.w()?;
            Ok(cuda::wrap(y, &dev))
        })
    }
}

/// The dropout key of one module in one micro-step: `[seed, micro_step, FNV-1a(module_path)]`.
/// Use the per-rank seed (the post's `SEED + rank`) and the global micro-batch counter, so the
/// recompute of a layer replays the forward's masks.
pub fn dropout_key(seed: u64, micro_step: u64, module_path: &str) -> [u64; 3] {
    let id = module_path.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    });
    [seed, micro_step, id]
}

/// The keep mask (u8, 1 = keep) of a tensor of `shape` for drop probability `p` in [0, 1) and
/// `key` (see [`dropout_key`]), indexed by the flat row-major element index. Same bits on CPU and
/// CUDA. Errors on `p` outside [0, 1).
pub fn dropout_mask(
    shape: impl Into<Shape>,
    p: f64,
    key: [u64; 3],
    device: &Device,
) -> Result<Tensor> {
    let keep = Keep::new(p, key)?;
    let mask = Tensor::zeros(shape, DType::U8, device)?;
    mask.inplace_op1(&MaskFill(keep))?;
    Ok(mask)
}

/// LoRA dropout: `x` with the elements [`dropout_mask`] drops set to 0 and the others scaled by
/// `1/(1−p)`. The backward applies the same mask (regenerated from `key`, nothing stored).
/// `p == 0` returns `x` unchanged (no kernel). Fused custom op.
pub fn lora_dropout(x: &Tensor, p: f64, key: [u64; 3]) -> Result<Tensor> {
    let keep = Keep::new(p, key)?;
    if p == 0.0 {
        return Ok(x.clone());
    }
    x.contiguous()?.apply_op1(Dropout(keep))
}

/// Composite reference for [`lora_dropout`]: `x · (mask · 1/(1−p))` in fp32, rounded once.
pub fn lora_dropout_slow(x: &Tensor, p: f64, key: [u64; 3]) -> Result<Tensor> {
    let keep = Keep::new(p, key)?;
    let m = dropout_mask(x.dims(), p, key, x.device())?.to_dtype(DType::F32)?;
    x.to_dtype(DType::F32)?
        .mul(&(m * keep.scale as f64)?)?
        .to_dtype(x.dtype())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{check_fused_vs_slow, randn};

    #[test]
    fn fused_matches_slow() -> Result<()> {
        let key = dropout_key(42, 3, "model.layers.0.self_attn.q_proj");
        for dtype in [DType::F32, DType::BF16] {
            let x = randn(&[4, 33], dtype, 1, &Device::Cpu)?;
            check_fused_vs_slow(
                &format!("lora_dropout {dtype:?}"),
                &[x],
                &[true],
                |t| lora_dropout(&t[0], 0.1, key),
                |t| lora_dropout_slow(&t[0], 0.1, key),
                (0.0, 0.0),
            )?;
        }
        Ok(())
    }

    #[test]
    fn mask_replays_and_depends_on_every_key_part() -> Result<()> {
        let dev = Device::Cpu;
        let m = |key| dropout_mask((64, 64), 0.25, key, &dev)?.to_dtype(DType::F32);
        let a = m([1, 2, 3])?;
        let kept = a.mean_all()?.to_scalar::<f32>()?;
        assert!((kept - 0.75).abs() < 0.03, "keep rate {kept}");
        assert_eq!(
            (&a - m([1, 2, 3])?)?.abs()?.sum_all()?.to_scalar::<f32>()?,
            0.0
        );
        for other in [[9, 2, 3], [1, 9, 3], [1, 2, 9]] {
            let d = (&a - m(other)?)?.abs()?.mean_all()?.to_scalar::<f32>()?;
            assert!(
                d > 0.2,
                "key {other:?} gave a mask too close to [1, 2, 3]: {d}"
            );
        }
        Ok(())
    }

    #[test]
    fn bad_probability_is_an_error() {
        assert!(dropout_mask(4, 1.0, [0; 3], &Device::Cpu).is_err());
        assert!(lora_dropout(
            &Tensor::zeros(4, DType::F32, &Device::Cpu).expect("zeros"),
            -0.1,
            [0; 3]
        )
        .is_err());
    }
}
