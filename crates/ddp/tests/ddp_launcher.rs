//! `ddprun`: environment, output prefixes, failure handling, restarts, two nodes on loopback.

mod common;
use common::*;
use std::process::Command;

fn sh(launcher: &[&str], script: &str) -> std::process::Output {
    Command::new(DDPRUN)
        .args(launcher)
        .args(["--", "sh", "-c", script])
        .output()
        .expect("run ddprun")
}

#[test]
fn standalone_prints_both_ranks() {
    let o = sh(
        &["--standalone", "--nproc-per-node", "2"],
        "echo $RANK $LOCAL_RANK $WORLD_SIZE",
    );
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(
        t.contains("[rank 0] 0 0 2") && t.contains("[rank 1] 1 1 2"),
        "{t}"
    );
}

#[test]
fn torchrun_environment_is_complete() {
    let o = sh(
        &["--standalone", "--nproc_per_node=1"],
        "echo $TORCHELASTIC_USE_AGENT_STORE $TORCHELASTIC_RESTART_COUNT $GROUP_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR",
    );
    let t = text(&o);
    assert!(t.contains("[rank 0] True 0 0 1 127.0.0.1"), "{t}");
}

#[test]
fn failed_worker_stops_the_others_and_fails_the_launch() {
    let t0 = std::time::Instant::now();
    let o = sh(
        &["--standalone", "--nproc-per-node", "2"],
        "if [ $RANK = 1 ]; then exit 3; fi; sleep 30",
    );
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(t0.elapsed().as_secs() < 10, "took {:?}", t0.elapsed());
    assert!(t.contains("worker rank 1") && t.contains("code 3"), "{t}");
}

#[test]
fn restart_increments_restart_count() {
    let o = sh(
        &["--standalone", "--nproc-per-node", "2", "--max-restarts", "1"],
        "if [ $TORCHELASTIC_RESTART_COUNT = 0 ] && [ $RANK = 1 ]; then exit 3; fi; echo attempt $TORCHELASTIC_RESTART_COUNT",
    );
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(
        t.contains("[rank 0] attempt 1") && t.contains("[rank 1] attempt 1"),
        "{t}"
    );
}

#[test]
fn two_nodes_on_loopback() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let ep = format!("127.0.0.1:{port}");
    let node = |rank: &str| {
        Command::new(DDPRUN)
            .args([
                "--nnodes",
                "2",
                "--nproc-per-node",
                "2",
                "--node-rank",
                rank,
                "--rdzv-id",
                "job1",
            ])
            .args(["--rdzv-endpoint", &ep, "--", WORKER, "collectives"])
            .env("G4FT_DDP_TIMEOUT_S", "20")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn ddprun")
    };
    let (a, b) = (node("0"), node("1"));
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    let (ta, tb) = (text(&a), text(&b));
    assert!(
        a.status.success() && b.status.success(),
        "node 0:\n{ta}\nnode 1:\n{tb}"
    );
    for r in 0..2 {
        assert!(ta.contains(&format!("[rank {r}] OK collectives")), "{ta}");
        assert!(
            tb.contains(&format!("[rank {}] OK collectives", r + 2)),
            "{tb}"
        );
    }
}
