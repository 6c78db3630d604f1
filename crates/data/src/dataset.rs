//! `TokenDataset`: one or several data files (JSONL, Parquet, Arrow or CSV, any [`Format`]),
//! tokenized once into a token cache per file and read by index — the post's `ChatJsonl`, without
//! holding the files in memory.
//!
//! `open` hashes each file, looks for its cache keyed by (file contents, encoder fingerprint,
//! max_len, label mode), and builds it under a file lock when missing (see [`crate::cache`]).
//! Call it on every rank before any collective. Bad lines fail the open unless
//! `skip_bad_lines`; skipped lines stay listed in [`TokenDataset::report`], also when the
//! dataset comes from the cache.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::cache::{self, CacheFile, CacheKey, CacheMeta, CacheWriter};
use crate::encoder::Encoder;
use crate::error::{DataError, Result};
use crate::files::DataFiles;
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

/// A tokenized dataset with random access by index: the rows of one or several data files, in
/// order.
#[derive(Debug)]
pub struct TokenDataset {
    files: DataFiles,
    parts: Vec<Part>,
    /// The first sample index of each part, and the total count at the end.
    starts: Vec<usize>,
    report: PrepareReport,
    pad_id: u32,
}

/// One data file's token cache.
#[derive(Debug)]
struct Part {
    path: PathBuf,
    cache: CacheFile,
    from_cache: bool,
}

impl TokenDataset {
    /// Opens one data file, tokenizing it (in parallel) unless a matching cache exists.
    pub fn open(path: &Path, encoder: Option<&Encoder>, opts: &DatasetOptions) -> Result<Self> {
        Self::open_files(&DataFiles::one(path), encoder, opts)
    }

    /// Opens several data files as one dataset, their rows in file order; each file has its own
    /// token cache (adding a file tokenizes only that one). Every file must hold rows of one
    /// format (detected from each file's first row unless given).
    pub fn open_files(
        files: &DataFiles,
        encoder: Option<&Encoder>,
        opts: &DatasetOptions,
    ) -> Result<Self> {
        let format = detect_files_format(files, &opts.prepare)?;
        let mut parts = Vec::with_capacity(files.files.len());
        for path in &files.files {
            parts.push(Part::open(path, format, encoder, opts)?);
        }
        if !opts.prepare.skip_bad_lines {
            if let Some(p) = parts.iter().find(|p| !p.report().bad_lines.is_empty()) {
                return Err(DataError::BadLines {
                    path: p.path.clone(),
                    lines: p.report().bad_lines.clone(),
                });
            }
        }
        let mut starts = vec![0];
        for p in &parts {
            starts.push(starts.last().copied().unwrap_or(0) + p.cache.len());
        }
        let report = match parts.as_slice() {
            [one] => one.report().clone(),
            _ => combined_report(&parts),
        };
        Ok(TokenDataset {
            files: files.clone(),
            parts,
            starts,
            report,
            pad_id: opts.pad_id.or(encoder.map(Encoder::pad_id)).unwrap_or(0),
        })
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.starts.last().copied().unwrap_or(0)
    }

    /// Whether there are no samples (never true for an opened dataset).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The part holding sample `i` and the sample's index in it (panics if `i >= len()`).
    fn locate(&self, i: usize) -> (&Part, usize) {
        assert!(i < self.len(), "sample {i} of a dataset of {}", self.len());
        let part = self.starts.partition_point(|&s| s <= i) - 1;
        (&self.parts[part], i - self.starts[part])
    }

    /// Token count of sample `i`.
    pub fn sample_len(&self, i: usize) -> usize {
        let (part, j) = self.locate(i);
        part.cache.record_len(j)
    }

    /// Token counts of all samples (for length grouping and packing).
    pub fn lengths(&self) -> Vec<usize> {
        (0..self.len()).map(|i| self.sample_len(i)).collect()
    }

    /// Reads sample `i` (panics if `i >= len()`, like slice indexing).
    pub fn sample(&self, i: usize) -> Result<Sample> {
        let (part, j) = self.locate(i);
        let (input_ids, labels) = part.cache.read(j)?;
        Ok(Sample { input_ids, labels })
    }

    /// 1-based line (Parquet: row) of sample `i` in its data file ([`Self::file_of`]).
    pub fn line_of(&self, i: usize) -> u64 {
        let (part, j) = self.locate(i);
        part.cache.lines[j]
    }

