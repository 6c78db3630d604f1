//! `ddprun`: a launcher with torchrun's interface and worker environment.
//!
//! Mirrors `torch.distributed.run` + `LocalElasticAgent` for the static case: it hosts the
//! TCPStore (node 0, or whoever binds the rendezvous endpoint), starts `--nproc-per-node` workers
//! with the full torchrun environment (`TORCHELASTIC_USE_AGENT_STORE=True`, so workers connect as
//! clients under `/worker/attempt_<n>/`), prefixes their output lines with `[rank N]`, forwards
//! SIGINT/SIGTERM/SIGHUP, and when a worker fails stops every worker (on every node, through the
//! store; each is told which worker failed, [`crate::signals::REASON_FD_ENV`]) and exits 1, or
//! restarts them all with `TORCHELASTIC_RESTART_COUNT+1` within `--max-restarts`. Not
//! supported: elastic `--nnodes MIN:MAX` with MIN != MAX, `-m`/python modules (the command is
//! always executed as given, like `--no-python`).

mod args;
mod workers;

pub use args::Args;

use crate::error::{DdpError, Result};
use crate::signals;
use crate::store::{StoreClient, StoreServer};
use g4ft_wait::Schedule;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use workers::{Outcome, WorkerSet};

/// When a launcher that waits first says what it waits for, and how often after that.
fn note_schedule() -> Schedule {
    Schedule::new(Duration::from_secs(2), Duration::from_secs(10))
}

/// Resolved job layout of this node.
#[derive(Debug, Clone)]
pub struct Layout {
    /// Nodes in the job.
    pub nnodes: usize,
    /// This node's rank.
    pub node_rank: usize,
    /// Workers per node.
    pub nproc: usize,
    /// Store host as workers should reach it.
    pub master_addr: String,
    /// Store port.
    pub master_port: u16,
    /// `TORCHELASTIC_RUN_ID`.
    pub run_id: String,
}

/// Runs the launcher; returns the process exit code (0 when every worker of the last attempt
/// succeeded on every node).
pub fn run(args: &Args) -> Result<i32> {
    signals::install(signals::Catch::default());
    let (layout, _server) = rendezvous_setup(args)?;
    let timeout = Duration::from_secs(args.rdzv_timeout);
    let Some(mut store) = connect(&layout, timeout)? else {
        return Ok(interrupted("the store"));
    };
    let ns = format!("ddprun/{}", layout.run_id);
    for attempt in 0..=args.max_restarts {
        let start = format!("attempt_{attempt}/start");
        if let Some(code) = node_barrier(&mut store, &ns, &start, &layout, timeout)? {
            return Ok(code);
        }
        let env = workers::worker_env(&layout, attempt, args.max_restarts);
        let mut set = WorkerSet::spawn(&args.command, &layout, &env)?;
        let outcome = set.monitor(&mut store, &format!("{ns}/attempt_{attempt}"), &layout)?;
        match outcome {
            Outcome::Success => {
                // The store host keeps serving until every node's workers are done.
                if layout.node_rank == 0 {
                    let done = format!("attempt_{attempt}/done");
                    if let Some(code) = node_barrier(&mut store, &ns, &done, &layout, timeout)? {
                        return Ok(code);
                    }
                } else {
                    store.set(
                        &format!("{ns}/attempt_{attempt}/done/{}", layout.node_rank),
                        NodeEntry::of(&layout).to_string().as_bytes(),
                    )?;
                }
                return Ok(0);
            }
            Outcome::Signal(sig) => return Ok(128 + sig),
            Outcome::Stopped(sig) => {
                eprintln!(
                    "ddprun: the workers stopped on {} sent to one of them; not restarting",
                    signals::name(sig)
                );
                return Ok(128 + sig);
            }
            Outcome::Failed(why) => {
                eprintln!("ddprun: {why}");
                if attempt < args.max_restarts {
                    eprintln!(
                        "ddprun: restarting all workers (attempt {} of {})",
                        attempt + 1,
                        args.max_restarts
                    );
                } else {
                    eprintln!(
                        "ddprun: no restarts left (--max-restarts {}); exiting with failure",
                        args.max_restarts
                    );
                }
            }
        }
    }
    Ok(1)
}

