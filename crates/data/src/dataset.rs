//! `TokenDataset`: a data file (JSONL or Parquet, any [`Format`]), tokenized once into a token cache and
//! read by index — the post's `ChatJsonl`, without holding the file in memory.
//!
//! `open` hashes the file, looks for the cache keyed by (file contents, encoder fingerprint,
//! max_len, label mode), and builds it under a file lock when missing (see [`crate::cache`]).
//! Call it on every rank before any collective. Bad lines fail the open unless
//! `skip_bad_lines`; skipped lines stay listed in [`TokenDataset::report`], also when the
//! dataset comes from the cache.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::cache::{self, CacheFile, CacheKey, CacheMeta, CacheWriter};
use crate::encoder::Encoder;
use crate::error::{DataError, Result};
use crate::hash::{hash_file, Fnv64};
use crate::prepare::{self, PrepareOptions, PrepareReport};
use crate::rows::Format;

/// How to open a dataset.
#[derive(Debug, Clone, PartialEq)]
pub struct DatasetOptions {
    /// Truncation, labels, bad-line policy.
    pub prepare: PrepareOptions,
    /// Directory for token caches; `None` uses `.g4ft-cache/` beside the data file.
    pub cache_dir: Option<PathBuf>,
    /// Pad id for pre-tokenized data without a tokenizer (from the model config; Gemma 4: 0).
    pub pad_id: Option<u32>,
    /// How long a rank waits for another process building the same cache before building it
    /// itself.
    pub lock_timeout: Duration,
}

impl Default for DatasetOptions {
    fn default() -> Self {
        DatasetOptions {
            prepare: PrepareOptions::default(),
            cache_dir: None,
            pad_id: None,
            lock_timeout: Duration::from_secs(3600),
        }
    }
}

/// One tokenized row: `input_ids` and unshifted `labels` (-100 = ignored) of equal length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    /// Token ids.
    pub input_ids: Vec<u32>,
    /// Labels.
    pub labels: Vec<i32>,
}

/// A tokenized dataset with random access by index.
#[derive(Debug)]
pub struct TokenDataset {
    data_path: PathBuf,
    cache: CacheFile,
    pad_id: u32,
    from_cache: bool,
}

impl TokenDataset {
    /// Opens `path`, tokenizing it (in parallel) unless a matching cache exists.
    pub fn open(path: &Path, encoder: Option<&Encoder>, opts: &DatasetOptions) -> Result<Self> {
        let format = prepare::detect_format(path, &opts.prepare)?;
        let (data_hash, data_len) = hash_file(path)?;
        let key = CacheKey {
            version: cache::CACHE_VERSION,
            data_hash: format!("{data_hash:016x}"),
            data_len,
            format: format.as_str().into(),
            encoder: match format {
                Format::Tokens => None,
                _ => encoder.map(|e| format!("{:016x}", e.fingerprint())),
            },
            max_len: opts.prepare.max_len,
            label_mode: opts.prepare.label_mode.as_str().into(),
            vocab_size: opts.prepare.vocab_size.or(encoder.map(Encoder::vocab_size)),
            max_line_bytes: opts.prepare.max_line_bytes,
        };
        let cache_path = cache_path(path, opts.cache_dir.as_deref(), &key)?;
        let mut from_cache = true;
        if let cache::Acquired::Build(_lock) = cache::acquire(&cache_path, opts.lock_timeout)? {
            from_cache = false;
            build(path, encoder, opts, key.clone(), &cache_path)?;
        }
        let cache = CacheFile::open(&cache_path)?;
        if cache.meta.key != key {
            return Err(DataError::Cache {
                path: cache_path,
                msg: format!(
                    "key mismatch: file has {:?}, wanted {key:?}",
                    cache.meta.key
                ),
            });
        }
        if !opts.prepare.skip_bad_lines && !cache.meta.report.bad_lines.is_empty() {
            return Err(DataError::BadLines {
                path: path.to_path_buf(),
                lines: cache.meta.report.bad_lines.clone(),
            });
        }
        let pad_id = opts.pad_id.or(encoder.map(Encoder::pad_id)).unwrap_or(0);
        Ok(TokenDataset {
            data_path: path.to_path_buf(),
            cache,
            pad_id,
            from_cache,
        })
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.cache.len()
    }

    /// Whether there are no samples (never true for an opened dataset).
    pub fn is_empty(&self) -> bool {
        self.cache.is_empty()
    }

    /// Token count of sample `i`.
    pub fn sample_len(&self, i: usize) -> usize {
        self.cache.record_len(i)
    }

    /// Token counts of all samples (for length grouping and packing).
    pub fn lengths(&self) -> Vec<usize> {
        (0..self.len()).map(|i| self.sample_len(i)).collect()
    }

    /// Reads sample `i` (panics if `i >= len()`, like slice indexing).
    pub fn sample(&self, i: usize) -> Result<Sample> {
        let (input_ids, labels) = self.cache.read(i)?;
        Ok(Sample { input_ids, labels })
    }

    /// 1-based line (Parquet: row) of sample `i` in the data file.
    pub fn line_of(&self, i: usize) -> u64 {
        self.cache.lines[i]
    }

    /// Pad id for collation.
    pub fn pad_id(&self) -> u32 {
        self.pad_id
    }

    /// Counts and skipped lines of the tokenization pass that built the cache.
    pub fn report(&self) -> &PrepareReport {
        &self.cache.meta.report
    }

    /// The truncation length the samples were encoded with.
    pub fn max_len(&self) -> usize {
        self.cache.meta.key.max_len
    }

    /// The data file.
    pub fn data_path(&self) -> &Path {
        &self.data_path
    }

    /// The token cache file.
    pub fn cache_path(&self) -> &Path {
        &self.cache.path
    }

    /// Whether this open reused an existing cache (false: this process tokenized).
    pub fn from_cache(&self) -> bool {
        self.from_cache
    }
}

/// `<cache_dir>/<data file stem>.<hash of key>.g4tok`, creating the directory.
fn cache_path(data: &Path, cache_dir: Option<&Path>, key: &CacheKey) -> Result<PathBuf> {
    let dir = match cache_dir {
        Some(d) => d.to_path_buf(),
        None => data.parent().unwrap_or(Path::new(".")).join(".g4ft-cache"),
    };
    std::fs::create_dir_all(&dir).map_err(|e| DataError::io(&dir, e))?;
    let mut h = Fnv64::default();
    h.field(&serde_json::to_vec(key).expect("cache key serializes"));
    let stem = data
        .file_stem()
        .map_or("data".into(), |s| s.to_string_lossy());
    Ok(dir.join(format!("{stem}.{:016x}.g4tok", h.finish())))
}

fn build(
    path: &Path,
    encoder: Option<&Encoder>,
    opts: &DatasetOptions,
    key: CacheKey,
    cache_path: &Path,
) -> Result<()> {
    let mut writer = CacheWriter::create(cache_path)?;
    // Bad lines are recorded in the cache even when they fail this open, so the report is
    // the same on every rank and restart; the failure is raised after loading.
    let prep = PrepareOptions {
        skip_bad_lines: true,
        ..opts.prepare.clone()
    };
    match prepare::tokenize_file(path, encoder, &prep, |line, row| writer.push(line, &row)) {
        Ok(report) => writer.finish(cache_path, &CacheMeta { key, report }),
        Err(e) => {
            writer.abandon();
            Err(e)
        }
    }
}
