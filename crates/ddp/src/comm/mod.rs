//! The communicator: the one abstraction over collective backends (CPU ring over TCP, NCCL).
//!
//! A backend executes collectives that the [`crate::ProcessGroup`] has already numbered and
//! fingerprinted; tensor collectives are asynchronous (they return a [`Work`]), object gathers
//! are blocking. Invariant: a backend issues collectives in the order it is called; after one
//! failure (timeout, dead peer, desync) every later call fails fast with the original cause.

mod cpu;
mod elem;
#[cfg(feature = "cuda")]
mod nccl;

use crate::error::{RankTag, Result};
use crate::fingerprint::Fingerprint;
use candle_core::Tensor;
use std::time::Duration;

pub use cpu::CpuComm;
#[cfg(feature = "cuda")]
pub use nccl::NcclComm;

/// Reduction of an all-reduce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    /// Element-wise sum.
    Sum,
    /// Element-wise mean over ranks (sum, then divide by world size; floats only).
    Avg,
}

impl ReduceOp {
    /// Name used in fingerprints.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Avg => "avg",
        }
    }
}

/// Which backend a communicator is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// Ring collectives over TCP, executed by a background thread.
    Cpu,
    /// NCCL on a dedicated CUDA stream.
    Nccl,
}

/// A backend that executes collectives (see the module docs for the contract).
pub trait Communicator {
    /// Which backend this is.
    fn backend(&self) -> Backend;

    /// In-place all-reduce of a contiguous tensor; returns once the work is queued.
    fn all_reduce(
        &self,
        t: &Tensor,
        op: ReduceOp,
        fp: &Fingerprint,
        timeout: Duration,
    ) -> Result<Work>;

    /// In-place broadcast of a contiguous tensor from `root`; returns once the work is queued.
    fn broadcast(
        &self,
        t: &Tensor,
        root: usize,
        fp: &Fingerprint,
        timeout: Duration,
    ) -> Result<Work>;

    /// Blocking all-gather of small byte blobs (sizes may differ per rank), indexed by rank.
    fn all_gather_bytes(
        &self,
        bytes: &[u8],
        fp: &Fingerprint,
        timeout: Duration,
    ) -> Result<Vec<Vec<u8>>>;
}

/// A queued collective; [`Work::wait`] returns when its result may be read by the caller
/// (CPU: the data is reduced; CUDA: the compute stream is ordered after it).
#[must_use = "a collective's result is only valid after wait()"]
pub struct Work {
    inner: WorkInner,
}

enum WorkInner {
    Done,
    Cpu {
        rx: std::sync::mpsc::Receiver<Result<()>>,
        tag: RankTag,
        what: String,
        timeout: Duration,
    },
    #[cfg(feature = "cuda")]
    Cuda(nccl::CudaWork),
}

impl Work {
    /// Work that is already complete (world size 1, empty tensors).
    pub fn done() -> Self {
        Work {
            inner: WorkInner::Done,
        }
    }

    /// Waits for the collective. Errors with the collective's failure (timeout naming missing
    /// ranks, dead peer, desync).
    pub fn wait(self) -> Result<()> {
        match self.inner {
            WorkInner::Done => Ok(()),
            WorkInner::Cpu {
                rx,
                tag,
                what,
                timeout,
            } => {
                // The comm thread answers within its own deadline; the margin covers queueing.
                let margin = timeout + timeout + Duration::from_secs(5);
                match rx.recv_timeout(margin) {
                    Ok(r) => r,
                    Err(_) => Err(tag.comm(what, "communicator thread stopped answering")),
                }
            }
            #[cfg(feature = "cuda")]
            WorkInner::Cuda(w) => w.wait(),
        }
    }
}
