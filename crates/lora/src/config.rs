//! `LoraConfig`: PEFT's LoRA config (`peft/tuners/lora/config.py`, PEFT 0.21) and its
//! `adapter_config.json` form.
//!
//! Reading follows PEFT: unknown keys are ignored, missing keys take PEFT's defaults. Features this
//! crate does not implement (DoRA, biases, `modules_to_save`, `fan_in_fan_out`, layer selection,
//! PiSSA-style inits, ...) are errors naming the field, never silently dropped. Writing produces
//! the fields PEFT has read for many releases, as `json.dumps(indent=2, sort_keys=True)` does.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{json, Map, Value};

use crate::error::{io_err, LoraError, Result};

/// `target_modules` (and `exclude_modules`): PEFT's two forms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetModules {
    /// One regex that must match the whole module path (`re.fullmatch`).
    Regex(String),
    /// Module-name suffixes: a path matches when it equals an entry or ends with `"." + entry`.
    /// A set in PEFT; parsed lists are sorted and deduplicated.
    List(Vec<String>),
}

impl std::fmt::Display for TargetModules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TargetModules::Regex(r) => write!(f, "{r:?} (regex)"),
            TargetModules::List(l) => write!(f, "{l:?}"),
        }
    }
}

/// `init_lora_weights`: how a fresh adapter is initialised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InitLoraWeights {
    /// `true`: A kaiming-uniform(a = √5), i.e. U(-1/√in, 1/√in); B zeros (the adapter starts as a no-op).
    Default,
    /// `"gaussian"`: A ~ N(0, 1/r) (std 1/r, as PEFT), B zeros.
    Gaussian,
    /// `false`: A and B both keep `nn.Linear`'s default init, U(-1/√fan_in, 1/√fan_in): a
    /// non-identity adapter, used by tests.
    Random,
}

/// PEFT LoRA configuration (the subset this crate implements).
#[derive(Debug, Clone, PartialEq)]
pub struct LoraConfig {
    /// Rank `r`.
    pub r: usize,
    /// `lora_alpha`; the scale is `alpha / r` (or `alpha / √r` with rsLoRA).
    pub lora_alpha: f64,
    /// Dropout probability on the adapter input, in `[0, 1)`.
    pub lora_dropout: f64,
    /// Which module paths get an adapter.
    pub target_modules: TargetModules,
    /// Module paths excluded even when targeted.
    pub exclude_modules: Option<TargetModules>,
    /// rsLoRA scaling `alpha / √r`.
    pub use_rslora: bool,
    /// Fresh-adapter initialisation.
    pub init_lora_weights: InitLoraWeights,
    /// Per-module rank overrides: key `k` applies to paths matching `^(.*\.)?(k)$`, first key in
    /// sorted order wins (PEFT's `get_pattern_key`).
    pub rank_pattern: BTreeMap<String, usize>,
    /// Per-module `lora_alpha` overrides, same matching as `rank_pattern`.
    pub alpha_pattern: BTreeMap<String, f64>,
    /// `base_model_name_or_path` (hub id or directory of the base model).
    pub base_model_name_or_path: Option<String>,
    /// Hub revision of the base model.
    pub revision: Option<String>,
    /// `task_type`, `"CAUSAL_LM"` for our adapters.
    pub task_type: Option<String>,
}

impl LoraConfig {
    /// A config with PEFT's defaults for everything except rank, alpha and targets
    /// (`lora_dropout` 0, `bias` "none", kaiming/zero init, `task_type` "CAUSAL_LM").
    pub fn new(r: usize, lora_alpha: f64, target_modules: TargetModules) -> Self {
        Self {
            r,
            lora_alpha,
            lora_dropout: 0.0,
            target_modules,
            exclude_modules: None,
            use_rslora: false,
            init_lora_weights: InitLoraWeights::Default,
            rank_pattern: BTreeMap::new(),
            alpha_pattern: BTreeMap::new(),
            base_model_name_or_path: None,
            revision: None,
            task_type: Some("CAUSAL_LM".to_string()),
        }
    }

    /// Checks ranges: `r >= 1`, `0 <= lora_dropout < 1`, finite alpha, non-empty targets.
    pub fn validate(&self, source_name: &str) -> Result<()> {
        let bad = |field: &str, msg: String| LoraError::Config {
            source_name: source_name.to_string(),
            field: field.to_string(),
            msg,
        };
        if self.r == 0 {
            return Err(bad("r", "must be >= 1, got 0".into()));
        }
        if !(0.0..1.0).contains(&self.lora_dropout) {
            let p = self.lora_dropout;
            return Err(bad("lora_dropout", format!("must be in [0, 1), got {p}")));
        }
        if !self.lora_alpha.is_finite() {
            return Err(bad(
                "lora_alpha",
                format!("must be finite, got {}", self.lora_alpha),
            ));
        }
        if let Some((k, _)) = self.rank_pattern.iter().find(|(_, &r)| r == 0) {
            return Err(bad(
                "rank_pattern",
                format!("rank for {k:?} must be >= 1, got 0"),
            ));
        }
        match &self.target_modules {
            TargetModules::List(l) if l.is_empty() => Err(bad(
                "target_modules",
                "empty list: no module would be adapted".into(),
            )),
            _ => Ok(()),
        }
    }

