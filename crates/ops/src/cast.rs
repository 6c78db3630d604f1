//! Several tensors cast to one dtype at once (`kernels/cast.cu`): on CUDA, contiguous fp32 tensors
//! go to bf16 / f16 in one launch per 16 tensors, into one packed buffer of which each result is a
//! view. A decoder layer's LoRA adapters are 14 such tensors (`A` and `B` of 7 projections): one
//! launch where `to_dtype` takes 14. Same bits as Candle's `to_dtype` (round to nearest even);
//! every other case (CPU, other dtypes, strided sources) is `to_dtype` per tensor. The results
//! carry no graph.

use candle_core::{DType, Result, Tensor};

/// Element alignment of each result in the packed buffer (128 bytes of bf16 / f16: the 16-byte
/// operand alignment of the adapter kernels, with room to spare).
#[cfg(feature = "cuda")]
const ALIGN: usize = 64;

/// `tensors`, detached and cast to `dtype` (see the module doc).
pub fn cast_together(tensors: &[&Tensor], dtype: DType) -> Result<Vec<Tensor>> {
    #[cfg(feature = "cuda")]
    if let Some(first) = tensors.first() {
        let packable = matches!(dtype, DType::BF16 | DType::F16)
            && tensors.iter().all(|t| {
                t.dtype() == DType::F32
                    && t.is_contiguous()
                    && t.device().same_device(first.device())
            });
        if let (true, candle_core::Device::Cuda(dev)) = (packable, first.device()) {
            return cuda_impl::cast_packed(dev, tensors, dtype);
        }
    }
    tensors.iter().map(|t| t.detach().to_dtype(dtype)).collect()
}

#[cfg(feature = "cuda")]
mod cuda_impl {
    use super::ALIGN;
    use crate::cuda::{self, cuda_module, Module};
    use candle_core::cuda_backend::cudarc::driver::{DevicePtr, DeviceRepr, LaunchConfig};
    use candle_core::cuda_backend::{CudaDevice, WrapErr};
    use candle_core::{DType, Result, Storage, Tensor};

    const MODULE: Module = cuda_module!("cast");
    /// Segments per launch (the kernel's `CAST_SEGMENTS`).
    const SEGMENTS: usize = 16;

    /// The kernel's `CastSegments`, passed by value.
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct CastSegments {
        src: [u64; SEGMENTS],
        dst: [u64; SEGMENTS],
        n: [u64; SEGMENTS],
    }

    // Plain `repr(C)` data, laid out as the kernel's struct (three arrays of 64-bit values).
    cuda::value_args!(CastSegments);

    /// [`super::cast_together`] on CUDA: contiguous fp32 `tensors` to bf16 / f16 `dtype`.
    pub(super) fn cast_packed(
        dev: &CudaDevice,
        tensors: &[&Tensor],
        dtype: DType,
    ) -> Result<Vec<Tensor>> {
        let offsets: Vec<usize> = tensors
            .iter()
            .scan(0usize, |next, t| {
                let at = *next;
                *next += t.elem_count().next_multiple_of(ALIGN);
                Some(at)
            })
            .collect();
        let total = match (offsets.last(), tensors.last()) {
            (Some(&at), Some(t)) => at + t.elem_count(),
            _ => 0,
        };
        let storage = match dtype {
            DType::BF16 => launch::<half::bf16>(dev, tensors, &offsets, total)?,
            _ => launch::<half::f16>(dev, tensors, &offsets, total)?,
        };
        let packed = crate::util::tensor_from_storage(Storage::Cuda(storage), &[total]);
        tensors
            .iter()
            .zip(&offsets)
            .map(|(t, &at)| packed.narrow(0, at, t.elem_count())?.reshape(t.dims()))
            .collect()
    }

    /// Casts every tensor into one new buffer of `total` elements of `T`, tensor `i` at element
    /// `offsets[i]`.
    fn launch<T: candle_core::cuda_backend::CudaDType + candle_core::WithDType + DeviceRepr>(
        dev: &CudaDevice,
        tensors: &[&Tensor],
        offsets: &[usize],
        total: usize,
    ) -> Result<candle_core::CudaStorage> {
        let name = "cast_together";
        // SAFETY: every result's elements are written below; the gaps between them are never read.
        let out = unsafe { dev.alloc::<T>(total.max(1))? };
        let stream = dev.cuda_stream();
        let out_ptr = out.device_ptr(&stream).0;
        let f = cuda::func(dev, &MODULE, &cuda::kname::<T>("cast_segments"))?;
        for (chunk, offs) in tensors.chunks(SEGMENTS).zip(offsets.chunks(SEGMENTS)) {
            let mut s = CastSegments {
                src: [0; SEGMENTS],
                dst: [0; SEGMENTS],
                n: [0; SEGMENTS],
            };
            for (k, (t, &at)) in chunk.iter().zip(offs).enumerate() {
                s.src[k] = cuda::addr::<f32>(t, name, "source")?;
                s.dst[k] = at as u64;
                s.n[k] = t.elem_count() as u64;
            }
            let longest = chunk.iter().map(|t| t.elem_count()).max().unwrap_or(0);
            let mut cfg: LaunchConfig = cuda::elementwise(longest);
            cfg.grid_dim.1 = chunk.len() as u32;
            let mut b = cuda::launch_args(&stream, &f);
            b.arg(&s).arg(&out_ptr);
            // SAFETY: each source holds n[k] fp32 elements and stays alive (borrowed) until the
            // call returns, after the stream has the work queued in order; the output holds
            // `total` elements, segment k's at dst[k]..dst[k] + n[k].
            unsafe { b.launch(cfg) }.w()?;
        }
        Ok(cuda::wrap(out, dev))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn gives_to_dtypes_bits_and_shapes() -> Result<()> {
        let dev = Device::Cpu;
        let a = Tensor::randn(0f32, 1.0, (3, 5), &dev)?;
        let b = Tensor::randn(0f32, 1.0, (7,), &dev)?;
        let out = cast_together(&[&a, &b], DType::BF16)?;
        for (got, src) in out.iter().zip([&a, &b]) {
            let want = src.to_dtype(DType::BF16)?;
            assert_eq!(got.dims(), src.dims());
            assert_eq!(got.dtype(), DType::BF16);
            let bits = |t: &Tensor| -> Result<Vec<u16>> {
                Ok(t.flatten_all()?
                    .to_vec1::<half::bf16>()?
                    .iter()
                    .map(|v| v.to_bits())
                    .collect())
            };
            assert_eq!(bits(got)?, bits(&want)?);
        }
        Ok(())
    }
}
