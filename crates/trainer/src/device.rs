//! The device a training process computes on.
//!
//! On the GPU, Candle runs everything on one stream of its own, which puts cudarc in multi-stream mode: with
//! cudarc's default event tracking every allocation then creates two CUDA events and every kernel
//! argument records one and waits on another (a `cuEventRecord` / `cuStreamWaitEvent` pair per
//! operand), host work that the single compute stream does not need. The other streams are the
//! NCCL backend's and the copy stream of `g4ft_ops::HostOffload`, which order themselves against
//! the compute stream with their own events and keep every buffer they hand over alive until the
//! compute stream has waited for it (`g4ft_ddp` `comm/nccl.rs`, `g4ft_ops` `offload.rs`). So
//! training devices switch tracking off before allocating.

use std::sync::Once;

use anyhow::{Context, Result};
use candle_core::Device;

/// The CPU, with the thread count of Candle's matmul worked out once per process.
///
/// Unless `RAYON_NUM_THREADS` is set, Candle's CPU matmul asks for the number of physical cores
/// at every call, which on Linux reads and parses `/proc/cpuinfo`: about half the time of the
/// tiny model's CPU step. The first call sets `RAYON_NUM_THREADS` to the count Candle would use
/// (if the user has not set it), after starting rayon's global pool at its own default size, so
/// that the matmuls and the pool run as before and only the repeated read goes away. It sets an
/// environment variable: call it before the process starts threads of its own.
pub fn cpu_training_device() -> Device {
    static THREADS: Once = Once::new();
    THREADS.call_once(|| {
        if std::env::var_os("RAYON_NUM_THREADS").is_none() {
            // An error means the pool already runs, at whatever size it was given.
            let _ = rayon::ThreadPoolBuilder::new().build_global();
            let threads = candle_core::utils::get_num_threads();
            std::env::set_var("RAYON_NUM_THREADS", threads.to_string());
        }
    });
    Device::Cpu
}

/// CUDA device `ordinal` with cudarc's per-buffer event tracking off (see the module doc).
/// Errors if this build has no CUDA support or the device cannot be opened.
pub fn cuda_training_device(ordinal: usize) -> Result<Device> {
    let device = Device::new_cuda(ordinal).with_context(|| {
        format!("opening CUDA device {ordinal} (a build with --features cuda?)")
    })?;
    #[cfg(feature = "cuda")]
    if let Device::Cuda(cuda) = &device {
        // SAFETY: nothing has been allocated on this device yet, and the only other stream (the
        // NCCL backend's) synchronises with the compute stream explicitly (module doc).
        unsafe { cuda.disable_event_tracking() };
    }
    Ok(device)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_device_fixes_candles_thread_count_unless_set() {
        let expected = std::env::var("RAYON_NUM_THREADS")
            .unwrap_or_else(|_| candle_core::utils::get_num_threads().to_string());
        assert!(cpu_training_device().is_cpu());
        assert!(cpu_training_device().is_cpu());
        assert_eq!(std::env::var("RAYON_NUM_THREADS").ok(), Some(expected));
    }
}
