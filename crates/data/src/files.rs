//! What `--data` names, resolved to the files it stands for, as Hugging Face `datasets` resolves
//! `load_dataset(folder)` and `data_files=` patterns (`docs/data.md`, "Several files"):
//!
//! - a file: itself;
//! - a glob (`data/train-*.parquet`, `shards/**/*.jsonl`): the files it matches, in path order;
//!   `*`, `?` and `[...]` stay inside one path component, a `**` component spans any number of
//!   folders;
//! - a folder: its data files, split by `datasets`' rules: `data/{split}-NNNNN-of-NNNNN*` shard
//!   names first, then a split keyword as a folder name (`train/`, `validation/`, `test/`, ...),
//!   then in a file name (`train.jsonl`, `my_test-1.parquet`), else every data file is `train`.
//!   One split is taken (`train` unless another is asked for).
//!
//! A folder's `README.md` (its dataset card) may list `configs` (subsets), each with its splits'
//! file patterns: the config asked for (else the default one) then decides the splits, as in
//! `datasets`. Files and folders whose names start with `.` or `__` are left out unless a pattern
//! names them (`.g4ft-cache/` beside the data is never data). The same rules serve a Hub
//! dataset's file list ([`crate::hub`]).

use std::path::{Path, PathBuf};

use g4ft_hub::{looks_like_a_path, Hub};

use crate::card::CardConfig;
use crate::error::{DataError, Result};

/// The split that holds every data file of a folder whose names name no split.
const DEFAULT_SPLIT: &str = "train";

/// Which split to take from a folder or a Hub dataset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitChoice<'a> {
    /// The split asked for, if any.
    pub asked: Option<&'a str>,
    /// The first of these that the files make is taken when none is asked for.
    pub defaults: &'a [&'a str],
    /// The option that asks for a split (named in errors).
    pub flag: &'a str,
    /// The config (subset) to take when the dataset card lists several.
    pub config: Option<&'a str>,
    /// The option that asks for a config (named in errors).
    pub config_flag: &'a str,
}

impl<'a> SplitChoice<'a> {
    /// Training data: `asked`, else `train` (`--data-split`).
    pub fn train(asked: Option<&'a str>) -> Self {
        SplitChoice {
            asked,
            defaults: &["train"],
            flag: "--data-split",
            config: None,
            config_flag: "--data-config",
        }
    }

    /// Evaluation data: `asked`, else `validation`, else `test` (`--eval-split`).
    pub fn eval(asked: Option<&'a str>) -> Self {
        SplitChoice {
            asked,
            defaults: &["validation", "test"],
            flag: "--eval-split",
            config: None,
            config_flag: "--eval-config",
        }
    }

    /// The same choice within the config `config`.
    pub fn with_config(self, config: Option<&'a str>) -> Self {
        SplitChoice { config, ..self }
    }
}

/// Splits in the order `datasets` lists them, each with the keywords that name it in a folder or
/// file name.
const SPLIT_KEYWORDS: [(&str, &[&str]); 3] = [
    ("train", &["train", "training"]),
    ("validation", &["validation", "valid", "dev", "val"]),
    ("test", &["test", "testing", "eval", "evaluation"]),
];

/// The characters that may stand beside a split keyword in a name (`datasets`' `NON_WORDS_CHARS`,
/// as a glob class).
const SEP: &str = "[-._ 0-9]";

/// File names that are never data, whatever their extension (metadata `datasets` skips).
const NOT_DATA: [&str; 6] = [
    "README.md",
    "config.json",
    "dataset_info.json",
    "dataset_infos.json",
    "dummy_data.zip",
    "dataset_dict.json",
];

/// Kinds of data file by extension, each with the extensions that make it, in the order that
/// breaks a tie in the file count (as `datasets` breaks it: Parquet, then JSON Lines, JSON).
const KINDS: [(&str, &[&str]); 6] = [
    ("parquet", &["parquet"]),
    ("arrow", &["arrow"]),
    ("json", &["jsonl", "json"]),
    ("csv", &["csv", "tsv"]),
    ("text", &["txt"]),
    ("xml", &["xml"]),
];

