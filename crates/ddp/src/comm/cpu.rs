//! CPU backend: ring collectives over TCP, run by one background thread per process group.
//!
//! Topology: rank r sends to `r+1` and receives from `r-1` (mod world) over two sockets whose
//! addresses are exchanged through the store. All-reduce is the bandwidth-optimal ring
//! (reduce-scatter then all-gather, `2(w-1)` steps); broadcast is a pipelined pass along the
//! ring from the root; object all-gather is a `(w-1)`-step ring. Every frame carries the sender's
//! [`Fingerprint`], checked against ours (desync → error, never a silent mix of collectives).
//! A separate sender thread writes, so a step's send and receive run concurrently (no deadlock
//! on full socket buffers). On any failure the rank sends an abort frame with the cause to its
//! successor and closes both sockets: the failure travels around the ring in milliseconds.
//! Invariant: results are bit-identical on all ranks (each chunk is reduced on one rank, then
//! copied), so replicas never drift through the communicator.

use super::elem::Elem;
use super::{check_tensor, Backend, Communicator, ReduceOp, TensorOp, Work, WorkInner};
use crate::error::{DdpError, RankTag, Result};
use crate::fingerprint::{Fingerprint, Ledger};
use crate::store::{is_timeout, StoreClient};
use crate::wait::WaitNotice;
use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, InplaceOp1, Layout, Tensor};
use std::cell::RefCell;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const MAGIC: u32 = 0x4734_4654; // "G4FT"
const ABORT_SEQ: u64 = u64::MAX;
const BCAST_PIECE: usize = 4 << 20;

/// The CPU ring communicator (see the module docs).
pub struct CpuComm {
    tag: RankTag,
    jobs: Option<Sender<Job>>,
    worker: Option<JoinHandle<()>>,
}

struct Job {
    fp: Fingerprint,
    timeout: Duration,
    kind: JobKind,
}

enum JobKind {
    Tensor(Tensor, TensorOp, Sender<Result<()>>),
    Gather(Vec<u8>, Sender<Result<Vec<Vec<u8>>>>),
}

impl CpuComm {
    /// Connects the ring: publishes this rank's listening address under `<ns>/addr/<rank>`,
    /// connects to the successor and accepts the predecessor, all within `timeout`.
    /// `ledger` (optional) lets timeouts name the ranks that never arrived.
    pub fn connect(
        tag: RankTag,
        store: &Arc<Mutex<StoreClient>>,
        ns: &str,
        ledger: Option<Arc<Ledger>>,
        timeout: Duration,
    ) -> Result<Self> {
        if tag.world == 1 {
            return Ok(Self::single(tag));
        }
        let deadline = Instant::now() + timeout;
        let (prev, next) = (
            (tag.rank + tag.world - 1) % tag.world,
            (tag.rank + 1) % tag.world,
        );
        let setup = |e: io::Error| tag.comm("cpu ring setup", e.to_string());
        let ip = store.lock().expect("store lock poisoned").local_ip()?;
        let listener = TcpListener::bind((ip, 0)).map_err(setup)?;
        let me = listener.local_addr().map_err(setup)?.to_string();
        let next_addr = {
            let mut s = store.lock().expect("store lock poisoned");
            s.set(&format!("{ns}/addr/{}", tag.rank), me.as_bytes())?;
            let b = s.get(&format!("{ns}/addr/{next}"))?;
            String::from_utf8(b)
                .map_err(|_| tag.comm("cpu ring setup", "peer address not UTF-8"))?
        };
        let mut tx = connect_retry(&next_addr, deadline).map_err(|e| {
            tag.comm(
                format!("cpu ring setup: connect to rank {next} at {next_addr}"),
                e.to_string(),
            )
        })?;
        let mut hello = MAGIC.to_ne_bytes().to_vec();
        hello.extend_from_slice(&(tag.rank as u64).to_ne_bytes());
        tx.write_all(&hello).map_err(setup)?;
        let mut rx = accept_until(&listener, deadline).map_err(|e| {
            tag.comm(
                format!("cpu ring setup: accept from rank {prev}"),
                e.to_string(),
            )
        })?;
        let mut got = [0u8; 12];
        read_full(&mut rx, &mut got, deadline, None).map_err(setup)?;
        let who = u64::from_ne_bytes(got[4..].try_into().expect("8 bytes"));
        if got[..4] != MAGIC.to_ne_bytes() || who != prev as u64 {
            return Err(tag.comm(
                "cpu ring setup",
                format!("hello from rank {who}, expected rank {prev}"),
            ));
        }
        for s in [&tx, &rx] {
            let _ = s.set_nodelay(true);
        }
        let shut = vec![
            tx.try_clone().map_err(setup)?,
            rx.try_clone().map_err(setup)?,
        ];
        let (ftx, frx) = channel();
        let send_failed = Arc::new(Mutex::new(None));
        let (sf, sh) = (
            send_failed.clone(),
            shut.iter().flat_map(|s| s.try_clone()).collect(),
        );
        std::thread::Builder::new()
            .name(format!("ddp-send-{}", tag.rank))
            .spawn(move || sender_loop(tx, frx, sf, sh))
            .map_err(|e| DdpError::io("spawn ddp sender thread", e))?;
        let ring = Ring {
            tag,
            prev,
            next,
            rx,
            tx: ftx,
            send_failed,
            shut,
            ledger,
            failed: None,
            timeout,
            notice: WaitNotice::new(tag, timeout),
        };
        let (jtx, jrx) = channel();
        let worker = std::thread::Builder::new()
            .name(format!("ddp-comm-{}", tag.rank))
            .spawn(move || worker_loop(ring, jrx))
            .map_err(|e| DdpError::io("spawn ddp comm thread", e))?;
        Ok(CpuComm {
            tag,
            jobs: Some(jtx),
            worker: Some(worker),
        })
    }