    /// Parses the text of an `adapter_config.json`; `source_name` (usually the file path) is used
    /// in error messages.
    pub fn from_json_str(text: &str, source_name: &str) -> Result<Self> {
        let value: Value = serde_json::from_str(text).map_err(|e| LoraError::Json {
            path: source_name.into(),
            msg: e.to_string(),
        })?;
        let Value::Object(map) = value else {
            return Err(LoraError::Json {
                path: source_name.into(),
                msg: "expected a JSON object".into(),
            });
        };
        let cfg = parse_fields(&Fields {
            map: &map,
            source_name,
        })?;
        cfg.validate(source_name)?;
        Ok(cfg)
    }

    /// Reads `dir/adapter_config.json`.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let path = dir.join(crate::io::CONFIG_NAME);
        std::fs::metadata(dir).map_err(io_err(dir))?;
        let text = match std::fs::read_to_string(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(LoraError::NotAnAdapter {
                    dir: dir.to_path_buf(),
                    inside: adapters_inside(dir),
                })
            }
            read => read.map_err(io_err(&path))?,
        };
        Self::from_json_str(&text, &path.display().to_string())
    }

    /// The `adapter_config.json` object (keys sorted, as PEFT writes them).
    pub fn to_json_value(&self) -> Value {
        let mut m: BTreeMap<&str, Value> = BTreeMap::new();
        m.insert("alpha_pattern", json!(self.alpha_pattern));
        m.insert("auto_mapping", Value::Null);
        m.insert(
            "base_model_name_or_path",
            json!(self.base_model_name_or_path),
        );
        m.insert("bias", json!("none"));
        m.insert("fan_in_fan_out", json!(false));
        m.insert("inference_mode", json!(true));
        m.insert("init_lora_weights", init_to_json(self.init_lora_weights));
        m.insert("layers_pattern", Value::Null);
        m.insert("layers_to_transform", Value::Null);
        m.insert("loftq_config", json!({}));
        m.insert("lora_alpha", number(self.lora_alpha));
        m.insert("lora_dropout", json!(self.lora_dropout));
        m.insert("megatron_config", Value::Null);
        m.insert("megatron_core", json!("megatron.core"));
        m.insert("modules_to_save", Value::Null);
        m.insert("peft_type", json!("LORA"));
        m.insert("r", json!(self.r));
        m.insert("rank_pattern", json!(self.rank_pattern));
        m.insert("revision", json!(self.revision));
        m.insert("target_modules", targets_to_json(&self.target_modules));
        m.insert("task_type", json!(self.task_type));
        m.insert("use_dora", json!(false));
        m.insert("use_rslora", json!(self.use_rslora));
        if let Some(ex) = &self.exclude_modules {
            m.insert("exclude_modules", targets_to_json(ex));
        }
        json!(m)
    }

    /// `adapter_config.json` text: 2-space indent, sorted keys (PEFT's `json.dumps` layout).
    pub fn to_json_string(&self) -> String {
        serde_json::to_string_pretty(&self.to_json_value())
            .expect("a JSON value built from plain data always serialises")
    }
}

/// PEFT writes integral alphas as ints (`"lora_alpha": 32`); keep that so consumers that expect an
/// int (older vLLM / llama.cpp scripts) are happy.
fn number(x: f64) -> Value {
    if x.fract() == 0.0 && x.abs() < 9.0e15 {
        json!(x as i64)
    } else {
        json!(x)
    }
}

fn targets_to_json(t: &TargetModules) -> Value {
    match t {
        TargetModules::Regex(r) => json!(r),
        // PEFT stores target_modules as a set and writes it as a list; sort for stable output.
        TargetModules::List(l) => {
            let mut l = l.clone();
            l.sort();
            l.dedup();
            json!(l)
        }
    }
}

fn init_to_json(init: InitLoraWeights) -> Value {
    match init {
        InitLoraWeights::Default => json!(true),
        InitLoraWeights::Gaussian => json!("gaussian"),
        InitLoraWeights::Random => json!(false),
    }
}

/// Typed access to the raw JSON object with PEFT's defaults and field-naming errors.
struct Fields<'a> {
    map: &'a Map<String, Value>,
    source_name: &'a str,
}

