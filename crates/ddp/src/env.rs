//! The torchrun worker environment (`RANK`, `LOCAL_RANK`, `WORLD_SIZE`, ...), as set by the real
//! torchrun agent (PyTorch 2.11, `LocalElasticAgent._start_workers`) and by our `ddprun`.
//!
//! Invariant: without `WORLD_SIZE` the process is a single rank (world size 1) and needs no store;
//! with it, `RANK`, `MASTER_ADDR` and `MASTER_PORT` must be present and consistent.

use crate::error::{DdpError, Result};

/// Set to `1` by `ddprun` in its workers' environment: it prefixes every line they print with
/// `[rank N] `, so their own messages need not name their rank.
pub const LINES_PREFIXED_ENV: &str = "G4FT_LINES_PREFIXED";

/// The prefix of a worker's own messages (e.g. its last line, the error that ends it), read
/// through `get`: `[rank N] ` (`RANK`, 0 when unset) under torchrun or alone, nothing under
/// `ddprun` ([`LINES_PREFIXED_ENV`]), whose prefix would otherwise come twice.
pub fn message_prefix(get: impl Fn(&str) -> Option<String>) -> String {
    if get(LINES_PREFIXED_ENV).as_deref() == Some("1") {
        return String::new();
    }
    format!("[rank {}] ", get("RANK").unwrap_or_else(|| "0".into()))
}

/// Where a worker is in the job, read from the torchrun environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DistEnv {
    /// `RANK`: global rank.
    pub rank: usize,
    /// `LOCAL_RANK`: rank on this node (the CUDA ordinal).
    pub local_rank: usize,
    /// `WORLD_SIZE`: all processes.
    pub world_size: usize,
    /// `LOCAL_WORLD_SIZE`: processes on this node.
    pub local_world_size: usize,
    /// `GROUP_RANK`: this node's rank.
    pub group_rank: usize,
    /// `GROUP_WORLD_SIZE`: number of nodes.
    pub group_world_size: usize,
    /// `MASTER_ADDR`: host of the store.
    pub master_addr: String,
    /// `MASTER_PORT`: port of the store.
    pub master_port: u16,
    /// `TORCHELASTIC_RESTART_COUNT`: 0 on the first attempt, +1 per restart.
    pub restart_count: u32,
    /// `TORCHELASTIC_MAX_RESTARTS`.
    pub max_restarts: u32,
    /// `TORCHELASTIC_RUN_ID` (`none` for static launches).
    pub run_id: String,
    /// `TORCHELASTIC_USE_AGENT_STORE == "True"`: the launcher hosts the store and every rank,
    /// rank 0 included, connects as a client under the `/worker/attempt_<n>` prefix.
    pub use_agent_store: bool,
}

impl DistEnv {
    /// A single process: rank 0 of 1, no store.
    pub fn single() -> Self {
        DistEnv {
            rank: 0,
            local_rank: 0,
            world_size: 1,
            local_world_size: 1,
            group_rank: 0,
            group_world_size: 1,
            master_addr: "127.0.0.1".into(),
            master_port: 0,
            restart_count: 0,
            max_restarts: 0,
            run_id: "none".into(),
            use_agent_store: false,
        }
    }

