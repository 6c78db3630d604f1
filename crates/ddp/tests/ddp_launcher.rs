//! `ddprun`: environment, output prefixes, failure handling, restarts, two nodes on loopback.

mod common;
use common::*;
use std::process::Command;
use std::time::Duration;

/// A loopback port free at the time of the call, for a store nobody else hosts.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

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
        "echo $TORCHELASTIC_USE_AGENT_STORE $TORCHELASTIC_RESTART_COUNT $GROUP_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $G4FT_LINES_PREFIXED",
    );
    let t = text(&o);
    assert!(t.contains("[rank 0] True 0 0 1 127.0.0.1 1"), "{t}");
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
fn a_killed_worker_is_named_with_its_signal() {
    let o = sh(
        &["--standalone", "--nproc-per-node", "2"],
        "if [ $RANK = 1 ]; then kill -KILL $$; fi; sleep 30",
    );
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(
        t.contains("worker rank 1 (node 0, local rank 1) was killed by SIGKILL"),
        "{t}"
    );
}

#[test]
fn output_held_open_by_a_workers_background_process_does_not_hold_the_launcher() {
    let t0 = std::time::Instant::now();
    let o = sh(&["--standalone"], "sleep 9 & echo started");
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t0.elapsed().as_secs() < 9, "took {:?}", t0.elapsed());
    assert!(
        t.contains("[rank 0] started") && t.contains("still holds its output open"),
        "{t}"
    );
}

