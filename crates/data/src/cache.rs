//! The token cache: one binary file per (data file, format, tokenizer, template, max_len, label
//! mode, line limit).
//!
//! Ranks and restarts reuse it. Every rank calls [`crate::TokenDataset::open`] itself before any
//! collective: the first process to create `<cache>.lock` tokenizes and renames a finished
//! temporary file into place (atomic); the others poll for the file, so a rank never sits in a
//! collective while another tokenizes (a known cause of NCCL timeouts).
//!
//! The lock file appears already `flock`ed by its builder (created under a temporary name,
//! locked, then hard-linked into place) and names it (`host pid`). A waiter that can lock it
//! knows the builder is gone, whatever host it ran on (the kernel, or the file server, drops the
//! lock of a dead process), and removes it saying so; a waiter says every few seconds whose build
//! it waits for and how to clear a lock by hand; after `lock_timeout` it tokenizes itself. The
//! process that takes the lock removes the temporary files of builds that died (killed while
//! tokenizing): those of this cache that nothing has written to for [`ABANDONED_AFTER`].
//!
//! Layout (little endian): magic `G4FTTOK1`; records, sample after sample, each its ids (u32)
//! then its labels (i32), `len` words each; `n+1` u64 record offsets (in 4-byte words after the
//! magic); `n` u64 source line numbers; the metadata JSON (key and report); a trailer of u64
//! offsets position, u64 metadata length and magic `G4FTTOKE`.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use g4ft_wait::{host_name, Schedule, PROGRESS_EVERY};

use crate::encoder::Encoded;
use crate::error::{DataError, Result};
use crate::prepare::PrepareReport;

const MAGIC: &[u8; 8] = b"G4FTTOK1";
const END_MAGIC: &[u8; 8] = b"G4FTTOKE";
/// Bumped when the layout or the encoding rules change.
pub const CACHE_VERSION: u32 = 2;

/// Everything the cached tokens depend on. Two opens share a cache file iff their keys are equal.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CacheKey {
    /// [`CACHE_VERSION`].
    pub version: u32,
    /// FNV-1a 64 of the data file's bytes (hex).
    pub data_hash: String,
    /// Data file size in bytes.
    pub data_len: u64,
    /// Row format (`chat`, `tokens`, ...).
    pub format: String,
    /// Encoder fingerprint (tokenizer, template, special tokens, options); `None` for tokens.
    pub encoder: Option<String>,
    /// Truncation length.
    pub max_len: usize,
    /// `full` or `assistant_only`.
    pub label_mode: String,
    /// Vocabulary bound checked on pre-tokenized ids.
    pub vocab_size: Option<usize>,
    /// JSONL line-size limit (longer lines are skipped).
    pub max_line_bytes: usize,
    /// The CSV field separator the file's name gives (`,` for `.csv`, a tab for `.tsv`); `None`
    /// for the kinds read by content. Two files of one content and stem are then two caches.
    pub csv_separator: Option<char>,
}

/// Metadata stored in the cache file.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct CacheMeta {
    /// The key the file was built for.
    pub key: CacheKey,
    /// Counts and skipped lines of the tokenization pass.
    pub report: PrepareReport,
}

/// Streams encoded rows into a temporary cache file, then renames it into place.
pub struct CacheWriter {
    tmp: PathBuf,
    out: BufWriter<File>,
    offsets: Vec<u64>,
    lines: Vec<u64>,
}

