//! NCCL backend (feature `cuda`): one communicator per process, bound to a dedicated
//! highest-priority stream, ordered against Candle's compute stream with events.
//!
//! Design (`docs/design.md`, "Candle facts"): everything is issued from the one host thread that
//! owns the Candle device (`Comm` is `!Send`). Per tensor collective: record an event on the
//! compute stream, make the comm stream wait on it, enqueue NCCL on the comm stream, record `done`
//! there; [`CudaWork::wait`] makes the compute stream wait on `done` and bounds the wait on the
//! host by the timeout. Buffers handed to NCCL are DDP's persistent buckets (or caller-owned
//! tensors kept alive until `wait`), so they outlive the collective even without Candle's event
//! tracking. Small-object gathers and barriers are NCCL collectives too (`ncclAllGather` of each
//! rank's length, then of the blobs padded to the longest; a barrier is the length gather alone),
//! on the comm stream, every host wait bounded by the timeout. The NCCL unique id travels through
//! the store (rank 0 SETs the 128 bytes, the others GET); a one-rank communicator (world size 1,
//! [`crate::GroupOptions::force_nccl`]) needs no store. After a timed-out collective the
//! communicator is aborted on drop without waiting for its streams (a dead peer never finishes).

use super::{check_tensor, Backend, Communicator, ReduceOp, TensorOp, Work, WorkInner};
use crate::error::{RankTag, Result};
use crate::fingerprint::Fingerprint;
use crate::store::StoreClient;
use crate::wait::WaitNotice;
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::CudaStorage;
use candle_core::{CpuStorage, DType, Device, InplaceOp1, Layout, Tensor};
use cudarc::driver::{result as drv, CudaEvent, CudaStream};
use cudarc::nccl::safe::{Comm, Id, ReduceOp as NcclReduce};
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The NCCL communicator of one rank (see module docs).
pub struct NcclComm {
    tag: RankTag,
    comm: Comm,
    device: Device,
    compute: Arc<CudaStream>,
    comm_stream: Arc<CudaStream>,
    // Set when a collective did not complete in time: drop must not wait for the streams.
    failed: Arc<AtomicBool>,
}

