//! Saying what a process waits for, one definition for the whole workspace.
//!
//! Nothing a g4ft tool does waits silently: a download, a tokenization, an evaluation, a lock held
//! by another process or a peer that has not arrived is reported on stderr after a short delay and
//! then at a steady interval. This crate holds what those reports share:
//!
//! - [`Schedule`]: when a long wait or a long piece of work speaks next;
//! - [`HolderLock`]: an exclusive lock file (`flock`) whose text names its holder, so that a
//!   process that finds it taken can say by whom; the kernel drops the lock when its holder dies,
//!   so a crash leaves no stale lock;
//! - [`host_name`] and [`this_process`]: how a holder names itself.

use std::fs::File;
use std::io::{Read, Seek, Write};
use std::path::Path;
use std::time::{Duration, Instant};

/// The interval of progress notes during long work (tokenizing, downloading, evaluating,
/// scoring).
pub const PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// When a wait or a piece of work that started at `start` speaks: first after `first`, then
/// `every` after each note.
#[derive(Debug, Clone)]
pub struct Schedule {
    start: Instant,
    next: Instant,
    every: Duration,
}

impl Schedule {
    /// A schedule starting now.
    pub fn new(first: Duration, every: Duration) -> Self {
        let start = Instant::now();
        Schedule {
            start,
            next: start + first,
            every,
        }
    }

    /// Progress notes of long work: every [`PROGRESS_EVERY`], the first one after that long.
    pub fn progress() -> Self {
        Self::new(PROGRESS_EVERY, PROGRESS_EVERY)
    }

    /// Whether a note is due now; if so, the next one is scheduled `every` from now.
    pub fn due_now(&mut self) -> bool {
        let now = Instant::now();
        if now < self.next {
            return false;
        }
        self.next = now + self.every;
        true
    }

    /// When the next note is due.
    pub fn next_due(&self) -> Instant {
        self.next
    }

    /// Time since the schedule started.
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// Whole seconds since the schedule started.
    pub fn elapsed_s(&self) -> u64 {
        self.elapsed().as_secs()
    }
}

/// This machine's name (Linux: the kernel's hostname; else `$HOSTNAME`; else `unknown-host`).
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown-host".into())
}

/// How this process names itself in a lock file: `pid P on HOST`.
pub fn this_process() -> String {
    format!("pid {} on {}", std::process::id(), host_name())
}

/// An exclusive lock on a file whose text names the holder; released when dropped or when the
/// process exits.
#[derive(Debug)]
pub struct HolderLock {
    _file: File,
}

/// What [`HolderLock::try_take`] found.
#[derive(Debug)]
pub enum Taken {
    /// This process now holds the lock.
    Held(HolderLock),
    /// Another process holds it: the text it wrote (`another process` when it wrote none yet).
    Busy(String),
}

impl HolderLock {
    /// Takes the lock of `path` (creating the file and its folder if needed) without waiting,
    /// and writes `holder` into it; or reads who holds it.
    pub fn try_take(path: &Path, holder: &str) -> std::io::Result<Taken> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let mut file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut text = String::new();
                let _ = file.read_to_string(&mut text);
                let text = text.trim();
                return Ok(Taken::Busy(if text.is_empty() {
                    "another process".into()
                } else {
                    text.to_string()
                }));
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(e),
        }
        file.set_len(0)?;
        file.rewind()?;
        file.write_all(holder.as_bytes())?;
        file.flush()?;
        Ok(Taken::Held(HolderLock { _file: file }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schedule_speaks_first_after_its_delay_then_every_interval() {
        let mut s = Schedule::new(Duration::ZERO, Duration::from_secs(60));
        assert!(s.due_now());
        assert!(!s.due_now());
        assert!(s.next_due() >= Instant::now() + Duration::from_secs(59));
        let mut late = Schedule::new(Duration::from_secs(60), Duration::ZERO);
        assert!(!late.due_now());
    }

    #[test]
    fn a_taken_lock_names_its_holder_until_released() {
        let dir = std::env::temp_dir().join(format!("g4ft-wait-lock-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("sub").join(".lock");
        let Taken::Held(held) = HolderLock::try_take(&path, "pid 1 on host-a").unwrap() else {
            panic!("a fresh lock is free")
        };
        match HolderLock::try_take(&path, "pid 2 on host-b").unwrap() {
            Taken::Busy(who) => assert_eq!(who, "pid 1 on host-a"),
            Taken::Held(_) => panic!("the lock is held"),
        }
        drop(held);
        assert!(matches!(
            HolderLock::try_take(&path, "pid 2 on host-b").unwrap(),
            Taken::Held(_)
        ));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "pid 2 on host-b");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn this_process_names_its_pid_and_host() {
        let me = this_process();
        assert!(me.starts_with(&format!("pid {} on ", std::process::id())));
        assert!(!host_name().is_empty());
    }
}