impl CacheWriter {
    /// Starts `<path>.tmp.<pid>.<nanos>` beside `path`.
    pub fn create(path: &Path) -> Result<Self> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let tmp = path.with_extension(format!("tmp.{}.{nanos}", std::process::id()));
        let file = File::create(&tmp).map_err(|e| DataError::io(&tmp, e))?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        out.write_all(MAGIC).map_err(|e| DataError::io(&tmp, e))?;
        Ok(CacheWriter {
            tmp,
            out,
            offsets: vec![0],
            lines: Vec::new(),
        })
    }

    /// Appends one row.
    pub fn push(&mut self, line: u64, row: &Encoded) -> Result<()> {
        let mut bytes = Vec::with_capacity(row.input_ids.len() * 8);
        bytes.extend(row.input_ids.iter().flat_map(|i| i.to_le_bytes()));
        bytes.extend(row.labels.iter().flat_map(|l| l.to_le_bytes()));
        self.out
            .write_all(&bytes)
            .map_err(|e| DataError::io(&self.tmp, e))?;
        let last = *self.offsets.last().expect("offsets start with 0");
        self.offsets.push(last + 2 * row.input_ids.len() as u64);
        self.lines.push(line);
        Ok(())
    }

    /// Writes the index and metadata, syncs, and renames the file to `path` (atomic).
    pub fn finish(mut self, path: &Path, meta: &CacheMeta) -> Result<()> {
        let tmp = self.tmp.clone();
        let io = |e| DataError::io(&tmp, e);
        let index_pos = 8 + 4 * *self.offsets.last().expect("offsets start with 0");
        let mut tail = Vec::with_capacity(16 * self.offsets.len() + 1024);
        tail.extend(self.offsets.iter().flat_map(|o| o.to_le_bytes()));
        tail.extend(self.lines.iter().flat_map(|l| l.to_le_bytes()));
        let json = serde_json::to_vec(meta).expect("cache metadata serializes");
        tail.extend_from_slice(&json);
        tail.extend(index_pos.to_le_bytes());
        tail.extend((json.len() as u64).to_le_bytes());
        tail.extend_from_slice(END_MAGIC);
        self.out.write_all(&tail).map_err(io)?;
        let file = self.out.into_inner().map_err(|e| io(e.into_error()))?;
        file.sync_all().map_err(io)?;
        std::fs::rename(&tmp, path).map_err(|e| DataError::io(path, e))
    }

    /// Removes the temporary file (on error paths).
    pub fn abandon(self) {
        let _ = std::fs::remove_file(&self.tmp);
    }
}

/// An opened cache file: its index in memory, records read on demand with positioned reads.
#[derive(Debug)]
pub struct CacheFile {
    /// The file.
    pub path: PathBuf,
    file: File,
    /// Record offsets in words, `n + 1` entries.
    pub offsets: Vec<u64>,
    /// Source line of each record.
    pub lines: Vec<u64>,
    /// Key and report.
    pub meta: CacheMeta,
}

impl CacheFile {
    /// Opens and validates a cache file.
    pub fn open(path: &Path) -> Result<Self> {
        let bad = |msg: String| DataError::Cache {
            path: path.to_path_buf(),
            msg,
        };
        let file = File::open(path).map_err(|e| DataError::io(path, e))?;
        let size = file.metadata().map_err(|e| DataError::io(path, e))?.len();
        if size < 8 + 24 {
            return Err(bad(format!("{size} bytes is too short")));
        }
        let mut trailer = [0u8; 24];
        file.read_exact_at(&mut trailer, size - 24)
            .map_err(|e| DataError::io(path, e))?;
        let mut head = [0u8; 8];
        file.read_exact_at(&mut head, 0)
            .map_err(|e| DataError::io(path, e))?;
        if &trailer[16..] != END_MAGIC || &head != MAGIC {
            return Err(bad(
                "bad magic (not a g4ft token cache, or an unfinished write)".into(),
            ));
        }
        let u64_at = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
        let (index_pos, json_len) = (u64_at(&trailer[..8]), u64_at(&trailer[8..16]));
        let tail_len = size.checked_sub(24 + index_pos).ok_or_else(|| {
            bad(format!(
                "index position {index_pos} is past the end ({size} bytes)"
            ))
        })?;
        let mut tail = vec![0u8; tail_len as usize];
        file.read_exact_at(&mut tail, index_pos)
            .map_err(|e| DataError::io(path, e))?;
        let index_len = tail
            .len()
            .checked_sub(json_len as usize)
            .filter(|l| l % 16 == 8)
            .ok_or_else(|| bad("index length is inconsistent".into()))?;
        let n = (index_len - 8) / 16;
        let words: Vec<u64> = tail[..index_len].chunks_exact(8).map(u64_at).collect();
        let (offsets, lines) = (words[..=n].to_vec(), words[n + 1..].to_vec());
        let meta: CacheMeta = serde_json::from_slice(&tail[index_len..])
            .map_err(|e| bad(format!("metadata: {e}")))?;
        if offsets.last().map(|&o| 8 + 4 * o) != Some(index_pos)
            || offsets
                .windows(2)
                .any(|w| w[1] < w[0] || (w[1] - w[0]) % 2 != 0)
        {
            return Err(bad("record offsets are inconsistent".into()));
        }
        Ok(CacheFile {
            path: path.to_path_buf(),
            file,
            offsets,
            lines,
            meta,
        })
    }

