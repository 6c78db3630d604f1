//! Errors of the DDP crate, grouped by area (environment, store, collectives, DDP, launcher).
//!
//! Invariant: every error raised once a rank is known carries `rank r/world` in its message, so a
//! line in a merged multi-rank log says which process failed.

use std::time::Duration;

/// `rank r/world` of the process raising an error; printed in front of every rank-level message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankTag {
    /// Global rank (`RANK`).
    pub rank: usize,
    /// Number of processes (`WORLD_SIZE`).
    pub world: usize,
}

impl std::fmt::Display for RankTag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "rank {}/{}", self.rank, self.world)
    }
}

/// Everything that can go wrong in process groups, stores, collectives, DDP and the launcher.
#[derive(Debug, thiserror::Error)]
pub enum DdpError {
    /// A torchrun environment variable is missing or malformed.
    #[error("environment variable {var}={value:?}: {reason}")]
    Env {
        /// Variable name, e.g. `RANK`.
        var: String,
        /// Value found (empty when missing).
        value: String,
        /// What is wrong, expected vs got.
        reason: String,
    },
    /// A TCPStore request failed (I/O error, protocol violation, closed connection).
    #[error("store {addr}: {op} {key:?}: {reason}")]
    Store {
        /// `host:port` of the store.
        addr: String,
        /// Request, e.g. `GET`.
        op: &'static str,
        /// Key as sent (with prefix), or empty.
        key: String,
        /// What went wrong.
        reason: String,
    },
    /// A store WAIT (or GET, which waits first) did not see its keys in time.
    #[error("store {addr}: waiting for keys {keys:?} timed out after {timeout:?}{hint}")]
    StoreTimeout {
        /// `host:port` of the store.
        addr: String,
        /// Keys that were still missing.
        keys: Vec<String>,
        /// The timeout that expired.
        timeout: Duration,
        /// Optional hint (empty or starting with "; ").
        hint: String,
    },
    /// A collective did not complete in time; names the ranks that never entered it.
    #[error("{tag}: {collective} timed out after {timeout:?}: {detail}")]
    CollectiveTimeout {
        /// Who raised it.
        tag: RankTag,
        /// `op #seq (call site)`.
        collective: String,
        /// The timeout that expired.
        timeout: Duration,
        /// Which ranks did not arrive and where they were last seen.
        detail: String,
    },
    /// Two ranks issued different collectives at the same sequence number.
    #[error(
        "{tag}: collective desync at #{seq}: this rank called {ours}, rank {peer} called {theirs}\n  \
         hint: every rank must issue the same collectives in the same order (rank-divergent code \
         path, unequal batch counts, or a collective inside `if rank == 0`)"
    )]
    Desync {
        /// Who raised it.
        tag: RankTag,
        /// Sequence number of the collective on this rank.
        seq: u64,
        /// This rank's collective (op, size, call site).
        ours: String,
        /// Rank that disagrees.
        peer: usize,
        /// The peer's collective.
        theirs: String,
    },
    /// A peer closed its connection or sent garbage during a collective (it died or aborted).
    #[error("{tag}: {collective}: peer rank {peer} {reason}")]
    PeerFailed {
        /// Who raised it.
        tag: RankTag,
        /// `op #seq (call site)`.
        collective: String,
        /// The failed peer.
        peer: usize,
        /// What happened (closed connection, reset, bad frame).
        reason: String,
    },
    /// A communicator-level failure that is not a peer's fault (setup, bad input, earlier failure).
    #[error("{tag}: {context}: {reason}")]
    Comm {
        /// Who raised it.
        tag: RankTag,
        /// Operation and object, e.g. `all_reduce #3 (f32 x 10)`.
        context: String,
        /// What went wrong, expected vs got.
        reason: String,
    },
    /// Parameters got no gradient before a synchronisation.
    #[error(
        "{tag}: {count} parameter(s) got no gradient before synchronisation #{sync}: {names:?}\n  \
         hint: put adapters only on modules the forward uses, freeze the others before wrapping, \
         or set `find_unused_parameters` when usage depends on the data (MoE)"
    )]
    UnusedParameters {
        /// Who raised it.
        tag: RankTag,
        /// 1-based number of the synchronised backward.
        sync: u64,
        /// How many.
        count: usize,
        /// Their names, model order.
        names: Vec<String>,
    },
    /// Trainable parameters differ between ranks (checksum mismatch).
    #[error(
        "{tag}: parameters drifted between ranks at step {step}: {detail}\n  \
         hint: a rank skipped an all-reduce (last micro-batch inside no_sync?) or applied a \
         rank-dependent update"
    )]
    ParameterDrift {
        /// Who raised it.
        tag: RankTag,
        /// Optimizer step (number of completed synchronisations).
        step: u64,
        /// First differing parameters and ranks.
        detail: String,
    },
    /// The DDP API was used in a way that would silently give wrong gradients.
    #[error("{tag}: {what}: {reason}")]
    Usage {
        /// Who raised it.
        tag: RankTag,
        /// Call and object, e.g. `grad_ready(layers.0.lora_A)`.
        what: String,
        /// What is wrong, expected vs got.
        reason: String,
    },
    /// A tensor operation inside DDP failed.
    #[error("{tag}: {context}: {source}")]
    Tensor {
        /// Who raised it.
        tag: RankTag,
        /// What was being done, naming the parameter or bucket.
        context: String,
        /// Candle's error.
        #[source]
        source: Box<candle_core::Error>,
    },
    /// An operating-system call failed outside a collective (bind, spawn, signal).
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The operation needs a cargo feature that this build lacks.
    #[error(
        "{what} needs the `{feature}` feature of g4ft-ddp (rebuild with --features {feature})"
    )]
    FeatureDisabled {
        /// What was requested.
        what: String,
        /// Feature name.
        feature: &'static str,
    },
}

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, DdpError>;

