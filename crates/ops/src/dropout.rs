//! LoRA dropout with a counter-based mask (`kernels/dropout.cu`) that replays exactly. Kept
//! elements are scaled by `1/(1−p)` (fp32, one rounding), as `torch.nn.Dropout`; the random stream
//! itself cannot match PyTorch's.
//!
//! The mask, for key `[k0, k1, k2] = [seed, micro_step, module id]` and drop probability `p`:
//!
//! - `kk = mix(k0 ^ mix(k1 ^ mix(k2)))`, once per call on the host, with `mix(z) = mix64(z + γ)`
//!   (SplitMix64's output for state `z`, `γ = 0x9E3779B97F4A7C15`; [`g4ft_hash`]);
//! - elements `2j` and `2j+1` share `h = mix(kk + j·γ)` ([`g4ft_hash::stream_u64`]`(kk, j)`),
//!   output `j` of the SplitMix64 generator seeded with `kk`; element `2j` draws
//!   `r = hi32(h) >> 8`, element `2j+1` `r = lo32(h) >> 8`;
//! - the element is kept iff `r >= round(p·2²⁴)`.
//!
//! No RNG state: the per-layer recompute and the backward regenerate the same mask from the key
//! (nothing is stored), and the CPU and CUDA produce identical bits.
//!
//! Why this hash. Cost: the previous definition ran four finalisers (eight 64-bit multiplies, each
//! emulated with 32-bit IMADs) per element, which made the bf16 kernel compute-bound (~82 µs per
//! call at 2048×15360 on the H200); this one runs one finaliser per two elements (2 multiplies),
//! and the CUDA grid-stride loop advances each thread's SplitMix64 state by `stride·γ` with one
//! 64-bit add, so the kernel should be bound by memory (not yet profiled). Quality: the draws are
//! consecutive outputs of SplitMix64 with its golden gamma (Steele, Lea & Flood 2014; passes
//! BigCrush), of which each element uses a disjoint 24-bit field, so every draw is uniform on
//! `[0, 2²⁴)` and the keep rate is exactly `1 − round(p·2²⁴)/2²⁴`, as before. Rejected:
//! `mix(kk ^ i)` (the same generator with gamma 1, which Steele et al. flag as weak: a gamma with
//! few bit transitions); a 32-bit counter hash (two 32-bit multiplies) keyed by XOR or addition
//! (with only 32 key bits the masks of two keys are index permutations of one another, e.g.
//! `mask_K'(i) = mask_K(i ^ K ^ K')`); Philox rounds (one 32×32→64 multiply each, but 7+ rounds
//! for Crush-resistance: more multiplies than one finaliser). Two keys' streams overlap only if
//! their `kk` lie within `n/2` steps of γ of each other (probability ≈ `n/2⁶⁴`).

use crate::util::{cpu_slice, with_float_type, Elem, Storable};
use candle_core::{
    bail, CpuStorage, CustomOp1, DType, Device, InplaceOp1, Layout, Result, Shape, Tensor,
};
use g4ft_hash::{fnv1a64, stream_u64};

/// SplitMix64's output for state `z`: `mix64(z + γ)`.
fn mix(z: u64) -> u64 {
    stream_u64(z, 0)
}

/// Mask parameters shared by the mask fill, the apply op and the raw-pointer launchers.
#[derive(Clone, Copy)]
pub(crate) struct Keep {
    /// The folded key `mix(k0 ^ mix(k1 ^ mix(k2)))`: the SplitMix64 state of element pair 0.
    pub(crate) kk: u64,
    /// Elements whose 24-bit draw is below it are dropped: `round(p·2²⁴)`.
    pub(crate) thresh: u32,
    /// `1/(1−p)`, the kept elements' factor.
    pub(crate) scale: f32,
}

impl Keep {
    /// The mask of drop probability `p` in `[0, 1)` and `key`.
    pub(crate) fn new(p: f64, key: [u64; 3]) -> Result<Self> {
        if !(0.0..1.0).contains(&p) {
            bail!("lora_dropout: p must be in [0, 1), got {p}");
        }
        let [k0, k1, k2] = key;
        Ok(Keep {
            kk: mix(k0 ^ mix(k1 ^ mix(k2))),
            thresh: (p * (1u64 << 24) as f64).round() as u32,
            scale: (1.0 / (1.0 - p)) as f32,
        })
    }