    /// Number of records.
    pub fn len(&self) -> usize {
        self.lines.len()
    }

    /// Whether there are no records.
    pub fn is_empty(&self) -> bool {
        self.lines.is_empty()
    }

    /// Token count of record `i`.
    pub fn record_len(&self, i: usize) -> usize {
        ((self.offsets[i + 1] - self.offsets[i]) / 2) as usize
    }

    /// Reads record `i` into `(ids, labels)`.
    pub fn read(&self, i: usize) -> Result<(Vec<u32>, Vec<i32>)> {
        let n = self.record_len(i);
        let mut bytes = vec![0u8; 8 * n];
        self.file
            .read_exact_at(&mut bytes, 8 + 4 * self.offsets[i])
            .map_err(|e| DataError::io(&self.path, e))?;
        let word = |c: &[u8]| <[u8; 4]>::try_from(c).expect("4 bytes");
        let ids = bytes[..4 * n]
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(word(c)))
            .collect();
        let labels = bytes[4 * n..]
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(word(c)))
            .collect();
        Ok((ids, labels))
    }
}

/// Holds `<cache>.lock` (and its `flock`) while this process builds the cache; removes it when
/// dropped.
pub struct BuildLock {
    path: PathBuf,
    _file: File,
}

impl Drop for BuildLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Outcome of waiting for a cache file.
pub enum Acquired {
    /// Another process finished the cache: open it.
    Ready,
    /// This process must build it (holding the lock, or without one after the timeout).
    Build(Option<BuildLock>),
}

/// When a waiter first says what it waits for (then every [`PROGRESS_EVERY`]).
const FIRST_NOTE: Duration = Duration::from_secs(2);