impl NcclComm {
    /// Creates the comm stream (highest priority), shares the unique id through the store under
    /// `<ns>/nccl_id` (`store` may be `None` only for a one-rank communicator) and runs
    /// `ncclCommInitRank`. Collective: every rank must call it.
    pub fn new(
        tag: RankTag,
        device: &Device,
        store: Option<&Arc<Mutex<StoreClient>>>,
        ns: &str,
    ) -> Result<Self> {
        let cd = device
            .as_cuda_device()
            .map_err(tag.tensor("NCCL setup: CUDA device"))?;
        let compute = cd.cuda_stream();
        let ctx = compute.context().clone();
        let drv_err = |what: &'static str| {
            move |e: cudarc::driver::DriverError| {
                tag.comm(format!("NCCL setup: {what}"), format!("{e:?}"))
            }
        };
        ctx.bind_to_thread().map_err(drv_err("bind context"))?;
        let (_least, greatest) =
            drv::stream::get_priority_range().map_err(drv_err("stream priority range"))?;
        let comm_stream = ctx
            .new_stream_with_priority(greatest)
            .map_err(drv_err("create comm stream"))?;
        let key = format!("{ns}/nccl_id");
        let new_id =
            || Id::new().map_err(|e| tag.comm("NCCL setup: ncclGetUniqueId", format!("{e:?}")));
        let id = match store {
            None if tag.world == 1 => new_id()?,
            None => {
                return Err(tag.comm(
                    "NCCL setup: unique id",
                    "no store to share it through (world size > 1)",
                ))
            }
            Some(store) if tag.rank == 0 => {
                let id = new_id()?;
                let bytes: Vec<u8> = id.internal().iter().map(|c| *c as u8).collect();
                store
                    .lock()
                    .expect("store lock poisoned")
                    .set(&key, &bytes)?;
                id
            }
            Some(store) => {
                let bytes = store.lock().expect("store lock poisoned").get(&key)?;
                let arr: [u8; 128] = bytes.as_slice().try_into().map_err(|_| {
                    tag.comm(
                        "NCCL setup: unique id",
                        format!("{} bytes in the store, expected 128", bytes.len()),
                    )
                })?;
                Id::uninit(arr.map(|b| b as core::ffi::c_char))
            }
        };
        let comm = Comm::from_rank(comm_stream.clone(), tag.rank, tag.world, id)
            .map_err(|e| tag.comm("NCCL setup: ncclCommInitRank", format!("{e:?}")))?;
        Ok(NcclComm {
            tag,
            comm,
            device: device.clone(),
            compute,
            comm_stream,
            failed: Arc::new(AtomicBool::new(false)),
        })
    }

    /// Fails fast once a collective has failed (the communicator is unusable after that).
    fn usable(&self, fp: &Fingerprint) -> Result<()> {
        if self.failed.load(Ordering::SeqCst) {
            return Err(self.tag.comm(
                fp.to_string(),
                "an earlier NCCL collective failed (timeout or CUDA error); the communicator is unusable",
            ));
        }
        Ok(())
    }

    fn enqueue(
        &self,
        t: &Tensor,
        kind: TensorOp,
        fp: &Fingerprint,
        timeout: Duration,
    ) -> Result<Work> {
        self.usable(fp)?;
        let off_device = (!t.device().same_device(&self.device)).then(|| {
            format!(
                "tensor on {:?}, the NCCL communicator is on {:?}",
                t.device().location(),
                self.device.location()
            )
        });
        check_tensor(self.tag, t, kind, fp, off_device)?;
        if t.elem_count() == 0 {
            return Ok(Work::done());
        }
        let op = NcclInPlace {
            nc: self,
            kind,
            done: RefCell::new(None),
            err: RefCell::new(None),
        };
        t.inplace_op1(&op)
            .map_err(self.tag.tensor(fp.to_string()))?;
        if let Some(e) = op.err.into_inner() {
            return Err(self.tag.comm(fp.to_string(), e));
        }
        let done = op.done.into_inner().ok_or_else(|| {
            self.tag
                .comm(fp.to_string(), "no completion event recorded")
        })?;
        Ok(Work::new(WorkInner::Cuda(CudaWork {
            done,
            compute: self.compute.clone(),
            tag: self.tag,
            what: fp.to_string(),
            timeout,
            failed: self.failed.clone(),
            keep: t.clone(),
        })))
    }

    /// Waits on the host, up to `deadline`, until everything queued on the comm stream is done.
    fn drain(&self, what: &str, timeout: Duration, deadline: Instant) -> Result<()> {
        let ev = self
            .comm_stream
            .record_event(None)
            .map_err(|e| self.tag.comm(what, format!("record event: {e:?}")))?;
        poll(&ev, self.tag, what, timeout, deadline, &self.failed)
    }

    /// `ncclAllGather` of one `T`-typed blob per rank (all of length `mine.len()`), indexed by rank.
    fn gather_equal<T>(
        &self,
        mine: &[T],
        what: &str,
        timeout: Duration,
        deadline: Instant,
    ) -> Result<Vec<T>>
    where
        T: cudarc::nccl::safe::NcclType + cudarc::driver::DeviceRepr + Copy,
    {
        let cs = &self.comm_stream;
        let d = |e: cudarc::driver::DriverError| self.tag.comm(what, format!("{e:?}"));
        // The host copies below synchronise the comm stream: drain it first, with the deadline.
        self.drain(what, timeout, deadline)?;
        let send = cs.clone_htod(mine).map_err(d)?;
        // SAFETY: fully written by the all-gather before it is read back.
        let mut recv = unsafe { cs.alloc::<T>(mine.len() * self.tag.world) }.map_err(d)?;
        self.comm
            .all_gather(&send, &mut recv)
            .map_err(|e| self.tag.comm(what, format!("ncclAllGather: {e:?}")))?;
        self.drain(what, timeout, deadline)?;
        cs.clone_dtoh(&recv).map_err(d)
    }
}

impl Communicator for NcclComm {
    fn backend(&self) -> Backend {
        Backend::Nccl
    }

    fn all_reduce(
        &self,
        t: &Tensor,
        op: ReduceOp,
        fp: &Fingerprint,
        timeout: Duration,
    ) -> Result<Work> {
        self.enqueue(t, TensorOp::Reduce(op), fp, timeout)
    }

    fn broadcast(
        &self,
        t: &Tensor,
        root: usize,
        fp: &Fingerprint,
        timeout: Duration,
    ) -> Result<Work> {
        self.enqueue(t, TensorOp::Bcast(root), fp, timeout)
    }

    fn all_gather_bytes(
        &self,
        bytes: &[u8],
        fp: &Fingerprint,
        timeout: Duration,
    ) -> Result<Vec<Vec<u8>>> {
        self.usable(fp)?;
        let what = fp.to_string();
        let deadline = Instant::now() + timeout;
        let lens = self.gather_equal(&[bytes.len() as u64], &what, timeout, deadline)?;
        let max = lens.iter().copied().max().unwrap_or(0) as usize;
        if max == 0 {
            return Ok(vec![Vec::new(); self.tag.world]);
        }
        let mut padded = bytes.to_vec();
        padded.resize(max, 0);
        let all = self.gather_equal(&padded, &what, timeout, deadline)?;
        Ok(all
            .chunks(max)
            .zip(&lens)
            .map(|(c, n)| c[..*n as usize].to_vec())
            .collect())
    }
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        // Comm's Drop aborts the communicator: let queued collectives finish first, unless one
        // already timed out (its peer is gone; waiting would hang forever).
        if !self.failed.load(Ordering::SeqCst) {
            let _ = self.comm_stream.synchronize();
            let _ = self.compute.synchronize();
        }
    }
}