    /// Reads the process environment; see [`DistEnv::from_lookup`].
    pub fn from_env() -> Result<Self> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Reads the variables through `get` (testable without touching the process environment).
    /// Errors name the variable and the bad value; `WORLD_SIZE` absent gives [`DistEnv::single`].
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let Some(world) = get("WORLD_SIZE") else {
            return Ok(Self::single());
        };
        let world_size: usize = parse("WORLD_SIZE", &world)?;
        if world_size == 0 {
            return Err(env_err("WORLD_SIZE", &world, "expected >= 1, got 0"));
        }
        let req =
            |k: &str| get(k).ok_or_else(|| env_err(k, "", "missing although WORLD_SIZE is set"));
        let rank: usize = parse("RANK", &req("RANK")?)?;
        if rank >= world_size {
            return Err(env_err(
                "RANK",
                &rank.to_string(),
                &format!("expected < WORLD_SIZE={world_size}"),
            ));
        }
        let opt = |k: &str, default: usize| -> Result<usize> {
            get(k).map_or(Ok(default), |v| parse(k, &v))
        };
        let (master_addr, master_port) = if world_size > 1 {
            (
                req("MASTER_ADDR")?,
                parse("MASTER_PORT", &req("MASTER_PORT")?)?,
            )
        } else {
            let addr = get("MASTER_ADDR").unwrap_or_else(|| "127.0.0.1".into());
            let port = get("MASTER_PORT").map_or(Ok(0), |v| parse("MASTER_PORT", &v))?;
            (addr, port)
        };
        Ok(DistEnv {
            rank,
            local_rank: opt("LOCAL_RANK", rank)?,
            world_size,
            local_world_size: opt("LOCAL_WORLD_SIZE", world_size)?,
            group_rank: opt("GROUP_RANK", 0)?,
            group_world_size: opt("GROUP_WORLD_SIZE", 1)?,
            master_addr,
            master_port,
            restart_count: opt("TORCHELASTIC_RESTART_COUNT", 0)? as u32,
            max_restarts: opt("TORCHELASTIC_MAX_RESTARTS", 0)? as u32,
            run_id: get("TORCHELASTIC_RUN_ID").unwrap_or_else(|| "none".into()),
            use_agent_store: get("TORCHELASTIC_USE_AGENT_STORE").as_deref() == Some("True"),
        })
    }

    /// Key prefix for the store: `/worker/attempt_<n>` under an agent store (PyTorch's
    /// `PrefixStore`, joined with `/`), none when rank 0 hosts a fresh store.
    pub fn store_prefix(&self) -> String {
        if self.use_agent_store {
            format!("/worker/attempt_{}/", self.restart_count)
        } else {
            String::new()
        }
    }
}

fn env_err(var: &str, value: &str, reason: &str) -> DdpError {
    DdpError::Env {
        var: var.into(),
        value: value.into(),
        reason: reason.into(),
    }
}

fn parse<T: std::str::FromStr>(var: &str, value: &str) -> Result<T> {
    value
        .trim()
        .parse()
        .map_err(|_| env_err(var, value, "expected a non-negative integer"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn lookup(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn own_messages_name_the_rank_unless_the_launcher_prefixes_every_line() {
        assert_eq!(message_prefix(lookup(&[])), "[rank 0] ");
        assert_eq!(message_prefix(lookup(&[("RANK", "3")])), "[rank 3] ");
        let ddprun = [("RANK", "3"), (LINES_PREFIXED_ENV, "1")];
        assert_eq!(message_prefix(lookup(&ddprun)), "");
    }

    #[test]
    fn absent_world_size_is_single_process() {
        assert_eq!(
            DistEnv::from_lookup(lookup(&[])).unwrap(),
            DistEnv::single()
        );
    }

    #[test]
    fn reads_agent_store_env() {
        let env = DistEnv::from_lookup(lookup(&[
            ("WORLD_SIZE", "4"),
            ("RANK", "3"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("GROUP_RANK", "1"),
            ("MASTER_ADDR", "10.0.0.1"),
            ("MASTER_PORT", "29500"),
            ("TORCHELASTIC_RESTART_COUNT", "2"),
            ("TORCHELASTIC_USE_AGENT_STORE", "True"),
        ]))
        .unwrap();
        assert_eq!(
            (env.rank, env.local_rank, env.world_size, env.group_rank),
            (3, 1, 4, 1)
        );
        assert_eq!(env.master_port, 29500);
        assert_eq!(env.store_prefix(), "/worker/attempt_2/");
    }

    #[test]
    fn errors_name_the_variable() {
        let err = DistEnv::from_lookup(lookup(&[("WORLD_SIZE", "2"), ("RANK", "x")])).unwrap_err();
        assert!(err.to_string().contains("RANK"), "{err}");
        let err = DistEnv::from_lookup(lookup(&[("WORLD_SIZE", "2"), ("RANK", "1")])).unwrap_err();
        assert!(err.to_string().contains("MASTER_ADDR"), "{err}");
        let err = DistEnv::from_lookup(lookup(&[("WORLD_SIZE", "2"), ("RANK", "2")])).unwrap_err();
        assert!(err.to_string().contains("< WORLD_SIZE=2"), "{err}");
    }
}