    /// The communicator of a one-process group: every collective is the identity.
    pub fn single(tag: RankTag) -> Self {
        CpuComm {
            tag,
            jobs: None,
            worker: None,
        }
    }

    fn submit(&self, job: Job) -> Result<()> {
        let what = job.fp.to_string();
        match &self.jobs {
            Some(j) => j
                .send(job)
                .map_err(|_| self.tag.comm(what, "communicator thread has exited")),
            None => Err(self.tag.comm(what, "no communicator thread (world size 1)")),
        }
    }

    fn tensor_job(
        &self,
        t: &Tensor,
        kind: TensorOp,
        fp: &Fingerprint,
        timeout: Duration,
    ) -> Result<Work> {
        let off_device = (!t.device().is_cpu()).then(|| {
            format!(
                "tensor on {:?}, the CPU backend needs CPU tensors",
                t.device().location()
            )
        });
        check_tensor(self.tag, t, kind, fp, off_device)?;
        if self.jobs.is_none() || t.elem_count() == 0 {
            return Ok(Work::done());
        }
        let (tx, rx) = channel();
        let job = Job {
            fp: fp.clone(),
            timeout,
            kind: JobKind::Tensor(t.clone(), kind, tx),
        };
        self.submit(job)?;
        Ok(Work::new(WorkInner::Cpu {
            rx,
            tag: self.tag,
            what: fp.to_string(),
            timeout,
        }))
    }
}

impl Communicator for CpuComm {
    fn backend(&self) -> Backend {
        Backend::Cpu
    }

    fn all_reduce(
        &self,
        t: &Tensor,
        op: ReduceOp,
        fp: &Fingerprint,
        timeout: Duration,
    ) -> Result<Work> {
        self.tensor_job(t, TensorOp::Reduce(op), fp, timeout)
    }

    fn broadcast(
        &self,
        t: &Tensor,
        root: usize,
        fp: &Fingerprint,
        timeout: Duration,
    ) -> Result<Work> {
        self.tensor_job(t, TensorOp::Bcast(root), fp, timeout)
    }

    fn all_gather_bytes(
        &self,
        bytes: &[u8],
        fp: &Fingerprint,
        timeout: Duration,
    ) -> Result<Vec<Vec<u8>>> {
        if self.jobs.is_none() {
            return Ok(vec![bytes.to_vec()]);
        }
        let (tx, rx) = channel();
        let job = Job {
            fp: fp.clone(),
            timeout,
            kind: JobKind::Gather(bytes.to_vec(), tx),
        };
        self.submit(job)?;
        rx.recv_timeout(timeout + timeout + Duration::from_secs(5))
            .map_err(|_| {
                self.tag
                    .comm(fp.to_string(), "communicator thread stopped answering")
            })?
    }
}