impl Fields<'_> {
    fn err(&self, field: &str, msg: impl Into<String>) -> LoraError {
        LoraError::Config {
            source_name: self.source_name.to_string(),
            field: field.to_string(),
            msg: msg.into(),
        }
    }

    /// The value, treating JSON `null` as absent.
    fn get(&self, field: &str) -> Option<&Value> {
        self.map.get(field).filter(|v| !v.is_null())
    }

    fn f64_or(&self, field: &str, default: f64) -> Result<f64> {
        match self.get(field) {
            None => Ok(default),
            Some(v) => v
                .as_f64()
                .ok_or_else(|| self.err(field, format!("expected a number, got {v}"))),
        }
    }

    fn usize_or(&self, field: &str, default: usize) -> Result<usize> {
        match self.get(field) {
            None => Ok(default),
            Some(v) => v.as_u64().map(|x| x as usize).ok_or_else(|| {
                self.err(field, format!("expected a non-negative integer, got {v}"))
            }),
        }
    }

    fn bool_or(&self, field: &str, default: bool) -> Result<bool> {
        match self.get(field) {
            None => Ok(default),
            Some(v) => v
                .as_bool()
                .ok_or_else(|| self.err(field, format!("expected true/false, got {v}"))),
        }
    }

    fn string(&self, field: &str) -> Result<Option<String>> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(v) => Err(self.err(field, format!("expected a string, got {v}"))),
        }
    }

    fn targets(&self, field: &str) -> Result<Option<TargetModules>> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(TargetModules::Regex(s.clone()))),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| {
                    v.as_str().map(str::to_string).ok_or_else(|| {
                        self.err(field, format!("list entries must be strings, got {v}"))
                    })
                })
                .collect::<Result<Vec<_>>>()
                .map(|mut l| {
                    // a set in PEFT: order carries no meaning
                    l.sort();
                    l.dedup();
                    Some(TargetModules::List(l))
                }),
            Some(v) => Err(self.err(field, format!("expected a regex string or a list, got {v}"))),
        }
    }

    fn pattern_map<T>(
        &self,
        field: &str,
        conv: impl Fn(&Value) -> Option<T>,
    ) -> Result<BTreeMap<String, T>> {
        match self.get(field) {
            None => Ok(BTreeMap::new()),
            Some(Value::Object(m)) => m
                .iter()
                .map(|(k, v)| {
                    conv(v).map(|x| (k.clone(), x)).ok_or_else(|| {
                        self.err(field, format!("{k:?}: expected a number, got {v}"))
                    })
                })
                .collect(),
            Some(v) => Err(self.err(field, format!("expected an object, got {v}"))),
        }
    }

    /// Errors when `field` is present with a value other than its no-op default.
    fn reject_unless(
        &self,
        field: &str,
        is_default: impl Fn(&Value) -> bool,
        why: &str,
    ) -> Result<()> {
        match self.get(field) {
            Some(v) if !is_default(v) => {
                Err(self.err(field, format!("{v} is not supported: {why}")))
            }
            _ => Ok(()),
        }
    }
}

fn is_false(v: &Value) -> bool {
    v == &Value::Bool(false)
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        Value::String(s) => s.is_empty(),
        _ => false,
    }
}

fn parse_fields(f: &Fields) -> Result<LoraConfig> {
    if let Some(t) = f.string("peft_type")? {
        if t != "LORA" {
            return Err(f.err("peft_type", format!("expected \"LORA\", got {t:?}")));
        }
    }
    let bias = f.string("bias")?.unwrap_or_else(|| "none".into());
    if bias != "none" {
        return Err(f.err("bias", format!("only \"none\" is supported, got {bias:?}")));
    }
    f.reject_unless(
        "fan_in_fan_out",
        is_false,
        "Conv1D-style (in, out) weights are not used by Gemma 4",
    )?;
    f.reject_unless("use_dora", is_false, "DoRA is not implemented")?;
    f.reject_unless("lora_bias", is_false, "adapter biases are not implemented")?;
    f.reject_unless("use_qalora", is_false, "QA-LoRA is not implemented")?;
    f.reject_unless(
        "modules_to_save",
        is_empty,
        "fully trained extra modules are not implemented",
    )?;
    f.reject_unless(
        "layers_to_transform",
        is_empty,
        "layer selection is not implemented; use a target_modules regex",
    )?;
    f.reject_unless(
        "layer_replication",
        is_empty,
        "layer replication is not implemented",
    )?;
    f.reject_unless(
        "target_parameters",
        is_empty,
        "parameter (MoE expert) targets are not implemented",
    )?;
    f.reject_unless(
        "trainable_token_indices",
        is_empty,
        "trainable tokens are not implemented",
    )?;
    let init = match f.get("init_lora_weights") {
        None | Some(Value::Bool(true)) => InitLoraWeights::Default,
        Some(Value::Bool(false)) => InitLoraWeights::Random,
        Some(Value::String(s)) if s == "gaussian" => InitLoraWeights::Gaussian,
        Some(v) => {
            return Err(f.err(
                "init_lora_weights",
                format!("{v} is not supported (true, false or \"gaussian\")"),
            ))
        }
    };
    let target_modules = f.targets("target_modules")?.ok_or_else(|| {
        f.err(
            "target_modules",
            "missing: name the modules to adapt (a regex or a list of names)",
        )
    })?;
    Ok(LoraConfig {
        r: f.usize_or("r", 8)?,
        lora_alpha: f.f64_or("lora_alpha", 8.0)?,
        lora_dropout: f.f64_or("lora_dropout", 0.0)?,
        target_modules,
        exclude_modules: f.targets("exclude_modules")?,
        use_rslora: f.bool_or("use_rslora", false)?,
        init_lora_weights: init,
        rank_pattern: f.pattern_map("rank_pattern", |v| v.as_u64().map(|x| x as usize))?,
        alpha_pattern: f.pattern_map("alpha_pattern", Value::as_f64)?,
        base_model_name_or_path: f.string("base_model_name_or_path")?,
        revision: f.string("revision")?,
        task_type: f.string("task_type")?,
    })
}