/// Polls `ev` until it completes; a CUDA error or passing `deadline` marks the communicator failed.
fn poll(
    ev: &CudaEvent,
    tag: RankTag,
    what: &str,
    timeout: Duration,
    deadline: Instant,
    failed: &AtomicBool,
) -> Result<()> {
    let start = Instant::now();
    let mut notice = WaitNotice::new(tag, timeout);
    loop {
        notice.tick(|| format!("NCCL {what} to complete"));
        match ev.try_is_complete() {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => {
                failed.store(true, Ordering::SeqCst);
                return Err(tag.comm(what, format!("CUDA error while waiting: {e:?}")));
            }
        }
        if Instant::now() >= deadline {
            failed.store(true, Ordering::SeqCst);
            return Err(tag.comm(
                what,
                format!("NCCL collective not complete after {timeout:?} (a peer died or diverged)"),
            ));
        }
        // Spin (yielding) for the first millisecond, where a DDP bucket's tail usually ends, then
        // sleep: a 50 µs sleep overshoots by tens of µs, which is exposed at the end of a step.
        if start.elapsed() < SPIN {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

/// How long [`poll`] spins before it sleeps between checks.
const SPIN: Duration = Duration::from_millis(1);

/// Candle in-place op that enqueues the NCCL call on the tensor's CUDA buffer.
struct NcclInPlace<'a> {
    nc: &'a NcclComm,
    kind: TensorOp,
    done: RefCell<Option<CudaEvent>>,
    err: RefCell<Option<String>>,
}

impl NcclInPlace<'_> {
    fn run<T: cudarc::nccl::safe::NcclType + candle_core::cuda_backend::CudaDType>(
        &self,
        s: &mut CudaStorage,
        a: usize,
        b: usize,
    ) -> candle_core::Result<()> {
        let slice = s.as_cuda_slice_mut::<T>()?;
        let mut view = slice.slice_mut(a..b);
        let r = match self.kind {
            TensorOp::Reduce(ReduceOp::Sum) => self
                .nc
                .comm
                .all_reduce_in_place(&mut view, &NcclReduce::Sum),
            TensorOp::Reduce(ReduceOp::Avg) => self
                .nc
                .comm
                .all_reduce_in_place(&mut view, &NcclReduce::Avg),
            TensorOp::Bcast(root) => self.nc.comm.broadcast_in_place(&mut view, root as i32),
        };
        if let Err(e) = r {
            *self.err.borrow_mut() = Some(format!("NCCL: {e:?}"));
        }
        Ok(())
    }
}

impl InplaceOp1 for NcclInPlace<'_> {
    fn name(&self) -> &'static str {
        "g4ft-ddp-nccl"
    }

    fn cpu_fwd(&self, _s: &mut CpuStorage, _l: &Layout) -> candle_core::Result<()> {
        candle_core::bail!("NCCL collective on a CPU tensor")
    }

    fn cuda_fwd(&self, s: &mut CudaStorage, l: &Layout) -> candle_core::Result<()> {
        let (a, b) = l.contiguous_offsets().ok_or_else(|| {
            candle_core::Error::Msg("NCCL collective on a non-contiguous tensor".into())
        })?;
        let w = |e: cudarc::driver::DriverError| candle_core::Error::Msg(format!("{e:?}"));
        // Comm stream waits for all compute work queued so far (the bucket's gradient copies).
        let ready = self.nc.compute.record_event(None).map_err(w)?;
        self.nc.comm_stream.wait(&ready).map_err(w)?;
        match s.dtype() {
            DType::F32 => self.run::<f32>(s, a, b)?,
            DType::F64 => self.run::<f64>(s, a, b)?,
            DType::BF16 => self.run::<half::bf16>(s, a, b)?,
            DType::F16 => self.run::<half::f16>(s, a, b)?,
            DType::U8 => self.run::<u8>(s, a, b)?,
            DType::U32 => self.run::<u32>(s, a, b)?,
            DType::I64 => self.run::<i64>(s, a, b)?,
            other => candle_core::bail!("NCCL: dtype {other:?} not supported"),
        }
        // Recorded after the NCCL call: the compute stream waits on it in CudaWork::wait.
        let done = self.nc.comm_stream.record_event(None).map_err(w)?;
        *self.done.borrow_mut() = Some(done);
        Ok(())
    }
}

/// A queued NCCL collective.
pub(crate) struct CudaWork {
    done: CudaEvent,
    compute: Arc<CudaStream>,
    tag: RankTag,
    what: String,
    timeout: Duration,
    failed: Arc<AtomicBool>,
    // Keeps the buffer alive until the collective is ordered before later compute work.
    keep: Tensor,
}

impl CudaWork {
    /// Orders the compute stream after the collective, then bounds completion on the host by the
    /// timeout (a dead peer would otherwise hang NCCL forever).
    pub(crate) fn wait(self) -> Result<()> {
        self.compute.wait(&self.done).map_err(|e| {
            self.tag
                .comm(&self.what, format!("compute stream wait: {e:?}"))
        })?;
        let deadline = Instant::now() + self.timeout;
        poll(
            &self.done,
            self.tag,
            &self.what,
            self.timeout,
            deadline,
            &self.failed,
        )?;
        drop(self.keep);
        Ok(())
    }
}
