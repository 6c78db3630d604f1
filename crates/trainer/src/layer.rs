//! One layer of configuration: a set of optional overrides, read from a TOML file, from the post's
//! environment variables or from the command line, and applied on top of a [`TrainConfig`].
//!
//! The TOML schema is this struct: keys are the [`TrainConfig`] field names, unknown keys are an
//! error that names the key, the file and the line (serde `deny_unknown_fields` plus the span
//! the `toml` parser reports).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::config::{DTypeKind, DeviceKind, LabelsKind, OnNonFinite, Origin, TrainConfig};
use crate::error::{Error, Result};

/// Optional overrides for every [`TrainConfig`] field; `None` leaves the value below unchanged.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(missing_docs)] // one field per TrainConfig field, documented there
pub struct ConfigLayer {
    pub model: Option<String>,
    pub data: Option<PathBuf>,
    pub eval_data: Option<PathBuf>,
    pub output: Option<PathBuf>,
    pub device: Option<DeviceKind>,
    pub dtype: Option<DTypeKind>,
    pub max_len: Option<usize>,
    pub labels: Option<LabelsKind>,
    pub data_format: Option<g4ft_data::Format>,
    pub enable_thinking: Option<bool>,
    pub max_line_bytes: Option<usize>,
    pub packing: Option<bool>,
    pub group_by_length: Option<bool>,
    pub shuffle: Option<bool>,
    pub skip_bad_lines: Option<bool>,
    pub micro_batch: Option<usize>,
    pub accum: Option<usize>,
    pub epochs: Option<usize>,
    pub max_steps: Option<usize>,
    pub lr: Option<f64>,
    pub warmup: Option<usize>,
    pub weight_decay: Option<f64>,
    pub max_grad_norm: Option<f64>,
    pub token_weighted_loss: Option<bool>,
    pub seed: Option<u64>,
    pub lora_r: Option<usize>,
    pub lora_alpha: Option<f64>,
    pub lora_dropout: Option<f64>,
    pub lora_targets: Option<String>,
    pub init_adapter: Option<PathBuf>,
    pub resume: Option<PathBuf>,
    pub save_every: Option<usize>,
    pub eval_every: Option<usize>,
    pub log_every: Option<usize>,
    pub bucket_cap_mb: Option<f64>,
    pub collective_timeout_s: Option<u64>,
    pub on_nonfinite: Option<OnNonFinite>,
    pub max_nonfinite_skips: Option<usize>,
    pub peak_tflops: Option<f64>,
    pub synthetic: Option<bool>,
    pub random_init: Option<bool>,
}

/// The post's environment variables and the fields they set.
pub const ENV_VARS: [(&str, &str); 3] = [
    ("MODEL_ID", "model"),
    ("DATA_PATH", "data"),
    ("OUTPUT_DIR", "output"),
];

impl ConfigLayer {
    /// Reads a TOML config file. Errors name the file and the line/column of the offending key
    /// (unknown keys list the valid ones) or value (wrong type).
    pub fn from_toml_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::ConfigRead {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_toml_str(&text, path)
    }

    /// Parses TOML text; `path` is used in error messages only.
    pub fn from_toml_str(text: &str, path: &Path) -> Result<Self> {
        toml::from_str(text).map_err(|e| {
            let offset = e.span().map_or(0, |s| s.start);
            let (line, column) = line_col(text, offset);
            Error::ConfigParse {
                path: path.to_path_buf(),
                line,
                column,
                message: e.message().trim().to_string(),
            }
        })
    }

    /// The layer set by `MODEL_ID`, `DATA_PATH` and `OUTPUT_DIR`, read through `lookup` (pass
    /// `|k| std::env::var(k).ok()`; tests pass a map). Empty values are ignored, as an unset
    /// variable would be in the post's `os.environ.get`.
    pub fn from_env(lookup: impl Fn(&str) -> Option<String>) -> Self {
        let get = |k: &str| lookup(k).filter(|v| !v.is_empty());
        Self {
            model: get("MODEL_ID"),
            data: get("DATA_PATH").map(PathBuf::from),
            output: get("OUTPUT_DIR").map(PathBuf::from),
            ..Self::default()
        }
    }

