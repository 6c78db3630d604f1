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
    /// Worker processes on this node.
    #[arg(
        long = "nproc-per-node",
        visible_alias = "nproc_per_node",
        default_value_t = 1
    )]
    pub nproc_per_node: usize,
    /// Number of nodes (`N` or `N:N`).
    #[arg(long, default_value = "1")]
    pub nnodes: String,
    /// This node's rank (node 0 hosts the store).
    #[arg(long = "node-rank", visible_alias = "node_rank", default_value_t = 0)]
    pub node_rank: usize,
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
    /// Accepted for compatibility: the command always runs as an executable.
    #[arg(long = "no-python", visible_alias = "no_python")]
    pub no_python: bool,
    /// The worker command and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<String>,
}

impl Args {
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
        if self.node_rank >= lo {
            return Err(bad(&format!(
                "--node-rank {} must be < --nnodes",
                self.node_rank
            )));
        }
        Ok(lo)
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
        assert_eq!((a.nproc_per_node, a.max_restarts), (2, 1));
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
}
