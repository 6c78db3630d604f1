//! Finding and reading checkpoints: a local directory or a Hub id (through `hf-hub`'s cache),
//! single-file or sharded safetensors, memory-mapped.
//!
//! Only text tensors are ever read; vision/audio tensors in the same files are ignored. The text
//! prefix is detected: `model.language_model.` (what the released ConditionalGeneration
//! checkpoints use) or `model.` (a text-only `ForCausalLM` save). Errors name the tensor, the
//! expected and actual shape and the file.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};
use g4ft_wait::{this_process, HolderLock, Schedule, Taken, PROGRESS_EVERY};

use crate::error::{Error, Result};

/// The files of one model: its `config.json` and the safetensors holding the weights.
#[derive(Debug, Clone)]
pub struct ModelFiles {
    /// Path of `config.json`.
    pub config: PathBuf,
    /// Safetensors files (one, or every shard named by `model.safetensors.index.json`).
    pub weights: Vec<PathBuf>,
}

/// Where and how to reach the Hugging Face Hub, from the same environment variables as
/// `huggingface_hub`: `HF_ENDPOINT`, `HF_TOKEN` (or `HUGGING_FACE_HUB_TOKEN`, else the token file
/// `huggingface-cli login` writes), `HF_HOME`, `HF_HUB_OFFLINE`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hub {
    /// Base URL (default `https://huggingface.co`).
    pub endpoint: Option<String>,
    /// Access token (gated repositories such as Gemma's need one).
    pub token: Option<String>,
    /// Branch, tag or commit (default `main`).
    pub revision: Option<String>,
    /// Cache root (`$HF_HOME/hub`, default `~/.cache/huggingface/hub`).
    pub cache_dir: Option<PathBuf>,
    /// Never download (`HF_HUB_OFFLINE=1`): use the cache only.
    pub offline: bool,
}

impl Hub {
    /// The settings of the environment, with `revision`.
    pub fn from_env(revision: Option<&str>) -> Self {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        Self {
            endpoint: var("HF_ENDPOINT"),
            token: var("HF_TOKEN").or_else(|| var("HUGGING_FACE_HUB_TOKEN")),
            revision: revision.map(str::to_string),
            cache_dir: None,
            // huggingface_hub's true values, in any case.
            offline: var("HF_HUB_OFFLINE").is_some_and(|v| {
                matches!(v.to_ascii_uppercase().as_str(), "1" | "ON" | "YES" | "TRUE")
            }),
        }
    }
}

/// Files a training run reads from a model repository besides the weights, and whether each
/// must exist (the tokenizer is not needed for pre-tokenized data; the data loader says so when
/// it is missing and needed).
pub const HUB_FILES: [(&str, bool); 6] = [
    ("config.json", true),
    ("tokenizer.json", false),
    ("tokenizer_config.json", false),
    ("chat_template.jinja", false),
    ("special_tokens_map.json", false),
    ("generation_config.json", false),
];

impl ModelFiles {
    /// [`Self::resolve_with`] with the environment's [`Hub`] settings.
    pub fn resolve(model: &str) -> Result<Self> {
        Self::resolve_with(model, &Hub::from_env(None))
    }

    /// Resolves `model`: an existing directory is used as is; a Hub model id (`owner/name`) is
    /// looked up in the Hub cache and downloaded if missing (every file a run needs:
    /// [`HUB_FILES`] and the weights), once: concurrent processes on one cache wait for the
    /// first one's download, saying so, and then read the cache. Something that looks like a
    /// path (`./x`, `/x`, `a/b/c`, or `dir/x` where `dir` is a local directory) but does not
    /// exist is an error, not a Hub lookup.
    pub fn resolve_with(model: &str, hub: &Hub) -> Result<Self> {
        let dir = Path::new(model);
        if dir.is_dir() {
            return Self::from_dir(dir);
        }
        let err = |msg: String| Error::Resolve {
            model: model.to_string(),
            msg,
        };
        if dir.exists() {
            return Err(err("not a directory (expected a model directory or a Hub id like google/gemma-4-12B-it)".into()));
        }
        if let Some(why) = looks_like_a_path(model) {
            return Err(err(format!(
                "no such directory ({why}, so it is not taken for a Hub id)"
            )));
        }
        Self::from_hub(model, hub)
    }

