//! Per-collective fingerprints and the store ledger that turns hangs into errors.
//!
//! Every collective gets a [`Fingerprint`]: sequence number, op, dtype, size and call site (from
//! `#[track_caller]`). The CPU backend carries it in every frame and compares it with the
//! neighbour's; the NCCL backend (whose kernels cannot carry it) agrees on it through the store
//! ([`Ledger::agree`]): before enqueueing for blocking collectives; for queued all-reduces on a
//! background thread (`Agreer`) whose result `Work::wait` checks, so that DDP's bucket launches
//! never wait for the other ranks' hosts. Every rank also announces its current collective under
//! `ddp/progress/<rank>` (a SET has no reply, so this costs one small write), so that a timeout can
//! name the ranks that never arrived and where they were last seen ([`Ledger::diagnose`]).

use crate::error::{DdpError, RankTag, Result};
use crate::store::StoreClient;
use crate::wait::WaitNotice;
use serde::{Deserialize, Serialize};
use std::sync::mpsc::{channel, sync_channel, Receiver, Sender, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What a collective is; part of the fingerprint compared across ranks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fingerprint {
    /// 1-based sequence number of collectives issued by this process group.
    pub seq: u64,
    /// `all_reduce(sum)`, `broadcast(root=0)`, `barrier`, `all_gather`, ...
    pub op: String,
    /// Element type (`f32`, ...) or `bytes`.
    pub dtype: String,
    /// Elements (0 for object gathers, whose sizes legitimately differ per rank).
    pub numel: u64,
    /// Call site, `file:line:col`, or a label such as `ddp bucket 2/5 (ddp created at ...)`.
    pub site: String,
}

impl std::fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} #{} ({} x {}) at {}",
            self.op, self.seq, self.dtype, self.numel, self.site
        )
    }
}

impl Fingerprint {
    /// Compact encoding used in frames and store values.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a Fingerprint always serialises")
    }

    /// Decodes [`Fingerprint::encode`]'s output.
    pub fn decode(b: &[u8]) -> Option<Self> {
        serde_json::from_slice(b).ok()
    }
}

/// The result of a queued collective's fingerprint agreement, computed by an [`Agreer`]; checked
/// in `Work::wait` before the collective's result may be read.
pub(crate) struct Agreement {
    rx: Receiver<Result<()>>,
    tag: RankTag,
    what: String,
    /// How long the agreement may take: the collective timeout plus a margin for queueing.
    limit: Duration,
}

impl Agreement {
    /// Blocks until the agreement is known; its error (desync, ranks that never arrived).
    pub(crate) fn check(&self) -> Result<()> {
        match self.rx.recv_timeout(self.limit) {
            Ok(r) => r,
            Err(_) => Err(self
                .tag
                .comm(&self.what, "fingerprint agreement thread stopped answering")),
        }
    }
}

/// One request to the agreement thread: agree on `fp` and answer on `reply`, or (`fp = None`)
/// just answer once everything queued before is done.
type AgreeRequest = (Option<Fingerprint>, Duration, SyncSender<Result<()>>);

/// Agrees on queued collectives' fingerprints on a thread of its own, with its own store
/// connection, in issue order: queuing an all-reduce (a DDP bucket launch) never waits for the
/// other ranks' hosts, and by the time the work is waited on its agreement is normally done.
/// Blocking collectives agree on the caller's thread after [`Agreer::flush`], so every rank's
/// agreements still run strictly one after another, in the same order on every rank.
pub(crate) struct Agreer {
    tx: Option<Sender<AgreeRequest>>,
    thread: Option<JoinHandle<()>>,
    tag: RankTag,
}

impl Agreer {
    /// Starts the thread; `ledger` must have a store connection of its own.
    pub(crate) fn start(ledger: Ledger) -> Result<Self> {
        let tag = ledger.tag;
        let (tx, rx) = channel::<AgreeRequest>();
        let thread = std::thread::Builder::new()
            .name(format!("g4ft-agree-{}", tag.rank))
            .spawn(move || {
                for (fp, timeout, reply) in rx {
                    let r = fp.map_or(Ok(()), |fp| ledger.agree(&fp, timeout));
                    let _ = reply.send(r);
                }
            })
            .map_err(|e| tag.comm("fingerprint agreement thread", e.to_string()))?;
        Ok(Agreer {
            tx: Some(tx),
            thread: Some(thread),
            tag,
        })
    }

