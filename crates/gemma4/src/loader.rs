//! Finding and reading checkpoints: a local directory or a Hub id (through `hf-hub`'s cache),
//! single-file or sharded safetensors, memory-mapped.
//!
//! Only text tensors are ever read; vision/audio tensors in the same files are ignored. The text
//! prefix is detected: `model.language_model.` (what the released ConditionalGeneration
//! checkpoints use) or `model.` (a text-only `ForCausalLM` save). Errors name the tensor, the
//! expected and actual shape and the file.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};
pub use g4ft_hub::Hub;
use g4ft_hub::{looks_like_a_path, HubRepo, RepoKind};

use crate::error::{Error, Result};

/// The files of one model: its `config.json` and the safetensors holding the weights.
#[derive(Debug, Clone)]
pub struct ModelFiles {
    /// Path of `config.json`.
    pub config: PathBuf,
    /// Safetensors files (one, or every shard named by `model.safetensors.index.json`).
    pub weights: Vec<PathBuf>,
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
        let repo = HubRepo::new(id, RepoKind::Model, hub);
        if let Some(files) = from_cache(&repo, true) {
            return Ok(files);
        }
        if repo.offline() {
            // Offline, what the cache has must do (a tokenizer may not be needed).
            return from_cache(&repo, false).ok_or_else(|| {
                resolve_err(format!(
                    "not in the Hub cache {} and HF_HUB_OFFLINE=1",
                    repo.cache_dir().display()
                ))
            });
        }
        // One download per cache: the first process takes the lock, the others wait for it
        // and then find everything in the cache.
        let _lock = repo.lock().map_err(|e| resolve_err(e.msg))?;
        if let Some(files) = from_cache(&repo, true) {
            return Ok(files);
        }
        let remote = repo.connect().map_err(|e| resolve_err(e.msg))?;
        for (file, required) in HUB_FILES {
            match remote.fetch(file) {
                Ok(_) => {}
                Err(e) if e.missing && !required => {}
                Err(e) => return Err(resolve_err(e.msg)),
            }
        }
        match remote.fetch("model.safetensors.index.json") {
            Ok(index) => {
                for shard in shard_files(&index)? {
                    remote.fetch(&shard).map_err(|e| resolve_err(e.msg))?;
                }
            }
            Err(e) if e.missing => {
                remote
                    .fetch("model.safetensors")
                    .map_err(|e| resolve_err(e.msg))?;
            }
            Err(e) => return Err(resolve_err(e.msg)),
        }
        from_cache(&repo, false)
            .ok_or_else(|| resolve_err("downloaded, but the cache does not hold every file".into()))
    }
}

/// The files of a cached repository: config and weights, and with `with_tokenizer` also
/// `tokenizer.json` (a cache from a download of the weights alone counts as incomplete).
fn from_cache(repo: &HubRepo, with_tokenizer: bool) -> Option<ModelFiles> {
    let config = repo.cached("config.json")?;
    if with_tokenizer && repo.cached("tokenizer.json").is_none() {
        return None;
    }
    let weights = match repo.cached("model.safetensors.index.json") {
        Some(index) => shard_files(&index)
            .ok()?
            .iter()
            .map(|f| repo.cached(f))
            .collect::<Option<Vec<_>>>()?,
        None => vec![repo.cached("model.safetensors")?],
    };
    Some(ModelFiles { config, weights })
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
