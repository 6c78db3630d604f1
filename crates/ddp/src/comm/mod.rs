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
use crate::fingerprint::{Agreement, Fingerprint};
use candle_core::{DType, Tensor};
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

/// A tensor collective as a backend executes it: an all-reduce with its reduction, or a
/// broadcast from a root rank.
#[derive(Debug, Clone, Copy)]
pub(crate) enum TensorOp {
    Reduce(ReduceOp),
    Bcast(usize),
}

/// What every backend requires of a tensor collective's buffer, checked in this order: on the
/// backend's device (`off_device` is the backend's own check: `Some(why)` when the tensor is
/// elsewhere), contiguous, and an element type the collective supports (f32 f64 bf16 f16 u8 u32
/// i64; avg only floats). Errors name the collective `fp`.
pub(crate) fn check_tensor(
    tag: RankTag,
    t: &Tensor,
    op: TensorOp,
    fp: &Fingerprint,
    off_device: Option<String>,
) -> Result<()> {
    let bad = |why: String| Err(tag.comm(fp.to_string(), why));
    if let Some(why) = off_device {
        return bad(why);
    }
    if !t.is_contiguous() {
        return bad("tensor is not contiguous (call .contiguous() first)".into());
    }
    let float = matches!(
        t.dtype(),
        DType::F32 | DType::F64 | DType::BF16 | DType::F16
    );
    let int = matches!(t.dtype(), DType::U8 | DType::U32 | DType::I64);
    match op {
        TensorOp::Reduce(ReduceOp::Avg) if !float => {
            bad(format!("avg needs a float dtype, got {:?}", t.dtype()))
        }
        _ if !(float || int) => bad(format!(
            "dtype {:?} not supported (f32 f64 bf16 f16 u8 u32 i64)",
            t.dtype()
        )),
        _ => Ok(()),
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
    /// The fingerprint agreement still to run before the result may be read (queued NCCL
    /// all-reduces; see [`Agreement`]).
    agreement: Option<Agreement>,
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
        Work::new(WorkInner::Done)
    }

    fn new(inner: WorkInner) -> Self {
        Work {
            inner,
            agreement: None,
        }
    }

    /// This work with `agreement` checked first in [`Work::wait`].
    pub(crate) fn with_agreement(mut self, agreement: Option<Agreement>) -> Self {
        self.agreement = agreement;
        self
    }

    /// Waits for the collective. Errors with the collective's failure (desync, timeout naming
    /// missing ranks, dead peer); a deferred fingerprint agreement is checked first.
    pub fn wait(self) -> Result<()> {
        let Work { inner, agreement } = self;
        if let Some(Err(e)) = agreement.as_ref().map(Agreement::check) {
            // The ranks diverged: the collective may never complete and (CUDA) may still write
            // into its buffer, so the buffer stays allocated; the error ends the process group.
            std::mem::forget(inner);
            return Err(e);
        }
        match inner {
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

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    const TAG: RankTag = RankTag { rank: 0, world: 2 };

    fn fp() -> Fingerprint {
        Fingerprint {
            seq: 7,
            op: "all_reduce(avg)".into(),
            dtype: "f32".into(),
            numel: 6,
            site: "here".into(),
        }
    }

    /// The error message of [`check_tensor`], or `None` when the tensor passes.
    fn why(t: &Tensor, op: TensorOp, off_device: Option<&str>) -> Option<String> {
        check_tensor(TAG, t, op, &fp(), off_device.map(String::from))
            .err()
            .map(|e| e.to_string())
    }

    #[test]
    fn tensor_checks_run_in_order_and_name_the_collective() {
        let f32s = Tensor::zeros((2, 3), DType::F32, &Device::Cpu).unwrap();
        let strided = f32s.t().unwrap();
        assert!(!strided.is_contiguous());
        let avg = TensorOp::Reduce(ReduceOp::Avg);
        assert_eq!(why(&f32s, avg, None), None);
        // The backend's device check comes first, then contiguity.
        let msg = why(&strided, avg, Some("tensor on elsewhere")).unwrap();
        assert_eq!(
            msg,
            "rank 0/2: all_reduce(avg) #7 (f32 x 6) at here: tensor on elsewhere"
        );
        let msg = why(&strided, avg, None).unwrap();
        assert!(
            msg.ends_with("tensor is not contiguous (call .contiguous() first)"),
            "{msg}"
        );
        // Integers: sum and broadcast, never avg; other dtypes not at all.
        let u32s = f32s.to_dtype(DType::U32).unwrap();
        assert_eq!(why(&u32s, TensorOp::Reduce(ReduceOp::Sum), None), None);
        assert_eq!(why(&u32s, TensorOp::Bcast(1), None), None);
        let msg = why(&u32s, avg, None).unwrap();
        assert!(msg.ends_with("avg needs a float dtype, got U32"), "{msg}");
        let i32s = f32s.to_dtype(DType::I32).unwrap();
        let msg = why(&i32s, TensorOp::Bcast(0), None).unwrap();
        assert!(
            msg.ends_with("dtype I32 not supported (f32 f64 bf16 f16 u8 u32 i64)"),
            "{msg}"
        );
    }

    #[test]
    fn cpu_backend_checks_before_the_world_size_1_shortcut() {
        let comm = CpuComm::single(RankTag { rank: 0, world: 1 });
        let t = Tensor::zeros((2, 3), DType::U8, &Device::Cpu).unwrap();
        let avg = comm.all_reduce(&t, ReduceOp::Avg, &fp(), Duration::from_secs(1));
        let msg = avg.err().expect("avg of u8 is refused").to_string();
        assert!(msg.contains("avg needs a float dtype, got U8"), "{msg}");
        comm.broadcast(&t, 0, &fp(), Duration::from_secs(1))
            .unwrap()
            .wait()
            .unwrap();
    }
}
