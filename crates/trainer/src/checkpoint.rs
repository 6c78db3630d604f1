//! Atomic checkpoint directories: a crash never leaves a half-written directory that looks like
//! the latest checkpoint.
//!
//! Protocol (rank 0 only; the other ranks wait at a barrier, as in the post):
//! 1. write everything into `OUTPUT/.tmp-<name>-<pid>/` (the caller's closure: PEFT adapter,
//!    trainer state);
//! 2. fsync every file, then write the completion marker [`COMPLETE_MARKER`] listing each file
//!    and its size, fsync it and the directory;
//! 3. rename to `OUTPUT/<name>/` (an existing one is first moved aside and deleted after), fsync
//!    `OUTPUT`.
//!
//! A directory counts as a checkpoint only if its marker parses and every listed file exists with
//! the listed size; dot-directories (temporaries) never count. Checkpoints are ordered by when
//! they were written (each marker's [`CompleteMarker::sequence`]), not by step: a run resumed from
//! an earlier checkpoint writes lower steps than the ones it went back past, and what it writes is
//! its newest state. [`latest_complete_checkpoint`] picks the valid one written last;
//! [`latest_checkpoint_of_run`] the same among one run's checkpoints, which is what an elastic
//! restart and `--resume latest` resume from; [`prune_checkpoints`] removes the oldest written.
//!
//! What a run keeps on disk and how it starts from it has its own modules: the trainer state
//! saved in each checkpoint ([`state`]), the start of a run, fresh or from an adapter or a
//! checkpoint ([`resume`]), and the output folder's lock and run record ([`run_dir`]).

pub mod resume;
pub mod run_dir;
pub mod state;

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Name of the completion marker inside a checkpoint directory.
pub const COMPLETE_MARKER: &str = "checkpoint_complete.json";

/// What the caller's writer returns: any error type (the LoRA crate's, candle's, anyhow's).
pub type WriterResult = std::result::Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// Contents of [`COMPLETE_MARKER`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompleteMarker {
    /// Directory name (`epoch-0`, `step-200`).
    pub name: String,
    /// Optimizer steps completed when it was written.
    pub step: u64,
    /// Id of the run that wrote it (see [`crate::checkpoint::run_dir`]); empty if unknown.
    #[serde(default)]
    pub run_id: String,
    /// Write order in the output folder: one more than the highest sequence of the folder's
    /// complete checkpoints when it was written (0 where the marker has none).
    #[serde(default)]
    pub sequence: u64,
    /// Every other file, relative path → size in bytes.
    pub files: BTreeMap<String, u64>,
}

/// A complete checkpoint found on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointInfo {
    /// The checkpoint directory.
    pub dir: PathBuf,
    /// Its marker.
    pub marker: CompleteMarker,
}

fn io_err(path: &Path, op: &str) -> impl FnOnce(std::io::Error) -> Error {
    let (path, op) = (path.to_path_buf(), op.to_string());
    move |source| Error::CheckpointIo { path, op, source }
}

/// Writes checkpoint `name` of run `run_id` (after `step` optimizer steps) atomically under
/// `output_dir`:
/// `write` fills the temporary directory it is given; on success the directory appears as
/// `output_dir/name` with a completion marker, replacing an older one of the same name. If
/// `write` or a later step fails (sealing, the renames), the temporary directory is removed and
/// the older checkpoint of that name stays.
pub fn write_checkpoint_atomic(
    output_dir: &Path,
    name: &str,
    step: u64,
    run_id: &str,
    write: impl FnOnce(&Path) -> WriterResult,
) -> Result<CheckpointInfo> {
    std::fs::create_dir_all(output_dir).map_err(io_err(output_dir, "create output dir"))?;
    let pid = std::process::id();
    let tmp = output_dir.join(format!(".tmp-{name}-{pid}"));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(io_err(&tmp, "remove stale temporary dir"))?;
    }
    std::fs::create_dir(&tmp).map_err(io_err(&tmp, "create temporary dir"))?;

    if let Err(source) = write(&tmp) {
        let _ = std::fs::remove_dir_all(&tmp); // best effort: the error below is what matters
        return Err(Error::CheckpointWriter { dir: tmp, source });
    }

    let placed = seal_and_place(output_dir, name, step, run_id, &tmp);
    if placed.is_err() {
        // Best effort, as above; a crash instead leaves these to `remove_stale_temporaries`.
        let _ = std::fs::remove_dir_all(&tmp);
        let (dir, old) = (output_dir.join(name), old_path(output_dir, name));
        if old.exists() && !dir.exists() {
            let _ = std::fs::rename(&old, &dir);
        }
    }
    placed
}