/// Decides who hosts the store and where workers find it.
fn rendezvous_setup(args: &Args) -> Result<(Layout, Option<StoreServer>)> {
    let nnodes = args.nnodes()?;
    let (host, port) = if args.standalone {
        ("127.0.0.1".to_string(), 0)
    } else if let Some(ep) = &args.rdzv_endpoint {
        split_endpoint(ep)?
    } else {
        let addr = args
            .master_addr
            .clone()
            .unwrap_or_else(|| "127.0.0.1".into());
        (addr, args.master_port.unwrap_or(29500))
    };
    let node_rank = args.node_rank();
    let bind_host = if host == "127.0.0.1" || host == "localhost" {
        "127.0.0.1"
    } else {
        "0.0.0.0"
    };
    let server = if node_rank == 0 {
        Some(StoreServer::bind(bind_host, port)?)
    } else {
        None
    };
    let port = server.as_ref().map_or(port, |s| s.port());
    let run_id = if args.standalone {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        format!("{}-{}", std::process::id(), now.as_nanos())
    } else {
        args.rdzv_id.clone()
    };
    let layout = Layout {
        nnodes,
        node_rank,
        nproc: args.nproc()?,
        master_addr: host,
        master_port: port,
        run_id,
    };
    Ok((layout, server))
}

fn split_endpoint(ep: &str) -> Result<(String, u16)> {
    let bad = || DdpError::Env {
        var: "--rdzv-endpoint".into(),
        value: ep.into(),
        reason: "expected HOST:PORT".into(),
    };
    let (h, p) = ep.rsplit_once(':').ok_or_else(bad)?;
    Ok((h.to_string(), p.parse().map_err(|_| bad())?))
}

/// The exit code after a signal stopped a wait, saying what was being waited for.
fn interrupted(what: &str) -> i32 {
    let sig = signals::received().unwrap_or(libc::SIGINT);
    eprintln!(
        "ddprun: stopped by {} while waiting for {what}",
        signals::name(sig)
    );
    128 + sig
}