impl DdpError {
    /// Whether this error can be the consequence of another rank's exit (a closed store or peer
    /// connection, a wait that never ended) rather than a cause of its own.
    pub fn may_follow_peer_exit(&self) -> bool {
        matches!(
            self,
            DdpError::Store { .. }
                | DdpError::StoreTimeout { .. }
                | DdpError::CollectiveTimeout { .. }
                | DdpError::PeerFailed { .. }
        )
    }

    /// Whether some error in `err`'s source chain is a [`DdpError`] that
    /// [may follow a peer's exit](DdpError::may_follow_peer_exit).
    pub fn chain_may_follow_peer_exit(err: &(dyn std::error::Error + 'static)) -> bool {
        let mut cur = Some(err);
        while let Some(e) = cur {
            if e.downcast_ref::<DdpError>()
                .is_some_and(DdpError::may_follow_peer_exit)
            {
                return true;
            }
            cur = e.source();
        }
        false
    }

    /// An [`DdpError::Io`] with context.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        DdpError::Io {
            context: context.into(),
            source,
        }
    }
}

impl RankTag {
    /// A [`DdpError::Comm`] raised by this rank.
    pub fn comm(self, context: impl Into<String>, reason: impl Into<String>) -> DdpError {
        DdpError::Comm {
            tag: self,
            context: context.into(),
            reason: reason.into(),
        }
    }

    /// A [`DdpError::Usage`] raised by this rank.
    pub fn usage(self, what: impl Into<String>, reason: impl Into<String>) -> DdpError {
        DdpError::Usage {
            tag: self,
            what: what.into(),
            reason: reason.into(),
        }
    }

    /// Wraps a Candle error with this rank and a context naming the tensor.
    pub fn tensor(self, context: impl Into<String>) -> impl FnOnce(candle_core::Error) -> DdpError {
        let context = context.into();
        move |source| DdpError::Tensor {
            tag: self,
            context,
            source: Box::new(source),
        }
    }
}

#[cfg(test)]
mod tests {
    /// Callers return `Result<_, DdpError>` from traits and closures; clippy's
    /// `result_large_err` fires at 128 bytes, so keep the enum below it.
    #[test]
    fn error_stays_small() {
        assert!(
            std::mem::size_of::<super::DdpError>() < 128,
            "{}",
            std::mem::size_of::<super::DdpError>()
        );
    }
}