/// Where a checkpoint being replaced waits while its successor moves in.
fn old_path(output_dir: &Path, name: &str) -> PathBuf {
    output_dir.join(format!(".old-{name}-{}", std::process::id()))
}

/// Records the written files' sizes in the completion marker, makes everything durable and puts
/// `tmp` in place as `output_dir/name` (the previous checkpoint of that name moved aside first,
/// then removed).
fn seal_and_place(
    output_dir: &Path,
    name: &str,
    step: u64,
    run_id: &str,
    tmp: &Path,
) -> Result<CheckpointInfo> {
    let mut files = BTreeMap::new();
    sync_tree(tmp, tmp, &mut files)?;
    let sequence = complete_checkpoints(output_dir)?
        .last()
        .map_or(1, |c| c.marker.sequence + 1);
    let marker = CompleteMarker {
        name: name.to_string(),
        step,
        run_id: run_id.to_string(),
        sequence,
        files,
    };
    let marker_path = tmp.join(COMPLETE_MARKER);
    let json = serde_json::to_vec_pretty(&marker).expect("the marker serializes");
    std::fs::write(&marker_path, json).map_err(io_err(&marker_path, "write marker"))?;
    sync_path(&marker_path)?;
    sync_path(tmp)?;

    let dir = output_dir.join(name);
    if dir.exists() {
        let old = old_path(output_dir, name);
        std::fs::rename(&dir, &old).map_err(io_err(&dir, "move the previous checkpoint aside"))?;
        std::fs::rename(tmp, &dir).map_err(io_err(tmp, &format!("rename to {}", dir.display())))?;
        std::fs::remove_dir_all(&old).map_err(io_err(&old, "remove the previous checkpoint"))?;
    } else {
        std::fs::rename(tmp, &dir).map_err(io_err(tmp, &format!("rename to {}", dir.display())))?;
    }
    sync_path(output_dir)?;
    Ok(CheckpointInfo { dir, marker })
}

/// fsyncs every file under `dir` (recursively) and its directories, recording sizes relative to
/// `root`.
fn sync_tree(root: &Path, dir: &Path, files: &mut BTreeMap<String, u64>) -> Result<()> {
    for entry in std::fs::read_dir(dir).map_err(io_err(dir, "list"))? {
        let path = entry.map_err(io_err(dir, "list"))?.path();
        if path.is_dir() {
            sync_tree(root, &path, files)?;
            sync_path(&path)?;
        } else {
            sync_path(&path)?;
            let len = std::fs::metadata(&path)
                .map_err(io_err(&path, "stat"))?
                .len();
            let rel = path
                .strip_prefix(root)
                .expect("walked from root")
                .to_string_lossy()
                .into_owned();
            files.insert(rel, len);
        }
    }
    Ok(())
}

/// fsync of a file or a directory (directories: so the renames and new entries are durable).
pub(crate) fn sync_path(path: &Path) -> Result<()> {
    File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(io_err(path, "fsync"))
}