    /// Uses a local directory holding `config.json` and `model.safetensors` or
    /// `model.safetensors.index.json` + shards.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let config = dir.join("config.json");
        if !config.is_file() {
            return Err(Error::Resolve {
                model: dir.display().to_string(),
                msg: "no config.json in this directory".into(),
            });
        }
        let index = dir.join("model.safetensors.index.json");
        let weights = if index.is_file() {
            shard_files(&index)?
                .into_iter()
                .map(|f| dir.join(f))
                .collect()
        } else {
            let single = dir.join("model.safetensors");
            if !single.is_file() {
                return Err(Error::Resolve {
                    model: dir.display().to_string(),
                    msg: "neither model.safetensors nor model.safetensors.index.json found".into(),
                });
            }
            vec![single]
        };
        Ok(ModelFiles { config, weights })
    }

    fn from_hub(id: &str, hub: &Hub) -> Result<Self> {
        let resolve_err = |msg: String| Error::Resolve {
            model: id.to_string(),
            msg,
        };
        let cache = match &hub.cache_dir {
            Some(d) => hf_hub::Cache::new(d.clone()),
            None => hf_hub::Cache::from_env(),
        };
        let repo = match &hub.revision {
            Some(rev) => {
                hf_hub::Repo::with_revision(id.into(), hf_hub::RepoType::Model, rev.clone())
            }
            None => hf_hub::Repo::model(id.into()),
        };
        if let Some(files) = from_cache(&cache.repo(repo.clone()), true) {
            return Ok(files);
        }
        if hub.offline {
            // Offline, what the cache has must do (a tokenizer may not be needed).
            return from_cache(&cache.repo(repo.clone()), false).ok_or_else(|| {
                resolve_err(format!(
                    "not in the Hub cache {} and HF_HUB_OFFLINE=1",
                    cache.path().display()
                ))
            });
        }
        // One download per cache: the first process takes the lock, the others wait for it
        // and then find everything in the cache.
        let lock_path = cache
            .path()
            .join(format!("{}.g4ft-download.lock", repo.folder_name()));
        let _lock = lock_download(&lock_path, id)?;
        if let Some(files) = from_cache(&cache.repo(repo.clone()), true) {
            return Ok(files);
        }
        let mut builder = hf_hub::api::sync::ApiBuilder::from_cache(cache.clone())
            .with_progress(false)
            .with_retries(3);
        if let Some(e) = &hub.endpoint {
            builder = builder.with_endpoint(e.trim_end_matches('/').to_string());
        }
        if let Some(t) = &hub.token {
            builder = builder.with_token(Some(t.clone()));
        }
        let api = builder
            .build()
            .map_err(|e| resolve_err(format!("hf-hub: {e}")))?;
        let remote = api.repo(repo.clone());
        let token_hint = if hub.token.is_some() || cache.token().is_some() {
            "check that the token may read this repository (gated models need the license accepted)"
        } else {
            "gated repositories need a token: set HF_TOKEN (or run huggingface-cli login)"
        };
        let cached = cache.repo(repo.clone());
        let fetch = |f: &str| -> std::result::Result<PathBuf, (bool, String)> {
            if let Some(p) = cached.get(f) {
                return Ok(p);
            }
            remote
                .download_with_progress(f, DownloadNote::new(id))
                .map_err(|e| {
                    let text = e.to_string();
                    let missing = text.contains("404");
                    let hint = if text.contains("401") || text.contains("403") {
                        format!("{text}; {token_hint}")
                    } else {
                        text
                    };
                    (missing, format!("{f}: {hint}"))
                })
        };
        for (file, required) in HUB_FILES {
            match fetch(file) {
                Ok(_) => {}
                Err((true, _)) if !required => {}
                Err((_, msg)) => return Err(resolve_err(msg)),
            }
        }
        match fetch("model.safetensors.index.json") {
            Ok(index) => {
                for shard in shard_files(&index)? {
                    fetch(&shard).map_err(|(_, m)| resolve_err(m))?;
                }
            }
            Err((true, _)) => {
                fetch("model.safetensors").map_err(|(_, m)| resolve_err(m))?;
            }
            Err((_, msg)) => return Err(resolve_err(msg)),
        }
        from_cache(&cache.repo(repo), false)
            .ok_or_else(|| resolve_err("downloaded, but the cache does not hold every file".into()))
    }
}

