//! Tensors parked in host memory between a forward and its backward: the offloaded checkpoints of
//! a layer-wise backward. The forward parks each recomputed layer's input when it reaches the
//! layer; the backward walk fetches it back to recompute the layer, after prefetching it while the
//! layer above ran.
//!
//! On CUDA a parked tensor is copied into page-locked host memory on a copy stream of its own, so
//! the copies run beside the compute stream's kernels. Events order the two streams; the host
//! waits on neither (but see the buffers below):
//! - [`HostOffload::park`]: the copy stream waits for the compute stream to reach the call (the
//!   tensor is written), copies device → host and records the copy's end. The device tensor is
//!   held until a later park or prefetch finds its copy ended, and goes back to Candle's pool
//!   then; of the tensors still being copied, the last `in_flight` ([`HostOffload::new`]) stay
//!   held and the compute stream waits for the copies of any older ones before their memory goes
//!   back.
//! - [`HostOffload::prefetch`]: a new device tensor is allocated in the compute stream's order; the
//!   copy stream waits for that point, copies host → device and records the copy's end.
//! - [`HostOffload::fetch`]: the compute stream waits for the prefetch's end and the tensor is
//!   ready for its kernels.
//!
//! A slot's host buffer is kept for the next park into it, and the copy stream runs its copies in
//! order, so a park never overwrites bytes that the slot's last prefetch still reads. A tensor
//! larger than the buffer gets a new one; only then does the host wait, for the copy stream to be
//! done with the old buffer (a batch longer than any before: at most once per slot and length).
//! On the CPU a tensor already lives in host memory: a park keeps it as it is.

use candle_core::{bail, Device, Result, Tensor};

/// Tensors parked in host memory by slot number (see the module docs).
pub struct HostOffload {
    inner: Inner,
}

enum Inner {
    /// CPU tensors, kept as they are.
    Host(Vec<Option<Tensor>>),
    #[cfg(feature = "cuda")]
    Cuda(cuda_impl::CudaOffload),
}

impl HostOffload {
    /// An empty parking for tensors of `device`. `in_flight`: how many parked tensors may
    /// still be copying out when the next park or prefetch comes before the compute stream waits
    /// for the oldest (what one layer parks, so that its parks do not wait for each other).
    pub fn new(device: &Device, in_flight: usize) -> Result<Self> {
        let inner = match device {
            #[cfg(feature = "cuda")]
            Device::Cuda(dev) => Inner::Cuda(cuda_impl::CudaOffload::new(dev, in_flight)?),
            _ => {
                let _ = in_flight; // host tensors are not copied
                Inner::Host(Vec::new())
            }
        };
        Ok(HostOffload { inner })
    }

    /// Parks `t` in `slot`, replacing whatever the slot held. The copy starts now; `t` may be
    /// dropped right after the call.
    pub fn park(&mut self, slot: usize, t: &Tensor) -> Result<()> {
        match &mut self.inner {
            Inner::Host(slots) => {
                if slots.len() <= slot {
                    slots.resize(slot + 1, None);
                }
                slots[slot] = Some(t.clone());
                Ok(())
            }
            #[cfg(feature = "cuda")]
            Inner::Cuda(c) => c.park(slot, t),
        }
    }

    /// Starts bringing `slot`'s tensor back to the device; [`HostOffload::fetch`] waits for it.
    /// Nothing to do when it is already on its way, or on the CPU. Errors when the slot holds no
    /// parked tensor.
    pub fn prefetch(&mut self, slot: usize) -> Result<()> {
        match &mut self.inner {
            Inner::Host(slots) => match slots.get(slot) {
                Some(Some(_)) => Ok(()),
                _ => bail!("host offload: slot {slot} holds no parked tensor"),
            },
            #[cfg(feature = "cuda")]
            Inner::Cuda(c) => c.prefetch(slot),
        }
    }

