//! PEFT targeting: which module paths get an adapter, with which rank and scale.
//!
//! Mirrors `check_target_module_exists` and `get_pattern_key` of PEFT 0.21
//! (`peft/tuners/tuners_utils.py`, `peft/utils/other.py`): a string is a regex that must match the
//! whole path (`re.fullmatch`), a list matches names equal to an entry or ending in `"." + entry`;
//! `exclude_modules` wins over targets. Paths are only ever matched against modules that exist, so
//! a pattern naming `v_proj` simply skips layers without one (k_eq_v, KV-shared layers).

use regex::Regex;

use crate::config::{LoraConfig, TargetModules};
use crate::error::{LoraError, Result};
use crate::linear::LoraLinear;

/// A linear module's path and shape, enough to plan adapters without weights.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProjectionShape {
    /// Checkpoint module path, e.g. `model.language_model.layers.0.self_attn.q_proj`.
    pub path: String,
    /// `in_features`.
    pub in_features: usize,
    /// `out_features`.
    pub out_features: usize,
}

impl ProjectionShape {
    /// A shape from path, in and out features.
    pub fn new(path: impl Into<String>, in_features: usize, out_features: usize) -> Self {
        Self {
            path: path.into(),
            in_features,
            out_features,
        }
    }
}

impl From<&LoraLinear> for ProjectionShape {
    fn from(l: &LoraLinear) -> Self {
        Self::new(l.path(), l.in_features(), l.out_features())
    }
}

/// One compiled `target_modules` / `exclude_modules` entry.
#[derive(Debug, Clone)]
enum Matcher {
    Regex(Regex),
    List(Vec<String>),
}

impl Matcher {
    fn new(t: &TargetModules, field: &str) -> Result<Self> {
        match t {
            TargetModules::Regex(p) => full_match_regex(p, field).map(Matcher::Regex),
            TargetModules::List(l) => Ok(Matcher::List(l.clone())),
        }
    }

    fn matches(&self, path: &str) -> bool {
        match self {
            Matcher::Regex(re) => re.is_match(path),
            Matcher::List(keys) => keys.iter().any(|k| {
                path == k
                    || path
                        .strip_suffix(k.as_str())
                        .is_some_and(|head| head.ends_with('.'))
            }),
        }
    }
}

/// Python's `re.fullmatch(p, s)` as a Rust regex: `^(?:p)$`.
fn full_match_regex(pattern: &str, field: &str) -> Result<Regex> {
    Regex::new(&format!("^(?:{pattern})$")).map_err(|source| LoraError::Regex {
        field: field.to_string(),
        pattern: pattern.to_string(),
        source,
    })
}

/// A compiled [`LoraConfig`]: answers "is this path adapted, with which r and scale".
#[derive(Debug, Clone)]
pub struct Targeting {
    target: Matcher,
    exclude: Option<Matcher>,
    rank_pattern: Vec<(Regex, usize)>,
    alpha_pattern: Vec<(Regex, f64)>,
    r: usize,
    lora_alpha: f64,
    use_rslora: bool,
    targets_text: String,
}

impl Targeting {
    /// Compiles the config's patterns; errors name the field whose regex does not compile.
    pub fn new(cfg: &LoraConfig) -> Result<Self> {
        // PEFT's get_pattern_key: re.match(rf"(.*\.)?({key})$", path), first key in dict order;
        // a saved config has sorted keys, which is the BTreeMap order.
        let pattern = |key: &str, field: &str| -> Result<Regex> {
            Regex::new(&format!(r"^(?:.*\.)?(?:{key})$")).map_err(|source| LoraError::Regex {
                field: field.to_string(),
                pattern: key.to_string(),
                source,
            })
        };
        Ok(Self {
            target: Matcher::new(&cfg.target_modules, "target_modules")?,
            exclude: cfg
                .exclude_modules
                .as_ref()
                .map(|e| Matcher::new(e, "exclude_modules"))
                .transpose()?,
            rank_pattern: cfg
                .rank_pattern
                .iter()
                .map(|(k, &r)| Ok((pattern(k, "rank_pattern")?, r)))
                .collect::<Result<_>>()?,
            alpha_pattern: cfg
                .alpha_pattern
                .iter()
                .map(|(k, &a)| Ok((pattern(k, "alpha_pattern")?, a)))
                .collect::<Result<_>>()?,
            r: cfg.r,
            lora_alpha: cfg.lora_alpha,
            use_rslora: cfg.use_rslora,
            targets_text: cfg.target_modules.to_string(),
        })
    }

    /// Whether `path` gets an adapter.
    pub fn is_target(&self, path: &str) -> bool {
        let excluded = self.exclude.as_ref().is_some_and(|e| e.matches(path));
        !excluded && self.target.matches(path)
    }

    /// Rank of the adapter at `path` (`rank_pattern` override or `r`).
    pub fn rank(&self, path: &str) -> usize {
        self.rank_pattern
            .iter()
            .find(|(re, _)| re.is_match(path))
            .map_or(self.r, |&(_, r)| r)
    }