impl Drop for CpuComm {
    fn drop(&mut self) {
        self.jobs = None; // closes the queue: the worker finishes queued jobs, then exits
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

fn worker_loop(mut ring: Ring, jobs: Receiver<Job>) {
    for job in jobs {
        let fp = job.fp;
        match job.kind {
            JobKind::Tensor(t, kind, reply) => {
                let r = ring.guard(&fp, job.timeout, |ring, deadline| {
                    ring.tensor(&t, kind, &fp, deadline)
                });
                let _ = reply.send(r);
            }
            JobKind::Gather(bytes, reply) => {
                let r = ring.guard(&fp, job.timeout, |ring, deadline| {
                    ring.gather(bytes, &fp, deadline)
                });
                let _ = reply.send(r);
            }
        }
    }
}

enum Frame {
    Data {
        head: Vec<u8>,
        payload: Vec<u8>,
        deadline: Instant,
    },
    Abort(Vec<u8>),
    /// Answered once every earlier frame is written to the socket.
    Flush(Sender<()>),
}

fn sender_loop(
    mut s: TcpStream,
    rx: Receiver<Frame>,
    failed: Arc<Mutex<Option<String>>>,
    shut: Vec<TcpStream>,
) {
    for frame in rx {
        let (res, stop) = match frame {
            Frame::Data {
                head,
                payload,
                deadline,
            } => {
                let left = deadline.saturating_duration_since(Instant::now());
                let _ = s.set_write_timeout(Some(left.max(Duration::from_millis(1))));
                (
                    s.write_all(&head).and_then(|_| s.write_all(&payload)),
                    false,
                )
            }
            Frame::Abort(b) => {
                let _ = s.set_write_timeout(Some(Duration::from_secs(1)));
                (s.write_all(&b), true)
            }
            Frame::Flush(ack) => {
                let _ = ack.send(());
                (Ok(()), false)
            }
        };
        if let Err(e) = &res {
            let mut f = failed.lock().expect("send_failed lock poisoned");
            f.get_or_insert_with(|| peer_io_reason(e));
        }
        if res.is_err() || stop {
            for c in &shut {
                let _ = c.shutdown(Shutdown::Both);
            }
            return;
        }
    }
}

struct Ring {
    tag: RankTag,
    prev: usize,
    next: usize,
    rx: TcpStream,
    tx: Sender<Frame>,
    send_failed: Arc<Mutex<Option<String>>>,
    shut: Vec<TcpStream>,
    ledger: Option<Arc<Ledger>>,
    failed: Option<String>,
    timeout: Duration,
    /// Notices of the current collective's wait for the predecessor.
    notice: WaitNotice,
}

impl Ring {
    /// Runs one collective with a deadline; after a failure, poisons the ring and tells the
    /// successor why (abort frame), so every rank fails promptly with the root cause.
    fn guard<T>(
        &mut self,
        fp: &Fingerprint,
        timeout: Duration,
        f: impl FnOnce(&mut Ring, Instant) -> Result<T>,
    ) -> Result<T> {
        if let Some(cause) = &self.failed {
            return Err(self.tag.comm(
                fp.to_string(),
                format!("communicator unusable after an earlier failure: {cause}"),
            ));
        }
        self.timeout = timeout;
        self.notice = WaitNotice::new(self.tag, timeout);
        let deadline = Instant::now() + timeout;
        // A collective completes only once our frames are on the wire: a rank may exit right
        // after its last collective, and its successor still needs those frames.
        let r = f(self, deadline).and_then(|v| self.flush(fp, deadline).map(|_| v));
        if let Err(e) = &r {
            let msg = e.to_string();
            let mut frame = head(ABORT_SEQ, &[], msg.len());
            frame.extend_from_slice(msg.as_bytes());
            if self.tx.send(Frame::Abort(frame)).is_err() {
                for c in &self.shut {
                    let _ = c.shutdown(Shutdown::Both);
                }
            }
            self.failed = Some(msg);
        }
        r
    }

    fn send(&self, fp: &Fingerprint, payload: Vec<u8>, deadline: Instant) -> Result<()> {
        let enc = fp.encode();
        let mut h = head(fp.seq, &enc, payload.len());
        h.extend_from_slice(&enc);
        self.tx
            .send(Frame::Data {
                head: h,
                payload,
                deadline,
            })
            .map_err(|_| self.send_error(fp))
    }

    fn flush(&self, fp: &Fingerprint, deadline: Instant) -> Result<()> {
        let (ack, done) = channel();
        self.tx
            .send(Frame::Flush(ack))
            .map_err(|_| self.send_error(fp))?;
        let left = deadline.saturating_duration_since(Instant::now());
        done.recv_timeout(left.max(Duration::from_millis(1)))
            .map_err(|_| self.send_error(fp))
    }

    fn send_error(&self, fp: &Fingerprint) -> DdpError {
        let why = self
            .send_failed
            .lock()
            .expect("send_failed lock poisoned")
            .clone();
        DdpError::PeerFailed {
            tag: self.tag,
            collective: fp.to_string(),
            peer: self.next,
            reason: format!(
                "cannot be written to: {}",
                why.unwrap_or_else(|| "sender stopped".into())
            ),
        }
    }

    /// Receives one frame from the predecessor, checks its fingerprint and returns the payload
    /// length; the payload is then read by [`Ring::payload`].
    fn recv_head(&mut self, fp: &Fingerprint, deadline: Instant) -> Result<usize> {
        let mut h = [0u8; 24];
        self.read(&mut h, fp, deadline)?;
        let magic = u32::from_ne_bytes(h[0..4].try_into().expect("4 bytes"));
        let seq = u64::from_ne_bytes(h[4..12].try_into().expect("8 bytes"));
        let fp_len = u32::from_ne_bytes(h[12..16].try_into().expect("4 bytes")) as usize;
        let len = u64::from_ne_bytes(h[16..24].try_into().expect("8 bytes")) as usize;
        if magic != MAGIC || fp_len > 1 << 16 || len > 1 << 40 {
            return Err(self.peer_failed(fp, "sent a malformed frame".into()));
        }
        if seq == ABORT_SEQ {
            let mut msg = vec![0u8; len.min(1 << 16)];
            self.read(&mut msg, fp, deadline)?;
            return Err(self.peer_failed(fp, format!("aborted: {}", String::from_utf8_lossy(&msg))));
        }
        let mut enc = vec![0u8; fp_len];
        self.read(&mut enc, fp, deadline)?;
        let theirs = Fingerprint::decode(&enc);
        if theirs.as_ref() != Some(fp) {
            return Err(DdpError::Desync {
                tag: self.tag,
                seq: fp.seq,
                ours: fp.to_string(),
                peer: self.prev,
                theirs: theirs
                    .map_or_else(|| format!("<unreadable, seq {seq}>"), |t| t.to_string()),
            });
        }
        Ok(len)
    }

    fn recv_into(&mut self, fp: &Fingerprint, dst: &mut [u8], deadline: Instant) -> Result<()> {
        let len = self.recv_head(fp, deadline)?;
        if len != dst.len() {
            return Err(self.peer_failed(fp, format!("sent {len} bytes, expected {}", dst.len())));
        }
        self.read(dst, fp, deadline)
    }

    fn read(&mut self, buf: &mut [u8], fp: &Fingerprint, deadline: Instant) -> Result<()> {
        let (prev, ledger) = (self.prev, self.ledger.as_deref());
        let what = || match ledger.and_then(|l| l.try_diagnose(fp)) {
            Some(why) => format!("{fp}: {why}"),
            None => format!("rank {prev}'s data in {fp}"),
        };
        read_full(&mut self.rx, buf, deadline, Some((&mut self.notice, &what)))
            .map_err(|e| self.read_error(e, fp))
    }

    fn read_error(&self, e: io::Error, fp: &Fingerprint) -> DdpError {
        if self
            .send_failed
            .lock()
            .expect("send_failed lock poisoned")
            .is_some()
        {
            return self.send_error(fp);
        }
        if is_timeout(&e) {
            let detail = match &self.ledger {
                Some(l) => l.diagnose(fp),
                None => format!("rank {} sent nothing", self.prev),
            };
            return DdpError::CollectiveTimeout {
                tag: self.tag,
                collective: fp.to_string(),
                timeout: self.timeout,
                detail,
            };
        }
        self.peer_failed(fp, peer_io_reason(&e))
    }

    fn peer_failed(&self, fp: &Fingerprint, reason: String) -> DdpError {
        DdpError::PeerFailed {
            tag: self.tag,
            collective: fp.to_string(),
            peer: self.prev,
            reason,
        }
    }

    fn tensor(
        &mut self,
        t: &Tensor,
        kind: TensorOp,
        fp: &Fingerprint,
        deadline: Instant,
    ) -> Result<()> {
        let op = RingOp {
            ring: RefCell::new(self),
            kind,
            fp,
            deadline,
            err: RefCell::new(None),
        };
        let r = t.inplace_op1(&op);
        if let Some(e) = op.err.into_inner() {
            return Err(e);
        }
        r.map_err(|e| DdpError::Tensor {
            tag: op.ring.borrow().tag,
            context: fp.to_string(),
            source: Box::new(e),
        })
    }

    fn all_reduce<T: Elem>(
        &mut self,
        data: &mut [T],
        op: ReduceOp,
        fp: &Fingerprint,
        deadline: Instant,
    ) -> Result<()> {
        let (w, r, n) = (self.tag.world, self.tag.rank, data.len());
        let chunk = |c: usize| (c * n / w)..((c + 1) * n / w);
        let mut tmp: Vec<T> = Vec::new();
        for s in 0..w - 1 {
            let (si, ri) = ((r + w - s) % w, (r + 2 * w - s - 1) % w);
            self.send(
                fp,
                bytemuck::cast_slice(&data[chunk(si)]).to_vec(),
                deadline,
            )?;
            tmp.clear();
            tmp.resize(chunk(ri).len(), T::zeroed());
            self.recv_into(fp, bytemuck::cast_slice_mut(&mut tmp), deadline)?;
            for (d, x) in data[chunk(ri)].iter_mut().zip(&tmp) {
                *d = T::add(*d, *x);
            }
        }
        if op == ReduceOp::Avg {
            for d in &mut data[chunk((r + 1) % w)] {
                *d = d.div(w).expect("avg dtype checked before queueing");
            }
        }
        for s in 0..w - 1 {
            let (si, ri) = ((r + 1 + w - s) % w, (r + w - s) % w);
            self.send(
                fp,
                bytemuck::cast_slice(&data[chunk(si)]).to_vec(),
                deadline,
            )?;
            self.recv_into(fp, bytemuck::cast_slice_mut(&mut data[chunk(ri)]), deadline)?;
        }
        Ok(())
    }

    fn broadcast(
        &mut self,
        data: &mut [u8],
        root: usize,
        fp: &Fingerprint,
        deadline: Instant,
    ) -> Result<()> {
        let forward = self.next != root;
        for piece in data.chunks_mut(BCAST_PIECE) {
            if self.tag.rank != root {
                self.recv_into(fp, piece, deadline)?;
            }
            if self.tag.rank == root || forward {
                self.send(fp, piece.to_vec(), deadline)?;
            }
        }
        Ok(())
    }

    fn gather(
        &mut self,
        mine: Vec<u8>,
        fp: &Fingerprint,
        deadline: Instant,
    ) -> Result<Vec<Vec<u8>>> {
        let (w, r) = (self.tag.world, self.tag.rank);
        let mut blocks = vec![Vec::new(); w];
        blocks[r] = mine;
        for s in 0..w - 1 {
            let (si, ri) = ((r + w - s) % w, (r + 2 * w - s - 1) % w);
            self.send(fp, blocks[si].clone(), deadline)?;
            let len = self.recv_head(fp, deadline)?;
            let mut b = vec![0u8; len];
            self.read(&mut b, fp, deadline)?;
            blocks[ri] = b;
        }
        Ok(blocks)
    }
}

/// Candle in-place op that runs a ring collective on the tensor's storage under its write lock.
struct RingOp<'a> {
    ring: RefCell<&'a mut Ring>,
    kind: TensorOp,
    fp: &'a Fingerprint,
    deadline: Instant,
    err: RefCell<Option<DdpError>>,
}

impl RingOp<'_> {
    fn run<T: Elem>(&self, data: &mut [T]) -> Result<()> {
        let mut ring = self.ring.borrow_mut();
        match self.kind {
            TensorOp::Reduce(op) => ring.all_reduce(data, op, self.fp, self.deadline),
            TensorOp::Bcast(root) => {
                ring.broadcast(bytemuck::cast_slice_mut(data), root, self.fp, self.deadline)
            }
        }
    }
}

