//! SIGINT, SIGTERM and SIGHUP caught, so that a process stops on its own terms: the handler
//! records the first of them and counts them, and does nothing else (async-signal-safe), unless
//! [`Catch`] asks it to print a line on the first or to end the process on a repeat.
//!
//! `ddprun` forwards what it catches to its workers and gives them time to stop; `train_ddp`
//! stops at the next step boundary with a checkpoint and ends at once on a second signal.
//!
//! `ddprun` also stops its workers itself, with SIGTERM, when another worker failed; it first
//! writes why into a pipe each worker inherits ([`REASON_FD_ENV`]), so that the handler can
//! tell that stop from one a user asked for ([`Catch::launcher_notice`]).

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

/// The signals [`install`] catches.
pub const STOP_SIGNALS: [i32; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// Set by `ddprun` in each worker's environment: the number of an inherited file descriptor,
/// the read end of a pipe into which `ddprun` writes why it stops the workers (`worker rank 1
/// (node 0, local rank 1) exited with code 3`) before it sends them SIGTERM.
pub const REASON_FD_ENV: &str = "G4FT_STOP_REASON_FD";

/// What the handler does besides recording.
#[derive(Debug, Clone, Default)]
pub struct Catch {
    /// A line written to stderr on the first signal, `{signal}` in it replaced by the signal's
    /// name.
    pub notice: Option<String>,
    /// A second stop signal (the same again, or the SIGTERM with which torchrun passes on a
    /// second Ctrl-C) at least this long after the first ends the process at once with exit
    /// code 128 + the first signal (sooner, it is taken for the same request delivered twice, as
    /// a terminal and a launcher both do, or a launcher's own stop right behind the signal it
    /// forwarded).
    pub exit_on_repeat_after: Option<Duration>,
    /// A line written to stderr when a second signal ends the process.
    pub exit_notice: Option<String>,
    /// A line written to stderr instead of `notice` when the first signal is `ddprun` stopping
    /// the workers because another one failed, `{reason}` in it replaced by `ddprun`'s words for
    /// the failure; `exit_notice` is then not written either. The process stops as on any stop
    /// signal. torchrun also stops the survivors of a failure with SIGTERM, but says nothing to
    /// them: under torchrun that signal reads as any other (`notice`).
    pub launcher_notice: Option<String>,
}

static FIRST: AtomicI32 = AtomicI32::new(0);
static COUNT: AtomicU32 = AtomicU32::new(0);
static FIRST_AT_NS: AtomicU64 = AtomicU64::new(0);
/// 0: a repeat does not end the process.
static REPEAT_NS: AtomicU64 = AtomicU64::new(0);
/// The notice of each signal of [`STOP_SIGNALS`], formatted before the handler can run.
static NOTICES: OnceLock<[Vec<u8>; 3]> = OnceLock::new();
/// [`Catch::exit_notice`], formatted before the handler can run.
static EXIT_NOTICE: OnceLock<Vec<u8>> = OnceLock::new();
/// [`Catch::launcher_notice`] before and after its `{reason}`.
static LAUNCHER_NOTICE: OnceLock<(Vec<u8>, Vec<u8>)> = OnceLock::new();
/// The pipe of [`REASON_FD_ENV`], non-blocking; -1 without one.
static REASON_FD: AtomicI32 = AtomicI32::new(-1);
/// Whether the first signal was the launcher's stop after a failure.
static BY_LAUNCHER: AtomicBool = AtomicBool::new(false);
/// The most of a launcher's reason that is written.
const REASON_MAX: usize = 512;

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given and is async-signal-safe.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Writes `text` to stderr from the handler.
fn write_stderr(text: &[u8]) {
    // SAFETY: write(2) is async-signal-safe and reads only the `text.len()` bytes it is given.
    unsafe { libc::write(2, text.as_ptr().cast(), text.len()) };
}

/// Reads what the launcher wrote into the [`REASON_FD_ENV`] pipe, without its line ends, into
/// `buf`: the length, 0 when it wrote nothing (or there is no pipe).
fn launcher_reason(buf: &mut [u8]) -> usize {
    let fd = REASON_FD.load(Ordering::SeqCst);
    if fd < 0 {
        return 0;
    }
    // SAFETY: read(2) is async-signal-safe; the fd is non-blocking and `buf` is writable for
    // its length.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    let mut n = n.max(0) as usize;
    while n > 0 && matches!(buf[n - 1], b'\n' | b'\r') {
        n -= 1;
    }
    n
}

/// Takes the pipe [`REASON_FD_ENV`] names, if it is one this process holds: non-blocking, and
/// not passed on to the processes this one starts.
fn open_reason_pipe() {
    let Some(fd) = std::env::var(REASON_FD_ENV)
        .ok()
        .and_then(|v| v.parse::<i32>().ok())
        .filter(|&fd| fd > 2)
    else {
        return;
    };
    // SAFETY: fstat(2) and fcntl(2) on a descriptor number only read or set its flags; one that
    // is not open fails with EBADF, and anything but a pipe is left alone.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(fd, &mut st) != 0 || st.st_mode & libc::S_IFMT != libc::S_IFIFO {
            return;
        }
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags < 0
            || libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) != 0
            || libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) != 0
        {
            return;
        }
    }
    REASON_FD.store(fd, Ordering::SeqCst);
}

