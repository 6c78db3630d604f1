//! Per-collective fingerprints and the store ledger that turns hangs into errors.
//!
//! Every collective gets a [`Fingerprint`]: sequence number, op, dtype, size and call site (from
//! `#[track_caller]`). The CPU backend carries it in every frame and compares it with the
//! neighbour's; the NCCL backend (whose kernels cannot carry it) agrees on it through the store
//! ([`Ledger::agree`]): before enqueueing for blocking collectives, in `Work::wait` for queued
//! all-reduces ([`Agreement`]), so that DDP's bucket launches never wait for the other ranks' hosts. Every rank also announces its current collective under
//! `ddp/progress/<rank>` (a SET has no reply, so this costs one small write), so that a timeout can
//! name the ranks that never arrived and where they were last seen ([`Ledger::diagnose`]).

use crate::error::{DdpError, RankTag, Result};
use crate::store::StoreClient;
use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex};
use std::time::Duration;

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

/// A fingerprint agreement left for later: a queued collective's [`Ledger::agree`], run when its
/// work is waited on (before its result may be read).
pub(crate) struct Agreement {
    ledger: Arc<Ledger>,
    fp: Fingerprint,
    timeout: Duration,
}

impl Agreement {
    /// The agreement on `fp` through `ledger`, bounded by `timeout`.
    pub(crate) fn new(ledger: Arc<Ledger>, fp: Fingerprint, timeout: Duration) -> Self {
        Agreement {
            ledger,
            fp,
            timeout,
        }
    }

    /// [`Ledger::agree`] on the fingerprint.
    pub(crate) fn check(&self) -> Result<()> {
        self.ledger.agree(&self.fp, self.timeout)
    }
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

    /// Explains a stuck collective: which ranks have not announced `fp` and where they are.
    /// Best effort: store errors are reported inside the text.
    pub fn diagnose(&self, fp: &Fingerprint) -> String {
        let mut missing = Vec::new();
        let mut notes = Vec::new();
        let mut store = self.lock();
        for r in 0..self.tag.world {
            if r == self.tag.rank {
                continue;
            }
            let key = format!("{}/progress/{r}", self.ns);
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
        match store.wait(&refs, timeout) {
            Ok(()) => {}
            Err(DdpError::StoreTimeout { keys: missing, .. }) => {
                let ranks: Vec<usize> = (0..self.tag.world)
                    .filter(|r| missing.contains(&keys[*r]))
                    .collect();
                return Err(DdpError::CollectiveTimeout {
                    tag: self.tag,
                    collective: fp.to_string(),
                    timeout,
                    detail: format!("ranks {ranks:?} did not arrive"),
                });
            }
            Err(e) => return Err(e),
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