/// Takes the build lock of `cache`, or waits until another process has written `cache`.
pub fn acquire(cache: &Path, timeout: Duration) -> Result<Acquired> {
    let lock = cache.with_extension("lock");
    let mut notes = Schedule::new(FIRST_NOTE, PROGRESS_EVERY);
    loop {
        if cache.exists() {
            return Ok(Acquired::Ready);
        }
        if let Some(guard) = try_create_lock(&lock)? {
            // Another process may have finished between our check and the lock.
            if cache.exists() {
                return Ok(Acquired::Ready);
            }
            remove_abandoned_temporaries(cache);
            return Ok(Acquired::Build(Some(guard)));
        }
        match holder(&lock)? {
            Holder::Gone(who) => {
                eprintln!(
                    "token cache: removed the stale lock {} of {who}, which is no longer running",
                    lock.display()
                );
                continue;
            }
            Holder::Vanished => continue,
            Holder::Alive(who) => {
                if notes.elapsed() > timeout {
                    eprintln!(
                        "token cache: {} still held by {who} after {} s; tokenizing here instead",
                        lock.display(),
                        timeout.as_secs()
                    );
                    return Ok(Acquired::Build(None));
                }
                if notes.due_now() {
                    eprintln!(
                        "token cache: waiting for {who} to finish {} ({} s of {} s); if no such process is running, remove {}",
                        cache.display(),
                        notes.elapsed_s(),
                        timeout.as_secs(),
                        lock.display()
                    );
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// How long a temporary cache file must have gone unwritten to count as left by a dead build. A
/// live build writes its buffer out at least every few seconds; only one that lost the lock
/// (after `lock_timeout`) can be writing beside the lock holder.
pub const ABANDONED_AFTER: Duration = Duration::from_secs(600);

/// Removes `<cache>.tmp.*` files not written for [`ABANDONED_AFTER`], saying so (best effort: a
/// file that cannot be removed stays).
fn remove_abandoned_temporaries(cache: &Path) {
    let (Some(dir), Some(name)) = (cache.parent(), cache.file_stem()) else {
        return;
    };
    let prefix = format!("{}.tmp.", name.to_string_lossy());
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for path in entries.flatten().map(|e| e.path()) {
        let ours = path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with(&prefix));
        let idle = std::fs::metadata(&path)
            .and_then(|m| m.modified())
            .is_ok_and(|t| t.elapsed().is_ok_and(|age| age >= ABANDONED_AFTER));
        if ours && idle && std::fs::remove_file(&path).is_ok() {
            eprintln!(
                "token cache: removed {}, left by a build that did not finish",
                path.display()
            );
        }
    }
}

/// Creates `lock` already locked: a temporary file is locked and written, then hard-linked to
/// the lock's name (which fails if the lock exists). `None` if another process holds it.
fn try_create_lock(lock: &Path) -> Result<Option<BuildLock>> {
    // Unique per attempt, not just per process: threads of one process race here too, and a
    // shared name would let one truncate, lock or remove another's file before it is linked.
    static ATTEMPT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let attempt = ATTEMPT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = lock.with_extension(format!(
        "lock.{}-{}-{attempt}",
        host_name(),
        std::process::id()
    ));
    let mut file = File::create(&tmp).map_err(|e| DataError::io(&tmp, e))?;
    // A file system without locks still gets the lock file; liveness then falls back to pids.
    let _ = file.lock();
    writeln!(file, "{} {}", host_name(), std::process::id()).map_err(|e| DataError::io(&tmp, e))?;
    let linked = std::fs::hard_link(&tmp, lock);
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(Some(BuildLock {
            path: lock.to_path_buf(),
            _file: file,
        })),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(None),
        Err(e) => Err(DataError::io(lock, e)),
    }
}

/// What a waiter knows about the holder of an existing lock.
enum Holder {
    /// Still building (or undecidable): its description.
    Alive(String),
    /// Dead: the lock was removed; its description.
    Gone(String),
    /// The lock disappeared meanwhile.
    Vanished,
}

/// Decides whether the builder named in `lock` still runs: it does while it holds the file's
/// `flock`. A dead builder's lock is removed (only if `lock` is still the file that was checked).
fn holder(lock: &Path) -> Result<Holder> {
    use std::os::unix::fs::MetadataExt;
    let mut file = match File::open(lock) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Holder::Vanished),
        Err(e) => return Err(DataError::io(lock, e)),
    };
    let mut text = String::new();
    let _ = std::io::Read::read_to_string(&mut file, &mut text);
    let who = describe_holder(&text);
    let dead = match file.try_lock() {
        Ok(()) => true,
        Err(std::fs::TryLockError::WouldBlock) => false,
        // No locking on this file system: a process of this host that is gone is dead.
        Err(std::fs::TryLockError::Error(_)) => pid_is_gone(&text),
    };
    if !dead {
        return Ok(Holder::Alive(who));
    }
    let same = match (file.metadata(), std::fs::metadata(lock)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    };
    if !same {
        return Ok(Holder::Vanished);
    }
    let _ = std::fs::remove_file(lock);
    Ok(Holder::Gone(who))
}

/// `process 123 on host-a` from the lock's text (`an unknown process` if it is empty or
/// unreadable, as when its writer died right after creating it).
fn describe_holder(text: &str) -> String {
    let mut parts = text.split_whitespace();
    match (parts.next(), parts.next()) {
        (Some(host), Some(pid)) => format!("process {pid} on {host}"),
        _ => "an unknown process (empty lock file)".into(),
    }
}

/// Whether the lock's text names a process of this host that no longer exists.
fn pid_is_gone(text: &str) -> bool {
    let mut parts = text.split_whitespace();
    match (
        parts.next(),
        parts.next().and_then(|p| p.parse::<u32>().ok()),
    ) {
        (Some(host), Some(pid)) => {
            host == host_name() && !Path::new(&format!("/proc/{pid}")).exists()
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> CacheMeta {
        CacheMeta {
            key: CacheKey {
                version: CACHE_VERSION,
                data_hash: "0".into(),
                data_len: 0,
                format: "tokens".into(),
                encoder: None,
                max_len: 8,
                label_mode: "full".into(),
                vocab_size: None,
                max_line_bytes: 1 << 20,
                csv_separator: None,
            },
            report: PrepareReport::default(),
        }
    }

    #[test]
    fn stale_and_foreign_locks_are_told_apart() {
        let dir = std::env::temp_dir().join(format!("g4ft-cache-lock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cache = dir.join("x.g4tok");
        let lock = cache.with_extension("lock");
        // An empty lock nobody holds (its writer died before writing), and one of another
        // host whose process is gone: both removed at once.
        for text in ["", "other-host 4242\n"] {
            std::fs::write(&lock, text).unwrap();
            let t0 = std::time::Instant::now();
            let Acquired::Build(Some(guard)) = acquire(&cache, Duration::from_secs(60)).unwrap()
            else {
                panic!("expected to take the lock");
            };
            // At once, not after the 60 s timeout (with room for a loaded CI machine).
            assert!(t0.elapsed() < Duration::from_secs(10));
            drop(guard);
            assert!(!lock.exists(), "the builder removes its lock");
        }
        // A live holder (this test holds the flock): the waiter waits, then builds itself.
        std::fs::write(&lock, "other-host 4242\n").unwrap();
        let held = File::open(&lock).unwrap();
        held.lock().unwrap();
        let got = acquire(&cache, Duration::from_millis(300)).unwrap();
        assert!(matches!(got, Acquired::Build(None)));
        assert!(lock.exists(), "a live holder's lock is kept");
        drop(held);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_lock_taker_removes_temporaries_of_dead_builds() {
        let dir = std::env::temp_dir().join(format!("g4ft-cache-tmp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cache = dir.join("x.0123.g4tok");
        let idle = CacheWriter::create(&cache).unwrap();
        let long_ago = std::time::SystemTime::now() - ABANDONED_AFTER - Duration::from_secs(1);
        idle.out.get_ref().set_modified(long_ago).unwrap();
        let idle_path = idle.tmp.clone();
        std::mem::forget(idle); // a build that died: nothing removes its file
        let busy = CacheWriter::create(&cache).unwrap();
        let other = dir.join("y.0123.tmp.1.2");
        std::fs::write(&other, "another cache's").unwrap();
        File::options()
            .write(true)
            .open(&other)
            .unwrap()
            .set_modified(long_ago)
            .unwrap();
        let Acquired::Build(Some(_guard)) = acquire(&cache, Duration::from_secs(60)).unwrap()
        else {
            panic!("expected to take the lock");
        };
        assert!(!idle_path.exists(), "an idle temporary of this cache goes");
        assert!(
            busy.tmp.exists() && other.exists(),
            "a written one and another cache's stay"
        );
        busy.abandon();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn roundtrip_and_corruption() {
        let dir = std::env::temp_dir().join(format!("g4ft-cache-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("x.g4tok");
        let mut w = CacheWriter::create(&path).unwrap();
        w.push(
            1,
            &Encoded {
                input_ids: vec![2, 7, 9],
                labels: vec![-100, 7, 9],
                truncated: false,
            },
        )
        .unwrap();
        w.push(
            4,
            &Encoded {
                input_ids: vec![5],
                labels: vec![5],
                truncated: true,
            },
        )
        .unwrap();
        w.finish(&path, &meta()).unwrap();
        let c = CacheFile::open(&path).unwrap();
        assert_eq!((c.len(), c.record_len(0), c.record_len(1)), (2, 3, 1));
        assert_eq!(c.read(0).unwrap(), (vec![2, 7, 9], vec![-100, 7, 9]));
        assert_eq!(c.read(1).unwrap(), (vec![5], vec![5]));
        assert_eq!(c.lines, vec![1, 4]);
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 3]).unwrap();
        assert!(CacheFile::open(&path)
            .unwrap_err()
            .to_string()
            .contains("token cache"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