/// Reads and validates the checkpoint in `dir`: the marker must parse and every listed file must
/// exist with its listed size. Errors explain what is missing (used for `--resume DIR`).
pub fn read_checkpoint(dir: &Path) -> Result<CheckpointInfo> {
    let invalid = |path: PathBuf, reason: String, hint: &'static str| Error::CheckpointInvalid {
        path,
        reason,
        hint,
    };
    if !dir.is_dir() {
        let reason = if dir.exists() {
            "not a directory"
        } else {
            "no such directory"
        };
        return Err(invalid(
            dir.to_path_buf(),
            reason.into(),
            "check the path; `--resume latest` takes the checkpoint of --output written last",
        ));
    }
    let marker_path = dir.join(COMPLETE_MARKER);
    let text = std::fs::read_to_string(&marker_path).map_err(|e| {
        invalid(
            marker_path.clone(),
            format!("no completion marker ({e})"),
            "the checkpoint was never completed (crash while saving?) or this is not a checkpoint directory; \
             pick an older one, or point --resume at the output directory's latest `step-*`/`epoch-*`",
        )
    })?;
    let marker: CompleteMarker = serde_json::from_str(&text).map_err(|e| {
        invalid(
            marker_path.clone(),
            format!("unreadable marker: {e}"),
            "the marker was edited or truncated",
        )
    })?;
    for (file, &want) in &marker.files {
        let path = dir.join(file);
        let got = std::fs::metadata(&path).map(|m| m.len());
        match got {
            Ok(len) if len == want => {}
            Ok(len) => {
                return Err(invalid(
                    path,
                    format!("size {len} bytes, expected {want} from the marker"),
                    "a file was modified or truncated after the checkpoint was written",
                ))
            }
            Err(e) => {
                return Err(invalid(
                    path,
                    format!("listed in the marker but unreadable: {e}"),
                    "files were deleted from the checkpoint",
                ))
            }
        }
    }
    Ok(CheckpointInfo {
        dir: dir.to_path_buf(),
        marker,
    })
}

/// The directories directly under `output_dir` that may be checkpoints (hidden ones, the
/// temporaries, left out); empty if the directory does not exist.
fn candidate_dirs(output_dir: &Path) -> Result<Vec<PathBuf>> {
    let entries = match std::fs::read_dir(output_dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err(output_dir, "list")(e)),
    };
    let mut dirs = Vec::new();
    for entry in entries {
        let path = entry.map_err(io_err(output_dir, "list"))?.path();
        let hidden = path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with('.'));
        if !hidden && path.is_dir() {
            dirs.push(path);
        }
    }
    Ok(dirs)
}

/// Every valid checkpoint directly under `output_dir`, oldest first (by write sequence, then step,
/// then name); empty if there is none or the directory does not exist. Incomplete directories and
/// temporaries are left out.
pub fn complete_checkpoints(output_dir: &Path) -> Result<Vec<CheckpointInfo>> {
    let mut found: Vec<CheckpointInfo> = candidate_dirs(output_dir)?
        .iter()
        .filter_map(|dir| read_checkpoint(dir).ok())
        .collect();
    found.sort_by_cached_key(|c| (c.marker.sequence, c.marker.step, c.marker.name.clone()));
    Ok(found)
}

/// Why each checkpoint directory under `output_dir` (in name order) whose completion marker is
/// there fails [`read_checkpoint`] (a file changed, truncated or deleted since);
/// [`complete_checkpoints`] leaves them out.
pub fn damaged_checkpoints(output_dir: &Path) -> Result<Vec<Error>> {
    let mut dirs = candidate_dirs(output_dir)?;
    dirs.sort();
    Ok(dirs
        .into_iter()
        .filter(|dir| dir.join(COMPLETE_MARKER).is_file())
        .filter_map(|dir| read_checkpoint(&dir).err())
        .collect())
}

/// The valid checkpoint written last directly under `output_dir` (the last of
/// [`complete_checkpoints`]), `None` if there is none or the directory does not exist.
pub fn latest_complete_checkpoint(output_dir: &Path) -> Result<Option<CheckpointInfo>> {
    Ok(complete_checkpoints(output_dir)?.pop())
}

/// [`latest_complete_checkpoint`] among the checkpoints that run `run_id` wrote.
pub fn latest_checkpoint_of_run(output_dir: &Path, run_id: &str) -> Result<Option<CheckpointInfo>> {
    Ok(complete_checkpoints(output_dir)?
        .into_iter()
        .rfind(|c| c.marker.run_id == run_id))
}

