//! g4ft-hub: reaching the Hugging Face Hub for a model or a dataset repository, through
//! `hf-hub`'s cache.
//!
//! [`Hub`] holds the settings `huggingface_hub` reads from the environment. A [`HubRepo`] is one
//! repository in the cache: [`HubRepo::lock`] makes concurrent processes on one cache download
//! once (the others wait, saying for whom), [`Remote::fetch`] downloads a file with a progress
//! line every 10 s and an error that says what a 401/403 needs, [`Remote::files`] lists the
//! repository. [`HubRepo::save_listing`] / [`HubRepo::cached_listing`] keep that list in the cache
//! so that a later run (or `HF_HUB_OFFLINE=1`) needs no request.

use std::path::{Path, PathBuf};
use std::time::Duration;

use g4ft_wait::{this_process, HolderLock, Schedule, Taken, PROGRESS_EVERY};

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

/// Why `spec` is a local path rather than a Hub id (`owner/name`), if it is one: it starts like
/// a path (`./x`, `/x`, `~`), has other than one `/`, or its owner is a local directory.
pub fn looks_like_a_path(spec: &str) -> Option<String> {
    if spec.starts_with(['.', '/', '~']) || spec.contains('\\') {
        return Some("it starts like a path".into());
    }
    let parts: Vec<&str> = spec.split('/').collect();
    if parts.len() != 2 || parts.iter().any(|p| p.is_empty()) {
        return Some("a Hub id has exactly one `/` (owner/name)".into());
    }
    if Path::new(parts[0]).is_dir() {
        return Some(format!("`{}` is a local directory", parts[0]));
    }
    None
}

/// A failure to reach a repository or one of its files.
#[derive(Debug, thiserror::Error)]
#[error("{msg}")]
pub struct HubError {
    /// What went wrong, naming the file and, for 401/403, what the token needs.
    pub msg: String,
    /// The Hub answered that the file does not exist (404).
    pub missing: bool,
}

impl HubError {
    fn new(msg: String) -> Self {
        HubError {
            msg,
            missing: false,
        }
    }
}

/// Which kind of repository.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RepoKind {
    /// A model (`https://huggingface.co/owner/name`).
    Model,
    /// A dataset (`https://huggingface.co/datasets/owner/name`).
    Dataset,
}

/// One repository at one revision, in the Hub cache.
pub struct HubRepo {
    id: String,
    hub: Hub,
    cache: hf_hub::Cache,
    repo: hf_hub::Repo,
}

/// The list of a repository's files at a revision, as [`HubRepo::save_listing`] keeps it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Listing {
    /// The commit the revision pointed to.
    pub commit: String,
    /// Every file, as a `/`-separated path in the repository.
    pub files: Vec<String>,
}

impl HubRepo {
    /// Repository `id` of `kind` at `hub.revision`, in `hub.cache_dir` (else the environment's
    /// cache).
    pub fn new(id: &str, kind: RepoKind, hub: &Hub) -> Self {
        let cache = match &hub.cache_dir {
            Some(d) => hf_hub::Cache::new(d.clone()),
            None => hf_hub::Cache::from_env(),
        };
        let kind = match kind {
            RepoKind::Model => hf_hub::RepoType::Model,
            RepoKind::Dataset => hf_hub::RepoType::Dataset,
        };
        let revision = hub.revision.clone().unwrap_or_else(|| "main".into());
        HubRepo {
            id: id.to_string(),
            hub: hub.clone(),
            cache,
            repo: hf_hub::Repo::with_revision(id.into(), kind, revision),
        }
    }

    /// The cache root.
    pub fn cache_dir(&self) -> &Path {
        self.cache.path()
    }

    /// Whether the settings forbid downloads (`HF_HUB_OFFLINE=1`).
    pub fn offline(&self) -> bool {
        self.hub.offline
    }

    /// `file` in the cache at this revision, if it is there.
    pub fn cached(&self, file: &str) -> Option<PathBuf> {
        self.cache.repo(self.repo.clone()).get(file)
    }

    /// This repository's folder in the cache.
    fn folder(&self) -> PathBuf {
        self.cache.path().join(self.repo.folder_name())
    }

    fn listing_path(&self) -> PathBuf {
        let revision = self.repo.revision().replace('/', "--");
        self.folder()
            .join("g4ft-listings")
            .join(format!("{revision}.json"))
    }

