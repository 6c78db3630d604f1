//! The output folder of a run, kept safe from other runs.
//!
//! - An exclusive lock ([`LOCK_FILE`], `flock`) for the run's lifetime: a second run into the
//!   same folder fails at once, naming the holder. The kernel drops the lock when the process
//!   dies, so a crash leaves no stale lock.
//! - A run record ([`RUN_FILE`]): the run id (also in every checkpoint's marker and state), the
//!   launcher's job id (`TORCHELASTIC_RUN_ID`) and process id, the settings' fingerprint, host,
//!   pid and start time. A fresh run refuses a folder that holds another run's record, checkpoints or metrics
//!   unless `--overwrite-output` ([`claim`]); an elastic restart continues only the run whose
//!   record names its job ([`crate::checkpoint::resume`]).
//!
//! Only rank 0 writes here; the other ranks only read checkpoints.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use g4ft_wait::{host_name, HolderLock, Taken};
use serde::{Deserialize, Serialize};

use crate::checkpoint::{complete_checkpoints, remove_stale_temporaries, sync_path};
use crate::error::{Error, Result};
use crate::metrics::METRICS_FILE;

/// The run record in the output folder.
pub const RUN_FILE: &str = "run.json";
/// The lock file in the output folder (its text names the holder).
pub const LOCK_FILE: &str = ".lock";
/// Files a run writes besides its checkpoints (what `--overwrite-output` removes with them).
pub const RUN_OUTPUTS: [&str; 4] = [RUN_FILE, METRICS_FILE, "loss.svg", "tensorboard"];

/// Contents of [`RUN_FILE`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRecord {
    /// This run's id (`run-<unix seconds>-<pid>` of its first start).
    pub run_id: String,
    /// The launcher's job id (`TORCHELASTIC_RUN_ID`), if launched by one.
    pub launcher_run_id: Option<String>,
    /// The launcher's process id (rank 0's parent) at the first start, which tells apart jobs
    /// launched without an id.
    #[serde(default)]
    pub launcher_pid: Option<u32>,
    /// [`crate::checkpoint::state::config_fingerprint`] of the run's settings.
    pub config_fingerprint: String,
    /// Host of rank 0.
    pub host: String,
    /// Rank 0's process id at the first start.
    pub pid: u32,
    /// Unix seconds of the first start.
    pub started: u64,
}

impl RunRecord {
    /// A new run started now by this process, under the launcher job `launcher_run_id` whose
    /// process is `launcher_pid`.
    pub fn new(
        launcher_run_id: Option<String>,
        launcher_pid: u32,
        config_fingerprint: String,
    ) -> Self {
        let started = unix_now();
        let pid = std::process::id();
        Self {
            run_id: format!("run-{started}-{pid}"),
            launcher_run_id,
            launcher_pid: Some(launcher_pid),
            config_fingerprint,
            host: host_name(),
            pid,
            started,
        }
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn io_err(path: &Path, op: &str) -> impl FnOnce(std::io::Error) -> Error {
    let (path, op) = (path.to_path_buf(), op.to_string());
    move |source| Error::CheckpointIo { path, op, source }
}

/// The exclusive lock on an output folder; released when dropped (or when the process exits).
#[derive(Debug)]
pub struct OutputLock {
    _held: HolderLock,
}

/// Creates `dir` if needed and locks it for this process, writing `holder` (who and what) into
/// the lock file. Fails at once if another process holds the lock, naming it.
pub fn lock(dir: &Path, holder: &str) -> Result<OutputLock> {
    std::fs::create_dir_all(dir).map_err(io_err(dir, "create output dir"))?;
    let path = dir.join(LOCK_FILE);
    match HolderLock::try_take(&path, holder).map_err(io_err(&path, "lock"))? {
        Taken::Held(held) => Ok(OutputLock { _held: held }),
        Taken::Busy(holder) => Err(Error::OutputBusy {
            dir: dir.to_path_buf(),
            holder,
        }),
    }
}

/// The run record of `dir`, `None` if there is none.
pub fn read_run(dir: &Path) -> Result<Option<RunRecord>> {
    let path = dir.join(RUN_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err(&path, "read")(e)),
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| Error::CheckpointInvalid {
            path,
            reason: format!("unreadable run record: {e}"),
            hint: "the file was edited or truncated; move it away if the folder holds no run you need",
        })
}

/// Writes the run record atomically and durably (temporary file, fsync, rename, fsync of `dir`).
pub fn write_run(dir: &Path, record: &RunRecord) -> Result<()> {
    let path = dir.join(RUN_FILE);
    let tmp = dir.join(format!(".{RUN_FILE}.tmp-{}", std::process::id()));
    let json = serde_json::to_vec_pretty(record).expect("the run record serializes");
    std::fs::write(&tmp, json).map_err(io_err(&tmp, "write"))?;
    sync_path(&tmp)?;
    std::fs::rename(&tmp, &path).map_err(io_err(&path, "rename into place"))?;
    sync_path(dir)
}

/// What of a previous run `dir` holds: its record, its complete checkpoints, its other outputs.
pub fn previous_outputs(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut found: Vec<PathBuf> = complete_checkpoints(dir)?
        .into_iter()
        .map(|c| c.dir)
        .collect();
    found.extend(
        RUN_OUTPUTS
            .iter()
            .map(|f| dir.join(f))
            .filter(|p| p.exists()),
    );
    Ok(found)
}

/// Whether `dir` holds something of a run worth keeping: a complete checkpoint, or metrics. (A
/// record alone is what a run that failed while starting leaves.)
fn holds_data(dir: &Path) -> Result<bool> {
    let metrics = std::fs::metadata(dir.join(METRICS_FILE)).is_ok_and(|m| m.len() > 0);
    Ok(metrics || !complete_checkpoints(dir)?.is_empty())
}

/// The way on when a continued run's --output holds another run.
const CONTINUE_ELSEWHERE: &str = "continue into the folder of the run you resume, or into a new \
                                  --output";

/// How the run about to start relates to the folder's contents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// A new run: the folder must hold no other run, or `overwrite` removes it.
    New {
        /// `--overwrite-output`.
        overwrite: bool,
    },
    /// The run `run_id` continues (a resume or an elastic restart): the folder may hold only it.
    Continue {
        /// The continued run's id.
        run_id: String,
    },
}