/// The subdirectories of `dir` that hold an adapter (a run's `step-N` / `epoch-E` checkpoints),
/// in name order with numbers compared as numbers.
fn adapters_inside(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .flatten()
        .filter(|e| e.path().join(crate::io::CONFIG_NAME).is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort_by_cached_key(|n| {
        let digits = n.len() - n.trim_end_matches(|c: char| c.is_ascii_digit()).len();
        let (stem, number) = n.split_at(n.len() - digits);
        (stem.to_string(), number.parse::<u64>().unwrap_or(0))
    });
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_through_json() {
        let mut cfg = LoraConfig::new(
            16,
            32.0,
            TargetModules::Regex(r".*\.(q_proj|v_proj)".into()),
        );
        cfg.lora_dropout = 0.05;
        cfg.use_rslora = true;
        cfg.base_model_name_or_path = Some("google/gemma-4-12B".into());
        cfg.rank_pattern.insert("down_proj".into(), 8);
        let text = cfg.to_json_string();
        assert!(text.contains("  \"lora_alpha\": 32,"), "{text}");
        let back = LoraConfig::from_json_str(&text, "test").unwrap();
        assert_eq!(back, cfg);
    }

    #[test]
    fn a_run_folder_given_as_an_adapter_names_its_checkpoints() {
        let dir = std::env::temp_dir().join(format!("g4ft-lora-run-{}", std::process::id()));
        for ckpt in ["step-10", "step-2", "epoch-0"] {
            std::fs::create_dir_all(dir.join(ckpt)).unwrap();
            std::fs::write(dir.join(ckpt).join(crate::io::CONFIG_NAME), "{}").unwrap();
        }
        std::fs::create_dir_all(dir.join("tensorboard")).unwrap();
        let msg = LoraConfig::from_dir(&dir).unwrap_err().to_string();
        let want = format!(
            "{}: not an adapter directory (no adapter_config.json); it holds the adapters \
             epoch-0, step-2, step-10: give one, e.g. {}",
            dir.display(),
            dir.join("step-10").display()
        );
        assert_eq!(msg, want);
        let msg = LoraConfig::from_dir(&dir.join("tensorboard"))
            .unwrap_err()
            .to_string();
        assert!(msg.ends_with("(no adapter_config.json)"), "{msg}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn unsupported_fields_name_the_field() {
        let err = LoraConfig::from_json_str(
            r#"{"target_modules": ["q_proj"], "bias": "all"}"#,
            "cfg.json",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("cfg.json") && err.contains("`bias`"), "{err}");
        let err =
            LoraConfig::from_json_str(r#"{"target_modules": ["q_proj"], "use_dora": true}"#, "c")
                .unwrap_err()
                .to_string();
        assert!(err.contains("use_dora"), "{err}");
        let err = LoraConfig::from_json_str(r#"{"r": 4}"#, "c")
            .unwrap_err()
            .to_string();
        assert!(err.contains("target_modules"), "{err}");
    }

    #[test]
    fn defaults_and_unknown_keys() {
        let cfg = LoraConfig::from_json_str(
            r#"{"target_modules": "x", "some_future_field": {"a": 1}, "init_lora_weights": "gaussian"}"#,
            "c",
        )
        .unwrap();
        assert_eq!((cfg.r, cfg.lora_alpha, cfg.lora_dropout), (8, 8.0, 0.0));
        assert_eq!(cfg.init_lora_weights, InitLoraWeights::Gaussian);
    }
}