/// Compression suffixes a data file may carry after its kind's extension.
const COMPRESSION: [&str; 6] = ["gz", "zst", "bz2", "xz", "lz4", "zip"];

/// The files `--data` (or `--eval-data`) stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataFiles {
    /// What was given: a file, a folder, a glob or a Hub id.
    pub spec: String,
    /// The config (subset) taken, when the dataset card lists configs.
    pub config: Option<String>,
    /// The split taken, when the spec has splits (a folder or a Hub dataset).
    pub split: Option<String>,
    /// The files, in the order their rows are concatenated.
    pub files: Vec<PathBuf>,
}

impl DataFiles {
    /// One file.
    pub fn one(path: &Path) -> Self {
        DataFiles {
            spec: path.display().to_string(),
            config: None,
            split: None,
            files: vec![path.to_path_buf()],
        }
    }

    /// Resolves `spec`: a local file, folder or glob ([`resolve_local`]), else a Hub dataset id
    /// (`owner/name`, [`crate::hub::resolve_hub`]: the split's files downloaded into the Hub
    /// cache once).
    pub fn resolve(spec: &str, split: SplitChoice, hub: &Hub) -> Result<Self> {
        if let Some(files) = resolve_local(spec, split)? {
            return Ok(files);
        }
        match looks_like_a_path(spec) {
            None => crate::hub::resolve_hub(spec, split, hub),
            Some(why) => Err(DataError::DataFiles {
                spec: spec.to_string(),
                msg: format!(
                    "no such file or folder, and no wildcard (*, ?, [) to match files ({why}, so \
                     it is not taken for a Hub dataset id)"
                ),
            }),
        }
    }