/// Takes `dir` for a run (rank 0, under [`lock`]): removes crash leftovers, checks that the folder
/// holds no other run (or clears it for `Claim::New { overwrite: true }`), and writes the run
/// record. Returns the record in force.
pub fn claim(dir: &Path, claim: &Claim, fresh: RunRecord) -> Result<RunRecord> {
    std::fs::create_dir_all(dir).map_err(io_err(dir, "create output dir"))?;
    remove_stale_temporaries(dir)?;
    let existing = read_run(dir)?;
    let record = match claim {
        Claim::New { overwrite } => {
            if holds_data(dir)? && !overwrite {
                let hint = if complete_checkpoints(dir)?.is_empty() {
                    "it has no complete checkpoint to continue from: replace it with \
                     --overwrite-output (deletes its metrics), or choose another --output"
                } else {
                    "continue that run with --resume latest, replace it with --overwrite-output \
                     (deletes its checkpoints and metrics), or choose another --output"
                };
                return Err(Error::OutputTaken {
                    dir: dir.to_path_buf(),
                    what: describe(dir, existing.as_ref())?,
                    hint: hint.into(),
                });
            }
            {
                for p in previous_outputs(dir)? {
                    let r = if p.is_dir() {
                        std::fs::remove_dir_all(&p)
                    } else {
                        std::fs::remove_file(&p)
                    };
                    r.map_err(io_err(&p, "remove (--overwrite-output)"))?;
                }
            }
            fresh
        }
        Claim::Continue { run_id } => {
            let other = existing.as_ref().filter(|r| &r.run_id != run_id);
            if let Some(other) = other.filter(|_| holds_data(dir).unwrap_or(true)) {
                return Err(Error::OutputTaken {
                    dir: dir.to_path_buf(),
                    what: format!(
                        "{} (you are continuing {run_id})",
                        describe(dir, Some(other))?
                    ),
                    hint: CONTINUE_ELSEWHERE.into(),
                });
            }
            let foreign: Vec<String> = complete_checkpoints(dir)?
                .into_iter()
                .filter(|c| &c.marker.run_id != run_id)
                .map(|c| format!("{} (run {})", c.marker.name, c.marker.run_id))
                .collect();
            if !foreign.is_empty() {
                return Err(Error::OutputTaken {
                    dir: dir.to_path_buf(),
                    what: format!(
                        "checkpoints of another run: {} (you are continuing {run_id})",
                        foreign.join(", ")
                    ),
                    hint: CONTINUE_ELSEWHERE.into(),
                });
            }
            match existing {
                Some(r) if &r.run_id == run_id => r,
                _ => RunRecord {
                    run_id: run_id.clone(),
                    ..fresh
                },
            }
        }
    };
    write_run(dir, &record)?;
    Ok(record)
}

