//! Shared helpers of the multi-process tests: run `ddprun`, or spawn workers by hand with a
//! torchrun environment and a store hosted by the test (to see how workers fail on their own).

#![allow(dead_code)] // each test file uses a subset

use g4ft_ddp::store::StoreServer;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const WORKER: &str = env!("CARGO_BIN_EXE_ddp_test_worker");
pub const DDPRUN: &str = env!("CARGO_BIN_EXE_ddprun");

/// Runs `ddprun <launcher args> -- <WORKER> <worker args>`.
pub fn ddprun(launcher: &[&str], worker: &[&str], timeout_s: f64) -> Output {
    let mut cmd = Command::new(DDPRUN);
    cmd.args(launcher).arg("--").arg(WORKER).args(worker);
    cmd.env("G4FT_DDP_TIMEOUT_S", timeout_s.to_string());
    cmd.output().expect("run ddprun")
}

/// Text of both streams, for assertions and failure messages.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// One worker's result when spawned without a launcher.
pub struct Ran {
    pub rank: usize,
    /// Exit code (`None` if killed by a signal or still running at the wall limit).
    pub code: Option<i32>,
    /// Whether the process ended before the wall limit.
    pub finished: bool,
    pub text: String,
    pub elapsed: Duration,
}

/// Spawns `world` workers with the torchrun environment against a store hosted here, waits
/// for all (killing any still alive after `wall_s`), and returns each rank's result.
pub fn spawn_world(world: usize, args: &[&str], timeout_s: f64, wall_s: u64) -> Vec<Ran> {
    let store = StoreServer::bind("127.0.0.1", 0).expect("bind store");
    spawn(world, args, timeout_s, wall_s, store.port(), true)
}

/// [`spawn_world`] with the store hosted by rank 0 (no agent store), as under plain torchrun
/// `--standalone` without the agent's store.
pub fn spawn_world_rank0_store(
    world: usize,
    args: &[&str],
    timeout_s: f64,
    wall_s: u64,
) -> Vec<Ran> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    spawn(world, args, timeout_s, wall_s, port, false)
}

fn spawn(
    world: usize,
    args: &[&str],
    timeout_s: f64,
    wall_s: u64,
    port: u16,
    agent_store: bool,
) -> Vec<Ran> {
    let t0 = Instant::now();
    let mut kids: Vec<_> = (0..world)
        .map(|rank| {
            Command::new(WORKER)
                .args(args)
                .env("RANK", rank.to_string())
                .env("LOCAL_RANK", rank.to_string())
                .env("WORLD_SIZE", world.to_string())
                .env("LOCAL_WORLD_SIZE", world.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .env(
                    "TORCHELASTIC_USE_AGENT_STORE",
                    if agent_store { "True" } else { "False" },
                )
                .env("TORCHELASTIC_RESTART_COUNT", "0")
                .env("TORCHELASTIC_RUN_ID", format!("t{}", std::process::id()))
                .env("G4FT_DDP_TIMEOUT_S", timeout_s.to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn worker")
        })
        .collect();
    let mut done: Vec<Option<(Option<i32>, Duration)>> = vec![None; world];
    while done.iter().any(Option::is_none) && t0.elapsed() < Duration::from_secs(wall_s) {
        for (r, k) in kids.iter_mut().enumerate() {
            if done[r].is_none() {
                if let Ok(Some(s)) = k.try_wait() {
                    done[r] = Some((s.code(), t0.elapsed()));
                }
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    kids.into_iter()
        .enumerate()
        .map(|(rank, mut k)| {
            if done[rank].is_none() {
                let _ = k.kill();
            }
            let out = k.wait_with_output().expect("collect worker output");
            let finished = done[rank].is_some();
            let (code, elapsed) = done[rank].unwrap_or((None, t0.elapsed()));
            Ran {
                rank,
                code,
                finished,
                text: text(&out),
                elapsed,
            }
        })
        .collect()
}