    fn request(&self, fp: Option<Fingerprint>, timeout: Duration, what: String) -> Agreement {
        let (reply, rx) = sync_channel(1);
        if let Some(tx) = &self.tx {
            // A send error means the thread is gone; `check` then reports it.
            let _ = tx.send((fp, timeout, reply));
        }
        Agreement {
            rx,
            tag: self.tag,
            what,
            limit: timeout + timeout + Duration::from_secs(5),
        }
    }

    /// Queues the agreement on `fp`.
    pub(crate) fn submit(&self, fp: &Fingerprint, timeout: Duration) -> Agreement {
        self.request(Some(fp.clone()), timeout, fp.to_string())
    }

    /// Waits until every agreement queued so far has run (their results stay with their works).
    pub(crate) fn flush(&self, timeout: Duration) -> Result<()> {
        self.request(
            None,
            timeout,
            "flush of queued fingerprint agreements".into(),
        )
        .check()
    }
}

impl Drop for Agreer {
    fn drop(&mut self) {
        drop(self.tx.take()); // ends the thread's loop once the queue is empty
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A failure another rank published before exiting ([`Ledger::peer_failure`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerFailure {
    /// The rank that failed.
    pub rank: usize,
    /// Whether its error was its own (not the consequence of yet another rank's exit).
    pub root_cause: bool,
    /// Its error message.
    pub message: String,
}

/// Store-backed progress announcements, fingerprint agreement and small-object gathers.
pub struct Ledger {
    store: Arc<Mutex<StoreClient>>,
    tag: RankTag,
    ns: String,
}

impl Ledger {
    /// A ledger for `tag` under key namespace `ns` (e.g. `ddp/g0`), sharing `store`.
    pub fn new(store: Arc<Mutex<StoreClient>>, tag: RankTag, ns: &str) -> Self {
        Ledger {
            store,
            tag,
            ns: ns.to_string(),
        }
    }

    /// The shared store connection.
    pub fn store(&self) -> &Arc<Mutex<StoreClient>> {
        &self.store
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, StoreClient> {
        self.store.lock().expect("store client lock poisoned")
    }

    /// Records that this rank entered `fp` (one SET, no round trip).
    pub fn announce(&self, fp: &Fingerprint) -> Result<()> {
        let key = format!("{}/progress/{}", self.ns, self.tag.rank);
        self.lock().set(&key, &fp.encode())
    }

    /// Publishes why this rank is about to exit, under `<ns>/failed/<rank>`, and waits for the
    /// store to have it (a PING after the SET), so that a peer that sees this rank's sockets
    /// close can read the cause. `follows_peer`: the message is itself the consequence of
    /// another rank's exit (peers then prefer a root cause). Best effort: a store that is already
    /// gone is ignored.
    pub fn publish_failure(&self, message: &str, follows_peer: bool) {
        let key = format!("{}/failed/{}", self.ns, self.tag.rank);
        let value = format!("{}{message}", if follows_peer { 'F' } else { 'C' });
        let mut store = self.lock();
        if store.set(&key, value.as_bytes()).is_ok() {
            let _ = store.ping();
        }
    }

    /// The failure other ranks published that best explains this one: the lowest rank with a
    /// root cause of its own, else the lowest rank that published anything. `Ok(None)` when no
    /// peer published a failure, `Err` when the store cannot be reached (its host has exited).
    pub fn peer_failure(&self) -> Result<Option<PeerFailure>> {
        let mut store = self.lock();
        let mut found = Vec::new();
        for r in (0..self.tag.world).filter(|&r| r != self.tag.rank) {
            let key = format!("{}/failed/{r}", self.ns);
            if store.check(&[&key])? {
                let text = String::from_utf8_lossy(&store.get(&key)?).into_owned();
                let (kind, message) = text.split_at(text.chars().next().map_or(0, char::len_utf8));
                found.push(PeerFailure {
                    rank: r,
                    root_cause: kind != "F",
                    message: message.to_string(),
                });
            }
        }
        let best = found.iter().position(|f| f.root_cause).unwrap_or(0);
        Ok((!found.is_empty()).then(|| found.swap_remove(best)))
    }

    /// Explains a stuck collective: which ranks have not announced `fp` and where they are.
    /// Best effort: store errors are reported inside the text.
    pub fn diagnose(&self, fp: &Fingerprint) -> String {
        Self::diagnose_with(&mut self.lock(), self.tag, &self.ns, fp)
    }

    /// [`Ledger::diagnose`] unless another thread of this rank is using the store connection
    /// (an agreement waiting for the same peers): `None` then, instead of blocking.
    pub fn try_diagnose(&self, fp: &Fingerprint) -> Option<String> {
        let mut store = self.store.try_lock().ok()?;
        Some(Self::diagnose_with(&mut store, self.tag, &self.ns, fp))
    }

    fn diagnose_with(store: &mut StoreClient, tag: RankTag, ns: &str, fp: &Fingerprint) -> String {
        let mut missing = Vec::new();
        let mut notes = Vec::new();
        for r in 0..tag.world {
            if r == tag.rank {
                continue;
            }
            let key = format!("{}/progress/{r}", ns);
            let seen = match store.check(&[&key]) {
                Ok(true) => store.get(&key).ok().and_then(|b| Fingerprint::decode(&b)),
                Ok(false) => None,
                Err(e) => return format!("could not read progress from the store: {e}"),
            };
            match seen {
                Some(p) if p == *fp => {}
                Some(p) if p.seq == fp.seq => notes.push(format!(
                    "rank {r} is in a different collective: {p} (desync)"
                )),
                Some(p) => {
                    missing.push(r);
                    notes.push(format!("rank {r} last entered {p}"));
                }
                None => {
                    missing.push(r);
                    notes.push(format!("rank {r} never entered a collective"));
                }
            }
        }
        if missing.is_empty() && notes.is_empty() {
            return "every rank entered it; a peer is slow or the network stalled".into();
        }
        format!("ranks {missing:?} did not arrive ({})", notes.join("; "))
    }

    /// Blocks until every rank has published the same fingerprint for `fp.seq`; errors with
    /// [`DdpError::CollectiveTimeout`] naming the missing ranks, or [`DdpError::Desync`].
    pub fn agree(&self, fp: &Fingerprint, timeout: Duration) -> Result<()> {
        let all = self.exchange("fp", fp, &fp.encode(), timeout)?;
        for (r, b) in all.iter().enumerate() {
            let theirs = Fingerprint::decode(b);
            if theirs.as_ref() != Some(fp) {
                return Err(DdpError::Desync {
                    tag: self.tag,
                    seq: fp.seq,
                    ours: fp.to_string(),
                    peer: r,
                    theirs: theirs.map_or("<unreadable>".into(), |t| t.to_string()),
                });
            }
        }
        Ok(())
    }

    /// All-gather of small byte blobs through the store (what the NCCL backend uses for
    /// objects and barriers). Result is indexed by rank.
    pub fn gather(
        &self,
        fp: &Fingerprint,
        bytes: &[u8],
        timeout: Duration,
    ) -> Result<Vec<Vec<u8>>> {
        self.exchange("gather", fp, bytes, timeout)
    }

    /// SET `<ns>/<kind>/<seq>/<rank>`, WAIT for every rank's key, MULTI_GET them, then delete our
    /// key of the previous round: every rank has read it, since all ranks wrote this round's keys
    /// only after finishing the previous round.
    fn exchange(
        &self,
        kind: &str,
        fp: &Fingerprint,
        bytes: &[u8],
        timeout: Duration,
    ) -> Result<Vec<Vec<u8>>> {
        let key = |seq: u64, r: usize| format!("{}/{kind}/{seq}/{r}", self.ns);
        let keys: Vec<String> = (0..self.tag.world).map(|r| key(fp.seq, r)).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let mut store = self.lock();
        store.set(&keys[self.tag.rank], bytes)?;
        // Waits in slices, so that a long wait is reported while it lasts.
        let deadline = Instant::now() + timeout;
        let mut notice = WaitNotice::new(self.tag, timeout);
        loop {
            let slice = notice
                .due(deadline)
                .saturating_duration_since(Instant::now());
            match store.wait(&refs, slice.max(Duration::from_millis(1))) {
                Ok(()) => break,
                Err(DdpError::StoreTimeout { keys: missing, .. }) => {
                    let ranks: Vec<usize> = (0..self.tag.world)
                        .filter(|r| missing.contains(&keys[*r]))
                        .collect();
                    if Instant::now() >= deadline {
                        return Err(DdpError::CollectiveTimeout {
                            tag: self.tag,
                            collective: fp.to_string(),
                            timeout,
                            detail: format!("ranks {ranks:?} did not arrive"),
                        });
                    }
                    notice.tick(|| format!("ranks {ranks:?} to reach {fp}"));
                }
                Err(e) => return Err(e),
            }
        }
        let values = store.multi_get(&refs)?;
        if fp.seq > 1 {
            store.delete(&key(fp.seq - 1, self.tag.rank))?;
        }
        Ok(values)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreServer;

    fn fp(seq: u64, op: &str) -> Fingerprint {
        Fingerprint {
            seq,
            op: op.into(),
            dtype: "f32".into(),
            numel: 4,
            site: "here".into(),
        }
    }

    fn ledgers(world: usize) -> (StoreServer, Vec<Ledger>) {
        let s = StoreServer::bind("127.0.0.1", 0).unwrap();
        let l = (0..world)
            .map(|rank| {
                let c = StoreClient::connect("127.0.0.1", s.port(), "", Duration::from_secs(5));
                Ledger::new(
                    Arc::new(Mutex::new(c.unwrap())),
                    RankTag { rank, world },
                    "t",
                )
            })
            .collect();
        (s, l)
    }

    #[test]
    fn agree_gather_and_desync() {
        let (_s, mut l) = ledgers(2);
        let b = l.pop().unwrap();
        let a = l.pop().unwrap();
        let h = std::thread::spawn(move || {
            b.agree(&fp(1, "all_reduce"), Duration::from_secs(5))
                .unwrap();
            let g = b
                .gather(&fp(2, "gather"), b"from1", Duration::from_secs(5))
                .unwrap();
            assert_eq!(g, vec![b"from0".to_vec(), b"from1".to_vec()]);
            b.agree(&fp(3, "barrier"), Duration::from_secs(5))
                .unwrap_err()
        });
        a.agree(&fp(1, "all_reduce"), Duration::from_secs(5))
            .unwrap();
        a.gather(&fp(2, "gather"), b"from0", Duration::from_secs(5))
            .unwrap();
        let err = a
            .agree(&fp(3, "all_reduce"), Duration::from_secs(5))
            .unwrap_err();
        assert!(matches!(err, DdpError::Desync { peer: 1, .. }), "{err}");
        let err_b = h.join().unwrap();
        assert!(err_b.to_string().contains("rank 1/2"), "{err_b}");
    }

    #[test]
    fn agreer_runs_queued_agreements_in_order_and_reports_a_desync() {
        let (_s, mut l) = ledgers(2);
        let (b, a) = (l.pop().unwrap(), l.pop().unwrap());
        let t = Duration::from_secs(5);
        let peer = std::thread::spawn(move || {
            let agreer = Agreer::start(b).unwrap();
            let first = agreer.submit(&fp(1, "all_reduce"), t);
            let second = agreer.submit(&fp(2, "all_reduce"), t);
            agreer.flush(t).unwrap();
            let third = agreer.submit(&fp(3, "barrier"), t);
            (first.check(), second.check(), third.check())
        });
        let agreer = Agreer::start(a).unwrap();
        let queued: Vec<Agreement> = (1..=2)
            .map(|seq| agreer.submit(&fp(seq, "all_reduce"), t))
            .collect();
        agreer.flush(t).unwrap();
        for q in &queued {
            q.check().unwrap();
        }
        let err = agreer.submit(&fp(3, "all_reduce"), t).check().unwrap_err();
        assert!(
            matches!(
                err,
                DdpError::Desync {
                    seq: 3,
                    peer: 1,
                    ..
                }
            ),
            "{err}"
        );
        let (first, second, third) = peer.join().unwrap();
        first.unwrap();
        second.unwrap();
        assert!(matches!(third, Err(DdpError::Desync { seq: 3, .. })));
    }

    #[test]
    fn missing_rank_is_named() {
        let (_s, l) = ledgers(3);
        let err = l[0]
            .agree(&fp(1, "barrier"), Duration::from_millis(200))
            .unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("ranks [1, 2] did not arrive") && msg.contains("rank 0/3"),
            "{msg}"
        );
        l[1].announce(&fp(1, "barrier")).unwrap();
        l[1].store().lock().unwrap().ping().unwrap(); // the SET is processed before the PING
        let d = l[0].diagnose(&fp(2, "barrier"));
        assert!(
            d.contains("rank 1 last entered barrier #1") && d.contains("rank 2 never"),
            "{d}"
        );
    }
}
