//! `ddprun` command line: torchrun's flags, both `-` and `_` spellings.

use crate::error::{DdpError, Result};
use clap::Parser;

/// Command line of `ddprun` (torchrun-compatible subset).
#[derive(Debug, Clone, Parser)]
#[command(
    name = "ddprun",
    about = "Launch one process per device with torchrun's environment"
)]
pub struct Args {
    /// Single-node job with a fresh store on a free local port.
    #[arg(long)]
    pub standalone: bool,
    /// Worker processes on this node: a number, `gpu` (one per visible GPU), `cpu` (one per
    /// CPU core) or `auto` (`gpu` if there are GPUs, else `cpu`), as torchrun.
    #[arg(
        long = "nproc-per-node",
        visible_alias = "nproc_per_node",
        default_value = "1"
    )]
    pub nproc_per_node: String,
    /// Number of nodes (`N` or `N:N`).
    #[arg(long, default_value = "1")]
    pub nnodes: String,
    /// This node's rank (node 0 hosts the store); each launcher of a multi-node job needs its
    /// own, as ddprun does not assign them.
    #[arg(long = "node-rank", visible_alias = "node_rank")]
    pub node_rank: Option<usize>,
    /// `HOST:PORT` of the rendezvous store.
    #[arg(long = "rdzv-endpoint", visible_alias = "rdzv_endpoint")]
    pub rdzv_endpoint: Option<String>,
    /// Rendezvous id (`TORCHELASTIC_RUN_ID`); all nodes of a job use the same.
    #[arg(long = "rdzv-id", visible_alias = "rdzv_id", default_value = "none")]
    pub rdzv_id: String,
    /// Accepted for compatibility; the store is always a TCPStore.
    #[arg(
        long = "rdzv-backend",
        visible_alias = "rdzv_backend",
        default_value = "c10d"
    )]
    pub rdzv_backend: String,
    /// Restarts of all workers after a failure.
    #[arg(
        long = "max-restarts",
        visible_alias = "max_restarts",
        default_value_t = 0
    )]
    pub max_restarts: u32,
    /// Store host for static launches (without `--rdzv-endpoint`).
    #[arg(long = "master-addr", visible_alias = "master_addr")]
    pub master_addr: Option<String>,
    /// Store port for static launches.
    #[arg(long = "master-port", visible_alias = "master_port")]
    pub master_port: Option<u16>,
    /// Seconds the nodes wait for each other at a rendezvous (and for the store to come up).
    #[arg(
        long = "rdzv-timeout",
        visible_alias = "rdzv_timeout",
        default_value_t = 300,
        value_parser = clap::value_parser!(u64).range(1..=7 * 24 * 3600)
    )]
    pub rdzv_timeout: u64,
    /// Accepted for compatibility: the command always runs as an executable.
    #[arg(long = "no-python", visible_alias = "no_python")]
    pub no_python: bool,
    /// The worker command and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<String>,
}

/// Upper bound of `--nproc-per-node` regardless of the machine.
pub const MAX_NPROC: usize = 1024;

impl Args {
    /// `--nproc-per-node` resolved to a count: at least 1, at most `MAX_NPROC` and what the
    /// open-file limit allows (each worker holds two pipes in the launcher).
    pub fn nproc(&self) -> Result<usize> {
        let bad = |reason: String| DdpError::Env {
            var: "--nproc-per-node".into(),
            value: self.nproc_per_node.clone(),
            reason,
        };
        let cpus = || std::thread::available_parallelism().map_or(1, |n| n.get());
        let n = match self.nproc_per_node.as_str() {
            "gpu" => match visible_gpus() {
                0 => {
                    return Err(bad(
                        "no GPU is visible (CUDA_VISIBLE_DEVICES, NVIDIA driver)".into(),
                    ))
                }
                n => n,
            },
            "cpu" => cpus(),
            "auto" => match visible_gpus() {
                0 => cpus(),
                n => n,
            },
            text => text
                .parse::<usize>()
                .map_err(|_| bad("expected a number, gpu, cpu or auto".into()))?,
        };
        if n == 0 {
            return Err(bad("at least 1 worker is needed".into()));
        }
        let fd_limit = open_file_limit();
        let max = MAX_NPROC.min(fd_limit.saturating_sub(64) / 3).max(1);
        if n > max {
            return Err(bad(format!(
                "at most {max} workers per node (limit {MAX_NPROC}; open files allowed: {fd_limit})"
            )));
        }
        Ok(n)
    }

