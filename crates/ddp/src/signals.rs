//! SIGINT, SIGTERM and SIGHUP caught, so that a process stops on its own terms: the handler
//! records the first of them and counts them, and does nothing else (async-signal-safe), unless
//! [`Catch`] asks it to print a line on the first or to end the process on a repeat.
//!
//! `ddprun` forwards what it catches to its workers and gives them time to stop; `train_ddp`
//! stops at the next step boundary with a checkpoint and ends at once on a second signal.

use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

/// The signals [`install`] catches.
pub const STOP_SIGNALS: [i32; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

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

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given and is async-signal-safe.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
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
        let slot = STOP_SIGNALS.iter().position(|&s| s == sig);
        if let (Some(notices), Some(i)) = (NOTICES.get(), slot) {
            let text = &notices[i];
            // SAFETY: write(2) is async-signal-safe; the buffer lives in a static.
            unsafe { libc::write(2, text.as_ptr().cast(), text.len()) };
        }
        return;
    }
    let repeat = REPEAT_NS.load(Ordering::SeqCst);
    if repeat > 0 && now.saturating_sub(FIRST_AT_NS.load(Ordering::SeqCst)) >= repeat {
        if let Some(text) = EXIT_NOTICE.get() {
            // SAFETY: write(2) is async-signal-safe; the buffer lives in a static.
            unsafe { libc::write(2, text.as_ptr().cast(), text.len()) };
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
    /// number caught (unless the handler ended it first).
    fn child(mode: &str) -> ! {
        install(Catch {
            notice: Some("caught {signal}".into()),
            exit_on_repeat_after: Some(REPEAT_AFTER),
            exit_notice: Some("ending now".into()),
        });
        let raise = |sig| {
            // SAFETY: raise(3) on this process, whose handler is installed above.
            unsafe { libc::raise(sig) };
        };
        let pause = || std::thread::sleep(REPEAT_AFTER + Duration::from_millis(100));
        raise(libc::SIGINT);
        match mode {
            "repeat-later" => {
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
}