    /// `slot`'s tensor, back on its device and ready for the compute stream's kernels (prefetched
    /// now if it was not); the slot is empty afterwards. Errors when the slot holds no parked
    /// tensor.
    pub fn fetch(&mut self, slot: usize) -> Result<Tensor> {
        match &mut self.inner {
            Inner::Host(slots) => match slots.get_mut(slot).and_then(Option::take) {
                Some(t) => Ok(t),
                None => bail!("host offload: slot {slot} holds no parked tensor"),
            },
            #[cfg(feature = "cuda")]
            Inner::Cuda(c) => c.fetch(slot),
        }
    }

    /// Lets go of every parked tensor still being copied out: the compute stream waits for the
    /// copies, and the device memory goes back to the pool at this point of its order, however
    /// far ahead of the device the host runs. Nothing to do on the CPU.
    pub fn settle(&mut self) -> Result<()> {
        match &mut self.inner {
            Inner::Host(_) => Ok(()),
            #[cfg(feature = "cuda")]
            Inner::Cuda(c) => c.settle(),
        }
    }

    /// Bytes of host memory the parked tensors take (on CUDA: the page-locked buffers, which stay
    /// allocated for the next parks).
    pub fn host_bytes(&self) -> usize {
        match &self.inner {
            Inner::Host(slots) => slots
                .iter()
                .flatten()
                .map(|t| t.elem_count() * t.dtype().size_in_bytes())
                .sum(),
            #[cfg(feature = "cuda")]
            Inner::Cuda(c) => c.host_bytes(),
        }
    }
}

impl std::fmt::Debug for HostOffload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostOffload")
            .field("host_bytes", &self.host_bytes())
            .finish()
    }
}

#[cfg(feature = "cuda")]
mod cuda_impl {
    use std::collections::HashMap;
    use std::sync::Arc;

    use candle_core::cuda_backend::cudarc::driver::{result, CudaEvent, CudaStream};
    use candle_core::cuda_backend::{CudaDevice, WrapErr};
    use candle_core::{bail, DType, Result, Shape, Storage, Tensor};

    use crate::cuda;

    /// Page-locked host bytes (`cuMemHostAlloc`), freed on drop.
    struct Pinned {
        ptr: *mut u8,
        len: usize,
    }

    // SAFETY: the allocation is owned; its bytes are only read and written by copies that the one
    // copy stream runs in order, and it is freed after that stream is synchronised.
    unsafe impl Send for Pinned {}

    impl Pinned {
        fn new(len: usize) -> Result<Self> {
            // SAFETY: a plain allocation in the bound context; every byte read back was first
            // written by a device → host copy.
            let ptr = unsafe { result::malloc_host(len.max(1), 0) }.map_err(|e| {
                candle_core::Error::Msg(format!(
                    "host offload: page-locked host memory of {len} bytes could not be allocated ({e}); the host's RAM (or its locked-memory limit, `ulimit -l`) holds less than the parked tensors"
                ))
            })?;
            Ok(Pinned {
                ptr: ptr.cast(),
                len,
            })
        }
    }

    impl Drop for Pinned {
        fn drop(&mut self) {
            // SAFETY: allocated by `cuMemHostAlloc`; the owner synchronised the copy stream.
            // An error here has nowhere to go: the process is past the copies that used it.
            let _ = unsafe { result::free_host(self.ptr.cast()) };
        }
    }

    /// One slot's host buffer and what is parked in it.
    struct Slot {
        host: Pinned,
        bytes: usize,
        dtype: DType,
        shape: Shape,
        parked: bool,
    }

    /// [`super::HostOffload`] on one CUDA device.
    pub(super) struct CudaOffload {
        dev: CudaDevice,
        compute: Arc<CudaStream>,
        copy: Arc<CudaStream>,
        slots: Vec<Option<Slot>>,
        /// Parked device tensors whose device → host copy may still run when the next park or
        /// prefetch comes, at most (the older ones make the compute stream wait for their copy).
        in_flight: usize,
        /// Parked device tensors whose device → host copy may still run, with its end.
        leaving: Vec<(Tensor, CudaEvent)>,
        /// Tensors on their way back, by slot, with the host → device copy's end.
        arriving: HashMap<usize, (Tensor, CudaEvent)>,
    }