    /// The file list [`Self::save_listing`] kept for this revision, if any.
    pub fn cached_listing(&self) -> Option<Listing> {
        let text = std::fs::read_to_string(self.listing_path()).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// Keeps `listing` in the cache for this revision (written whole: a crash leaves the old one).
    pub fn save_listing(&self, listing: &Listing) -> Result<(), HubError> {
        let path = self.listing_path();
        let tmp = path.with_extension(format!("json.{}", std::process::id()));
        let text = serde_json::to_string(listing).expect("a listing serializes");
        std::fs::create_dir_all(path.parent().expect("a listing has a folder"))
            .and_then(|()| std::fs::write(&tmp, text))
            .and_then(|()| std::fs::rename(&tmp, &path))
            .map_err(|e| HubError::new(format!("{}: {e}", path.display())))
    }

    /// Takes this repository's download lock in the cache, waiting while another process holds
    /// it and saying so every 10 s, with the lock file and the holder (its pid and host, which
    /// the holder writes into the file). The lock dies with its holder, so a crashed download
    /// frees it.
    pub fn lock(&self) -> Result<HolderLock, HubError> {
        let path = self
            .cache
            .path()
            .join(format!("{}.g4ft-download.lock", self.repo.folder_name()));
        let mut notes = Schedule::new(Duration::from_secs(2), PROGRESS_EVERY);
        loop {
            let taken = HolderLock::try_take(&path, &this_process())
                .map_err(|e| HubError::new(format!("{}: {e}", path.display())))?;
            match taken {
                Taken::Held(lock) => return Ok(lock),
                Taken::Busy(holder) if notes.due_now() => eprintln!(
                    "hub: waiting for {holder} to download {} into the cache ({} s; lock {})",
                    self.id,
                    notes.elapsed_s(),
                    path.display()
                ),
                Taken::Busy(_) => {}
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A connection to the Hub for this repository.
    pub fn connect(&self) -> Result<Remote<'_>, HubError> {
        let mut builder = hf_hub::api::sync::ApiBuilder::from_cache(self.cache.clone())
            .with_progress(false)
            .with_retries(3);
        if let Some(e) = &self.hub.endpoint {
            builder = builder.with_endpoint(e.trim_end_matches('/').to_string());
        }
        if let Some(t) = &self.hub.token {
            builder = builder.with_token(Some(t.clone()));
        }
        let api = builder
            .build()
            .map_err(|e| HubError::new(format!("hf-hub: {e}")))?;
        Ok(Remote {
            repo: self,
            api: api.repo(self.repo.clone()),
        })
    }

    /// What a 401 or 403 needs.
    fn token_hint(&self) -> &'static str {
        if self.hub.token.is_some() || self.cache.token().is_some() {
            "check that the token may read this repository (gated repositories need their \
             license accepted)"
        } else {
            "gated repositories need a token: set HF_TOKEN (or run huggingface-cli login)"
        }
    }
}

/// A repository reached over the network.
pub struct Remote<'a> {
    repo: &'a HubRepo,
    api: hf_hub::api::sync::ApiRepo,
}

impl Remote<'_> {
    /// `file` from the cache, else downloaded into it (a line at the start of each file over
    /// 10 MB and every 10 s). A 404 is [`HubError::missing`].
    pub fn fetch(&self, file: &str) -> Result<PathBuf, HubError> {
        if let Some(p) = self.repo.cached(file) {
            return Ok(p);
        }
        self.api
            .download_with_progress(file, DownloadNote::new(&self.repo.id))
            .map_err(|e| self.error(file, e.to_string()))
    }

    /// Every file of the repository at its revision, and the commit.
    pub fn files(&self) -> Result<Listing, HubError> {
        let info = self
            .api
            .info()
            .map_err(|e| self.error("the file list", e.to_string()))?;
        Ok(Listing {
            commit: info.sha,
            files: info.siblings.into_iter().map(|s| s.rfilename).collect(),
        })
    }

    fn error(&self, what: &str, text: String) -> HubError {
        let missing = text.contains("404");
        let msg = if text.contains("401") || text.contains("403") {
            format!("{what}: {text}; {}", self.repo.token_hint())
        } else {
            format!("{what}: {text}")
        };
        HubError { msg, missing }
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