/// The files of a cached repository: config and weights, and with `with_tokenizer` also
/// `tokenizer.json` (a cache from a download of the weights alone counts as incomplete).
fn from_cache(cached: &hf_hub::CacheRepo, with_tokenizer: bool) -> Option<ModelFiles> {
    let config = cached.get("config.json")?;
    if with_tokenizer && cached.get("tokenizer.json").is_none() {
        return None;
    }
    let weights = match cached.get("model.safetensors.index.json") {
        Some(index) => shard_files(&index)
            .ok()?
            .iter()
            .map(|f| cached.get(f))
            .collect::<Option<Vec<_>>>()?,
        None => vec![cached.get("model.safetensors")?],
    };
    Some(ModelFiles { config, weights })
}

/// Why `model` is a local path rather than a Hub id (`owner/name`), if it is one.
fn looks_like_a_path(model: &str) -> Option<String> {
    if model.starts_with(['.', '/', '~']) || model.contains('\\') {
        return Some("it starts like a path".into());
    }
    let parts: Vec<&str> = model.split('/').collect();
    if parts.len() != 2 || parts.iter().any(|p| p.is_empty()) {
        return Some("a Hub id has exactly one `/` (owner/name)".into());
    }
    if Path::new(parts[0]).is_dir() {
        return Some(format!("`{}` is a local directory", parts[0]));
    }
    None
}

/// Takes the download lock of a repository in the cache, waiting while another process downloads
/// it and saying so every 10 s, with the lock file and the holder (its pid and host, which the
/// holder writes into the file). The lock dies with its holder, so a crashed download frees it.
fn lock_download(path: &Path, id: &str) -> Result<HolderLock> {
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut notes = Schedule::new(Duration::from_secs(2), PROGRESS_EVERY);
    loop {
        match HolderLock::try_take(path, &this_process()).map_err(io)? {
            Taken::Held(lock) => return Ok(lock),
            Taken::Busy(holder) if notes.due_now() => eprintln!(
                "hub: waiting for {holder} to download {id} into the cache ({} s; lock {})",
                notes.elapsed_s(),
                path.display()
            ),
            Taken::Busy(_) => {}
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A download's progress as a line every 10 s (and one at the start of each file over 10 MB):
/// the progress bar is invisible under a launcher.
struct DownloadNote {
    id: String,
    file: String,
    size: usize,
    done: usize,
    notes: Schedule,
}

impl DownloadNote {
    fn new(id: &str) -> Self {
        Self {
            id: id.to_string(),
            file: String::new(),
            size: 0,
            done: 0,
            notes: Schedule::progress(),
        }
    }
}

impl hf_hub::api::Progress for DownloadNote {
    fn init(&mut self, size: usize, filename: &str) {
        (self.size, self.done, self.file) = (size, 0, filename.to_string());
        if size > 10 << 20 {
            eprintln!(
                "hub: downloading {} {filename} ({:.1} GiB)",
                self.id,
                size as f64 / (1u64 << 30) as f64
            );
        }
        self.notes = Schedule::progress();
    }

    fn update(&mut self, size: usize) {
        self.done += size;
        if self.notes.due_now() {
            eprintln!(
                "hub: {} {}: {:.1} of {:.1} GiB",
                self.id,
                self.file,
                self.done as f64 / (1u64 << 30) as f64,
                self.size as f64 / (1u64 << 30) as f64
            );
        }
    }

    fn finish(&mut self) {}
}

fn shard_files(index: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(index).map_err(|source| Error::Io {
        path: index.to_path_buf(),
        source,
    })?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|source| Error::Json {
        file: index.display().to_string(),
        source,
    })?;
    let map = v
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| {
            Error::config(
                &index.display().to_string(),
                "weight_map",
                "missing or not an object",
            )
        })?;
    let files: BTreeSet<String> = map
        .values()
        .filter_map(|f| f.as_str().map(str::to_string))
        .collect();
    Ok(files.into_iter().collect())
}

/// Memory-mapped safetensors files with a name → file routing table and the detected text prefix.
pub struct Checkpoint {
    files: Vec<(PathBuf, MmapedSafetensors)>,
    routing: HashMap<String, usize>,
    prefix: String,
}

impl std::fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpoint")
            .field(
                "files",
                &self.files.iter().map(|(p, _)| p).collect::<Vec<_>>(),
            )
            .field("tensors", &self.routing.len())
            .field("prefix", &self.prefix)
            .finish()
    }
}

