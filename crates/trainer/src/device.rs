//! The CUDA device a training process computes on.
//!
//! Candle runs everything on one stream of its own, which puts cudarc in multi-stream mode: with
//! cudarc's default event tracking every allocation then creates two CUDA events and every kernel
//! argument records one and waits on another (a `cuEventRecord` / `cuStreamWaitEvent` pair per
//! operand), host work that the single compute stream does not need. The only other stream is the
//! NCCL backend's, which orders itself against the compute stream with its own events and keeps
//! every buffer it hands to NCCL alive until the compute stream has waited for it
//! (`g4ft_ddp` `comm/nccl.rs`). So training devices switch tracking off before allocating.

use anyhow::{Context, Result};
use candle_core::Device;

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