    /// The data file holding sample `i`.
    pub fn file_of(&self, i: usize) -> &Path {
        &self.locate(i).0.path
    }

    /// Pad id for collation.
    pub fn pad_id(&self) -> u32 {
        self.pad_id
    }

    /// Counts of the tokenization passes that built the caches, summed over the files (length
    /// percentiles over every kept row; the skipped rows of every file, in file order).
    pub fn report(&self) -> &PrepareReport {
        &self.report
    }

    /// Each data file with its own report (where each skipped row is).
    pub fn file_reports(&self) -> impl Iterator<Item = (&Path, &PrepareReport)> {
        self.parts.iter().map(|p| (p.path.as_path(), p.report()))
    }

    /// The truncation length the samples were encoded with.
    pub fn max_len(&self) -> usize {
        self.parts[0].cache.meta.key.max_len
    }

    /// What the dataset was opened from.
    pub fn files(&self) -> &DataFiles {
        &self.files
    }

    /// The token cache file of each data file.
    pub fn cache_paths(&self) -> Vec<&Path> {
        self.parts.iter().map(|p| p.cache.path.as_path()).collect()
    }

    /// Whether this open reused existing caches for every file (false: this process tokenized).
    pub fn from_cache(&self) -> bool {
        self.parts.iter().all(|p| p.from_cache)
    }
}

impl Part {
    fn open(
        path: &Path,
        format: Format,
        encoder: Option<&Encoder>,
        opts: &DatasetOptions,
    ) -> Result<Self> {
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
            csv_separator: crate::source::csv::separator(path).map(char::from),
        };
        let cache_path = cache_path(path, opts.cache_dir.as_deref(), &key)?;
        let mut from_cache = true;
        if let cache::Acquired::Build(_lock) = cache::acquire(&cache_path, opts.lock_timeout)? {
            from_cache = false;
            build(path, encoder, &opts.prepare, key.clone(), &cache_path)?;
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
        Ok(Part {
            path: path.to_path_buf(),
            cache,
            from_cache,
        })
    }

    fn report(&self) -> &PrepareReport {
        &self.cache.meta.report
    }
}

/// The one format of every file: given, or detected from each file's first row; files of two
/// formats, and Arrow files of two schemas, are an error naming one of each.
pub fn detect_files_format(files: &DataFiles, opts: &PrepareOptions) -> Result<Format> {
    crate::source::arrow::check_one_schema(&files.files)?;
    let mut first: Option<(&Path, Format)> = None;
    for path in &files.files {
        let format = prepare::detect_format(path, opts)?;
        match first {
            None => first = Some((path, format)),
            Some((p, f)) if f != format => {
                return Err(DataError::DataFiles {
                    spec: files.spec.clone(),
                    msg: format!(
                        "{} holds {} rows but {} holds {} rows (each detected from its first \
                         row): keep one format, or pass --data-format",
                        p.display(),
                        f.as_str(),
                        path.display(),
                        format.as_str()
                    ),
                })
            }
            Some(_) => {}
        }
    }
    first.map(|(_, f)| f).ok_or_else(|| DataError::DataFiles {
        spec: files.spec.clone(),
        msg: "no data files".into(),
    })
}

/// The reports of several files as one.
fn combined_report(parts: &[Part]) -> PrepareReport {
    let reports: Vec<&PrepareReport> = parts.iter().map(Part::report).collect();
    let lengths: Vec<u64> = parts
        .iter()
        .flat_map(|p| (0..p.cache.len()).map(|i| p.cache.record_len(i) as u64))
        .collect();
    PrepareReport::combine(&reports, &lengths)
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
    prepare: &PrepareOptions,
    key: CacheKey,
    cache_path: &Path,
) -> Result<()> {
    let mut writer = CacheWriter::create(cache_path)?;
    // Bad lines are recorded in the cache even when they fail this open, so the report is
    // the same on every rank and restart; the failure is raised after loading.
    let prep = PrepareOptions {
        skip_bad_lines: true,
        ..prepare.clone()
    };
    match prepare::tokenize_file(path, encoder, &prep, |line, row| writer.push(line, &row)) {
        Ok(report) => writer.finish(cache_path, &CacheMeta { key, report }),
        Err(e) => {
            writer.abandon();
            Err(e)
        }
    }
}