    /// The mask of the elements from `first` on (`first` even): pair `first / 2` becomes pair 0,
    /// i.e. the SplitMix64 state advances by `first / 2` steps of γ.
    #[cfg(feature = "cuda")]
    fn starting_at(self, first: usize) -> Result<Self> {
        if first % 2 == 1 {
            bail!("lora_dropout: a chunk must start at an even element, got {first}");
        }
        Ok(Keep {
            kk: self
                .kk
                .wrapping_add((first as u64 / 2).wrapping_mul(g4ft_hash::GAMMA)),
            ..self
        })
    }

    /// The keep bits of elements `0, 1, 2, …` (endless; zip it with the data).
    fn bits(self) -> impl Iterator<Item = bool> {
        (0u64..).flat_map(move |j| {
            let h = stream_u64(self.kk, j);
            [
                ((h >> 32) as u32 >> 8) >= self.thresh,
                (h as u32 >> 8) >= self.thresh,
            ]
        })
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
        for (x, k) in m[a..b].iter_mut().zip(self.0.bits()) {
            *x = k as u8;
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
                .zip(self.0.bits())
                .map(|(v, k)| T::from_f32(if k { v.to_f32() * self.0.scale } else { 0.0 }))
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
    use crate::cuda::{self, cuda_module, Module};
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::DevicePtr;
    use candle_core::cuda_backend::{CudaDevice, WrapErr};
    use candle_core::{bail, CudaStorage, DType, Layout, Result};

    const MODULE: Module = cuda_module!("dropout");

    /// Grid of a launch over `n` elements: one thread per element pair.
    fn grid(n: usize) -> candle_core::cuda_backend::cudarc::driver::LaunchConfig {
        cuda::elementwise(n.div_ceil(2))
    }

    pub(super) fn mask(s: &mut CudaStorage, l: &Layout, k: Keep) -> Result<()> {
        let dev = s.device().clone();
        let Some((a, b_off)) = l.contiguous_offsets() else {
            bail!("dropout-mask: mask must be contiguous");
        };
        let n = b_off - a;
        let mut out = s.as_cuda_slice_mut::<u8>()?.slice_mut(a..b_off);
        let f = cuda::func(&dev, &MODULE, "dropout_mask")?;
        let stream = dev.cuda_stream();
        let mut b = cuda::launch_args(&stream, &f);
        b.arg(&mut out).arg(&n).arg(&k.kk).arg(&k.thresh);
        // SAFETY: out holds n bytes.
        unsafe { b.launch(grid(n)) }.w()?;
        Ok(())
    }

    /// `dropout_<dtype>` (`y = drop(x)`) or `dropout_acc_<dtype>` (`y += drop(x)`) over `n`
    /// elements at raw device addresses, on candle's stream.
    pub(super) fn launch(
        dev: &CudaDevice,
        root: &str,
        (x, y): (u64, u64),
        n: usize,
        dtype: DType,
        k: Keep,
    ) -> Result<()> {
        let name = cuda::kname_of(root, dtype)?;
        if n == 0 {
            return Ok(());
        }
        let f = cuda::func(dev, &MODULE, &name)?;
        let stream = dev.cuda_stream();
        let mut b = cuda::launch_args(&stream, &f);
        b.arg(&x)
            .arg(&y)
            .arg(&n)
            .arg(&k.kk)
            .arg(&k.thresh)
            .arg(&k.scale);
        // SAFETY: the callers guarantee x and y address n elements of `dtype` on `dev`.
        unsafe { b.launch(grid(n)) }.w()?;
        Ok(())
    }

    pub(super) fn apply(s: &CudaStorage, l: &Layout, k: Keep) -> Result<CudaStorage> {
        let dev = s.device().clone();
        let n = l.shape().elem_count();
        cuda::with_cuda_float_type!(s, "lora-dropout", T => {
            let stream = dev.cuda_stream();
            let x = cuda::view::<T>(s, l, "lora-dropout", "x")?;
            // SAFETY: every element is written by the kernel.
            let y = unsafe { dev.alloc::<T>(n)? };
            let (xp, yp) = (x.device_ptr(&stream).0, y.device_ptr(&stream).0);
            launch(&dev, "dropout", (xp, yp), n, s.dtype(), k)?;
            Ok(cuda::wrap(y, &dev))
        })
    }
}

/// `y = dropout(x)` ([`lora_dropout`]'s forward with drop probability `p` and `key`) between raw
/// device addresses on `dev`: `x` and `y` each address `n` contiguous elements of `dtype` (f32,
/// bf16 or f16), elements `first..first + n` of the masked tensor (`first` even: a chunk of it),
/// that stay alive until candle's stream `dev.cuda_stream()` (where it runs) has executed it; they
/// may be equal (in place). Errors on `p` outside `[0, 1)`, an odd `first` or another dtype.
#[cfg(feature = "cuda")]
pub(crate) fn cuda_dropout_into(
    dev: &candle_core::cuda_backend::CudaDevice,
    (x, y): (u64, u64),
    (first, n): (usize, usize),
    dtype: DType,
    p: f64,
    key: [u64; 3],
) -> Result<()> {
    let keep = Keep::new(p, key)?.starting_at(first)?;
    cuda_impl::launch(dev, "dropout", (x, y), n, dtype, keep)
}

/// `dx += dropout(t)` between raw device addresses on `dev`: for the elements [`dropout_mask`]
/// keeps, `dx = r(dx + t·1/(1−p))` (one fp32 fma, one rounding to `dtype`); dropped elements of
/// `dx` are not touched. `t` and `dx` each address `n` contiguous elements of `dtype` (f32, bf16
/// or f16), elements `first..first + n` of the masked tensor (`first` even), valid until candle's
/// stream `dev.cuda_stream()` (where it runs) has executed it. The dropout backward accumulated
/// into an existing gradient, e.g. a fused LoRA linear's `dx`. Errors on `p` outside `[0, 1)`, an
/// odd `first` or another dtype.
#[cfg(feature = "cuda")]
pub(crate) fn cuda_dropout_acc(
    dev: &candle_core::cuda_backend::CudaDevice,
    (t, dx): (u64, u64),
    (first, n): (usize, usize),
    dtype: DType,
    p: f64,
    key: [u64; 3],
) -> Result<()> {
    let keep = Keep::new(p, key)?.starting_at(first)?;
    cuda_impl::launch(dev, "dropout_acc", (t, dx), n, dtype, keep)
}

/// The dropout key of one module in one micro-step: `[seed, micro_step, FNV-1a(module_path)]`.
/// Use the per-rank seed (the post's `SEED + rank`) and the global micro-batch counter, so the
/// recompute of a layer replays the forward's masks.
pub fn dropout_key(seed: u64, micro_step: u64, module_path: &str) -> [u64; 3] {
    [seed, micro_step, fnv1a64(module_path.as_bytes())]
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
    fn odd_lengths_and_offsets_match_the_mask() -> Result<()> {
        // 99 elements: the last pair is half; a narrowed view starts mid-pair.
        let key = [4, 5, 6];
        let x = Tensor::ones((3, 33), DType::F32, &Device::Cpu)?;
        let y = lora_dropout(&x, 0.5, key)?;
        let m = dropout_mask((3, 33), 0.5, key, &Device::Cpu)?.to_dtype(DType::F32)?;
        assert_eq!((y - (m * 2.0)?)?.abs()?.sum_all()?.to_scalar::<f32>()?, 0.0);
        let tail = Tensor::ones(99, DType::F32, &Device::Cpu)?.narrow(0, 1, 97)?;
        let m97 = dropout_mask(97, 0.5, key, &Device::Cpu)?.to_dtype(DType::F32)?;
        let y97 = lora_dropout(&tail, 0.5, key)?;
        assert_eq!(
            (y97 - (m97 * 2.0)?)?.abs()?.sum_all()?.to_scalar::<f32>()?,
            0.0,
            "the mask is indexed from the op's first element"
        );
        Ok(())
    }

    #[test]
    fn draws_of_a_pair_and_of_neighbouring_pairs_are_independent() -> Result<()> {
        // Both elements of a pair come from one SplitMix64 output: their keep bits (and those of
        // adjacent pairs) must be uncorrelated. 2^16 pairs at p = 0.5: the joint keep rate
        // (0.25) has a standard error of ~0.0017.
        let n = 1 << 17;
        let m: Vec<u8> = dropout_mask(n, 0.5, [7, 8, 9], &Device::Cpu)?.to_vec1()?;
        let both = |d: usize| {
            let hits = (0..n - d)
                .step_by(2)
                .filter(|&i| m[i] & m[i + d] == 1)
                .count();
            hits as f64 / ((n - d).div_ceil(2)) as f64
        };
        for d in [1, 2, 3] {
            let r = both(d);
            assert!((r - 0.25).abs() < 0.01, "P(keep i and i+{d}) = {r}");
        }
        let kept = m.iter().map(|&b| b as f64).sum::<f64>() / n as f64;
        assert!((kept - 0.5).abs() < 0.01, "keep rate {kept}");
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

/// GPU check of the raw-pointer launchers (feature `cuda`, GPU machine; picked by the `gpu_` filter
/// of `src/gpu_tests.rs`): bit-exact against the CPU mask on an odd length, at pair-aligned and
/// misaligned addresses, f32 and bf16.
#[cfg(all(test, feature = "cuda"))]
mod gpu_launcher_tests {
    use super::*;
    use crate::testing::randn;

    /// Device address of element `off` of the contiguous GPU tensor `t`.
    fn addr(t: &Tensor, off: usize) -> Result<u64> {
        let base = crate::cuda::addr_of(t, "test", "t")?;
        Ok(base + (off * t.dtype().size_in_bytes()) as u64)
    }

    #[test]
    fn gpu_dropout_launchers_match_cpu() -> Result<()> {
        let gpu = Device::new_cuda(0)?;
        let Device::Cuda(cd) = &gpu else {
            bail!("not a CUDA device")
        };
        let (n, p, key) = (1001usize, 0.3, [11, 12, 13]);
        for dtype in [DType::F32, DType::BF16] {
            for off in [0usize, 1] {
                let x = randn(&[n + 1], dtype, 1, &Device::Cpu)?;
                let d = randn(&[n + 1], dtype, 2, &Device::Cpu)?;
                let (xg, yg, dg) = (
                    x.to_device(&gpu)?,
                    x.zeros_like()?.to_device(&gpu)?,
                    d.to_device(&gpu)?,
                );
                // Two chunks (elements 0..6 and 6..n) must give the mask of one launch.
                for (first, len) in [(0, 6), (6, n - 6)] {
                    let (xa, ya, da) = (
                        addr(&xg, off + first)?,
                        addr(&yg, off + first)?,
                        addr(&dg, off + first)?,
                    );
                    cuda_dropout_into(cd, (xa, ya), (first, len), dtype, p, key)?;
                    cuda_dropout_acc(cd, (xa, da), (first, len), dtype, p, key)?;
                }
                let xs = x.narrow(0, off, n)?;
                let want_y = lora_dropout(&xs, p, key)?;
                let keep = Keep::new(p, key)?;
                let xs32: Vec<f32> = xs.to_dtype(DType::F32)?.to_vec1()?;
                let ds32: Vec<f32> = d.narrow(0, off, n)?.to_dtype(DType::F32)?.to_vec1()?;
                let acc: Vec<f32> = xs32
                    .iter()
                    .zip(&ds32)
                    .zip(keep.bits())
                    .map(|((&t, &g), k)| if k { t.mul_add(keep.scale, g) } else { g })
                    .collect();
                let want_d = Tensor::new(acc, &Device::Cpu)?.to_dtype(dtype)?;
                for (what, got, want) in [
                    (
                        "into",
                        yg.to_device(&Device::Cpu)?.narrow(0, off, n)?,
                        want_y,
                    ),
                    (
                        "acc",
                        dg.to_device(&Device::Cpu)?.narrow(0, off, n)?,
                        want_d,
                    ),
                ] {
                    let bad = got
                        .ne(&want)?
                        .to_dtype(DType::F32)?
                        .sum_all()?
                        .to_scalar::<f32>()?;
                    if bad != 0.0 {
                        bail!("cuda_dropout_{what} {dtype:?} offset {off}: {bad} of {n} differ");
                    }
                }
            }
        }
        Ok(())
    }
}
