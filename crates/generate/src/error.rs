//! Errors of generation: bad options, bad config files (naming the file and field), model errors.

use std::path::PathBuf;

/// A generation error.
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    /// An option is out of range or options contradict each other.
    #[error("{option}: {msg}")]
    Option {
        /// The option (`temperature`, `top_p`, ...).
        option: &'static str,
        /// What is wrong.
        msg: String,
    },
    /// A config file could not be read or has a bad field.
    #[error("{}: {msg}", path.display())]
    Config {
        /// The file.
        path: PathBuf,
        /// What is wrong (names the field).
        msg: String,
    },
    /// The model failed.
    #[error(transparent)]
    Model(#[from] g4ft_gemma4::Error),
    /// A tensor op failed.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

/// `Result` with [`GenerateError`].
pub type Result<T, E = GenerateError> = std::result::Result<T, E>;