impl InplaceOp1 for RingOp<'_> {
    fn name(&self) -> &'static str {
        "g4ft-ddp-ring"
    }

    fn cpu_fwd(&self, s: &mut CpuStorage, l: &Layout) -> candle_core::Result<()> {
        let (a, b) = l.contiguous_offsets().ok_or_else(|| {
            candle_core::Error::Msg("ring collective on a non-contiguous tensor".into())
        })?;
        let r = match s {
            CpuStorage::F32(v) => self.run(&mut v[a..b]),
            CpuStorage::F64(v) => self.run(&mut v[a..b]),
            CpuStorage::BF16(v) => self.run(&mut v[a..b]),
            CpuStorage::F16(v) => self.run(&mut v[a..b]),
            CpuStorage::U8(v) => self.run(&mut v[a..b]),
            CpuStorage::U32(v) => self.run(&mut v[a..b]),
            CpuStorage::I64(v) => self.run(&mut v[a..b]),
            other => {
                return Err(candle_core::Error::Msg(format!(
                    "ring collective: dtype {:?} not supported",
                    other.dtype()
                )))
            }
        };
        r.map_err(|e| {
            let msg = e.to_string();
            *self.err.borrow_mut() = Some(e);
            candle_core::Error::Msg(msg)
        })
    }
}

