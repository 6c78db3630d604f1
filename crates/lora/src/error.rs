//! The crate's error type, grouped by area (config, targeting, adapter files, merge).
//!
//! Every message names the file, field, module path or tensor key it is about, with expected vs got
//! where a comparison failed.

use std::path::PathBuf;

/// Errors of the LoRA crate.
#[derive(Debug, thiserror::Error)]
pub enum LoraError {
    // --- config ------------------------------------------------------------------------------
    /// A config field has a value this crate does not support or that is invalid.
    #[error("{source_name}: field `{field}`: {msg}")]
    Config {
        /// Where the config came from (`adapter_config.json` path or `LoraConfig`).
        source_name: String,
        /// The offending field, with PEFT's name.
        field: String,
        /// What is wrong and, when known, what to do instead.
        msg: String,
    },
    /// A `target_modules` / `exclude_modules` / pattern regex does not compile.
    #[error("{field}: regex {pattern:?} does not compile: {source}")]
    Regex {
        /// The config field holding the pattern.
        field: String,
        /// The pattern as written.
        pattern: String,
        /// The regex crate's error.
        source: regex::Error,
    },

    // --- targeting ---------------------------------------------------------------------------
    /// `target_modules` selected no module of the model (PEFT: "Target modules ... not found").
    #[error(
        "target_modules {targets} matched none of the model's {count} projection modules; \
         available module paths include: {examples}"
    )]
    NoTargetMatched {
        /// `target_modules` as written in the config.
        targets: String,
        /// Number of module paths that were tried.
        count: usize,
        /// A few of the available module paths.
        examples: String,
    },

    // --- adapter / checkpoint files -----------------------------------------------------------
    /// The adapter is already merged into the checkpoint it is applied to.
    #[error(
        "{}: this adapter is already merged into {} (its merged_adapters.json lists it); \
         applying it again would add it twice: give the base model, or this one without the adapter",
        adapter.display(),
        model.display()
    )]
    AlreadyMerged {
        /// The merged checkpoint's directory.
        model: PathBuf,
        /// The adapter directory.
        adapter: PathBuf,
    },
    /// A directory given as an adapter has no `adapter_config.json`.
    #[error("{}: not an adapter directory (no adapter_config.json){}", dir.display(), adapters_hint(dir, inside))]
    NotAnAdapter {
        /// The directory.
        dir: PathBuf,
        /// Its subdirectories that are adapters (a run folder's checkpoints).
        inside: Vec<String>,
    },
    /// Reading or writing a file failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A JSON file does not parse or has the wrong structure.
    #[error("{}: {msg}", path.display())]
    Json {
        /// The JSON file.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
    /// A safetensors file cannot be read or written.
    #[error("{}: {msg}", path.display())]
    Safetensors {
        /// The safetensors file.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
    /// A tensor has a different shape than the model (or config) requires.
    #[error("{}: {key}: expected shape {expected:?}, got {got:?}{hint}", path.display())]
    Shape {
        /// The file holding the tensor.
        path: PathBuf,
        /// The tensor key.
        key: String,
        /// The shape the model / config implies.
        expected: Vec<usize>,
        /// The shape in the file.
        got: Vec<usize>,
        /// Extra explanation, starting with "; " when present.
        hint: String,
    },
    /// A tensor key names a module the model does not have, or is not a LoRA tensor we support.
    #[error("{}: {key}: {msg}", path.display())]
    Key {
        /// The file holding the key.
        path: PathBuf,
        /// The tensor key.
        key: String,
        /// What is wrong, with a hint.
        msg: String,
    },
    /// A tensor that must be present is missing.
    #[error("{}: missing tensor {key} ({why})", path.display())]
    MissingKey {
        /// The file that should hold it.
        path: PathBuf,
        /// The missing key.
        key: String,
        /// Why it is required.
        why: String,
    },

    /// A tensor holds NaN or infinite values: its file is damaged, or it was saved by a run
    /// that diverged. Training from it, applying it or merging it would spread them.
    #[error(
        "{}: {key}: {count} of {total} values are not finite (NaN or ±inf; the first at flat \
         index {first}): the file is damaged or was written by a run that diverged",
        path.display()
    )]
    NonFinite {
        /// The file holding the tensor.
        path: PathBuf,
        /// The tensor key.
        key: String,
        /// How many values are NaN or infinite.
        count: usize,
        /// How many values the tensor has.
        total: usize,
        /// The flat index of the first one.
        first: usize,
    },

    // --- merge ---------------------------------------------------------------------------------
    /// The merge's output directory exists and holds files: a merge never writes over them.
    #[error(
        "{}: exists and is not an empty directory; choose a new output directory",
        path.display()
    )]
    OutputExists {
        /// The output directory.
        path: PathBuf,
    },

    // --- tensors -------------------------------------------------------------------------------
    /// A Candle operation failed; `context` says on which module / tensor.
    #[error("{context}: {source}")]
    Candle {
        /// What was being done.
        context: String,
        /// Candle's error.
        source: candle_core::Error,
    },
}

/// `Result` with [`LoraError`].
pub type Result<T> = std::result::Result<T, LoraError>;

/// Adds a context string to Candle errors.
pub(crate) trait CandleContext<T> {
    /// Wraps a Candle error into [`LoraError::Candle`] with `context`.
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T>;
}

impl<T> CandleContext<T> for candle_core::Result<T> {
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| LoraError::Candle {
            context: context(),
            source,
        })
    }
}

/// `Io` error constructor for `map_err`.
/// "; it holds the adapters step-20, step-40: give one, e.g. out/step-40" when `inside` has any.
fn adapters_hint(dir: &std::path::Path, inside: &[String]) -> String {
    let Some(last) = inside.last() else {
        return String::new();
    };
    let shown = if inside.len() > 6 {
        format!(
            "{}, …, {}",
            inside[..2].join(", "),
            inside[inside.len() - 3..].join(", ")
        )
    } else {
        inside.join(", ")
    };
    format!(
        "; it holds the adapters {shown}: give one, e.g. {}",
        dir.join(last).display()
    )
}

pub(crate) fn io_err(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> LoraError {
    let path = path.into();
    move |source| LoraError::Io { path, source }
}
