//! Errors of the Gemma 4 crate, grouped by area (config, loading, input, tensor ops).
//!
//! Every message names what went wrong and where: the config field, the checkpoint file and
//! tensor, the expected and actual shape, or the batch field.

use std::path::PathBuf;

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, Error>;

/// Errors raised while parsing configs, loading checkpoints or running the model.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A `config.json` field is missing, has the wrong type, or an unsupported value.
    #[error("{file}: config field `{field}`: {msg}")]
    Config {
        /// The config file (or `<memory>` for a string).
        file: String,
        /// The offending field, dotted for nested keys.
        field: String,
        /// What is wrong, with the expected value where useful.
        msg: String,
    },
    /// The config file is not valid JSON.
    #[error("{file}: invalid JSON: {source}")]
    Json {
        /// The config file.
        file: String,
        /// The parser error (with line and column).
        source: serde_json::Error,
    },
    /// A file could not be read or opened.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A tensor the model needs is absent from every checkpoint file.
    #[error("{files}: tensor `{tensor}` (expected shape {expected:?}) not found{hint}")]
    MissingTensor {
        /// The checkpoint file(s) searched.
        files: String,
        /// Full tensor name.
        tensor: String,
        /// The shape the config implies.
        expected: Vec<usize>,
        /// Extra advice (e.g. a near-miss prefix), may be empty.
        hint: String,
    },
    /// A tensor exists but its shape disagrees with the config.
    #[error("{file}: {tensor}: expected {expected:?}, got {actual:?}")]
    ShapeMismatch {
        /// The checkpoint file holding the tensor.
        file: PathBuf,
        /// Full tensor name.
        tensor: String,
        /// The shape the config implies.
        expected: Vec<usize>,
        /// The shape stored in the file.
        actual: Vec<usize>,
    },
    /// A checkpoint file could not be parsed, or a tensor in it could not be read.
    #[error("{file}: {tensor}: {msg}")]
    Checkpoint {
        /// The checkpoint file.
        file: PathBuf,
        /// The tensor being read (or `<header>`).
        tensor: String,
        /// The underlying error.
        msg: String,
    },
    /// A model id or directory could not be resolved to local files.
    #[error("cannot resolve model `{model}`: {msg}")]
    Resolve {
        /// What the user passed (directory or hub id).
        model: String,
        /// Why it failed, with a hint.
        msg: String,
    },
    /// A batch given to the model is inconsistent (lengths, token ids out of range, ...).
    #[error("invalid batch: {field}: {msg}")]
    Batch {
        /// The batch field (`input_ids`, `attention_mask`, `labels`, ...).
        field: &'static str,
        /// What is wrong (expected vs got).
        msg: String,
    },
    /// A recompute keep mask whose length is not the model's layer count.
    #[error("the recompute keep mask covers {mask_layers} layers, the model has {model_layers}")]
    KeepMask {
        /// Layers the mask covers.
        mask_layers: usize,
        /// Layers of the model.
        model_layers: usize,
    },
    /// An error from a Candle tensor operation.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

impl Error {
    pub(crate) fn config(file: &str, field: &str, msg: impl Into<String>) -> Self {
        Error::Config {
            file: file.to_string(),
            field: field.to_string(),
            msg: msg.into(),
        }
    }

    pub(crate) fn batch(field: &'static str, msg: impl Into<String>) -> Self {
        Error::Batch {
            field,
            msg: msg.into(),
        }
    }
}