/// Frame header: magic, seq, fingerprint length, payload length.
fn head(seq: u64, fp: &[u8], payload_len: usize) -> Vec<u8> {
    let mut h = Vec::with_capacity(24 + fp.len());
    h.extend_from_slice(&MAGIC.to_ne_bytes());
    h.extend_from_slice(&seq.to_ne_bytes());
    h.extend_from_slice(&(fp.len() as u32).to_ne_bytes());
    h.extend_from_slice(&(payload_len as u64).to_ne_bytes());
    h
}

/// `read_exact` with an absolute deadline (the socket timeout is reset before each read).
/// What an I/O error on a peer's socket says about the peer (the same words for both directions:
/// whether a dead peer shows as EOF, a broken pipe or a reset depends on timing).
fn peer_io_reason(e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::UnexpectedEof | io::ErrorKind::BrokenPipe => {
            "closed the connection (exited, crashed or was killed)".into()
        }
        io::ErrorKind::ConnectionReset => "reset the connection (crashed or was killed)".into(),
        _ => e.to_string(),
    }
}

/// Reads exactly `buf.len()` bytes before `deadline`. While it blocks, `notice` (if any) reports
/// the wait, describing it with its closure.
fn read_full(
    s: &mut TcpStream,
    buf: &mut [u8],
    deadline: Instant,
    mut notice: Option<(&mut WaitNotice, &dyn Fn() -> String)>,
) -> io::Result<()> {
    let mut off = 0;
    while off < buf.len() {
        let now = Instant::now();
        if now >= deadline {
            return Err(io::ErrorKind::TimedOut.into());
        }
        let until = notice.as_ref().map_or(deadline, |(n, _)| n.due(deadline));
        s.set_read_timeout(Some(
            until
                .saturating_duration_since(now)
                .max(Duration::from_millis(1)),
        ))?;
        match s.read(&mut buf[off..]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => off += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted || is_timeout(&e) => {
                if let Some((n, what)) = notice.as_mut() {
                    n.tick(*what);
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn connect_retry(addr: &str, deadline: Instant) -> io::Result<TcpStream> {
    loop {
        match TcpStream::connect(addr) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

fn accept_until(l: &TcpListener, deadline: Instant) -> io::Result<TcpStream> {
    l.set_nonblocking(true)?;
    loop {
        match l.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false)?;
                return Ok(s);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "no connection in time",
                    ));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(e),
        }
    }
}
