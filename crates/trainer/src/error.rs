//! The trainer crate's error type, grouped by area (config, optimizer, checkpoint, state, metrics),
//! in the style of candle's `error.rs`. Every message names what it was working on (a file, a key, a
//! buffer) and, for mismatches, says "expected … got …"; where a common cause is known it adds a hint.

use std::path::PathBuf;

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, Error>;

/// Errors raised by the trainer's pieces.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    // ---- config ----
    /// The TOML config file could not be read.
    #[error("config {path}: cannot read: {source}")]
    ConfigRead {
        /// The file given to `--config`.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The TOML config file does not parse, names an unknown key, or has a value of the wrong type.
    #[error("config {path}:{line}:{column}: {message}")]
    ConfigParse {
        /// The file given to `--config`.
        path: PathBuf,
        /// 1-based line of the offending key or value.
        line: usize,
        /// 1-based column.
        column: usize,
        /// What the TOML parser or the schema said (for unknown keys it lists the valid ones).
        message: String,
    },
    /// The command line does not parse (or asks for `--help` / `--version`: print it with
    /// [`clap::Error::exit`]).
    #[error(transparent)]
    Flags(#[from] clap::Error),
    /// A resolved config value is out of range.
    #[error("config field `{field}` = {value} (set by {origin}): {reason}")]
    ConfigInvalid {
        /// The field (TOML key; the flag is the same with dashes).
        field: String,
        /// The offending value as shown in the config table.
        value: String,
        /// Where the value came from (`default`, the TOML file, an environment variable, a flag).
        origin: String,
        /// The constraint it violates.
        reason: String,
    },

    // ---- optimizer ----
    /// A buffer handed to the optimizer or to clipping has the wrong length, dtype or count.
    #[error("optimizer: {what}: expected {expected}, got {got}")]
    OptimShape {
        /// Which buffer (for example `bucket 2 grads`).
        what: String,
        /// The expected length, dtype or count.
        expected: String,
        /// What was passed.
        got: String,
    },

    // ---- checkpoint ----
    /// A file-system operation on a checkpoint directory failed.
    #[error("checkpoint {path}: {op}: {source}")]
    CheckpointIo {
        /// The file or directory.
        path: PathBuf,
        /// What was being done (`create dir`, `fsync`, `rename to …`).
        op: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The caller's writer (for example the LoRA crate's PEFT save) failed inside the temporary dir.
    #[error("checkpoint {dir}: writing the adapter failed: {source}\n  hint: check free disk space and permissions of the output directory")]
    CheckpointWriter {
        /// The temporary directory being written.
        dir: PathBuf,
        /// The writer's error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A checkpoint directory is missing a file or has an unreadable / inconsistent one.
    #[error("checkpoint {path}: {reason}\n  hint: {hint}")]
    CheckpointInvalid {
        /// The offending file or directory.
        path: PathBuf,
        /// What is wrong.
        reason: String,
        /// Likely cause.
        hint: &'static str,
    },
    /// Resuming is impossible because the number of processes changed.
    #[error("resume from {path}: `{field}` was {saved} when the checkpoint was written, now {current}\n  hint: {hint}")]
    ResumeMismatch {
        /// The checkpoint directory.
        path: PathBuf,
        /// The field.
        field: String,
        /// Value in the checkpoint.
        saved: String,
        /// Value in this run.
        current: String,
        /// What to do.
        hint: &'static str,
    },
    /// A setting given for this run contradicts the checkpoint or adapter the run starts from.
    #[error("`{field}` {detail}")]
    SettingConflict {
        /// The setting.
        field: String,
        /// `= VALUE (set by ORIGIN) contradicts the checkpoint DIR, which has VALUE` and a hint.
        detail: String,
    },
    /// The starting point cannot be decided (flags that exclude each other, no checkpoint to
    /// resume, an elastic restart into another job's folder).
    #[error("{reason}\n  hint: {hint}")]
    Start {
        /// What is wrong.
        reason: String,
        /// What to do.
        hint: String,
    },

    // ---- output folder ----
    /// Another process holds the output folder's lock.
    #[error("output {dir} is in use by {holder}\n  hint: wait for that run to end, or choose another --output")]
    OutputBusy {
        /// The output folder.
        dir: PathBuf,
        /// The lock file's text (pid, host, run).
        holder: String,
    },
    /// The output folder holds another run.
    #[error("output {dir} holds {what}\n  hint: {hint}")]
    OutputTaken {
        /// The output folder.
        dir: PathBuf,
        /// What is there.
        what: String,
        /// What to do.
        hint: String,
    },

    // ---- metrics ----
    /// Writing the metrics JSONL file or the loss plot failed.
    #[error("metrics {path}: {source}")]
    MetricsIo {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },

    // ---- training ----
    /// The loss or the gradient norm was not finite and the policy says stop.
    #[error("step {step}: {what}; stopping (on_nonfinite = {policy})\n  hint: lower --lr, raise --warmup, check the data for empty or truncated samples, or use --dtype f32")]
    NonFinite {
        /// The optimizer step (1-based).
        step: u64,
        /// Which value was bad and its value.
        what: String,
        /// The policy in force.
        policy: String,
    },

    /// A tensor operation failed.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
    /// An adapter directory could not be read.
    #[error(transparent)]
    Lora(Box<g4ft_lora::LoraError>),
}

impl From<g4ft_lora::LoraError> for Error {
    fn from(e: g4ft_lora::LoraError) -> Self {
        Error::Lora(Box::new(e))
    }
}
