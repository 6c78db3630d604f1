//! PyTorch-style DistributedDataParallel for Candle, model-agnostic.
//!
//! * [`env`](mod@env): the torchrun worker environment; without `WORLD_SIZE` a single process.
//! * [`store`]: PyTorch's TCPStore protocol, client (works under the real torchrun) and server.
//! * [`comm`]: the [`Communicator`] trait with a CPU ring backend over TCP and (feature `cuda`)
//!   an NCCL backend on a dedicated high-priority stream.
//! * [`ProcessGroup`]: rendezvous, numbered and fingerprinted collectives with timeouts, and the
//!   helpers "decide on rank 0" and "rank 0 works, then barrier". World size 1 runs no
//!   communicator, unless [`GroupOptions::force_nccl`] / `G4FT_DDP_FORCE_NCCL=1` asks for a
//!   one-rank NCCL communicator on a CUDA device (to exercise and time NCCL on one GPU).
//! * [`DistributedDataParallel`]: broadcast at construction, reverse-order fp32 buckets that are
//!   the gradient storage, async all-reduce per bucket during backward, `no_sync`, unused
//!   parameter and replica-drift detection.
//! * [`launcher`]: the `ddprun` launcher (torchrun's interface and environment).
//! * [`signals`]: SIGINT / SIGTERM / SIGHUP caught, for the launcher and its workers to stop on
//!   their own terms.
//!
//! Deliberately left out: models, optimizers, data loading (other crates), elastic membership
//! changes, `Join` for uneven inputs, reduce-scatter/ZeRO sharding.

#[cfg(any(feature = "cuda", test))]
mod accumulate;
pub mod bucket;
pub mod comm;
pub mod ddp;
pub mod env;
pub mod error;
pub mod fingerprint;
pub mod group;
pub mod launcher;
pub mod signals;
pub mod store;
mod wait;

pub use comm::{Backend, Communicator, ReduceOp, Work};
pub use ddp::{Bucket, DdpOptions, DistributedDataParallel, NoSync};
pub use env::DistEnv;
pub use error::{DdpError, RankTag, Result};
pub use group::{GroupOptions, ProcessGroup, DEFAULT_TIMEOUT, FORCE_NCCL_ENV};