    /// `spec (config main, split train, 3 files)`, or the file for a single file.
    pub fn describe(&self) -> String {
        let n = self.files.len();
        if n == 1 && self.split.is_none() && self.files[0] == Path::new(&self.spec) {
            return self.spec.clone();
        }
        let mut parts: Vec<String> = Vec::new();
        if let Some(c) = &self.config {
            parts.push(format!("config {c}"));
        }
        if let Some(s) = &self.split {
            parts.push(format!("split {s}"));
        }
        parts.push(format!("{n} file{}", plural(n)));
        format!("{} ({})", self.spec, parts.join(", "))
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// Resolves a local `spec`: a file, a folder (taking the split `split` chooses) or a glob.
/// `None` when it is none of these and has no wildcard (the caller may try it as a Hub id).
pub fn resolve_local(spec: &str, split: SplitChoice) -> Result<Option<DataFiles>> {
    let err = |msg: String| DataError::DataFiles {
        spec: spec.to_string(),
        msg,
    };
    let path = Path::new(spec);
    if path.is_file() {
        if let Some(s) = split.asked {
            return Err(err(format!(
                "a split (`{s}`) names part of a folder or a Hub dataset; this is one file"
            )));
        }
        return Ok(Some(DataFiles::one(path)));
    }
    if path.is_dir() {
        let names = walk(path)?;
        let readme = path.join("README.md");
        let card = match readme.is_file() {
            true => Some(std::fs::read_to_string(&readme).map_err(|e| DataError::io(&readme, e))?),
            false => None,
        };
        let (config, split, rel) = choose_split(&names, card.as_deref(), split).map_err(err)?;
        return Ok(Some(DataFiles {
            spec: spec.to_string(),
            config,
            split: Some(split),
            files: rel.iter().map(|r| path.join(r)).collect(),
        }));
    }
    if !has_wildcard(spec) {
        return Ok(None);
    }
    if let Some(s) = split.asked {
        return Err(err(format!(
            "a split (`{s}`) names part of a folder or a Hub dataset, not of a glob's files"
        )));
    }
    let (base, pattern) = split_glob(spec);
    let base_dir = if base.as_os_str().is_empty() {
        Path::new(".")
    } else {
        base.as_path()
    };
    let names = if base_dir.is_dir() {
        walk(base_dir)?
    } else {
        Vec::new()
    };
    let files: Vec<PathBuf> = names
        .iter()
        .filter(|n| glob_matches(&pattern, n) && !unrequested_hidden(&pattern, n))
        .map(|n| base.join(n))
        .collect();
    if files.is_empty() {
        return Err(err("no file matches this pattern".into()));
    }
    Ok(Some(DataFiles {
        spec: spec.to_string(),
        config: None,
        split: None,
        files,
    }))
}

/// The split `choice` takes from a folder's or a Hub dataset's files (`/`-separated paths
/// relative to its root; `card` its `README.md`), by the rules of the module doc: the config
/// taken, the split's name and its data files. The error lists the configs or splits there are,
/// or says why no file is data.
pub fn choose_split(
    names: &[String],
    card: Option<&str>,
    choice: SplitChoice,
) -> std::result::Result<(Option<String>, String, Vec<String>), String> {
    let Splits { config, mut splits } = splits(names, card, choice)?;
    let wanted: Vec<&str> = match choice.asked {
        Some(s) => vec![s],
        None => choice.defaults.to_vec(),
    };
    if let Some(i) = wanted
        .iter()
        .find_map(|w| splits.iter().position(|(s, _)| s == w))
    {
        let (split, files) = splits.swap_remove(i);
        return Ok((config, split, files));
    }
    let have: Vec<&str> = splits.iter().map(|(s, _)| s.as_str()).collect();
    Err(format!(
        "no split {} here{}: the files make the split{} {} (pick one with {})",
        wanted
            .iter()
            .map(|w| format!("`{w}`"))
            .collect::<Vec<_>>()
            .join(" or "),
        config
            .map(|c| format!(" in config `{c}`"))
            .unwrap_or_default(),
        plural(have.len()),
        have.join(", "),
        choice.flag
    ))
}

/// The splits of a folder or a Hub dataset, and the config (subset) they belong to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Splits {
    /// The config taken from the dataset card, when it lists any.
    pub config: Option<String>,
    /// Each split with its data files, in order.
    pub splits: Vec<(String, Vec<String>)>,
}

/// Every split of a folder's or a Hub dataset's files (`/`-separated paths relative to its root),
/// each with its data files in order, by the rules of the module doc; when the dataset card
/// (`card`, its `README.md`) lists `configs`, the splits of the one `choice.config` names (else
/// of the default one). Only files of the kind most of them are count (Parquet wins a tie); an error when
/// there are none, or when that kind is not JSON or Parquet.
pub fn splits(
    names: &[String],
    card: Option<&str>,
    choice: SplitChoice,
) -> std::result::Result<Splits, String> {
    let mut candidates: Vec<String> = names.iter().filter(|n| is_data_file(n)).cloned().collect();
    candidates.sort();
    let visible: Vec<String> = candidates
        .iter()
        .filter(|n| !unrequested_hidden(&[], n))
        .cloned()
        .collect();
    if visible.is_empty() {
        return Err(format!(
            "no data files here ({} file{} in all; data files end in .jsonl, .json or .parquet, \
             compressed or not)",
            names.len(),
            plural(names.len())
        ));
    }
    let configs = match card {
        Some(text) => crate::card::configs(text).map_err(|e| format!("README.md: configs: {e}"))?,
        None => Vec::new(),
    };
    let (config, patterns) = match (configs.is_empty(), choice.config) {
        (true, Some(c)) => {
            return Err(format!(
                "a config (`{c}`) was asked for, but the dataset card (README.md) lists no configs"
            ))
        }
        (true, None) => (None, split_patterns(&visible)),
        (false, _) => {
            let chosen = pick_config(&configs, choice)?;
            (Some(chosen.name.clone()), chosen.splits.clone())
        }
    };
    let mut splits: Vec<(String, Vec<String>)> = patterns
        .into_iter()
        .map(|(split, patterns)| {
            let mut files: Vec<String> = Vec::new();
            for p in patterns {
                let pattern = components(&p);
                for n in &candidates {
                    if glob_matches(&pattern, n)
                        && !unrequested_hidden(&pattern, n)
                        && !files.contains(n)
                    {
                        files.push(n.clone());
                    }
                }
            }
            (split, files)
        })
        .collect();
    let all: Vec<String> = splits.iter().flat_map(|(_, f)| f.clone()).collect();
    let kind = majority_kind(&all);
    if !matches!(kind, "json" | "parquet") {
        return Err(format!(
            "the data files here are {kind} files, which are not read: convert them to JSONL or \
             Parquet"
        ));
    }
    for (_, files) in &mut splits {
        files.retain(|f| kind_of(f) == Some(kind));
    }
    splits.retain(|(_, files)| !files.is_empty());
    Ok(Splits { config, splits })
}

/// The config `choice` names, else the card's default (`default: true`, else the one named
/// `default`, else the only one).
fn pick_config<'c>(
    configs: &'c [CardConfig],
    choice: SplitChoice,
) -> std::result::Result<&'c CardConfig, String> {
    let names = configs
        .iter()
        .map(|c| c.name.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    match choice.config {
        Some(a) => configs.iter().find(|c| c.name == a).ok_or_else(|| {
            format!("no config `{a}` in the dataset card (README.md): it lists {names}")
        }),
        None => configs
            .iter()
            .find(|c| c.default)
            .or_else(|| configs.iter().find(|c| c.name == "default"))
            .or_else(|| (configs.len() == 1).then(|| &configs[0]))
            .ok_or_else(|| {
                format!(
                    "the dataset card (README.md) lists the configs {names} and marks none as \
                     the default (pick one with {})",
                    choice.config_flag
                )
            }),
    }
}