/// Deletes the complete checkpoints of `output_dir` written first until at most `keep` remain
/// (`--save-total-limit`), besides the last one written at step `best` (the best evaluation so
/// far, kept as transformers keeps its best checkpoint); returns what it removed. The one
/// written last is never removed.
pub fn prune_checkpoints(
    output_dir: &Path,
    keep: usize,
    best: Option<u64>,
) -> Result<Vec<PathBuf>> {
    let all = complete_checkpoints(output_dir)?;
    let excess = all.len().saturating_sub(keep.max(1));
    let spared = all.iter().rposition(|c| Some(c.marker.step) == best);
    let mut removed = Vec::new();
    let old = all.into_iter().enumerate().take(excess);
    for (_, c) in old.filter(|(i, _)| Some(*i) != spared) {
        std::fs::remove_dir_all(&c.dir).map_err(io_err(&c.dir, "remove an old checkpoint"))?;
        removed.push(c.dir);
    }
    Ok(removed)
}

/// Removes `.tmp-*` and `.old-*` directories left in `output_dir` by crashed saves; returns what
/// it removed. A save that replaces a checkpoint of the same name moves the old one aside as
/// `.old-<name>-<pid>` before renaming the new one into place: if a crash came between the two
/// renames, the old one is renamed back to `<name>` instead of removed. Call on rank 0 before
/// training (only rank 0 writes, so nothing else is writing).
pub fn remove_stale_temporaries(output_dir: &Path) -> Result<Vec<PathBuf>> {
    let mut removed = Vec::new();
    let entries = match std::fs::read_dir(output_dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(removed),
        Err(e) => return Err(io_err(output_dir, "list")(e)),
    };
    for entry in entries {
        let path = entry.map_err(io_err(output_dir, "list"))?.path();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if !path.is_dir() || !(name.starts_with(".tmp-") || name.starts_with(".old-")) {
            continue;
        }
        let replaced = name
            .strip_prefix(".old-")
            .and_then(|rest| rest.rsplit_once('-'))
            .map(|(ckpt, _pid)| output_dir.join(ckpt))
            .filter(|ckpt| !ckpt.exists() && read_checkpoint(&path).is_ok());
        if let Some(ckpt) = replaced {
            std::fs::rename(&path, &ckpt).map_err(io_err(&path, "restore a checkpoint"))?;
            sync_path(output_dir)?;
        } else {
            std::fs::remove_dir_all(&path).map_err(io_err(&path, "remove stale temporary dir"))?;
            removed.push(path);
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory under the system temp dir, removed on drop.
    struct TempDir(PathBuf);
    impl TempDir {
        fn new(tag: &str) -> Self {
            let p = std::env::temp_dir().join(format!("g4ft-ckpt-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).unwrap();
            Self(p)
        }
    }
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn write_files(
        files: &'static [(&'static str, &'static str)],
    ) -> impl FnOnce(&Path) -> WriterResult {
        move |dir| {
            for (name, text) in files {
                std::fs::write(dir.join(name), text)?;
            }
            Ok(())
        }
    }

    #[test]
    fn write_then_find_latest() {
        let out = TempDir::new("latest");
        write_checkpoint_atomic(&out.0, "step-2", 2, "r", write_files(&[("a.txt", "two")]))
            .unwrap();
        let info = write_checkpoint_atomic(
            &out.0,
            "step-10",
            10,
            "r",
            write_files(&[("a.txt", "ten!")]),
        )
        .unwrap();
        assert_eq!(info.dir, out.0.join("step-10"));
        assert_eq!(info.marker.files.get("a.txt"), Some(&4));
        let latest = latest_complete_checkpoint(&out.0).unwrap().unwrap();
        assert_eq!(latest.marker.name, "step-10", "not by name order");
        let names: Vec<String> = std::fs::read_dir(&out.0)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            names.iter().all(|n| !n.starts_with('.')),
            "no temporaries left: {names:?}"
        );
    }

    #[test]
    fn a_failure_after_the_writer_leaves_the_previous_checkpoint_and_no_temporary() {
        let out = TempDir::new("seal-fail");
        write_checkpoint_atomic(&out.0, "step-2", 2, "r", write_files(&[("a.txt", "ok")])).unwrap();
        // A dangling link: the writer succeeds, fsyncing what it left fails.
        let err = write_checkpoint_atomic(&out.0, "step-2", 4, "r", |dir| {
            std::os::unix::fs::symlink(dir.join("gone"), dir.join("link"))?;
            Ok(())
        })
        .unwrap_err();
        assert!(err.to_string().contains("fsync"), "{err}");
        let names: Vec<String> = std::fs::read_dir(&out.0)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["step-2"]);
        assert_eq!(
            read_checkpoint(&out.0.join("step-2")).unwrap().marker.step,
            2
        );
    }

    #[test]
    fn failed_writer_leaves_nothing() {
        let out = TempDir::new("fail");
        write_checkpoint_atomic(&out.0, "step-1", 1, "r", write_files(&[("a.txt", "ok")])).unwrap();
        let err = write_checkpoint_atomic(&out.0, "step-2", 2, "r", |dir| {
            std::fs::write(dir.join("half.bin"), "partial")?;
            Err("disk full".into())
        })
        .unwrap_err();
        assert!(err.to_string().contains("disk full"), "{err}");
        assert!(!out.0.join("step-2").exists());
        assert_eq!(std::fs::read_dir(&out.0).unwrap().count(), 1);
        assert_eq!(
            latest_complete_checkpoint(&out.0)
                .unwrap()
                .unwrap()
                .marker
                .step,
            1
        );
    }

    #[test]
    fn crash_leftovers_are_not_the_latest() {
        let out = TempDir::new("crash");
        write_checkpoint_atomic(&out.0, "step-5", 5, "r", write_files(&[("a.txt", "five")]))
            .unwrap();
        // a crash before the rename: a temporary with everything but the marker
        let tmp = out.0.join(".tmp-step-9-123");
        std::fs::create_dir(&tmp).unwrap();
        std::fs::write(tmp.join("a.txt"), "nine").unwrap();
        // a directory without a marker (e.g. copied by hand, or a non-atomic writer)
        std::fs::create_dir(out.0.join("step-8")).unwrap();
        // a complete marker whose file was truncated afterwards
        write_checkpoint_atomic(&out.0, "step-7", 7, "r", write_files(&[("a.txt", "seven")]))
            .unwrap();
        std::fs::write(out.0.join("step-7/a.txt"), "sev").unwrap();

        assert_eq!(
            latest_complete_checkpoint(&out.0)
                .unwrap()
                .unwrap()
                .marker
                .name,
            "step-5"
        );
        let msg = read_checkpoint(&out.0.join("step-8"))
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("no completion marker") && msg.contains("hint:"),
            "{msg}"
        );
        let msg = read_checkpoint(&out.0.join("step-7"))
            .unwrap_err()
            .to_string();
        assert!(msg.contains("size 3 bytes, expected 5"), "{msg}");
        let msg = read_checkpoint(&out.0.join("step-99"))
            .unwrap_err()
            .to_string();
        assert!(msg.contains("step-99: no such directory"), "{msg}");

        let removed = remove_stale_temporaries(&out.0).unwrap();
        assert_eq!(removed, vec![tmp]);
    }

    #[test]
    fn rewriting_a_name_replaces_it() {
        let out = TempDir::new("rewrite");
        write_checkpoint_atomic(
            &out.0,
            "epoch-0",
            3,
            "r",
            write_files(&[("a.txt", "old"), ("b.txt", "x")]),
        )
        .unwrap();
        write_checkpoint_atomic(&out.0, "epoch-0", 4, "r", write_files(&[("a.txt", "new!")]))
            .unwrap();
        let info = read_checkpoint(&out.0.join("epoch-0")).unwrap();
        assert_eq!(info.marker.step, 4);
        assert!(!out.0.join("epoch-0/b.txt").exists());
        assert_eq!(std::fs::read_dir(&out.0).unwrap().count(), 1);
    }

    #[test]
    fn latest_of_a_run_and_pruning() {
        let out = TempDir::new("prune");
        for (name, step, run) in [("step-2", 2, "a"), ("step-4", 4, "a"), ("step-6", 6, "b")] {
            write_checkpoint_atomic(&out.0, name, step, run, write_files(&[("a.txt", "x")]))
                .unwrap();
        }
        let a = latest_checkpoint_of_run(&out.0, "a").unwrap().unwrap();
        assert_eq!(a.marker.name, "step-4");
        assert!(latest_checkpoint_of_run(&out.0, "c").unwrap().is_none());
        let removed = prune_checkpoints(&out.0, 2, None).unwrap();
        assert_eq!(removed, vec![out.0.join("step-2")]);
        let left: Vec<String> = complete_checkpoints(&out.0)
            .unwrap()
            .into_iter()
            .map(|c| c.marker.name)
            .collect();
        assert_eq!(left, ["step-4", "step-6"]);
    }

    #[test]
    fn the_checkpoint_of_the_best_evaluation_outlives_the_limit() {
        let out = TempDir::new("prune-best");
        for (name, step) in [("step-2", 2), ("step-4", 4), ("step-6", 6), ("step-8", 8)] {
            write_checkpoint_atomic(&out.0, name, step, "r", write_files(&[("a.txt", "x")]))
                .unwrap();
        }
        assert_eq!(
            prune_checkpoints(&out.0, 2, Some(4)).unwrap(),
            [out.0.join("step-2")]
        );
        let left: Vec<String> = complete_checkpoints(&out.0)
            .unwrap()
            .into_iter()
            .map(|c| c.marker.name)
            .collect();
        assert_eq!(left, ["step-4", "step-6", "step-8"]);
        // A best among the newest costs nothing extra; of two checkpoints at the best step,
        // the one written last is spared.
        assert_eq!(
            prune_checkpoints(&out.0, 2, Some(8)).unwrap(),
            [out.0.join("step-4")]
        );
        write_checkpoint_atomic(&out.0, "epoch-0", 8, "r", write_files(&[("a.txt", "x")])).unwrap();
        write_checkpoint_atomic(&out.0, "step-10", 10, "r", write_files(&[("a.txt", "x")]))
            .unwrap();
        assert_eq!(
            prune_checkpoints(&out.0, 1, Some(8)).unwrap(),
            [out.0.join("step-6"), out.0.join("step-8")]
        );
    }

    #[test]
    fn after_going_back_to_an_earlier_step_the_latest_is_what_was_written_last() {
        let out = TempDir::new("rewind");
        let save = |name: &str, step| {
            write_checkpoint_atomic(&out.0, name, step, "r", write_files(&[("a.txt", "x")]))
                .unwrap()
        };
        for (name, step) in [("step-10", 10), ("step-20", 20), ("step-30", 30)] {
            save(name, step);
        }
        // Resumed from step-10: its next saves are the run's newest state.
        assert_eq!(save("step-15", 15).marker.sequence, 4);
        let latest = |dir: &Path| latest_checkpoint_of_run(dir, "r").unwrap().unwrap();
        assert_eq!(latest(&out.0).marker.name, "step-15");
        assert_eq!(
            prune_checkpoints(&out.0, 2, None).unwrap(),
            [out.0.join("step-10"), out.0.join("step-20")]
        );
        // The next save is the newest; the first written of the others goes.
        save("step-20", 20);
        assert_eq!(latest(&out.0).marker.name, "step-20");
        assert_eq!(
            prune_checkpoints(&out.0, 2, None).unwrap(),
            [out.0.join("step-30")]
        );
    }

    #[test]
    fn a_crash_while_replacing_a_checkpoint_restores_the_replaced_one() {
        let out = TempDir::new("replace-crash");
        let info =
            write_checkpoint_atomic(&out.0, "step-4", 4, "r", write_files(&[("a.txt", "four")]))
                .unwrap();
        // The crash came after moving step-4 aside, before the new one was renamed into place.
        let aside = out.0.join(".old-step-4-77");
        std::fs::rename(&info.dir, &aside).unwrap();
        let tmp = out.0.join(".tmp-step-4-77");
        std::fs::create_dir(&tmp).unwrap();
        assert_eq!(remove_stale_temporaries(&out.0).unwrap(), [tmp]);
        assert_eq!(read_checkpoint(&info.dir).unwrap().marker, info.marker);
        assert!(!aside.exists());
    }

    #[test]
    fn missing_output_dir_has_no_checkpoint() {
        assert!(latest_complete_checkpoint(Path::new("/nonexistent/g4ft"))
            .unwrap()
            .is_none());
    }
}
