//! The process group: rendezvous through the store, one communicator, numbered and
//! fingerprinted collectives, and the helpers for the post's rules (broadcast a decision from
//! rank 0; rank-0-only work followed by a barrier).
//!
//! Mirrors `torch.distributed.init_process_group(env://)`: with `TORCHELASTIC_USE_AGENT_STORE=True`
//! every rank connects to the launcher's store under `/worker/attempt_<n>/`; otherwise rank 0
//! serves the store on `MASTER_PORT`. Invariants: `world_size == 1` returns early inside each
//! collective (no store, no sockets) unless the one-rank NCCL communicator is forced
//! ([`GroupOptions::force_nccl`], `G4FT_DDP_FORCE_NCCL=1`); every collective is counted, numbered
//! and announced, so a hang becomes an error naming the missing ranks, and a desync one naming
//! both call sites.

use crate::comm::{Backend, Communicator, CpuComm, ReduceOp, Work};
use crate::env::DistEnv;
use crate::error::{RankTag, Result};
use crate::fingerprint::{Agreer, Fingerprint, Ledger};
use crate::store::{StoreClient, StoreServer};
use candle_core::{Device, Tensor};
use serde::{de::DeserializeOwned, Serialize};
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::panic::Location;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Default collective timeout (PyTorch's default for NCCL is 10 minutes too).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// Environment variable read when [`GroupOptions::force_nccl`] is `None`: `1`/`true`/`yes` force
/// the NCCL communicator at world size 1, `0`/`false`/`no`/empty/absent do not.
pub const FORCE_NCCL_ENV: &str = "G4FT_DDP_FORCE_NCCL";

static GROUPS: AtomicUsize = AtomicUsize::new(0);

/// Options of [`ProcessGroup::new`].
#[derive(Debug, Clone)]
pub struct GroupOptions {
    /// Bound on every collective and store request (default 10 minutes; tests use seconds).
    pub timeout: Duration,
    /// Agree on every collective's fingerprint through the store (blocking collectives before
    /// running; queued all-reduces on a background thread, checked in `Work::wait`, so a DDP
    /// bucket launch never waits for the other ranks' hosts). The CPU
    /// backend checks fingerprints in-band anyway; NCCL needs this to turn a desync into an
    /// error instead of a hang. Default: on for NCCL, off for CPU.
    pub store_checks: Option<bool>,
    /// Namespace of this group's store keys; every rank must use the same. Default `pg<n>` for
    /// the n-th group this process creates (set it when several ranks share one process).
    pub name: Option<String>,
    /// At world size 1 on a CUDA device, still create a one-rank NCCL communicator (with its
    /// comm stream and events) and run every collective (all_reduce, broadcast, barrier,
    /// all_gather) through it instead of returning early: the way to exercise and time the NCCL
    /// path on a single GPU. Changes nothing at world size > 1 on CUDA (always NCCL); an error on
    /// a CPU device. `None` (default): read [`FORCE_NCCL_ENV`] (`G4FT_DDP_FORCE_NCCL=1`).
    pub force_nccl: Option<bool>,
}

impl Default for GroupOptions {
    fn default() -> Self {
        GroupOptions {
            timeout: DEFAULT_TIMEOUT,
            store_checks: None,
            name: None,
            force_nccl: None,
        }
    }
}

impl GroupOptions {
    /// Whether the NCCL communicator is forced at world size 1: the option, or else
    /// [`FORCE_NCCL_ENV`] read through `get`. Errors name the variable and its bad value.
    pub fn resolve_force_nccl(&self, get: impl Fn(&str) -> Option<String>) -> Result<bool> {
        if let Some(f) = self.force_nccl {
            return Ok(f);
        }
        let v = get(FORCE_NCCL_ENV).unwrap_or_default();
        match v.trim().to_ascii_lowercase().as_str() {
            "" | "0" | "false" | "no" => Ok(false),
            "1" | "true" | "yes" => Ok(true),
            _ => Err(crate::error::DdpError::Env {
                var: FORCE_NCCL_ENV.into(),
                value: v,
                reason: "expected 1/true/yes or 0/false/no".into(),
            }),
        }
    }
}

/// A group of `WORLD_SIZE` processes that run collectives together (see module docs).
pub struct ProcessGroup {
    env: DistEnv,
    tag: RankTag,
    timeout: Duration,
    comm: Box<dyn Communicator>,
    ledger: Option<Arc<Ledger>>,
    store_checks: bool,
    /// Runs queued all-reduces' agreements off this thread (with store checks, world > 1).
    agreer: Option<Agreer>,
    /// World size 1 without a forced communicator: collectives return at once.
    trivial: bool,
    seq: Cell<u64>,
    counts: RefCell<BTreeMap<String, u64>>,
    // Declared last: dropped after the communicator, so peers see our sockets close first.
    _server: Option<StoreServer>,
}

impl ProcessGroup {
    /// Joins the group described by the torchrun environment; see [`ProcessGroup::new`].
    pub fn from_env(device: &Device, opts: GroupOptions) -> Result<Self> {
        Self::new(DistEnv::from_env()?, device, opts)
    }

    /// Joins the group: hosts the store on rank 0 when there is no agent store, connects to it,
    /// and sets up the backend for `device` (NCCL for CUDA devices, the TCP ring otherwise).
    /// At world size 1 there is no store and no communicator, unless
    /// [`GroupOptions::force_nccl`] asks for a one-rank NCCL communicator (CUDA devices only).
    /// Collective: every rank must call it.
    pub fn new(env: DistEnv, device: &Device, opts: GroupOptions) -> Result<Self> {
        let tag = RankTag {
            rank: env.rank,
            world: env.world_size,
        };
        let force_nccl = opts.resolve_force_nccl(|k| std::env::var(k).ok())?;
        if force_nccl && !device.is_cuda() {
            return Err(tag.usage(
                "ProcessGroup::new",
                format!(
                    "force_nccl ({FORCE_NCCL_ENV}) needs a CUDA device, got {:?}",
                    device.location()
                ),
            ));
        }
        let id = GROUPS.fetch_add(1, Ordering::SeqCst);
        let ns = format!(
            "ddp/{}",
            opts.name.clone().unwrap_or_else(|| format!("pg{id}"))
        );
        let base =
            |comm: Box<dyn Communicator>, ledger, store_checks, agreer, server| ProcessGroup {
                env: env.clone(),
                tag,
                timeout: opts.timeout,
                comm,
                ledger,
                store_checks,
                agreer,
                trivial: env.world_size == 1 && !force_nccl,
                seq: Cell::new(0),
                counts: RefCell::new(BTreeMap::new()),
                _server: server,
            };
        if env.world_size == 1 {
            let comm: Box<dyn Communicator> = if force_nccl {
                new_nccl(tag, device, None, &ns)?
            } else {
                Box::new(CpuComm::single(tag))
            };
            return Ok(base(comm, None, false, None, None));
        }
        let server = if !env.use_agent_store && env.rank == 0 {
            Some(StoreServer::bind("0.0.0.0", env.master_port)?)
        } else {
            None
        };
        let client = StoreClient::connect(
            &env.master_addr,
            env.master_port,
            &env.store_prefix(),
            opts.timeout,
        )?;
        let store = Arc::new(Mutex::new(client));
        let ledger = Arc::new(Ledger::new(store.clone(), tag, &ns));
        let (comm, backend): (Box<dyn Communicator>, Backend) = if device.is_cuda() {
            (new_nccl(tag, device, Some(&store), &ns)?, Backend::Nccl)
        } else {
            let c = CpuComm::connect(tag, &store, &ns, Some(ledger.clone()), opts.timeout)?;
            (Box::new(c), Backend::Cpu)
        };
        let checks = opts.store_checks.unwrap_or(backend == Backend::Nccl);
        let agreer = if checks {
            // Its own connection: its exchanges wait for peers while this thread announces.
            let conn = StoreClient::connect(
                &env.master_addr,
                env.master_port,
                &env.store_prefix(),
                opts.timeout,
            )?;
            Some(Agreer::start(Ledger::new(
                Arc::new(Mutex::new(conn)),
                tag,
                &ns,
            ))?)
        } else {
            None
        };
        Ok(base(comm, Some(ledger), checks, agreer, server))
    }

    /// Ends this rank after a failure, so that every rank reports its own root cause.
    ///
    /// `message` is this rank's error; `follows_peer` says whether it may be the consequence of
    /// another rank's exit ([`crate::DdpError::chain_may_follow_peer_exit`]). Then the error another
    /// rank published first is named in front of it ("rank 0 failed first: …"), or, when the
    /// store is gone too, a hint says that its host exited. Publishes the message for the
    /// peers, closes the communicator (peers blocked on this rank see it at once) and, on the
    /// rank that hosts the store, keeps the store up until the peers have left (at most
    /// `linger`), so they can read the cause. Returns the text to report.
    pub fn fail(self, message: &str, follows_peer: bool, linger: Duration) -> String {
        let ProcessGroup {
            comm,
            ledger,
            agreer,
            _server: server,
            ..
        } = self;
        let Some(ledger) = ledger else {
            return message.to_string();
        };
        let report = if !follows_peer {
            message.to_string()
        } else {
            match ledger.peer_failure() {
                Ok(Some(peer)) => format!(
                    "rank {} failed first: {}\n  then this rank: {message}",
                    peer.rank, peer.message
                ),
                Ok(None) => message.to_string(),
                Err(_) => format!(
                    "{message}\n  hint: the store is gone: the rank hosting it (rank 0) or the \
                     launcher has exited; its log has the cause"
                ),
            }
        };
        ledger.publish_failure(message, follows_peer);
        drop(agreer);
        drop(comm);
        drop(ledger);
        if let Some(server) = server {
            server.wait_until_idle(linger);
        }
        report
    }

    /// This process's global rank.
    pub fn rank(&self) -> usize {
        self.tag.rank
    }

    /// Number of processes.
    pub fn world_size(&self) -> usize {
        self.tag.world
    }

    /// `rank r/world`, for messages.
    pub fn tag(&self) -> RankTag {
        self.tag
    }

    /// The environment the group was built from.
    pub fn env(&self) -> &DistEnv {
        &self.env
    }

    /// Which backend runs the tensor collectives.
    pub fn backend(&self) -> Backend {
        self.comm.backend()
    }

    /// The collective timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Number of collectives issued so far (the last sequence number).
    pub fn seq(&self) -> u64 {
        self.seq.get()
    }

    /// How many collectives of each kind were issued (`all_reduce(avg)`, `barrier`, ...).
    pub fn counts(&self) -> BTreeMap<String, u64> {
        self.counts.borrow().clone()
    }

    /// Numbers, counts and announces a blocking collective; with store checks, agrees on it
    /// first (after the queued agreements, so that every rank agrees in the same order).
    fn begin(&self, op: String, dtype: String, numel: usize, site: String) -> Result<Fingerprint> {
        let fp = self.enter(op, dtype, numel, site)?;
        if let (Some(l), true) = (&self.ledger, self.store_checks) {
            if let Some(a) = &self.agreer {
                a.flush(self.timeout)?;
            }
            l.agree(&fp, self.timeout)?;
        }
        Ok(fp)
    }

    /// Numbers, counts and announces a collective.
    fn enter(&self, op: String, dtype: String, numel: usize, site: String) -> Result<Fingerprint> {
        *self.counts.borrow_mut().entry(op.clone()).or_default() += 1;
        self.seq.set(self.seq.get() + 1);
        let fp = Fingerprint {
            seq: self.seq.get(),
            op,
            dtype,
            numel: numel as u64,
            site,
        };
        if let Some(l) = &self.ledger {
            l.announce(&fp)?;
        }
        Ok(fp)
    }

    /// In-place all-reduce of `t` (any supported dtype; `Avg` needs floats); blocks until done.
    #[track_caller]
    pub fn all_reduce(&self, t: &Tensor, op: ReduceOp) -> Result<()> {
        self.all_reduce_async(t, op)?.wait()
    }

    /// Queues an in-place all-reduce of `t` and returns at once; read `t` only after
    /// [`Work::wait`]. The fingerprint's call site is the caller's. Queuing never waits for the
    /// other ranks: with store checks (NCCL), the fingerprint agreement runs on a background
    /// thread and [`Work::wait`] reports a desync before the result can be read.
    #[track_caller]
    pub fn all_reduce_async(&self, t: &Tensor, op: ReduceOp) -> Result<Work> {
        self.all_reduce_labeled(t, op, site(Location::caller()))
    }

    /// [`ProcessGroup::all_reduce_async`] with an explicit fingerprint label instead of the call
    /// site (DDP labels buckets so the launching call site may differ between ranks).
    pub fn all_reduce_labeled(&self, t: &Tensor, op: ReduceOp, label: String) -> Result<Work> {
        let fp = self.enter(
            format!("all_reduce({})", op.name()),
            dtype(t),
            t.elem_count(),
            label,
        )?;
        if self.trivial {
            return Ok(Work::done());
        }
        let agreement = self.agreer.as_ref().map(|a| a.submit(&fp, self.timeout));
        Ok(self
            .comm
            .all_reduce(t, op, &fp, self.timeout)?
            .with_agreement(agreement))
    }

    /// In-place broadcast of `t` from `root`; blocks until done.
    #[track_caller]
    pub fn broadcast(&self, t: &Tensor, root: usize) -> Result<()> {
        let fp = self.begin(
            format!("broadcast(root={root})"),
            dtype(t),
            t.elem_count(),
            site(Location::caller()),
        )?;
        // Checked here, for every backend (and world size 1), after the fingerprint so that a
        // bad root on one rank still shows up as that rank's error rather than a desync.
        if root >= self.tag.world {
            return Err(self.tag.comm(
                fp.to_string(),
                format!("root {root} >= world size {}", self.tag.world),
            ));
        }
        if self.trivial {
            return Ok(());
        }
        self.comm.broadcast(t, root, &fp, self.timeout)?.wait()
    }

    /// Blocks until every rank has called `barrier` (at the same point of the sequence).
    #[track_caller]
    pub fn barrier(&self) -> Result<()> {
        let fp = self.begin(
            "barrier".into(),
            "bytes".into(),
            0,
            site(Location::caller()),
        )?;
        if self.trivial {
            return Ok(());
        }
        self.comm
            .all_gather_bytes(&[], &fp, self.timeout)
            .map(|_| ())
    }

    /// All-gather of small byte blobs (sizes may differ), indexed by rank.
    #[track_caller]
    pub fn all_gather_bytes(&self, bytes: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.gather_at(bytes, "all_gather", site(Location::caller()))
    }

    fn gather_at(&self, bytes: &[u8], op: &str, site: String) -> Result<Vec<Vec<u8>>> {
        let fp = self.begin(op.into(), "bytes".into(), 0, site)?;
        if self.trivial {
            return Ok(vec![bytes.to_vec()]);
        }
        self.comm.all_gather_bytes(bytes, &fp, self.timeout)
    }

    /// All-gather of a serde value (JSON on the wire), indexed by rank.
    #[track_caller]
    pub fn all_gather_object<T: Serialize + DeserializeOwned>(&self, v: &T) -> Result<Vec<T>> {
        let site = site(Location::caller());
        let bytes =
            serde_json::to_vec(v).map_err(|e| self.tag.comm("all_gather_object", e.to_string()))?;
        self.gather_at(&bytes, "all_gather_object", site)?
            .iter()
            .enumerate()
            .map(|(r, b)| {
                serde_json::from_slice(b).map_err(|e| {
                    self.tag
                        .comm("all_gather_object", format!("value from rank {r}: {e}"))
                })
            })
            .collect()
    }

    /// Every rank gets `root`'s value (`v` is ignored elsewhere). Use it for decisions all ranks
    /// must act on identically (early stop, NaN skip).
    #[track_caller]
    pub fn broadcast_object<T: Serialize + DeserializeOwned>(
        &self,
        v: &T,
        root: usize,
    ) -> Result<T> {
        let site = site(Location::caller());
        if root >= self.tag.world {
            return Err(self.tag.comm(
                "broadcast_object",
                format!("root {root} >= world size {}", self.tag.world),
            ));
        }
        let mine = if self.tag.rank == root {
            serde_json::to_vec(v).map_err(|e| self.tag.comm("broadcast_object", e.to_string()))?
        } else {
            Vec::new()
        };
        let all = self.gather_at(&mine, &format!("broadcast_object(root={root})"), site)?;
        serde_json::from_slice(&all[root]).map_err(|e| {
            self.tag
                .comm("broadcast_object", format!("value from rank {root}: {e}"))
        })
    }

    /// Rank 0 evaluates `decide` and every rank returns its value: the post's rule "make the
    /// decision on rank 0, broadcast it, act on the broadcast value".
    #[track_caller]
    pub fn decide_on_rank0<T: Serialize + DeserializeOwned>(
        &self,
        decide: impl FnOnce() -> T,
    ) -> Result<T> {
        let site = site(Location::caller());
        let v = (self.tag.rank == 0).then(decide);
        let mine = match &v {
            Some(v) => serde_json::to_vec(v)
                .map_err(|e| self.tag.comm("decide_on_rank0", e.to_string()))?,
            None => Vec::new(),
        };
        let all = self.gather_at(&mine, "decide_on_rank0", site)?;
        match v {
            Some(v) => Ok(v),
            None => serde_json::from_slice(&all[0]).map_err(|e| {
                self.tag
                    .comm("decide_on_rank0", format!("value from rank 0: {e}"))
            }),
        }
    }

    /// Runs `work` on rank 0 only (checkpoint writes, logging), then synchronises all ranks.
    /// If `work` fails on rank 0, every rank returns an error naming it (no rank is left
    /// waiting). Returns `Some(result)` on rank 0, `None` elsewhere.
    #[track_caller]
    pub fn rank0_then_barrier<R, E: std::fmt::Display>(
        &self,
        work: impl FnOnce() -> std::result::Result<R, E>,
    ) -> Result<Option<R>> {
        let site = site(Location::caller());
        let out = (self.tag.rank == 0).then(work);
        let status: Option<String> = match &out {
            Some(Err(e)) => Some(e.to_string()),
            _ => None,
        };
        let mine = serde_json::to_vec(&status).expect("Option<String> serialises");
        let all = self.gather_at(&mine, "rank0_then_barrier", site)?;
        let status0: Option<String> = serde_json::from_slice(&all[0]).map_err(|e| {
            self.tag
                .comm("rank0_then_barrier", format!("status from rank 0: {e}"))
        })?;
        if let Some(msg) = status0 {
            return Err(self
                .tag
                .comm("rank0_then_barrier", format!("rank 0's work failed: {msg}")));
        }
        Ok(out.and_then(|r| r.ok()))
    }
}

fn site(l: &Location<'_>) -> String {
    format!("{}:{}:{}", l.file(), l.line(), l.column())
}

fn dtype(t: &Tensor) -> String {
    t.dtype().as_str().to_string()
}

#[cfg(not(feature = "cuda"))]
fn new_nccl(
    tag: RankTag,
    _device: &Device,
    _store: Option<&Arc<Mutex<StoreClient>>>,
    _ns: &str,
) -> Result<Box<dyn Communicator>> {
    Err(crate::error::DdpError::FeatureDisabled {
        what: format!("{tag}: a process group on a CUDA device (NCCL backend)"),
        feature: "cuda",
    })
}

#[cfg(feature = "cuda")]
fn new_nccl(
    tag: RankTag,
    device: &Device,
    store: Option<&Arc<Mutex<StoreClient>>>,
    ns: &str,
) -> Result<Box<dyn Communicator>> {
    Ok(Box::new(crate::comm::NcclComm::new(
        tag, device, store, ns,
    )?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(force: Option<bool>) -> GroupOptions {
        GroupOptions {
            force_nccl: force,
            ..Default::default()
        }
    }

    #[test]
    fn force_nccl_option_wins_over_env() {
        let env = |v: &'static str| move |k: &str| (k == FORCE_NCCL_ENV).then(|| v.to_string());
        assert!(!opts(Some(false)).resolve_force_nccl(env("1")).unwrap());
        assert!(opts(Some(true)).resolve_force_nccl(env("0")).unwrap());
        assert!(opts(None).resolve_force_nccl(env("1")).unwrap());
        assert!(opts(None).resolve_force_nccl(env(" TRUE ")).unwrap());
        assert!(!opts(None).resolve_force_nccl(env("0")).unwrap());
        assert!(!opts(None).resolve_force_nccl(|_| None).unwrap());
        let err = opts(None).resolve_force_nccl(env("maybe")).unwrap_err();
        assert!(err.to_string().contains(FORCE_NCCL_ENV), "{err}");
    }

    #[test]
    fn force_nccl_on_cpu_is_an_error() {
        let err = ProcessGroup::new(DistEnv::single(), &Device::Cpu, opts(Some(true)))
            .err()
            .expect("force_nccl on a CPU device must fail");
        assert!(err.to_string().contains("needs a CUDA device"), "{err}");
    }

    #[test]
    fn world_one_without_force_is_local() {
        let pg = ProcessGroup::new(DistEnv::single(), &Device::Cpu, opts(Some(false))).unwrap();
        let t = Tensor::new(&[1f32, 2.0], &Device::Cpu).unwrap();
        pg.all_reduce(&t, ReduceOp::Sum).unwrap();
        pg.barrier().unwrap();
        assert_eq!(pg.all_gather_object(&7u32).unwrap(), vec![7]);
        assert_eq!(pg.backend(), Backend::Cpu);
        assert_eq!(pg.seq(), 3);
    }
}