    /// `lora_alpha` at `path` (`alpha_pattern` override or `lora_alpha`).
    pub fn alpha(&self, path: &str) -> f64 {
        self.alpha_pattern
            .iter()
            .find(|(re, _)| re.is_match(path))
            .map_or(self.lora_alpha, |&(_, a)| a)
    }

    /// `alpha / r`, or `alpha / √r` with rsLoRA.
    pub fn scale(&self, path: &str) -> f64 {
        let r = self.rank(path) as f64;
        let alpha = self.alpha(path);
        if self.use_rslora {
            alpha / r.sqrt()
        } else {
            alpha / r
        }
    }

    /// Which of `paths` are targeted; errors when none is (listing a few available paths).
    pub fn select<'p>(&self, paths: impl IntoIterator<Item = &'p str>) -> Result<Vec<bool>> {
        let paths: Vec<&str> = paths.into_iter().collect();
        let chosen: Vec<bool> = paths.iter().map(|p| self.is_target(p)).collect();
        if chosen.iter().any(|&c| c) {
            return Ok(chosen);
        }
        Err(LoraError::NoTargetMatched {
            targets: self.targets_text.clone(),
            count: paths.len(),
            examples: examples(&paths),
        })
    }
}

/// Up to 8 paths, spread over the list, so both early and late layers show.
fn examples(paths: &[&str]) -> String {
    if paths.is_empty() {
        return "(none: the model exposed no projections)".into();
    }
    let step = paths.len().div_ceil(8);
    let picked: Vec<&str> = paths.iter().step_by(step).copied().collect();
    picked.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(t: TargetModules) -> LoraConfig {
        LoraConfig::new(4, 8.0, t)
    }

    #[test]
    fn regex_is_full_match() {
        let t = Targeting::new(&cfg(TargetModules::Regex(r".*\.(q_proj|v_proj)".into()))).unwrap();
        assert!(t.is_target("model.layers.0.self_attn.q_proj"));
        assert!(!t.is_target("model.layers.0.self_attn.q_proj_extra"));
        let t = Targeting::new(&cfg(TargetModules::Regex("q_proj".into()))).unwrap();
        assert!(
            !t.is_target("model.layers.0.self_attn.q_proj"),
            "fullmatch, not search"
        );
        // the blog post's pattern
        let post = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)";
        let t = Targeting::new(&cfg(TargetModules::Regex(post.into()))).unwrap();
        assert!(t.is_target("model.language_model.layers.5.mlp.down_proj"));
        assert!(!t.is_target("model.layers.5.mlp.down_proj"));
    }

    #[test]
    fn list_is_suffix_match_on_dot_boundary() {
        let t = Targeting::new(&cfg(TargetModules::List(vec![
            "q_proj".into(),
            "mlp.up_proj".into(),
        ])))
        .unwrap();
        assert!(t.is_target("a.b.q_proj"));
        assert!(t.is_target("q_proj"));
        assert!(!t.is_target("a.b.xq_proj"));
        assert!(t.is_target("layers.1.mlp.up_proj"));
        assert!(!t.is_target("layers.1.xmlp.up_proj"));
    }

    #[test]
    fn exclude_and_patterns() {
        let mut c = cfg(TargetModules::List(vec![
            "q_proj".into(),
            "down_proj".into(),
        ]));
        c.exclude_modules = Some(TargetModules::Regex(r".*layers\.1\..*".into()));
        c.rank_pattern.insert("down_proj".into(), 2);
        c.alpha_pattern
            .insert(r"layers\.0\.mlp\.down_proj".into(), 1.0);
        c.use_rslora = true;
        let t = Targeting::new(&c).unwrap();
        assert!(!t.is_target("layers.1.q_proj"));
        assert_eq!(t.rank("layers.0.mlp.down_proj"), 2);
        assert_eq!(t.rank("layers.0.q_proj"), 4);
        assert_eq!(t.scale("layers.0.mlp.down_proj"), 1.0 / 2f64.sqrt());
        assert_eq!(t.scale("layers.2.mlp.down_proj"), 8.0 / 2f64.sqrt());
        assert_eq!(t.scale("layers.0.q_proj"), 4.0);
    }

    #[test]
    fn nothing_matched_lists_paths() {
        let t = Targeting::new(&cfg(TargetModules::List(vec!["qkv".into()]))).unwrap();
        let err = t
            .select(["m.layers.0.q_proj", "m.layers.0.k_proj"])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("m.layers.0.q_proj") && err.contains("qkv"),
            "{err}"
        );
    }

    #[test]
    fn bad_regex_names_field() {
        let err = Targeting::new(&cfg(TargetModules::Regex("(".into())))
            .unwrap_err()
            .to_string();
        assert!(err.contains("target_modules"), "{err}");
    }
}