    impl CudaOffload {
        pub(super) fn new(dev: &CudaDevice, in_flight: usize) -> Result<Self> {
            let compute = dev.cuda_stream();
            let copy = compute.context().new_stream().w()?;
            Ok(CudaOffload {
                dev: dev.clone(),
                compute,
                copy,
                slots: Vec::new(),
                in_flight,
                leaving: Vec::new(),
                arriving: HashMap::new(),
            })
        }

        /// The compute stream waits for `done`, then `t` is dropped: its memory goes back to the
        /// pool in the compute stream's order, after the copy that read or wrote it.
        fn release(&self, t: Tensor, done: &CudaEvent) -> Result<()> {
            self.compute.wait(done).w()?;
            drop(t);
            Ok(())
        }

        /// Drops the parked tensors whose copy has ended, and makes the compute stream wait for
        /// the copies of all but the last `in_flight` others before dropping them too:
        /// tensors parked in a row (a layer's outputs, then the next layer's input) do not hold
        /// the compute stream back on each other's copies.
        fn release_leaving(&mut self) -> Result<()> {
            let mut copying = Vec::with_capacity(self.leaving.len());
            for (t, done) in std::mem::take(&mut self.leaving) {
                if !done.try_is_complete().w()? {
                    copying.push((t, done));
                }
            }
            let older = copying.len().saturating_sub(self.in_flight);
            for (t, done) in copying.drain(..older) {
                self.release(t, &done)?;
            }
            self.leaving = copying;
            Ok(())
        }

        pub(super) fn park(&mut self, slot: usize, t: &Tensor) -> Result<()> {
            let op = "host offload";
            self.compute.context().bind_to_thread().w()?;
            self.release_leaving()?;
            if let Some((stale, done)) = self.arriving.remove(&slot) {
                self.release(stale, &done)?;
            }
            let t = t.contiguous()?;
            let bytes = t.elem_count() * t.dtype().size_in_bytes();
            if self.slots.len() <= slot {
                self.slots.resize_with(slot + 1, || None);
            }
            let src = cuda::addr_of(&t, op, "parked tensor")?;
            let written = self.compute.record_event(None).w()?;
            self.copy.wait(&written).w()?;
            let host = match self.slots[slot].take() {
                Some(s) if s.host.len >= bytes => s.host,
                old => {
                    // The old buffer may still be read by a copy queued on the copy stream.
                    self.copy.synchronize().w()?;
                    drop(old);
                    Pinned::new(bytes)?
                }
            };
            // SAFETY: `src` holds `bytes` bytes and stays allocated until `done` (held in
            // `leaving`); the host buffer holds at least `bytes` and is not read by the host.
            let queued = unsafe {
                let dst = std::slice::from_raw_parts_mut(host.ptr, bytes);
                result::memcpy_dtoh_async(dst, src, self.copy.cu_stream())
            };
            // The buffer stays with the slot either way: a copy queued earlier may still read it.
            self.slots[slot] = Some(Slot {
                host,
                bytes,
                dtype: t.dtype(),
                shape: t.shape().clone(),
                parked: queued.is_ok(),
            });
            queued.w()?;
            let done = self.copy.record_event(None).w()?;
            self.leaving.push((t, done));
            Ok(())
        }