/// "run R (started at unix time T on H, pid P) with checkpoints step-20, step-40" for messages;
/// past five checkpoints, their count and the first and last written.
fn describe(dir: &Path, record: Option<&RunRecord>) -> Result<String> {
    let names: Vec<String> = complete_checkpoints(dir)?
        .into_iter()
        .map(|c| c.marker.name)
        .collect();
    let run = match record {
        Some(r) => format!(
            "run {} (started at unix time {} on {}, pid {})",
            r.run_id, r.started, r.host, r.pid
        ),
        None => "the outputs of an earlier run".into(),
    };
    Ok(match names.as_slice() {
        [] => format!("{run}, its metrics and no complete checkpoint"),
        [first, .., last] if names.len() > 5 => format!(
            "{run} with {} checkpoints, {first} first and {last} last",
            names.len()
        ),
        _ => format!("{run} with checkpoints {}", names.join(", ")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::write_checkpoint_atomic;

    fn tmp(tag: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("g4ft-rundir-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        p
    }

    fn ckpt(dir: &Path, name: &str, step: u64, run: &str) {
        write_checkpoint_atomic(dir, name, step, run, |d| {
            std::fs::write(d.join("a"), "x")?;
            Ok(())
        })
        .unwrap();
    }

    #[test]
    fn a_second_lock_fails_naming_the_holder() {
        let dir = tmp("lock");
        let held = lock(&dir, "pid 1 on host-a, run r1").unwrap();
        let msg = lock(&dir, "pid 2").unwrap_err().to_string();
        assert!(
            msg.contains("pid 1 on host-a, run r1") && msg.contains("in use"),
            "{msg}"
        );
        drop(held);
        lock(&dir, "pid 2").unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_new_run_refuses_a_folder_with_another_run() {
        let dir = tmp("new");
        let first = claim(
            &dir,
            &Claim::New { overwrite: false },
            RunRecord::new(None, 0, "f".into()),
        )
        .unwrap();
        ckpt(&dir, "step-2", 2, &first.run_id);
        std::fs::write(dir.join("metrics.jsonl"), "{}\n").unwrap();
        let second = RunRecord {
            run_id: "run-other".into(),
            ..first.clone()
        };
        // A record alone (a run that failed while starting) does not hold the folder.
        let empty = tmp("record-only");
        claim(&empty, &Claim::New { overwrite: false }, first.clone()).unwrap();
        claim(&empty, &Claim::New { overwrite: false }, second.clone()).unwrap();
        // Metrics without a complete checkpoint (a crash during the first save): nothing to
        // continue, so the hint offers only replacing it.
        std::fs::write(empty.join("metrics.jsonl"), "{}\n").unwrap();
        let msg = claim(&empty, &Claim::New { overwrite: false }, first.clone())
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("its metrics and no complete checkpoint")
                && msg.contains("no complete checkpoint to continue from")
                && !msg.contains("--resume"),
            "{msg}"
        );
        std::fs::remove_dir_all(&empty).unwrap();
        let msg = claim(&dir, &Claim::New { overwrite: false }, second.clone())
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains(&first.run_id)
                && msg.contains("step-2")
                && msg.contains("--resume latest")
                && msg.contains("--overwrite-output"),
            "{msg}"
        );
        // Overwriting removes the previous run's outputs, nothing else.
        std::fs::write(dir.join("notes.txt"), "mine").unwrap();
        let r = claim(&dir, &Claim::New { overwrite: true }, second).unwrap();
        assert_eq!(r.run_id, "run-other");
        assert!(!dir.join("step-2").exists() && !dir.join("metrics.jsonl").exists());
        assert!(dir.join("notes.txt").exists());
        assert_eq!(read_run(&dir).unwrap().unwrap().run_id, "run-other");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_folder_of_many_checkpoints_is_described_by_count_first_and_last() {
        let dir = tmp("many");
        let record = RunRecord::new(None, 0, "f".into());
        for step in (10..=70).step_by(10) {
            ckpt(&dir, &format!("step-{step}"), step, &record.run_id);
        }
        let said = describe(&dir, Some(&record)).unwrap();
        assert!(
            said.ends_with("with 7 checkpoints, step-10 first and step-70 last"),
            "{said}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn continuing_needs_the_folder_to_hold_only_that_run() {
        let dir = tmp("cont");
        let rec = claim(
            &dir,
            &Claim::New { overwrite: false },
            RunRecord::new(None, 0, "f".into()),
        )
        .unwrap();
        ckpt(&dir, "step-2", 2, &rec.run_id);
        let again = claim(
            &dir,
            &Claim::Continue {
                run_id: rec.run_id.clone(),
            },
            RunRecord::new(None, 0, "g".into()),
        )
        .unwrap();
        assert_eq!(again, rec, "the record of the continued run is kept");
        let msg = claim(
            &dir,
            &Claim::Continue {
                run_id: "run-x".into(),
            },
            RunRecord::new(None, 0, "g".into()),
        )
        .unwrap_err()
        .to_string();
        assert!(msg.contains(&rec.run_id) && msg.contains("run-x"), "{msg}");
        // A folder without record but with another run's checkpoint.
        std::fs::remove_file(dir.join(RUN_FILE)).unwrap();
        let msg = claim(
            &dir,
            &Claim::Continue {
                run_id: "run-x".into(),
            },
            RunRecord::new(None, 0, "g".into()),
        )
        .unwrap_err()
        .to_string();
        assert!(msg.contains("checkpoints of another run: step-2"), "{msg}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