extern "C" fn on_signal(sig: libc::c_int) {
    // The other stop signals are blocked while this runs (sa_mask), so the first's time is
    // stored before any repeat reads it.
    COUNT.fetch_add(1, Ordering::SeqCst);
    let now = monotonic_ns();
    if FIRST
        .compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst)
        .is_ok()
    {
        FIRST_AT_NS.store(now, Ordering::SeqCst);
        let mut reason = [0u8; REASON_MAX];
        let n = launcher_reason(&mut reason);
        if n > 0 {
            BY_LAUNCHER.store(true, Ordering::SeqCst);
            if let Some((before, after)) = LAUNCHER_NOTICE.get() {
                write_stderr(before);
                write_stderr(&reason[..n]);
                write_stderr(after);
            }
            return;
        }
        let slot = STOP_SIGNALS.iter().position(|&s| s == sig);
        if let (Some(notices), Some(i)) = (NOTICES.get(), slot) {
            write_stderr(&notices[i]);
        }
        return;
    }
    let repeat = REPEAT_NS.load(Ordering::SeqCst);
    if repeat > 0 && now.saturating_sub(FIRST_AT_NS.load(Ordering::SeqCst)) >= repeat {
        if let Some(text) = EXIT_NOTICE
            .get()
            .filter(|_| !BY_LAUNCHER.load(Ordering::SeqCst))
        {
            write_stderr(text);
        }
        // SAFETY: _exit is async-signal-safe; ending the process here is what was asked.
        unsafe { libc::_exit(128 + FIRST.load(Ordering::SeqCst)) };
    }
}

/// Installs the handler for [`STOP_SIGNALS`] (with `SA_RESTART`, so that blocking calls in
/// progress continue). The first call's `catch` holds for the process.
pub fn install(catch: Catch) {
    if let Some(notice) = &catch.notice {
        let _ = NOTICES.set(
            STOP_SIGNALS
                .map(|s| format!("{}\n", notice.replace("{signal}", &name(s))).into_bytes()),
        );
    }
    if let Some(text) = &catch.exit_notice {
        let _ = EXIT_NOTICE.set(format!("{text}\n").into_bytes());
    }
    if let Some(text) = &catch.launcher_notice {
        let (before, after) = text.split_once("{reason}").unwrap_or((text, ""));
        let _ = LAUNCHER_NOTICE.set((before.into(), format!("{after}\n").into_bytes()));
    }
    open_reason_pipe();
    if let Some(after) = catch.exit_on_repeat_after {
        let _ = REPEAT_NS.compare_exchange(
            0,
            (after.as_nanos() as u64).max(1),
            Ordering::SeqCst,
            Ordering::SeqCst,
        );
    }
    for sig in STOP_SIGNALS {
        // SAFETY: a zeroed sigaction is a valid value to fill in; `on_signal` has the C ABI a
        // plain (not SA_SIGINFO) handler needs and touches only atomics, a static buffer and
        // async-signal-safe calls; replacing these signals' default disposition is intended.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as *const () as libc::sighandler_t;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            for s in STOP_SIGNALS {
                libc::sigaddset(&mut action.sa_mask, s);
            }
            libc::sigaction(sig, &action, std::ptr::null_mut());
        }
    }
}