        pub(super) fn prefetch(&mut self, slot: usize) -> Result<()> {
            if self.arriving.contains_key(&slot) {
                return Ok(());
            }
            let op = "host offload";
            self.compute.context().bind_to_thread().w()?;
            self.release_leaving()?;
            let s = match self.slots.get_mut(slot) {
                Some(Some(s)) if s.parked => s,
                _ => bail!("{op}: slot {slot} holds no parked tensor"),
            };
            let t = empty(&self.dev, s.dtype, &s.shape)?;
            let dst = cuda::addr_of(&t, op, "fetched tensor")?;
            let allocated = self.compute.record_event(None).w()?;
            self.copy.wait(&allocated).w()?;
            // SAFETY: `dst` holds `s.bytes` bytes, usable by the copy stream after `allocated`,
            // and is handed to the compute stream only after `done`; the host buffer holds the
            // bytes the slot's park copied, in copy-stream order.
            unsafe {
                let src = std::slice::from_raw_parts(s.host.ptr, s.bytes);
                result::memcpy_htod_async(dst, src, self.copy.cu_stream()).w()?;
            }
            s.parked = false;
            let done = self.copy.record_event(None).w()?;
            self.arriving.insert(slot, (t, done));
            Ok(())
        }

        pub(super) fn fetch(&mut self, slot: usize) -> Result<Tensor> {
            self.prefetch(slot)?;
            let (t, done) = self
                .arriving
                .remove(&slot)
                .expect("prefetch leaves the slot arriving");
            self.compute.wait(&done).w()?;
            Ok(t)
        }

        pub(super) fn settle(&mut self) -> Result<()> {
            self.compute.context().bind_to_thread().w()?;
            for (t, done) in std::mem::take(&mut self.leaving) {
                self.release(t, &done)?;
            }
            Ok(())
        }

        pub(super) fn host_bytes(&self) -> usize {
            self.slots.iter().flatten().map(|s| s.host.len).sum()
        }
    }

    impl Drop for CudaOffload {
        fn drop(&mut self) {
            // Device tensors go back to the pool after their copies, host buffers after the copy
            // stream is done with them. Errors have nowhere to go from a drop.
            let _ = self.compute.context().bind_to_thread();
            for (t, done) in std::mem::take(&mut self.leaving)
                .into_iter()
                .chain(std::mem::take(&mut self.arriving).into_values())
            {
                let _ = self.release(t, &done);
            }
            let _ = self.copy.synchronize();
        }
    }

    /// An uninitialised contiguous tensor of `dtype` and `shape` on `dev` (every byte is written
    /// by the copy before a kernel reads it).
    fn empty(dev: &CudaDevice, dtype: DType, shape: &Shape) -> Result<Tensor> {
        let n = shape.elem_count().max(1);
        // SAFETY: see the doc: the host → device copy writes every byte first.
        let storage = unsafe {
            match dtype {
                DType::F32 => cuda::wrap(dev.alloc::<f32>(n)?, dev),
                DType::BF16 => cuda::wrap(dev.alloc::<half::bf16>(n)?, dev),
                DType::F16 => cuda::wrap(dev.alloc::<half::f16>(n)?, dev),
                other => bail!("host offload: {other:?} tensors are not parked (f32, bf16, f16)"),
            }
        };
        Ok(crate::util::tensor_from_storage(
            Storage::Cuda(storage),
            shape.dims(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_parking_gives_back_the_tensor_once() -> Result<()> {
        let dev = Device::Cpu;
        let mut park = HostOffload::new(&dev, 3)?;
        let a = Tensor::arange(0f32, 6., &dev)?.reshape((2, 3))?;
        let b = Tensor::arange(0u32, 4, &dev)?;
        park.park(3, &a)?;
        park.park(0, &b)?;
        assert_eq!(park.host_bytes(), 6 * 4 + 4 * 4);
        park.prefetch(3)?;
        let got = park.fetch(3)?;
        assert_eq!(got.to_vec2::<f32>()?, a.to_vec2::<f32>()?);
        let err = park.fetch(3).unwrap_err().to_string();
        assert!(err.contains("slot 3 holds no parked tensor"), "{err}");
        assert!(park.prefetch(1).is_err());
        assert_eq!(park.fetch(0)?.to_vec1::<u32>()?, vec![0, 1, 2, 3]);
        Ok(())
    }
}
