//! The decoding defaults of a model directory: `generation_config.json` as transformers reads it.
//!
//! Read: `eos_token_id` (an id or a list: generation stops on any of them; Gemma 4 -it lists
//! `<eos>` and the end-of-turn `<turn|>`), `pad_token_id`, `do_sample`, `temperature`, `top_k`,
//! `top_p`; other keys are ignored. Without the file (or without `eos_token_id` in it) the stop ids
//! come from `config.json`'s `eos_token_id` (top level, else `text_config`), as transformers'
//! `GenerationConfig.from_model_config` does.

use std::path::Path;

use serde_json::Value;

use crate::error::{GenerateError, Result};
use crate::sampling::{Sampling, SamplingParams};

/// transformers' file name.
pub const GENERATION_CONFIG_NAME: &str = "generation_config.json";

/// Decoding defaults of a model.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerationConfig {
    /// Token ids that end a reply.
    pub eos_token_ids: Vec<u32>,
    /// Token fed to rows that already stopped (`None`: the model config's pad id is used).
    pub pad_token_id: Option<u32>,
    /// Sample instead of greedy decoding.
    pub do_sample: bool,
    /// Softmax temperature when sampling.
    pub temperature: Option<f64>,
    /// Keep the `k` most likely tokens when sampling (0 = all).
    pub top_k: Option<usize>,
    /// Keep the smallest set of tokens whose probability reaches `p` when sampling.
    pub top_p: Option<f64>,
}

impl GenerationConfig {
    /// Reads `dir/generation_config.json` (optional) with the `config.json` fallback for the stop
    /// ids (see the module doc). Errors name the file and the field.
    pub fn from_model_dir(dir: &Path) -> Result<Self> {
        let mut cfg = match read_json(&dir.join(GENERATION_CONFIG_NAME))? {
            Some((path, v)) => {
                Self::from_json(&v).map_err(|msg| GenerateError::Config { path, msg })?
            }
            None => GenerationConfig::default(),
        };
        if cfg.eos_token_ids.is_empty() {
            if let Some((path, v)) = read_json(&dir.join("config.json"))? {
                let field = v
                    .get("eos_token_id")
                    .or_else(|| v.get("text_config").and_then(|t| t.get("eos_token_id")));
                if let Some(f) = field {
                    cfg.eos_token_ids = token_ids(f, "eos_token_id")
                        .map_err(|msg| GenerateError::Config { path, msg })?;
                }
            }
        }
        Ok(cfg)
    }

    /// Parses the JSON of a `generation_config.json`; the error names the bad field.
    pub fn from_json(v: &Value) -> Result<Self, String> {
        let obj = v
            .as_object()
            .ok_or_else(|| "expected a JSON object".to_string())?;
        let num = |key: &str| -> Result<Option<f64>, String> {
            match obj.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(x) => x
                    .as_f64()
                    .map(Some)
                    .ok_or_else(|| format!("`{key}` must be a number, got {x}")),
            }
        };
        let eos_token_ids = match obj.get("eos_token_id") {
            None | Some(Value::Null) => Vec::new(),
            Some(x) => token_ids(x, "eos_token_id")?,
        };
        let pad_token_id = match obj.get("pad_token_id") {
            None | Some(Value::Null) => None,
            Some(x) => Some(token_id(x, "pad_token_id")?),
        };
        let do_sample = match obj.get("do_sample") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(x) => return Err(format!("`do_sample` must be true or false, got {x}")),
        };
        let top_k = match num("top_k")? {
            Some(k) if k < 0.0 || k.fract() != 0.0 => {
                return Err(format!("`top_k` must be a whole number >= 0, got {k}"))
            }
            k => k.map(|k| k as usize),
        };
        Ok(GenerationConfig {
            eos_token_ids,
            pad_token_id,
            do_sample,
            temperature: num("temperature")?,
            top_k,
            top_p: num("top_p")?,
        })
    }

    /// What transformers does with no decoding arguments: greedy, or sampling with this file's
    /// temperature (default 1), top-k (default 50, as transformers) and top-p when `do_sample`.
    pub fn default_sampling(&self, seed: u64) -> Sampling {
        if !self.do_sample {
            return Sampling::Greedy;
        }
        Sampling::Random(SamplingParams {
            temperature: self.temperature.unwrap_or(1.0),
            top_k: self.top_k.unwrap_or(50),
            top_p: self.top_p.unwrap_or(1.0),
            seed,
        })
    }
}

fn read_json(path: &Path) -> Result<Option<(std::path::PathBuf, Value)>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(GenerateError::Config {
                path: path.to_path_buf(),
                msg: e.to_string(),
            })
        }
    };
    let v = serde_json::from_str(&text).map_err(|e| GenerateError::Config {
        path: path.to_path_buf(),
        msg: format!("invalid JSON: {e}"),
    })?;
    Ok(Some((path.to_path_buf(), v)))
}

fn token_id(v: &Value, key: &str) -> Result<u32, String> {
    v.as_u64()
        .and_then(|x| u32::try_from(x).ok())
        .ok_or_else(|| format!("`{key}` must be a token id (an integer >= 0), got {v}"))
}

fn token_ids(v: &Value, key: &str) -> Result<Vec<u32>, String> {
    match v {
        Value::Array(xs) => xs.iter().map(|x| token_id(x, key)).collect(),
        x => Ok(vec![token_id(x, key)?]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_lists_single_ids_and_sampling_fields() {
        let v = serde_json::json!({"eos_token_id": [1, 106], "pad_token_id": 0, "do_sample": true,
            "temperature": 0.7, "top_k": 64, "top_p": 0.95, "transformers_version": "5.23.0"});
        let c = GenerationConfig::from_json(&v).unwrap();
        assert_eq!(c.eos_token_ids, vec![1, 106]);
        assert_eq!(c.pad_token_id, Some(0));
        assert_eq!(
            c.default_sampling(3),
            Sampling::Random(SamplingParams {
                temperature: 0.7,
                top_k: 64,
                top_p: 0.95,
                seed: 3
            })
        );
        let c = GenerationConfig::from_json(&serde_json::json!({"eos_token_id": 1})).unwrap();
        assert_eq!(c.eos_token_ids, vec![1]);
        assert_eq!(c.default_sampling(0), Sampling::Greedy);
    }

    #[test]
    fn bad_fields_are_named() {
        for (v, want) in [
            (serde_json::json!({"eos_token_id": "x"}), "`eos_token_id`"),
            (
                serde_json::json!({"eos_token_id": [1, -2]}),
                "`eos_token_id`",
            ),
            (serde_json::json!({"do_sample": 1}), "`do_sample`"),
            (serde_json::json!({"top_k": 2.5}), "`top_k`"),
            (serde_json::json!({"temperature": "hot"}), "`temperature`"),
        ] {
            let err = GenerationConfig::from_json(&v).unwrap_err();
            assert!(err.contains(want), "{v}: {err}");
        }
    }
}