impl Checkpoint {
    /// Maps the files and reads their headers; detects the text prefix from `embed_tokens.weight`.
    pub fn open(paths: &[PathBuf]) -> Result<Self> {
        let mut files = Vec::with_capacity(paths.len());
        let mut routing = HashMap::new();
        for (i, p) in paths.iter().enumerate() {
            if let Err(source) = std::fs::metadata(p) {
                return Err(Error::Io {
                    path: p.clone(),
                    source,
                });
            }
            // SAFETY: the file is mapped read-only; like every mmap-based loader we rely on it not
            // being truncated or rewritten while the model is alive.
            let st = unsafe { MmapedSafetensors::new(p) }.map_err(|e| Error::Checkpoint {
                file: p.clone(),
                tensor: "<header>".into(),
                msg: e.to_string(),
            })?;
            for (name, _) in st.tensors() {
                routing.insert(name, i);
            }
            files.push((p.clone(), st));
        }
        let prefix = if routing.contains_key("model.language_model.embed_tokens.weight") {
            "model.language_model"
        } else if routing.contains_key("model.embed_tokens.weight") {
            "model"
        } else {
            return Err(Error::MissingTensor {
                files: Self::describe(&files),
                tensor: "model.language_model.embed_tokens.weight".into(),
                expected: vec![],
                hint: " (nor model.embed_tokens.weight): not a Gemma 4 checkpoint?".into(),
            });
        };
        Ok(Checkpoint {
            files,
            routing,
            prefix: prefix.to_string(),
        })
    }

    fn describe(files: &[(PathBuf, MmapedSafetensors)]) -> String {
        match files {
            [(p, _)] => p.display().to_string(),
            _ => format!(
                "{} (+{} more shards)",
                files
                    .first()
                    .map(|(p, _)| p.display().to_string())
                    .unwrap_or_default(),
                files.len().saturating_sub(1)
            ),
        }
    }

    /// The detected text prefix without trailing dot (`model.language_model` or `model`).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// `true` if the checkpoint holds `{prefix}.{name}`.
    pub fn contains(&self, name: &str) -> bool {
        self.routing
            .contains_key(&format!("{}.{name}", self.prefix))
    }

    /// Reads `{prefix}.{name}`, checks its shape and converts it to `dtype` on `device`.
    pub fn tensor(
        &self,
        name: &str,
        shape: &[usize],
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        let full = format!("{}.{name}", self.prefix);
        let Some(&i) = self.routing.get(&full) else {
            return Err(Error::MissingTensor {
                files: Self::describe(&self.files),
                tensor: full,
                expected: shape.to_vec(),
                hint: String::new(),
            });
        };
        let (path, st) = &self.files[i];
        let ck = |e: candle_core::Error| Error::Checkpoint {
            file: path.clone(),
            tensor: full.clone(),
            msg: e.to_string(),
        };
        let view = st.get(&full).map_err(ck)?;
        if view.shape() != shape {
            return Err(Error::ShapeMismatch {
                file: path.clone(),
                tensor: full,
                expected: shape.to_vec(),
                actual: view.shape().to_vec(),
            });
        }
        let t = st.load(&full, device).map_err(ck)?;
        t.to_dtype(dtype).map_err(ck)
    }
}