/// Each split's patterns, in `datasets`' order of rules: shard names, split folders, split file
/// names, then everything as `train`. The first rule that matches a file decides the splits.
fn split_patterns(data: &[String]) -> Vec<(String, Vec<String>)> {
    let shard = components("data/*-[0-9][0-9][0-9][0-9][0-9]-of-[0-9][0-9][0-9][0-9][0-9]*.*");
    let mut sharded: Vec<String> = Vec::new();
    for n in data.iter().filter(|n| glob_matches(&shard, n)) {
        let base = n.rsplit('/').next().unwrap_or(n);
        if let Some(name) = shard_split(base).filter(|s| !sharded.iter().any(|k| k == s)) {
            sharded.push(name.to_string());
        }
    }
    if !sharded.is_empty() {
        let known: Vec<String> = SPLIT_KEYWORDS
            .iter()
            .map(|(s, _)| s.to_string())
            .filter(|s| sharded.contains(s))
            .collect();
        let mut others: Vec<String> = sharded.into_iter().filter(|s| !known.contains(s)).collect();
        others.sort();
        return known
            .into_iter()
            .chain(others)
            .map(|s| {
                let p =
                    format!("data/{s}-[0-9][0-9][0-9][0-9][0-9]-of-[0-9][0-9][0-9][0-9][0-9]*.*");
                (s, vec![p])
            })
            .collect();
    }
    let in_folder = [
        "**/{k}/**",
        "**/{k}{s}*/**",
        "**/*{s}{k}/**",
        "**/*{s}{k}{s}*/**",
    ];
    let in_name = ["**/{k}{s}*", "**/*{s}{k}{s}*"];
    for rule in [&in_folder[..], &in_name[..]] {
        let found: Vec<(String, Vec<String>)> = SPLIT_KEYWORDS
            .iter()
            .map(|(split, keywords)| {
                let patterns = keywords
                    .iter()
                    .flat_map(|k| {
                        rule.iter()
                            .map(move |r| r.replace("{k}", k).replace("{s}", SEP))
                    })
                    .collect::<Vec<_>>();
                (split.to_string(), patterns)
            })
            .filter(|(_, patterns)| {
                patterns.iter().any(|p| {
                    let c = components(p);
                    data.iter().any(|n| glob_matches(&c, n))
                })
            })
            .collect();
        if !found.is_empty() {
            return found;
        }
    }
    vec![(DEFAULT_SPLIT.to_string(), vec!["**".to_string()])]
}

/// The split a shard's file name gives: what comes before its last `-NNNNN-of-NNNN` (the
/// split name `datasets` reads from `data/{split}-NNNNN-of-NNNNN*`).
fn shard_split(base: &str) -> Option<&str> {
    let b = base.as_bytes();
    let digits = |r: std::ops::Range<usize>| b[r].iter().all(u8::is_ascii_digit);
    (1..b.len().saturating_sub(13))
        .rev()
        .find(|&i| {
            b[i] == b'-'
                && digits(i + 1..i + 6)
                && &b[i + 6..i + 10] == b"-of-"
                && digits(i + 10..i + 14)
        })
        .map(|i| &base[..i])
}

