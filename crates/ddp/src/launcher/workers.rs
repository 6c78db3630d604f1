//! Worker processes of one attempt: environment, spawn (each in its own process group), output
//! prefixing, monitoring, and stopping (SIGTERM to the group, SIGKILL after a grace period;
//! after a failure, each worker is first told why through its [`signals::REASON_FD_ENV`]
//! pipe). A [`WorkerSet`] dropped with workers still running (the launcher's own error, such
//! as a lost store) stops them, so that no worker outlives its launcher.

use super::Layout;
use crate::error::{DdpError, Result};
use crate::signals;
use crate::store::StoreClient;
use std::io::{BufRead, BufReader, PipeWriter, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Grace period between SIGTERM and SIGKILL when stopping workers.
const GRACE: Duration = Duration::from_secs(3);
/// How long workers given the launcher's signal may take to stop on their own (a training worker
/// finishes its step and saves a checkpoint) before they are stopped: torchrun's 30 s.
const SIGNAL_GRACE: Duration = Duration::from_secs(30);
/// How long the output of workers that exited is still copied: a process a worker started in the
/// background can hold its output open after the worker is gone.
const DRAIN: Duration = Duration::from_secs(5);

/// How an attempt ended on this node.
#[derive(Debug)]
pub enum Outcome {
    /// Every local worker exited 0.
    Success,
    /// A worker (here or on another node) failed; the text says which.
    Failed(String),
    /// The launcher got this signal; workers were given it and have exited.
    Signal(i32),
    /// A worker (here or on another node) was sent this stop signal and exited with 128 + it,
    /// as a training worker does once the job has stopped at a step with its checkpoint; the
    /// others were given time to do the same. Not a failure: nothing is restarted.
    Stopped(i32),
}

/// The stop signal whose 128 + number `code` is, if any.
fn stop_signal_of(code: i32) -> Option<i32> {
    signals::STOP_SIGNALS
        .into_iter()
        .find(|&sig| code == 128 + sig)
}

/// The torchrun environment of every local worker of `attempt` (rank-specific variables are added
/// per worker in [`WorkerSet::spawn`]).
pub fn worker_env(l: &Layout, attempt: u32, max_restarts: u32) -> Vec<(String, String)> {
    let world = l.nnodes * l.nproc;
    let mut env = vec![
        ("WORLD_SIZE", world.to_string()),
        ("LOCAL_WORLD_SIZE", l.nproc.to_string()),
        ("GROUP_RANK", l.node_rank.to_string()),
        ("GROUP_WORLD_SIZE", l.nnodes.to_string()),
        ("ROLE_NAME", "default".into()),
        ("ROLE_WORLD_SIZE", world.to_string()),
        ("MASTER_ADDR", l.master_addr.clone()),
        ("MASTER_PORT", l.master_port.to_string()),
        ("TORCHELASTIC_RESTART_COUNT", attempt.to_string()),
        ("TORCHELASTIC_MAX_RESTARTS", max_restarts.to_string()),
        ("TORCHELASTIC_RUN_ID", l.run_id.clone()),
        ("TORCHELASTIC_USE_AGENT_STORE", "True".into()),
        (crate::env::LINES_PREFIXED_ENV, "1".into()),
        (
            "TORCHELASTIC_SIGNALS_TO_HANDLE",
            "SIGTERM,SIGINT,SIGHUP,SIGQUIT".into(),
        ),
    ];
    if std::env::var_os("TORCH_NCCL_ASYNC_ERROR_HANDLING").is_none() {
        env.push(("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1".into()));
    }
    if l.nproc > 1 && std::env::var_os("OMP_NUM_THREADS").is_none() {
        env.push(("OMP_NUM_THREADS", "1".into()));
    }
    env.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

struct Worker {
    rank: usize,
    local_rank: usize,
    child: Child,
    exit: Option<i32>,
    pumps: Vec<JoinHandle<()>>,
    /// The write end of the worker's [`signals::REASON_FD_ENV`] pipe.
    reason: PipeWriter,
}

/// Makes the worker `cmd` starts die with the launcher (Linux's parent-death signal, SIGKILL):
/// a launcher killed without a chance to stop its workers would otherwise leave them training
/// on, unseen, while the other nodes wait for them. Workers are started from the launcher's main
/// thread, whose end is the process's.
fn die_with_launcher(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: getpid(2) before the fork; prctl(2), getppid(2) and _exit(2) in the child are
    // async-signal-safe, as code between fork and exec must be.
    let launcher = unsafe { libc::getpid() };
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The launcher may have died before the signal was armed.
            if libc::getppid() != launcher {
                libc::_exit(128 + libc::SIGKILL);
            }
            Ok(())
        });
    }
}