    /// Applies every set field to `config` and records `origin` for it in `origins`.
    pub fn apply_to(
        self,
        config: &mut TrainConfig,
        origins: &mut BTreeMap<&'static str, Origin>,
        origin: impl Fn(&'static str) -> Origin,
    ) {
        macro_rules! set {
            ($($field:ident),* $(,)?) => {$(
                if let Some(v) = self.$field {
                    config.$field = v;
                    origins.insert(stringify!($field), origin(stringify!($field)));
                }
            )*};
        }
        macro_rules! set_some {
            ($($field:ident),* $(,)?) => {$(
                if let Some(v) = self.$field {
                    config.$field = Some(v);
                    origins.insert(stringify!($field), origin(stringify!($field)));
                }
            )*};
        }
        set!(
            model,
            data,
            output,
            device,
            dtype,
            max_len,
            labels,
            max_line_bytes,
            packing,
            group_by_length,
            shuffle,
            skip_bad_lines,
            micro_batch,
            accum,
            epochs,
            lr,
            warmup,
            weight_decay,
            max_grad_norm,
            token_weighted_loss,
            seed,
            lora_r,
            lora_alpha,
            lora_dropout,
            lora_targets,
            log_every,
            bucket_cap_mb,
            collective_timeout_s,
            on_nonfinite,
            max_nonfinite_skips,
            synthetic,
            random_init,
        );
        set_some!(
            data_format,
            enable_thinking,
            eval_data,
            max_steps,
            init_adapter,
            resume,
            save_every,
            eval_every,
            peak_tflops,
        );
    }
}

/// 1-based (line, column) of a byte offset.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ConfigLayer> {
        ConfigLayer::from_toml_str(text, Path::new("run.toml"))
    }

    #[test]
    fn parses_known_keys_and_enums() {
        let l = parse("lr = 2e-4\nlabels = \"assistant_only\"\ndtype = \"f32\"\nmax_steps = 5\nlora_alpha = 16\n")
            .unwrap();
        assert_eq!(l.lr, Some(2e-4));
        assert_eq!(l.labels, Some(LabelsKind::AssistantOnly));
        assert_eq!(l.dtype, Some(DTypeKind::F32));
        assert_eq!(l.max_steps, Some(5));
        assert_eq!(l.lora_alpha, Some(16.0), "integers are accepted for floats");
    }

    #[test]
    fn unknown_key_names_key_file_and_line() {
        let msg = parse("lr = 1e-4\n\nlearning_rate = 3e-4\n")
            .unwrap_err()
            .to_string();
        assert!(msg.starts_with("config run.toml:3:"), "{msg}");
        assert!(msg.contains("learning_rate"), "{msg}");
    }

    #[test]
    fn wrong_type_names_line() {
        let msg = parse("seed = 1\naccum = \"eight\"\n")
            .unwrap_err()
            .to_string();
        assert!(msg.starts_with("config run.toml:2:"), "{msg}");
        let msg = parse("device = \"tpu\"\n").unwrap_err().to_string();
        assert!(msg.contains("tpu") && msg.contains("run.toml:1:"), "{msg}");
    }

    #[test]
    fn env_layer_reads_the_posts_three_variables() {
        let env: BTreeMap<&str, &str> = [
            ("MODEL_ID", "assets/tiny"),
            ("DATA_PATH", ""),
            ("OUTPUT_DIR", "out"),
        ]
        .into_iter()
        .collect();
        let l = ConfigLayer::from_env(|k| env.get(k).map(|v| v.to_string()));
        assert_eq!(l.model.as_deref(), Some("assets/tiny"));
        assert_eq!(l.data, None, "empty values are ignored");
        assert_eq!(l.output, Some(PathBuf::from("out")));
    }

    #[test]
    fn apply_overrides_and_records_origin() {
        let mut c = TrainConfig::default();
        let mut origins = BTreeMap::new();
        let l = parse("lr = 1e-3\nmax_steps = 7\n").unwrap();
        l.apply_to(&mut c, &mut origins, |_| Origin::File("run.toml".into()));
        assert_eq!((c.lr, c.max_steps, c.accum), (1e-3, Some(7), 8));
        assert_eq!(origins.get("lr"), Some(&Origin::File("run.toml".into())));
        assert!(!origins.contains_key("accum"));
    }
}