/// The kind (a [`KINDS`] name) of a file, from its extensions (`x.jsonl.gz` is `json`).
fn kind_of(name: &str) -> Option<&'static str> {
    let base = name.rsplit('/').next().unwrap_or(name);
    let exts: Vec<String> = base.split('.').skip(1).map(str::to_lowercase).collect();
    let mut exts = exts.iter().rev().peekable();
    while exts
        .peek()
        .is_some_and(|e| COMPRESSION.contains(&e.as_str()))
    {
        exts.next();
    }
    let ext = exts.next()?;
    KINDS
        .iter()
        .find(|(_, es)| es.contains(&ext.as_str()))
        .map(|(k, _)| *k)
}

fn is_data_file(name: &str) -> bool {
    let base = name.rsplit('/').next().unwrap_or(name);
    !NOT_DATA.contains(&base) && kind_of(name).is_some()
}

/// The kind most of `files` are (ties broken by [`KINDS`]' order).
fn majority_kind(files: &[String]) -> &'static str {
    KINDS
        .iter()
        .map(|(k, _)| (*k, files.iter().filter(|f| kind_of(f) == Some(k)).count()))
        .fold(
            ("json", 0),
            |best, (k, n)| if n > best.1 { (k, n) } else { best },
        )
        .0
}

/// Whether a glob has a wildcard.
fn has_wildcard(spec: &str) -> bool {
    spec.contains(['*', '?', '['])
}

/// A glob's leading folders without wildcards, and the rest as components.
fn split_glob(spec: &str) -> (PathBuf, Vec<String>) {
    let parts = components(spec);
    let fixed = parts.iter().take_while(|p| !has_wildcard(p)).count();
    let fixed = fixed.min(parts.len().saturating_sub(1));
    let mut base: PathBuf = parts[..fixed].iter().collect();
    if spec.starts_with('/') {
        base = Path::new("/").join(base);
    }
    (base, parts[fixed..].to_vec())
}

fn components(pattern: &str) -> Vec<String> {
    pattern
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .map(str::to_string)
        .collect()
}

/// Whether the `/`-separated `path` of a file matches the glob `pattern` (as components): a `**`
/// component matches any number of path components (at the end, at least one: `dir/**` is what is
/// under `dir`), any other one exactly one.
fn glob_matches(pattern: &[String], path: &str) -> bool {
    let names: Vec<&str> = path.split('/').collect();
    match_from(pattern, &names)
}

fn match_from(pattern: &[String], names: &[&str]) -> bool {
    match pattern.split_first() {
        None => names.is_empty(),
        Some((p, rest)) if p == "**" => {
            (usize::from(rest.is_empty())..=names.len()).any(|k| match_from(rest, &names[k..]))
        }
        Some((p, rest)) => {
            !names.is_empty() && name_matches(p.as_bytes(), names[0].as_bytes()) && {
                match_from(rest, &names[1..])
            }
        }
    }
}

/// `fnmatch` on one name: `*` any run, `?` one character, `[...]` a class (`!` or `^` negates,
/// `a-z` ranges).
fn name_matches(p: &[u8], s: &[u8]) -> bool {
    match p.first() {
        None => s.is_empty(),
        Some(b'*') => (0..=s.len()).any(|k| name_matches(&p[1..], &s[k..])),
        Some(b'?') => !s.is_empty() && name_matches(&p[1..], &s[1..]),
        Some(b'[') => match (class(&p[1..], s.first().copied()), s.is_empty()) {
            (Some((true, used)), false) => name_matches(&p[1 + used..], &s[1..]),
            (Some(_), _) => false,
            (None, _) => s.first() == Some(&b'[') && name_matches(&p[1..], &s[1..]),
        },
        Some(&c) => s.first() == Some(&c) && name_matches(&p[1..], &s[1..]),
    }
}