    /// `--nnodes` as a fixed count; elastic ranges with MIN != MAX are rejected.
    pub fn nnodes(&self) -> Result<usize> {
        let bad = |reason: &str| DdpError::Env {
            var: "--nnodes".into(),
            value: self.nnodes.clone(),
            reason: reason.into(),
        };
        let (lo, hi) = self
            .nnodes
            .split_once(':')
            .unwrap_or((&self.nnodes, &self.nnodes));
        let lo: usize = lo.parse().map_err(|_| bad("expected N or N:N"))?;
        let hi: usize = hi.parse().map_err(|_| bad("expected N or N:N"))?;
        if lo != hi || lo == 0 {
            return Err(bad(
                "elastic ranges are not supported; expected a fixed N >= 1",
            ));
        }
        if self.node_rank() >= lo {
            return Err(bad(&format!(
                "--node-rank {} must be < --nnodes",
                self.node_rank()
            )));
        }
        if lo > 1 && self.node_rank.is_none() {
            return Err(DdpError::Env {
                var: "--node-rank".into(),
                value: "unset".into(),
                reason: format!(
                    "a job of {lo} nodes needs each launcher's own --node-rank, 0 to {} (node \
                     0 hosts the store at --rdzv-endpoint); ddprun does not assign them",
                    lo - 1
                ),
            });
        }
        if lo > 1 && self.max_restarts > 0 && self.rdzv_id == "none" {
            return Err(DdpError::Env {
                var: "--rdzv-id".into(),
                value: self.rdzv_id.clone(),
                reason: "--max-restarts on several nodes needs the job's id, the same on every \
                         node, so that a restarted node can tell its job's checkpoints from \
                         another job's"
                    .into(),
            });
        }
        Ok(lo)
    }

    /// This node's rank (0 when `--node-rank` is not given, as on a single node).
    pub fn node_rank(&self) -> usize {
        self.node_rank.unwrap_or(0)
    }
}

/// GPUs this process may use: the entries of `CUDA_VISIBLE_DEVICES` when it is set, else the
/// GPUs the NVIDIA driver lists under `/proc/driver/nvidia/gpus`.
fn visible_gpus() -> usize {
    if let Ok(v) = std::env::var("CUDA_VISIBLE_DEVICES") {
        return v
            .split(',')
            .filter(|d| !d.trim().is_empty() && !d.starts_with('-'))
            .count();
    }
    std::fs::read_dir("/proc/driver/nvidia/gpus").map_or(0, |d| d.count())
}

/// The soft limit of open files of this process.
fn open_file_limit() -> usize {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we pass and touches nothing else.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } == 0;
    if ok {
        usize::try_from(r.rlim_cur).unwrap_or(usize::MAX)
    } else {
        1024
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn torchrun_spellings() {
        let a = Args::try_parse_from([
            "ddprun",
            "--standalone",
            "--nproc_per_node=2",
            "--max-restarts",
            "1",
            "--",
            "sh",
            "-c",
            "echo $RANK",
        ])
        .unwrap();
        assert!(a.standalone);
        assert_eq!((a.nproc().unwrap(), a.max_restarts), (2, 1));
        assert_eq!(a.command, vec!["sh", "-c", "echo $RANK"]);
        let b = Args::try_parse_from([
            "ddprun",
            "--nnodes",
            "2:2",
            "--node_rank",
            "1",
            "prog",
            "--flag",
        ])
        .unwrap();
        assert_eq!(b.nnodes().unwrap(), 2);
        assert_eq!(b.command, vec!["prog", "--flag"]);
        let c = Args::try_parse_from(["ddprun", "--nnodes", "1:4", "prog"]).unwrap();
        assert!(c.nnodes().unwrap_err().to_string().contains("elastic"));
    }

    #[test]
    fn several_nodes_need_node_ranks_and_restarts_a_job_id() {
        let nodes = |flags: &[&str]| {
            let mut argv = vec!["ddprun", "--nnodes", "2"];
            argv.extend(flags);
            argv.push("prog");
            Args::try_parse_from(argv).unwrap().nnodes()
        };
        let err = nodes(&[]).unwrap_err().to_string();
        assert!(
            err.contains("--node-rank") && err.contains("0 to 1"),
            "{err}"
        );
        assert_eq!(nodes(&["--node-rank", "0"]).unwrap(), 2);
        let err = nodes(&["--node-rank", "1", "--max-restarts", "1"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("--rdzv-id"), "{err}");
        let restartable = ["--node-rank", "1", "--max-restarts", "1", "--rdzv-id", "j"];
        assert_eq!(nodes(&restartable).unwrap(), 2);
        // One node needs neither.
        let one = Args::try_parse_from(["ddprun", "--max-restarts", "1", "prog"]).unwrap();
        assert_eq!((one.nnodes().unwrap(), one.node_rank()), (1, 0));
    }

    #[test]
    fn nproc_per_node_is_bounded_and_takes_torchruns_words() {
        let nproc = |v: &str| {
            Args::try_parse_from(["ddprun", "--nproc-per-node", v, "prog"])
                .unwrap()
                .nproc()
        };
        for (v, says) in [
            ("0", "at least 1"),
            ("100000", "at most"),
            ("two", "expected a number, gpu, cpu or auto"),
        ] {
            let msg = nproc(v).unwrap_err().to_string();
            assert!(
                msg.contains(says) && msg.contains("--nproc-per-node"),
                "{v}: {msg}"
            );
        }
        let cpus = std::thread::available_parallelism().unwrap().get();
        assert_eq!(nproc("cpu").unwrap(), cpus.min(nproc("cpu").unwrap()));
        assert!(nproc("auto").unwrap() >= 1);
        match visible_gpus() {
            0 => assert!(nproc("gpu").unwrap_err().to_string().contains("no GPU")),
            n => assert_eq!(nproc("gpu").unwrap(), n),
        }
    }
}