/// The first signal caught, if any.
pub fn received() -> Option<i32> {
    match FIRST.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// How many signals were caught.
pub fn count() -> u32 {
    COUNT.load(Ordering::SeqCst)
}

/// One flag per signal of [`STOP_SIGNALS`], 1 for the one caught first: summed over ranks by an
/// all-reduce, [`flagged`] reads which any rank caught.
pub fn caught_flags() -> [f64; 3] {
    let caught = received();
    STOP_SIGNALS.map(|s| f64::from(u8::from(caught == Some(s))))
}

/// The first signal of [`STOP_SIGNALS`] whose flag is set in `flags` ([`caught_flags`] summed
/// over ranks), if any.
pub fn flagged(flags: &[f64]) -> Option<i32> {
    STOP_SIGNALS
        .into_iter()
        .zip(flags)
        .find_map(|(sig, &ranks)| (ranks > 0.0).then_some(sig))
}

/// The signal's name (`SIGINT`): the stop signals and those that end a crashed or killed
/// process; `signal N` for others.
pub fn name(sig: i32) -> String {
    let known = match sig {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        libc::SIGHUP => "SIGHUP",
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGILL => "SIGILL",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGQUIT => "SIGQUIT",
        s => return format!("signal {s}"),
    };
    known.into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// Set in the copy of this test binary that [`run_child`] starts: which sequence it raises.
    const CHILD: &str = "G4FT_SIGNALS_TEST_CHILD";
    const REPEAT_AFTER: Duration = Duration::from_millis(300);

    /// In the child: installs the handler, raises `mode`'s signals and exits with 10 + the
    /// number caught (unless the handler ended it first). In mode `launcher`, a launcher's
    /// reason waits in the pipe of [`REASON_FD_ENV`] first.
    fn child(mode: &str) -> ! {
        if mode == "launcher" {
            let mut fds = [0; 2];
            // SAFETY: pipe(2) fills the two descriptors; write(2) reads the given bytes.
            unsafe {
                assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
                let why = b"worker rank 1 exited with code 3\n";
                libc::write(fds[1], why.as_ptr().cast(), why.len());
            }
            std::env::set_var(REASON_FD_ENV, fds[0].to_string());
        }
        install(Catch {
            notice: Some("caught {signal}".into()),
            exit_on_repeat_after: Some(REPEAT_AFTER),
            exit_notice: Some("ending now".into()),
            launcher_notice: Some("stopped by the launcher: {reason}".into()),
        });
        let raise = |sig| {
            // SAFETY: raise(3) on this process, whose handler is installed above.
            unsafe { libc::raise(sig) };
        };
        let pause = || std::thread::sleep(REPEAT_AFTER + Duration::from_millis(100));
        raise(libc::SIGINT);
        match mode {
            "repeat-later" | "launcher" => {
                pause();
                raise(libc::SIGINT);
            }
            "repeat-at-once" => raise(libc::SIGINT),
            "another-later" => {
                pause();
                raise(libc::SIGTERM);
            }
            "another-at-once" => {
                raise(libc::SIGTERM);
                assert_eq!(received(), Some(libc::SIGINT));
            }
            _ => {}
        }
        std::process::exit(10 + count() as i32)
    }

    /// Runs `test` of this binary again in a child with `CHILD=mode`: its exit code and stderr.
    fn run_child(test: &str, mode: &str) -> (Option<i32>, String) {
        let out = Command::new(std::env::current_exe().unwrap())
            .args([test, "--exact", "--nocapture", "--test-threads", "1"])
            .env(CHILD, mode)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    #[test]
    fn flags_summed_over_ranks_name_the_first_stop_signal() {
        assert_eq!(flagged(&[0.0, 0.0, 0.0]), None);
        assert_eq!(flagged(&[0.0, 2.0, 1.0]), Some(libc::SIGTERM));
        assert_eq!(flagged(&[1.0, 1.0, 0.0]), Some(libc::SIGINT));
    }

    #[test]
    fn the_first_signal_is_noted_and_only_a_later_repeat_ends_the_process() {
        if let Ok(mode) = std::env::var(CHILD) {
            child(&mode);
        }
        let test =
            "signals::tests::the_first_signal_is_noted_and_only_a_later_repeat_ends_the_process";
        // One signal: noted once, the process goes on.
        let (code, err) = run_child(test, "once");
        assert_eq!(code, Some(11), "{err}");
        assert_eq!(err.matches("caught SIGINT").count(), 1, "{err}");
        // A second signal after the delay, the same or another (torchrun passes a second Ctrl-C
        // on as SIGTERM): the process ends as the first signal would end it.
        let (code, err) = run_child(test, "repeat-later");
        assert_eq!(code, Some(128 + libc::SIGINT), "{err}");
        assert!(err.ends_with("ending now\n"), "{err}");
        let (code, err) = run_child(test, "another-later");
        assert_eq!(code, Some(128 + libc::SIGINT), "{err}");
        // Sooner, it is the same request delivered twice: counted only.
        assert_eq!(run_child(test, "repeat-at-once").0, Some(12));
        assert_eq!(run_child(test, "another-at-once").0, Some(12));
    }

    #[test]
    fn a_launchers_stop_after_a_failure_says_why_instead_of_the_notices() {
        if let Ok(mode) = std::env::var(CHILD) {
            child(&mode);
        }
        let test =
            "signals::tests::a_launchers_stop_after_a_failure_says_why_instead_of_the_notices";
        // The launcher's reason replaces the notice; the process stops as on any signal, and
        // a later repeat ends it without the exit notice.
        let (code, err) = run_child(test, "launcher");
        assert_eq!(code, Some(128 + libc::SIGINT), "{err}");
        assert_eq!(
            err.lines().collect::<Vec<_>>(),
            ["stopped by the launcher: worker rank 1 exited with code 3"],
            "{err}"
        );
    }
}