/// Leaves the descriptor `fd` open in the worker `cmd` starts, where [`signals::REASON_FD_ENV`]
/// names it.
fn hand_over(cmd: &mut Command, fd: i32) {
    cmd.env(signals::REASON_FD_ENV, fd.to_string());
    // SAFETY: fcntl(2) in the child, between fork and exec, only clears the descriptor's
    // close-on-exec flag, and is async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// The local workers of one attempt.
pub struct WorkerSet {
    workers: Vec<Worker>,
}

impl WorkerSet {
    /// Starts `nproc` copies of `command` with `env` plus `RANK`, `LOCAL_RANK`, `ROLE_RANK`.
    pub fn spawn(command: &[String], l: &Layout, env: &[(String, String)]) -> Result<Self> {
        let mut set = WorkerSet {
            workers: Vec::new(),
        };
        for local_rank in 0..l.nproc {
            let rank = l.node_rank * l.nproc + local_rank;
            let mut cmd = Command::new(&command[0]);
            cmd.args(&command[1..])
                .envs(env.iter().map(|(k, v)| (k, v)))
                .env("RANK", rank.to_string())
                .env("LOCAL_RANK", local_rank.to_string())
                .env("ROLE_RANK", rank.to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .process_group(0);
            die_with_launcher(&mut cmd);
            let started = std::io::pipe().and_then(|(read_end, reason)| {
                hand_over(&mut cmd, read_end.as_raw_fd());
                // The read end is closed here once the worker holds it.
                Ok((cmd.spawn()?, reason))
            });
            let (mut child, reason) = match started {
                Ok(c) => c,
                Err(e) => {
                    set.stop();
                    return Err(DdpError::io(
                        format!("start worker {rank}: {:?}", command),
                        e,
                    ));
                }
            };
            let mut pumps = Vec::new();
            if let Some(out) = child.stdout.take() {
                pumps.push(pump(out, rank, false));
            }
            if let Some(err) = child.stderr.take() {
                pumps.push(pump(err, rank, true));
            }
            set.workers.push(Worker {
                rank,
                local_rank,
                child,
                exit: None,
                pumps,
                reason,
            });
        }
        Ok(set)
    }

    /// Polls workers, the launcher's signals and the job-wide failure key `<ns>/failed` until
    /// every worker exited 0, one failed (then the others are stopped and the failure is
    /// published for the other nodes), or a signal arrived (forwarded, then workers stopped).
    pub fn monitor(&mut self, store: &mut StoreClient, ns: &str, l: &Layout) -> Result<Outcome> {
        let failed_key = format!("{ns}/failed");
        let stopped_key = format!("{ns}/stopped");
        let mut last_check = Instant::now();
        loop {
            if let Some(sig) = signals::received() {
                self.signal_all(sig);
                self.wait_after_signal(sig);
                self.stop();
                return Ok(Outcome::Signal(sig));
            }
            let (mut failure, mut stopped) = (None, None);
            for w in &mut self.workers {
                if w.exit.is_none() {
                    if let Some(status) = w
                        .child
                        .try_wait()
                        .map_err(|e| DdpError::io("wait for worker", e))?
                    {
                        // A worker killed by a signal has no exit code; it did not stop on its
                        // own terms, so it counts as failed.
                        let (code, stop, how) = match status.code() {
                            Some(code) => (
                                code,
                                stop_signal_of(code),
                                format!("exited with code {code}"),
                            ),
                            None => {
                                let sig = signal_of(&status);
                                (
                                    128 + sig,
                                    None,
                                    format!("was killed by {}", signals::name(sig)),
                                )
                            }
                        };
                        w.exit = Some(code);
                        if let Some(sig) = stop {
                            stopped = stopped.or(Some(sig));
                        } else if code != 0 && failure.is_none() {
                            failure = Some(format!(
                                "worker rank {} (node {}, local rank {}) {how}",
                                w.rank, l.node_rank, w.local_rank
                            ));
                        }
                    }
                }
            }
            if let (None, Some(sig)) = (&failure, stopped) {
                if let Err(e) = store.set(&stopped_key, sig.to_string().as_bytes()) {
                    eprintln!("ddprun: could not tell the other nodes that the job stopped: {e}");
                }
                return Ok(self.stopped_by(sig));
            }
            if let Some(why) = failure {
                if let Err(e) = store.set(&failed_key, why.as_bytes()) {
                    eprintln!("ddprun: could not tell the other nodes that {why}: {e}");
                }
                self.stop_after_failure(&why);
                return Ok(Outcome::Failed(format!(
                    "{why}; stopping the other workers"
                )));
            }
            if self.workers.iter().all(|w| w.exit == Some(0)) {
                self.join_pumps();
                return Ok(Outcome::Success);
            }
            if l.nnodes > 1 && last_check.elapsed() > Duration::from_millis(200) {
                last_check = Instant::now();
                if store.check(&[&failed_key])? {
                    let why = String::from_utf8_lossy(&store.get(&failed_key)?).into_owned();
                    self.stop_after_failure(&why);
                    return Ok(Outcome::Failed(format!(
                        "another node failed: {why}; stopping this node's workers"
                    )));
                }
                if store.check(&[&stopped_key])? {
                    let sig = String::from_utf8_lossy(&store.get(&stopped_key)?).parse();
                    return Ok(self.stopped_by(sig.unwrap_or(libc::SIGTERM)));
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A worker stopped on `sig` (here or on another node): the others stop at the same step
    /// boundary, and get [`SIGNAL_GRACE`] to do so (rank 0 may be saving the checkpoint) before
    /// they are stopped.
    fn stopped_by(&mut self, sig: i32) -> Outcome {
        let deadline = Instant::now() + SIGNAL_GRACE;
        while Instant::now() < deadline && self.workers.iter().any(|w| w.exit.is_none()) {
            self.reap();
            std::thread::sleep(Duration::from_millis(20));
        }
        self.stop();
        Outcome::Stopped(sig)
    }

    /// Gives the workers that were sent `sig` [`SIGNAL_GRACE`] to exit on their own. A second
    /// signal to the launcher (even one that came before this wait began) is forwarded as `sig`
    /// again, which a worker takes as "stop now" (another signal it would only note, as it does
    /// a launcher's duplicate), and leaves them [`GRACE`] to do so.
    fn wait_after_signal(&mut self, sig: i32) {
        let mut deadline = Instant::now() + SIGNAL_GRACE;
        let mut repeated = false;
        eprintln!(
            "ddprun: {} sent to the workers; waiting up to {} s for them to stop (again to stop them at once)",
            signals::name(sig),
            SIGNAL_GRACE.as_secs()
        );
        while Instant::now() < deadline {
            self.reap();
            if self.workers.iter().all(|w| w.exit.is_some()) {
                return;
            }
            if !repeated && signals::count() >= 2 {
                self.signal_all(sig);
                repeated = true;
                deadline = Instant::now() + GRACE;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Records the exit of every worker that has exited.
    fn reap(&mut self) {
        for w in &mut self.workers {
            if w.exit.is_none() {
                if let Ok(Some(s)) = w.child.try_wait() {
                    w.exit = Some(s.code().unwrap_or(-1));
                }
            }
        }
    }

    fn signal_all(&self, sig: i32) {
        for w in self.workers.iter().filter(|w| w.exit.is_none()) {
            // SAFETY: kill(2) on the worker's own process group (created with process_group(0),
            // so its id is the child's pid); no memory is touched.
            unsafe {
                libc::kill(-(w.child.id() as libc::pid_t), sig);
            }
        }
    }

    /// [`WorkerSet::stop`] because `why` (a worker failed), which each live worker reads from
    /// its [`signals::REASON_FD_ENV`] pipe when the SIGTERM comes.
    fn stop_after_failure(&mut self, why: &str) {
        for w in self.workers.iter_mut().filter(|w| w.exit.is_none()) {
            // A worker that does not read it, or has exited meanwhile, leaves it unread.
            let _ = w.reason.write_all(why.as_bytes());
        }
        self.stop();
    }

    /// SIGTERM to every live worker's process group, SIGKILL after [`GRACE`], then reap.
    pub fn stop(&mut self) {
        self.signal_all(libc::SIGTERM);
        let deadline = Instant::now() + GRACE;
        loop {
            self.reap();
            if self.workers.iter().all(|w| w.exit.is_some()) || Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.signal_all(libc::SIGKILL);
        for w in &mut self.workers {
            if w.exit.is_none() {
                let _ = w.child.wait();
                w.exit = Some(-9);
            }
        }
        self.join_pumps();
    }

    /// Waits for the output of the exited workers to be copied, at most [`DRAIN`]; output held
    /// open longer by a process a worker left behind is no longer copied, with a warning.
    fn join_pumps(&mut self) {
        let deadline = Instant::now() + DRAIN;
        while Instant::now() < deadline
            && self
                .workers
                .iter()
                .any(|w| w.pumps.iter().any(|p| !p.is_finished()))
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        for w in &mut self.workers {
            let held = w.pumps.iter().any(|p| !p.is_finished());
            for p in w.pumps.drain(..).filter(|p| p.is_finished()) {
                let _ = p.join();
            }
            if held {
                eprintln!(
                    "ddprun: worker rank {} exited, but a process it started still holds its \
                     output open; its further output is not shown",
                    w.rank
                );
            }
        }
    }
}

impl Drop for WorkerSet {
    fn drop(&mut self) {
        if self.workers.iter().any(|w| w.exit.is_none()) {
            self.stop();
        }
    }
}

fn signal_of(status: &std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status.signal().unwrap_or(0)
}

/// Copies a worker's stream to ours line by line, each line prefixed with `[rank N] `.
fn pump(src: impl Read + Send + 'static, rank: usize, is_err: bool) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut r = BufReader::new(src);
        let mut line = Vec::new();
        while matches!(r.read_until(b'\n', &mut line), Ok(n) if n > 0) {
            if line.last() != Some(&b'\n') {
                line.push(b'\n');
            }
            let mut msg = format!("[rank {rank}] ").into_bytes();
            msg.extend_from_slice(&line);
            let _ = if is_err {
                std::io::stderr().lock().write_all(&msg)
            } else {
                std::io::stdout().lock().write_all(&msg)
            };
            line.clear();
        }
    })
}
