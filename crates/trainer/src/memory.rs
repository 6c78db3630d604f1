//! Peak memory for the log line and benchmarks: on CUDA the device's default memory pool (Candle
//! allocates every tensor with `cuMemAllocAsync` from it), whose used-memory high-water mark is
//! the analogue of `torch.cuda.max_memory_allocated`; on CPU the process's resident set.

use anyhow::{Context, Result};
use candle_core::Device;

/// Peak-memory probe: the CUDA pool's high-water mark or the process's peak RSS.
pub enum MemProbe {
    /// The CUDA device's default memory pool.
    #[cfg(feature = "cuda")]
    Pool(cuda_pool::Pool),
    /// Host process memory (CPU training).
    Rss,
}

impl MemProbe {
    /// Probe for `device`; on CUDA also raises the pool's release threshold to `u64::MAX`.
    pub fn new(device: &Device) -> Result<Self> {
        match device {
            #[cfg(feature = "cuda")]
            Device::Cuda(d) => Ok(MemProbe::Pool(cuda_pool::Pool::new(d)?)),
            _ => Ok(MemProbe::Rss),
        }
    }

    /// Memory in use now (pool) / resident now (RSS), bytes.
    pub fn current(&self) -> Result<u64> {
        match self {
            #[cfg(feature = "cuda")]
            MemProbe::Pool(p) => p.used_current(),
            MemProbe::Rss => proc_status_kb("VmRSS:").map(|kb| kb * 1024),
        }
    }

    /// High-water mark since the last reset (pool) / since process start (RSS), bytes.
    pub fn peak(&self) -> Result<u64> {
        match self {
            #[cfg(feature = "cuda")]
            MemProbe::Pool(p) => p.used_high(),
            MemProbe::Rss => proc_status_kb("VmHWM:").map(|kb| kb * 1024),
        }
    }

    /// Restarts the high-water mark (pool only; RSS peak cannot be reset).
    pub fn reset_peak(&self) -> Result<()> {
        match self {
            #[cfg(feature = "cuda")]
            MemProbe::Pool(p) => p.reset_high(),
            MemProbe::Rss => Ok(()),
        }
    }

    /// What [`MemProbe::peak`] measures, for logs.
    pub fn what(&self) -> &'static str {
        match self {
            #[cfg(feature = "cuda")]
            MemProbe::Pool(_) => "cuda mem-pool used high-water mark",
            MemProbe::Rss => "process peak RSS (VmHWM)",
        }
    }
}

/// A `kB` field of `/proc/self/status`.
fn proc_status_kb(field: &str) -> Result<u64> {
    let s = std::fs::read_to_string("/proc/self/status").context("reading /proc/self/status")?;
    let line = s
        .lines()
        .find(|l| l.starts_with(field))
        .with_context(|| format!("/proc/self/status has no {field}"))?;
    line[field.len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .with_context(|| format!("parsing {line:?}"))
}

#[cfg(feature = "cuda")]
mod cuda_pool {
    //! The device's default memory pool (candle allocates with `cuMemAllocAsync` from it).
    use anyhow::{Context, Result};
    use candle_core::cuda_backend::cudarc::driver::{result, sys};
    use candle_core::cuda_backend::CudaDevice;

    /// The default pool of one device.
    pub struct Pool(sys::CUmemoryPool);

    impl Pool {
        /// Looks the pool up and raises its release threshold to `u64::MAX` so freed blocks stay
        /// mapped across synchronisations (`docs/design.md`, "Candle facts").
        pub fn new(dev: &CudaDevice) -> Result<Self> {
            let stream = dev.cuda_stream();
            let ctx = stream.context();
            ctx.bind_to_thread().context("binding the CUDA context")?;
            // SAFETY: the device handle comes from a live context.
            let pool = unsafe { result::device::get_default_mem_pool(ctx.cu_device()) }
                .context("cuDeviceGetDefaultMemPool")?;
            let p = Pool(pool);
            p.set(
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                u64::MAX,
            )?;
            Ok(p)
        }

        fn get(&self, attr: sys::CUmemPool_attribute) -> Result<u64> {
            let mut v: u64 = 0;
            // SAFETY: the attributes used here are all 64-bit values.
            unsafe { result::mem_pool::get_attribute(self.0, attr, (&mut v as *mut u64).cast()) }
                .with_context(|| format!("cuMemPoolGetAttribute {attr:?}"))?;
            Ok(v)
        }

        fn set(&self, attr: sys::CUmemPool_attribute, mut v: u64) -> Result<()> {
            // SAFETY: as in `get`.
            unsafe { result::mem_pool::set_attribute(self.0, attr, (&mut v as *mut u64).cast()) }
                .with_context(|| format!("cuMemPoolSetAttribute {attr:?}"))
        }

        /// Bytes in use now.
        pub fn used_current(&self) -> Result<u64> {
            self.get(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)
        }

        /// High-water mark of bytes in use.
        pub fn used_high(&self) -> Result<u64> {
            self.get(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH)
        }

        /// Restarts the high-water mark.
        pub fn reset_high(&self) -> Result<()> {
            self.set(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH, 0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_probe_reports_resident_memory() {
        let p = MemProbe::new(&Device::Cpu).unwrap();
        assert!(p.current().unwrap() > 0);
        assert!(p.peak().unwrap() >= p.current().unwrap());
        assert_eq!(p.what(), "process peak RSS (VmHWM)");
    }
}