/// Whether `c` is in the class that starts after `[`, and the class's length through `]`;
/// `None` when the class does not close (the `[` is then literal).
fn class(p: &[u8], c: Option<u8>) -> Option<(bool, usize)> {
    let negated = matches!(p.first(), Some(b'!' | b'^'));
    let mut i = usize::from(negated);
    let mut hit = false;
    let start = i;
    while i < p.len() && (p[i] != b']' || i == start) {
        if i + 2 < p.len() && p[i + 1] == b'-' && p[i + 2] != b']' {
            hit |= c.is_some_and(|c| p[i] <= c && c <= p[i + 2]);
            i += 3;
        } else {
            hit |= c == Some(p[i]);
            i += 1;
        }
    }
    (i < p.len()).then_some((hit != negated, i + 1))
}

/// Whether `path` has more hidden (`.x`) or special (`__x`) components than `pattern` names:
/// such files are left out unless asked for.
fn unrequested_hidden(pattern: &[String], path: &str) -> bool {
    let count = |parts: &mut dyn Iterator<Item = &str>, prefix: &str| {
        parts
            .filter(|c| c.starts_with(prefix) && *c != "." && *c != "..")
            .count()
    };
    ["." as &str, "__"].iter().any(|prefix| {
        count(&mut path.split('/'), prefix) > count(&mut pattern.iter().map(String::as_str), prefix)
    })
}

/// Every file under `root` (following links), as `/`-separated paths relative to it, sorted.
fn walk(root: &Path) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = root.join(&rel);
        for entry in std::fs::read_dir(&dir).map_err(|e| DataError::io(&dir, e))? {
            let entry = entry.map_err(|e| DataError::io(&dir, e))?;
            let child = rel.join(entry.file_name());
            let path = root.join(&child);
            if path.is_dir() {
                stack.push(child);
            } else if path.is_file() {
                out.push(child.to_string_lossy().replace('\\', "/"));
            }
        }
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn names_match_like_fnmatch() {
        assert!(name_matches(b"train[-._ 0-9]*", b"train-00.jsonl"));
        assert!(!name_matches(b"train[-._ 0-9]*", b"training.jsonl"));
        assert!(name_matches(b"*[-._ 0-9]test[-._ 0-9]*", b"my_test.json"));
        assert!(name_matches(b"[!a]?", b"bc"));
        assert!(!name_matches(b"[!a]?", b"ac"));
        assert!(name_matches(b"a[b", b"a[b"));
        assert!(glob_matches(&components("**/train/**"), "train/x.jsonl"));
        assert!(glob_matches(
            &components("**/train/**"),
            "a/train/b/x.jsonl"
        ));
        assert!(!glob_matches(&components("**/train/**"), "train.jsonl"));
        assert!(!glob_matches(
            &components("**/valid[-._ 0-9]*/**"),
            "valid.jsonl"
        ));
        assert!(glob_matches(&components("**"), "valid.jsonl"));
        assert!(glob_matches(&components("*.jsonl"), "a.jsonl"));
        assert!(!glob_matches(&components("*.jsonl"), "d/a.jsonl"));
    }

    #[test]
    fn shard_names_make_the_splits() {
        let files = names(&[
            "README.md",
            "data/test_sft-00000-of-00001-aa.parquet",
            "data/train_sft-00000-of-00002-bb.parquet",
            "data/train_sft-00001-of-00002-cc.parquet",
        ]);
        let (_, split, got) =
            choose_split(&files, None, SplitChoice::train(Some("train_sft"))).unwrap();
        assert_eq!(split, "train_sft");
        assert_eq!(got, files[2..]);
        let err = choose_split(&files, None, SplitChoice::train(None)).unwrap_err();
        assert!(err.contains("splits test_sft, train_sft"), "{err}");
    }

    #[test]
    fn hidden_and_metadata_files_are_not_data() {
        let files = names(&[
            ".g4ft-cache/x.jsonl",
            "__x/y.jsonl",
            "config.json",
            "a.jsonl",
        ]);
        let got = choose_split(&files, None, SplitChoice::train(None)).unwrap();
        assert_eq!(got.2, names(&["a.jsonl"]));
    }
}