#[test]
fn a_worker_program_that_does_not_exist_is_one_error_line() {
    let o = Command::new(DDPRUN)
        .args(["--standalone", "--", "/nonexistent/worker"])
        .output()
        .expect("run ddprun");
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(
        t.starts_with("ddprun: start worker 0: [\"/nonexistent/worker\"]: "),
        "{t}"
    );
    assert_eq!(
        (t.lines().count(), t.matches("ddprun").count()),
        (1, 1),
        "{t}"
    );
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
fn a_worker_stopped_by_a_signal_stops_the_job_without_a_restart() {
    // Rank 1 is sent SIGTERM (as by a scheduler) and stops at once; rank 0, as a trainer saving
    // the step's checkpoint, takes longer than the 3 s a failed job's workers get.
    let o = sh(
        &[
            "--standalone",
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "1",
        ],
        "if [ $RANK = 1 ]; then exit 143; fi; sleep 4; echo saved; exit 143",
    );
    let t = text(&o);
    assert_eq!(o.status.code(), Some(143), "{t}");
    assert!(
        t.contains("[rank 0] saved")
            && t.contains("the workers stopped on SIGTERM sent to one of them; not restarting")
            && !t.contains("restarting all workers"),
        "{t}"
    );
}

#[test]
fn nodes_with_different_worker_counts_are_an_error_at_the_rendezvous() {
    let ep = format!("127.0.0.1:{}", free_port());
    let node = |rank: &str, nproc: &str| {
        Command::new(DDPRUN)
            .args([
                "--nnodes",
                "2",
                "--nproc-per-node",
                nproc,
                "--node-rank",
                rank,
            ])
            .args([
                "--rdzv-endpoint",
                &ep,
                "--rdzv-id",
                "job2",
                "--rdzv-timeout",
                "20",
            ])
            .args(["--", "sh", "-c", "echo started"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn ddprun")
    };
    let (a, b) = (node("0", "1"), node("1", "2"));
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    let (ta, tb) = (text(&a), text(&b));
    // Node 0 says why; node 1 says so too, unless node 0's store went first.
    assert!(
        ta.contains("the nodes run different numbers of workers (node 0: 1, node 1: 2)"),
        "{ta}"
    );
    for (o, t) in [(&a, &ta), (&b, &tb)] {
        assert_eq!(o.status.code(), Some(1), "{t}");
        assert!(!t.contains("started"), "{t}");
    }
}

#[test]
fn workers_die_with_a_killed_launcher() {
    let mut launcher = Watched::start(&["--standalone"], "echo pid $$; sleep 60", true);
    launcher.wait_for("pid ", Duration::from_secs(20));
    let line = launcher.seen.iter().find(|l| l.contains("pid ")).unwrap();
    let pid = line.rsplit(' ').next().unwrap().to_string();
    launcher.signal(libc::SIGKILL);
    let _ = launcher.finish();
    let gone = (0..100).any(|_| {
        std::thread::sleep(Duration::from_millis(50));
        !std::path::Path::new(&format!("/proc/{pid}")).exists()
    });
    assert!(gone, "worker {pid} outlived its launcher");
}

/// Two launchers of two workers each, nodes 0 and 1 of job `id` at the endpoint `ep`, running
/// `worker`; their outputs once both have exited.
fn two_nodes(ep: &str, id: &str, worker: &[&str]) -> (std::process::Output, std::process::Output) {
    let node = |rank: &str| {
        Command::new(DDPRUN)
            .args([
                "--nnodes",
                "2",
                "--nproc-per-node",
                "2",
                "--node-rank",
                rank,
            ])
            .args(["--rdzv-id", id, "--rdzv-endpoint", ep, "--"])
            .args(worker)
            .env("G4FT_DDP_TIMEOUT_S", "20")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn ddprun")
    };
    let (a, b) = (node("0"), node("1"));
    (a.wait_with_output().unwrap(), b.wait_with_output().unwrap())
}

#[test]
fn two_nodes_on_loopback() {
    let ep = format!("127.0.0.1:{}", free_port());
    let (a, b) = two_nodes(&ep, "job1", &[WORKER, "collectives"]);
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

#[test]
fn workers_stopped_after_a_failure_are_told_which_worker_failed() {
    // Rank 3 (node 1) fails once the others wait for a stop signal; its node's launcher stops
    // rank 2 and node 0's launcher, told through the store, stops ranks 0 and 1.
    let ep = format!("127.0.0.1:{}", free_port());
    let script = format!("if [ $RANK = 3 ]; then sleep 3; exit 3; fi; exec {WORKER} wait-for-stop");
    let (a, b) = two_nodes(&ep, "job3", &["sh", "-c", &script]);
    let (ta, tb) = (text(&a), text(&b));
    let failed = "worker rank 3 (node 1, local rank 1) exited with code 3";
    assert!(
        tb.contains(&format!("ddprun: {failed}; stopping the other workers")),
        "{tb}"
    );
    assert!(
        ta.contains(&format!(
            "ddprun: another node failed: {failed}; stopping this node's workers"
        )),
        "{ta}"
    );
    for (o, t, ranks) in [(&a, &ta, [0, 1].as_slice()), (&b, &tb, &[2])] {
        assert_eq!(o.status.code(), Some(1), "{t}");
        for r in ranks {
            assert!(
                t.contains(&format!("[rank {r}] stopped by the launcher: {failed}\n")),
                "{t}"
            );
        }
        assert!(!t.contains("SIGTERM: stopping"), "{t}");
    }
}

#[test]
fn worker_counts_that_make_no_sense_are_errors() {
    for (n, says) in [
        ("0", "at least 1"),
        ("100000", "at most"),
        ("lots", "gpu, cpu or auto"),
    ] {
        let t0 = std::time::Instant::now();
        let o = sh(&["--standalone", "--nproc-per-node", n], "echo ran");
        let t = text(&o);
        assert_eq!(o.status.code(), Some(1), "{n}: {t}");
        assert!(
            t.contains("--nproc-per-node") && t.contains(says),
            "{n}: {t}"
        );
        assert!(!t.contains("ran"), "{n}: no worker may start: {t}");
        assert!(t0.elapsed().as_secs() < 5, "{n}: took {:?}", t0.elapsed());
    }
}

/// A launcher whose output is read line by line on threads, so that a test can wait for a line,
/// signal it and collect what it printed.
struct Watched {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
    readers: Vec<std::thread::JoinHandle<()>>,
    seen: Vec<String>,
}

impl Watched {
    /// Starts `ddprun <args> -- sh -c <script>`, reading its stderr, and its stdout if `stdout`.
    fn start(args: &[&str], script: &str, stdout: bool) -> Self {
        use std::io::{BufRead, BufReader, Read};
        use std::process::Stdio;
        let mut child = Command::new(DDPRUN)
            .args(args)
            .args(["--", "sh", "-c", script])
            .stdout(if stdout {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut streams: Vec<Box<dyn Read + Send>> = vec![Box::new(child.stderr.take().unwrap())];
        if let Some(out) = child.stdout.take() {
            streams.push(Box::new(out));
        }
        let (tx, lines) = std::sync::mpsc::channel();
        let readers = streams
            .into_iter()
            .map(|s| {
                let tx = tx.clone();
                std::thread::spawn(move || {
                    for line in BufReader::new(s).lines().map_while(Result::ok) {
                        let _ = tx.send(line);
                    }
                })
            })
            .collect();
        Watched {
            child,
            lines,
            readers,
            seen: Vec::new(),
        }
    }

    /// Waits for a line containing `note`; kills the launcher and panics when no line comes for
    /// `quiet`.
    fn wait_for(&mut self, note: &str, quiet: Duration) {
        while !self.seen.iter().any(|l| l.contains(note)) {
            match self.lines.recv_timeout(quiet) {
                Ok(line) => self.seen.push(line),
                Err(_) => {
                    let _ = self.child.kill();
                    panic!("no '{note}' within {quiet:?}: {:?}", self.seen);
                }
            }
        }
    }

    fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }

    /// Waits for the launcher to exit: its exit code, and every line it printed.
    fn finish(mut self) -> (Option<i32>, String) {
        let status = self.child.wait().unwrap();
        // The readers end at EOF, after the launcher's last line (it may lag the exit under load).
        for r in self.readers {
            r.join().unwrap();
        }
        self.seen.extend(self.lines.try_iter());
        (status.code(), self.seen.join("\n"))
    }
}

/// Starts a launcher that waits, waits until it says `note`, sends `sig`, and returns its exit
/// code and stderr.
fn interrupt_waiting(args: &[&str], note: &str, sig: i32) -> (Option<i32>, String) {
    let mut launcher = Watched::start(args, "echo ran", false);
    let t0 = std::time::Instant::now();
    launcher.wait_for(note, Duration::from_secs(10));
    assert!(
        t0.elapsed().as_secs() < 6,
        "the first note took {:?}",
        t0.elapsed()
    );
    launcher.signal(sig);
    let t1 = std::time::Instant::now();
    let stopped = launcher.finish();
    assert!(
        t1.elapsed().as_secs() < 3,
        "took {:?} to stop",
        t1.elapsed()
    );
    stopped
}

#[test]
fn a_launcher_waiting_for_another_node_says_so_and_stops_on_a_signal() {
    let ep = format!("127.0.0.1:{}", free_port());
    // Node 0 hosts the store and waits for node 1, which never starts.
    let (code, err) = interrupt_waiting(
        &["--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", &ep],
        "waiting for node(s) 1 of 2",
        libc::SIGTERM,
    );
    assert_eq!(code, Some(128 + libc::SIGTERM), "{err}");
    assert!(
        err.contains("stopped by SIGTERM while waiting for the other nodes"),
        "{err}"
    );
    // Node 1 waits for a store nobody hosts.
    let (code, err) = interrupt_waiting(
        &["--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", &ep],
        "waiting for the store",
        libc::SIGINT,
    );
    assert_eq!(code, Some(128 + libc::SIGINT), "{err}");
    assert!(
        err.contains("(hosted by node 0)") && err.contains("--rdzv-timeout"),
        "{err}"
    );
}

#[test]
fn a_store_that_never_comes_up_is_an_error_after_the_rendezvous_timeout() {
    let ep = format!("127.0.0.1:{}", free_port());
    let o = sh(
        &[
            "--nnodes",
            "2",
            "--node-rank",
            "1",
            "--rdzv-endpoint",
            &ep,
            "--rdzv-timeout",
            "2",
        ],
        "echo ran",
    );
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(
        t.contains("not reachable for 2 s (--rdzv-timeout): node 0's launcher hosts it")
            && !t.contains("retried for")
            && !t.contains("ran"),
        "{t}"
    );
}

#[test]
fn a_rendezvous_that_never_completes_times_out_naming_the_node() {
    let t0 = std::time::Instant::now();
    let o = sh(
        &[
            "--nnodes",
            "2",
            "--node-rank",
            "0",
            "--rdzv-timeout",
            "2",
            "--master-port",
            "0",
        ],
        "echo ran",
    );
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(
        t.contains("node(s) 1 of 2 never reached attempt_0/start"),
        "{t}"
    );
    assert!(t0.elapsed().as_secs() < 8, "took {:?}", t0.elapsed());
}

#[test]
fn a_rank_waiting_for_rank_0s_store_says_so() {
    let port = free_port();
    // Rank 1 of 2 without rank 0: the store it should connect to never comes up.
    let o = Command::new(WORKER)
        .arg("collectives")
        .envs([
            ("RANK", "1"),
            ("LOCAL_RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("TORCHELASTIC_USE_AGENT_STORE", "False"),
            ("G4FT_DDP_TIMEOUT_S", "6"),
        ])
        .env("MASTER_PORT", port.to_string())
        .output()
        .unwrap();
    let t = text(&o);
    assert!(!o.status.success(), "{t}");
    assert!(
        t.contains(&format!(
            "store 127.0.0.1:{port}: not reachable yet after 5 s of 6 s"
        )) && t.contains("waiting for rank 0 or the launcher"),
        "{t}"
    );
}

/// Starts `ddprun --standalone` on a worker script, sends it SIGINT once the worker has said
/// `ready`, then SIGINT again after `again` if given: the exit code, the seconds from the first
/// signal to the exit, and the output.
fn interrupt_running(script: &str, again: Option<Duration>) -> (Option<i32>, f64, String) {
    let mut launcher = Watched::start(&["--standalone"], script, true);
    launcher.wait_for("ready", Duration::from_secs(20));
    let t0 = std::time::Instant::now();
    launcher.signal(libc::SIGINT);
    if let Some(after) = again {
        std::thread::sleep(after);
        launcher.signal(libc::SIGINT);
    }
    let (code, out) = launcher.finish();
    (code, t0.elapsed().as_secs_f64(), out)
}

/// A worker that, as a trainer saving a checkpoint, takes `secs` seconds to stop on SIGINT,
/// unless a second SIGINT comes: then it stops at once. Other signals end it (bash's default).
fn slow_to_stop(secs: u32) -> String {
    format!(
        "got=0; trap 'got=$((got+1))' INT; echo ready; \
         while [ $got -eq 0 ]; do sleep 0.1; done; echo saving; \
         n=0; while [ $got -lt 2 ] && [ $n -lt {} ]; do sleep 0.1; n=$((n+1)); done; \
         if [ $got -ge 2 ]; then echo stopped at once; else echo saved; fi; exit 130",
        secs * 10
    )
}

#[test]
fn workers_given_a_signal_have_time_to_stop_on_their_own() {
    // Longer than the 3 s between SIGTERM and SIGKILL of a failed job's stop.
    let (code, secs, out) = interrupt_running(&slow_to_stop(5), None);
    assert_eq!(code, Some(128 + libc::SIGINT), "{out}");
    assert!(
        out.contains("SIGINT sent to the workers") && out.contains("[rank 0] saved"),
        "{out}"
    );
    assert!(secs >= 5.0, "stopped after {secs} s: {out}");
}

#[test]
fn a_second_signal_stops_the_workers_at_once() {
    let (code, secs, out) = interrupt_running(&slow_to_stop(60), Some(Duration::from_secs(1)));
    assert_eq!(code, Some(128 + libc::SIGINT), "{out}");
    // The second signal reaches the worker as the first did, not as a SIGTERM.
    assert!(
        out.contains("[rank 0] stopped at once") && !out.contains("[rank 0] saved"),
        "{out}"
    );
    assert!(secs < 20.0, "took {secs} s: {out}");
}