/// Connects to the rendezvous store in one-second attempts, so that a signal stops the wait
/// and on [`note_schedule`] a line says who is awaited; `None` if a signal arrived first.
fn connect(l: &Layout, timeout: Duration) -> Result<Option<StoreClient>> {
    let start = Instant::now();
    let mut notes = note_schedule();
    loop {
        if signals::received().is_some() {
            return Ok(None);
        }
        match StoreClient::connect(&l.master_addr, l.master_port, "", Duration::from_secs(1)) {
            // Reconnect with the full timeout for the requests that follow.
            Ok(_) => {
                return StoreClient::connect(&l.master_addr, l.master_port, "", timeout).map(Some)
            }
            Err(DdpError::Store { addr, reason, .. }) if start.elapsed() >= timeout => {
                // The last one-second attempt's own words without its retry note.
                let last = reason.split(" (retried").next().unwrap_or_default();
                return Err(DdpError::Store {
                    addr,
                    op: "connect",
                    key: String::new(),
                    reason: format!(
                        "{last}; not reachable for {} s (--rdzv-timeout): node 0's launcher \
                         hosts it; is it running, with this --rdzv-endpoint?",
                        timeout.as_secs()
                    ),
                });
            }
            Err(e) if start.elapsed() >= timeout => return Err(e),
            Err(_) => {}
        }
        if notes.due_now() {
            eprintln!(
                "ddprun: node {} waiting for the store at {}:{} (hosted by node 0): {} s of {} s (--rdzv-timeout); Ctrl-C stops",
                l.node_rank,
                l.master_addr,
                l.master_port,
                start.elapsed().as_secs(),
                timeout.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// What each launcher writes at a node barrier: its workers per node and who it is.
#[derive(Debug, Clone, PartialEq, Eq)]
struct NodeEntry {
    nproc: usize,
    /// `pid P on HOST`.
    launcher: String,
}

impl std::fmt::Display for NodeEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.nproc, self.launcher)
    }
}

impl NodeEntry {
    /// This launcher's entry.
    fn of(l: &Layout) -> NodeEntry {
        NodeEntry {
            nproc: l.nproc,
            launcher: g4ft_wait::this_process(),
        }
    }

    fn parse(bytes: &[u8]) -> NodeEntry {
        let text = String::from_utf8_lossy(bytes);
        let (nproc, launcher) = text
            .split_once(' ')
            .unwrap_or((&text, "an unknown launcher"));
        NodeEntry {
            nproc: nproc.parse().unwrap_or(0),
            launcher: launcher.to_string(),
        }
    }
}

/// The launchers at a barrier (`entries[n]`: node n's) must be one per node rank (the entry
/// under this node's rank is still `mine`) and run as many workers each (ranks are numbered
/// node by node).
fn check_nodes(entries: &[NodeEntry], mine: &NodeEntry, node_rank: usize) -> Result<()> {
    if entries.get(node_rank) != Some(mine) {
        let theirs = entries.get(node_rank).map_or("", |e| e.launcher.as_str());
        return Err(DdpError::Env {
            var: "--node-rank".into(),
            value: node_rank.to_string(),
            reason: format!(
                "the launcher {theirs} was started with the same node rank; give each \
                 launcher its own --node-rank (0 to --nnodes - 1)"
            ),
        });
    }
    if entries.iter().any(|e| e.nproc != mine.nproc) {
        let each: Vec<String> = entries
            .iter()
            .enumerate()
            .map(|(n, e)| format!("node {n}: {}", e.nproc))
            .collect();
        return Err(DdpError::Env {
            var: "--nproc-per-node".into(),
            value: mine.nproc.to_string(),
            reason: format!(
                "the nodes run different numbers of workers ({}); ddprun needs the same on every \
                 node",
                each.join(", ")
            ),
        });
    }
    Ok(())
}

/// All nodes set `<ns>/<what>/<node>` and wait for each other's key, in one-second waits so
/// that a signal stops it (returns the exit code) and on [`note_schedule`] a line names the nodes
/// still missing.
fn node_barrier(
    store: &mut StoreClient,
    ns: &str,
    what: &str,
    l: &Layout,
    timeout: Duration,
) -> Result<Option<i32>> {
    let mine = NodeEntry::of(l);
    store.set(
        &format!("{ns}/{what}/{}", l.node_rank),
        mine.to_string().as_bytes(),
    )?;
    let keys: Vec<String> = (0..l.nnodes).map(|n| format!("{ns}/{what}/{n}")).collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let start = Instant::now();
    let mut notes = note_schedule();
    loop {
        if signals::received().is_some() {
            return Ok(Some(interrupted(&format!("the other nodes at {what}"))));
        }
        match store.wait(&refs, Duration::from_secs(1)) {
            Ok(()) => {
                let entries = keys
                    .iter()
                    .map(|k| Ok(NodeEntry::parse(&store.get(k)?)))
                    .collect::<Result<Vec<_>>>()?;
                check_nodes(&entries, &mine, l.node_rank)?;
                return Ok(None);
            }
            Err(DdpError::StoreTimeout { keys: missing, .. }) => {
                let nodes: Vec<String> = missing
                    .iter()
                    .filter_map(|k| k.rsplit('/').next())
                    .map(str::to_string)
                    .collect();
                if start.elapsed() >= timeout {
                    return Err(DdpError::StoreTimeout {
                        addr: store.addr().to_string(),
                        keys: missing,
                        timeout,
                        hint: format!(
                            "; node(s) {} of {} never reached {what}: start a launcher on each with the same --rdzv-endpoint and --rdzv-id, or raise --rdzv-timeout",
                            nodes.join(", "),
                            l.nnodes
                        ),
                    });
                }
                if notes.due_now() {
                    eprintln!(
                        "ddprun: node {} waiting for node(s) {} of {} at {what}: {} s of {} s (--rdzv-timeout); Ctrl-C stops",
                        l.node_rank,
                        nodes.join(", "),
                        l.nnodes,
                        start.elapsed().as_secs(),
                        timeout.as_secs()
                    );
                }
            }
            Err(e) => return Err(e),
        }
    }
}
