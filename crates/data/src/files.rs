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
//!   One split is taken (`train` unless another is asked for);
//! - a folder written by `save_to_disk` (it holds `state.json` or `dataset_dict.json`): its Arrow
//!   files as `load_from_disk` reads them, a dataset dict's split taken the same way
//!   (module `saved`).
//!
//! A folder's `README.md` (its dataset card) may list `configs` (subsets), each with its splits'
//! file patterns: the config asked for (else the default one) then decides the splits, as in
//! `datasets`. Files and folders whose names start with `.` or `__` are left out unless a pattern
//! names them (`.g4ft-cache/` beside the data is never data). The same rules serve a Hub
//! dataset's file list ([`crate::hub`]).

use std::path::{Path, PathBuf};

use g4ft_hub::{looks_like_a_path, Hub};

use crate::card::{is_split_name, CardConfig};
use crate::error::{DataError, Result};
use crate::glob::{components, glob_matches, has_wildcard, split_glob, unrequested_hidden, walk};

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

    /// The splits to look for, in order: the one asked for, else the defaults.
    pub fn wanted(&self) -> Vec<&'a str> {
        match self.asked {
            Some(s) => vec![s],
            None => self.defaults.to_vec(),
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

/// The builder `datasets` reads a file with, by extension (lower case): its readers of data
/// files and its folders of media. A file is data when one of its extensions is here; the builder
/// most of a split's extensions name reads the split.
const BUILDERS: &[(&str, &str)] = &[
    ("parquet", "parquet"),
    ("geoparquet", "parquet"),
    ("gpq", "parquet"),
    ("json", "json"),
    ("jsonl", "json"),
    ("ndjson", "json"),
    ("arrow", "arrow"),
    ("csv", "csv"),
    ("tsv", "csv"),
    ("txt", "text"),
    ("xml", "xml"),
    ("hdf5", "hdf5"),
    ("h5", "hdf5"),
    ("conll", "conll"),
    ("conllu", "conll"),
    ("tar", "webdataset"),
    ("eval", "eval"),
    ("toml", "harbor"),
    ("md", "harbor"),
    ("lance", "lance"),
    ("vortex", "vortex"),
    ("fasta", "fasta"),
    ("fastq", "fastq"),
    ("pdb", "pdb"),
    ("jpg", "imagefolder"),
    ("jpeg", "imagefolder"),
    ("png", "imagefolder"),
    ("gif", "imagefolder"),
    ("bmp", "imagefolder"),
    ("tif", "imagefolder"),
    ("tiff", "imagefolder"),
    ("webp", "imagefolder"),
    ("wav", "audiofolder"),
    ("mp3", "audiofolder"),
    ("flac", "audiofolder"),
    ("ogg", "audiofolder"),
    ("m4a", "audiofolder"),
    ("mp4", "videofolder"),
    ("mov", "videofolder"),
    ("mkv", "videofolder"),
    ("webm", "videofolder"),
    ("pdf", "pdffolder"),
];

/// Builders whose extensions count in upper case too (`A.PNG`); the others' only in lower case.
const ANY_CASE: [&str; 5] = [
    "imagefolder",
    "audiofolder",
    "videofolder",
    "pdffolder",
    "pdb",
];

/// The builders this crate reads.
const READ: [&str; 4] = ["json", "parquet", "arrow", "csv"];

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
    if path.is_file() && !has_wildcard(spec) {
        if let Some(s) = split.asked {
            return Err(err(format!(
                "a split (`{s}`) names part of a folder or a Hub dataset; this is one file"
            )));
        }
        return Ok(Some(DataFiles::one(path)));
    }
    if path.is_dir() && !has_wildcard(spec) {
        if let Some(saved) = crate::saved::resolve_saved(path, spec, split)? {
            return Ok(Some(saved));
        }
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
    check_pattern(spec).map_err(err)?;
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
        .filter(|n| {
            glob_matches(&pattern, n)
                && !unrequested_hidden(&pattern, n)
                && !unrequested_metadata(&pattern, n)
        })
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
    let wanted = choice.wanted();
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
/// of the default one). Without a card, a split's files of another builder than most of them are
/// left out, as `datasets` leaves them out; a split of another builder than the others, a card's
/// config whose files are of two kinds, a split without files, a card's file that is not there,
/// a builder other than JSON, Parquet, Arrow or CSV, CSV files with both `.csv` and `.tsv` names,
/// and a card's CSV config with reading options (`sep`, ...) are errors.
pub fn splits(
    names: &[String],
    card: Option<&str>,
    choice: SplitChoice,
) -> std::result::Result<Splits, String> {
    if names.iter().any(|n| n == ".huggingface.yaml") {
        return Err(
            ".huggingface.yaml sets this dataset's configs, and it is not read here: \
                    name the files of a split with a glob, or pass its folder"
                .into(),
        );
    }
    let mut candidates: Vec<String> = names.iter().filter(|n| is_data_file(n)).cloned().collect();
    candidates.sort();
    let configs = match card {
        Some(text) => crate::card::configs(text).map_err(|e| format!("README.md: configs: {e}"))?,
        None => Vec::new(),
    };
    let mut options: &[String] = &[];
    let (config, patterns) = match (configs.is_empty(), choice.config) {
        (true, Some(c)) => {
            return Err(format!(
                "a config (`{c}`) was asked for, but the dataset card (README.md) lists no configs"
            ))
        }
        (true, None) => (None, inferred_patterns(names, "")?),
        (false, _) => {
            let chosen = pick_config(&configs, choice)?;
            options = &chosen.options;
            let dir = chosen.data_dir.as_deref().unwrap_or("");
            let patterns = match &chosen.splits {
                Some(splits) => splits
                    .iter()
                    .map(|(split, ps)| (split.clone(), ps.iter().map(|p| under(dir, p)).collect()))
                    .collect(),
                None => inferred_patterns(names, dir)?,
            };
            (Some(chosen.name.clone()), patterns)
        }
    };
    let in_config = config
        .as_ref()
        .map(|c| format!("config {c}: "))
        .unwrap_or_default();
    let mut splits: Vec<(String, Vec<String>)> = Vec::new();
    for (split, patterns) in patterns {
        let mut files: Vec<String> = Vec::new();
        for p in &patterns {
            check_pattern(p).map_err(|e| format!("{in_config}split `{split}`: {e}"))?;
            let pattern = components(p);
            let matched = candidates.iter().filter(|n| {
                glob_matches(&pattern, n)
                    && !unrequested_hidden(&pattern, n)
                    && !unrequested_metadata(&pattern, n)
            });
            let before = files.len();
            for n in matched {
                if !files.contains(n) {
                    files.push(n.clone());
                }
            }
            if files.len() == before && config.is_some() && !has_wildcard(p) {
                return Err(format!(
                    "{in_config}split `{split}`: no data file `{p}` here"
                ));
            }
        }
        if files.is_empty() {
            return Err(format!(
                "{in_config}split `{split}` has no data files (patterns {})",
                patterns.join(", ")
            ));
        }
        splits.push((split, files));
    }
    let builder = match config {
        Some(_) => one_builder(&splits, &in_config)?,
        None => {
            let builder = one_inferred_builder(&splits)?;
            for (_, files) in &mut splits {
                files.retain(|f| has_builder(f, builder));
            }
            builder
        }
    };
    if !READ.contains(&builder) {
        return Err(format!(
            "{in_config}the data files here are read by `datasets`' {builder} builder, which is \
             not read here: convert them to JSONL, Parquet, Arrow or CSV"
        ));
    }
    if builder == "csv" {
        check_csv(&splits, options).map_err(|e| format!("{in_config}{e}"))?;
    }
    Ok(Splits { config, splits })
}

/// An error for CSV files `datasets` would read otherwise than this crate: `.csv` and `.tsv` files
/// in one split (`datasets` reads them all with the separator of the more common extension), or
/// a card config's reading options for its csv builder (`sep`, `names`, ...).
fn check_csv(
    splits: &[(String, Vec<String>)],
    options: &[String],
) -> std::result::Result<(), String> {
    if !options.is_empty() {
        return Err(format!(
            "the dataset card sets {} for datasets' csv builder, which is not applied here: \
             CSV files are read with pandas' defaults (`,`, or a tab for .tsv)",
            options.join(", ")
        ));
    }
    for (split, files) in splits {
        let sep = |f: &String| crate::source::csv::separator(Path::new(f));
        if let Some(tab) = files.iter().find(|f| sep(f) == Some(b'\t')) {
            if let Some(comma) = files.iter().find(|f| sep(f) == Some(b',')) {
                return Err(format!(
                    "split `{split}` has both .csv and .tsv files ({comma}, {tab}), which \
                     datasets reads with one separator: keep one kind"
                ));
            }
        }
    }
    Ok(())
}

/// An error for a pattern `datasets` refuses: `**` inside a component (`**.jsonl`).
fn check_pattern(pattern: &str) -> std::result::Result<(), String> {
    match pattern.split('/').find(|c| c.contains("**") && *c != "**") {
        Some(c) => Err(format!(
            "`{pattern}`: `**` must be a whole path component (`**/{}`), not part of `{c}`",
            c.replace("**", "*")
        )),
        None => Ok(()),
    }
}

/// `pattern` inside the folder `dir` (none: the root).
fn under(dir: &str, pattern: &str) -> String {
    match dir {
        "" => pattern.to_string(),
        _ => format!("{dir}/{pattern}"),
    }
}

/// The folder rules' splits of the files under `dir`, as patterns from the root. As in
/// `datasets`, every file that is not hidden or metadata takes part, data or not: a split whose
/// files are none of them data is then an error (no data files), not a split left out.
fn inferred_patterns(
    names: &[String],
    dir: &str,
) -> std::result::Result<Vec<(String, Vec<String>)>, String> {
    let prefix = under(dir, "");
    let mut visible: Vec<String> = names
        .iter()
        .filter_map(|n| n.strip_prefix(prefix.as_str()))
        .filter(|n| !unrequested_hidden(&[], n) && !unrequested_metadata(&[], n))
        .map(str::to_string)
        .collect();
    visible.sort();
    if !visible.iter().any(|n| is_data_file(n)) {
        return Err(format!(
            "no data files {} (data files end in .jsonl, .json, .parquet, .csv or .tsv, compressed \
             or not)",
            if dir.is_empty() {
                "here".to_string()
            } else {
                format!("in `{dir}`")
            }
        ));
    }
    let patterns = split_patterns(&visible)?;
    Ok(patterns
        .into_iter()
        .map(|(split, ps)| (split, ps.iter().map(|p| under(dir, p)).collect()))
        .collect())
}

/// The one builder of a card config's files (`datasets` reads them all with one).
fn one_builder(
    splits: &[(String, Vec<String>)],
    in_config: &str,
) -> std::result::Result<&'static str, String> {
    let mut builders: Vec<(&'static str, &str)> = Vec::new();
    for f in splits.iter().flat_map(|(_, files)| files) {
        let b = extensions(f).find_map(builder_of).unwrap_or("archive");
        if !builders.iter().any(|(k, _)| *k == b) {
            builders.push((b, f));
        }
    }
    match builders.as_slice() {
        [(b, _)] => Ok(b),
        [(a, fa), (b, fb), ..] => Err(format!(
            "{in_config}its files are of two kinds: {fa} ({a}) and {fb} ({b}); keep one kind"
        )),
        [] => Err(format!("{in_config}no data files")),
    }
}

/// The builder of every split, inferred per split as `datasets` infers it; splits of two are an
/// error naming them.
fn one_inferred_builder(
    splits: &[(String, Vec<String>)],
) -> std::result::Result<&'static str, String> {
    let mut first: Option<(&str, &'static str)> = None;
    for (split, files) in splits {
        let b = infer_builder(files).unwrap_or("archive");
        match first {
            None => first = Some((split, b)),
            Some((s, a)) if a != b => {
                return Err(format!(
                    "the split `{s}` is {a} files but `{split}` is {b} files: keep one kind"
                ))
            }
            Some(_) => {}
        }
    }
    first
        .map(|(_, b)| b)
        .ok_or_else(|| "no data files here".to_string())
}

/// The config `choice` names, else the card's default (the only one, the one named `default`,
/// or the one marked `default: true`; [`crate::card::configs`] has checked there is at most one).
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
            .find(|c| configs.len() == 1 || c.default || c.name == "default")
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
fn split_patterns(data: &[String]) -> std::result::Result<Vec<(String, Vec<String>)>, String> {
    let shard = components("data/*-[0-9][0-9][0-9][0-9][0-9]-of-[0-9][0-9][0-9][0-9][0-9]*.*");
    let mut sharded: Vec<String> = Vec::new();
    for n in data.iter().filter(|n| glob_matches(&shard, n)) {
        let base = n.rsplit('/').next().unwrap_or(n);
        if let Some(name) = shard_split(base).filter(|s| !sharded.iter().any(|k| k == s)) {
            sharded.push(name.to_string());
        }
    }
    if let Some(bad) = sharded.iter().find(|s| !is_split_name(s)) {
        return Err(format!(
            "a shard's file name gives the split `{bad}`: split names are letters, digits and `_`, \
             joined by dots"
        ));
    }
    if !sharded.is_empty() {
        let known: Vec<String> = SPLIT_KEYWORDS
            .iter()
            .map(|(s, _)| s.to_string())
            .filter(|s| sharded.contains(s))
            .collect();
        let mut others: Vec<String> = sharded.into_iter().filter(|s| !known.contains(s)).collect();
        others.sort();
        return Ok(known
            .into_iter()
            .chain(others)
            .map(|s| {
                let p =
                    format!("data/{s}-[0-9][0-9][0-9][0-9][0-9]-of-[0-9][0-9][0-9][0-9][0-9]*.*");
                (s, vec![p])
            })
            .collect());
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
            return Ok(found);
        }
    }
    Ok(vec![(DEFAULT_SPLIT.to_string(), vec!["**".to_string()])])
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

/// The extensions of a file name (`a.jsonl.gz`: `jsonl`, `gz`).
fn extensions(name: &str) -> impl Iterator<Item = &str> {
    name.rsplit('/').next().unwrap_or(name).split('.').skip(1)
}

/// The builder an extension (as written) names.
fn builder_of(ext: &str) -> Option<&'static str> {
    let lower = ext.to_lowercase();
    let (_, builder) = BUILDERS.iter().find(|(e, _)| *e == lower)?;
    (ext == lower || (ANY_CASE.contains(builder) && ext == ext.to_uppercase())).then_some(*builder)
}

/// Whether `datasets` would take the file for data (a known extension anywhere in its name, or
/// an archive).
fn is_data_file(name: &str) -> bool {
    extensions(name).any(|e| e == "zip" || builder_of(e).is_some())
}

/// Whether `name` is one of `datasets`' metadata files that `pattern` does not name.
fn unrequested_metadata(pattern: &[String], name: &str) -> bool {
    let base = name.rsplit('/').next().unwrap_or(name);
    NOT_DATA.contains(&base) && pattern.last().map(String::as_str) != Some(base)
}

/// The builder of a split's files as `datasets` infers it: the extension most of them carry
/// (counted in lower case, each extension of each name), ties going to Parquet, Lance, Vortex,
/// Arrow, JSON Lines, JSON, CSV, then the later name in alphabetical order.
fn infer_builder(files: &[String]) -> Option<&'static str> {
    let mut counts: Vec<(String, usize)> = Vec::new();
    for ext in files.iter().flat_map(|f| extensions(f)) {
        let ext = ext.to_lowercase();
        match counts.iter_mut().find(|(e, _)| *e == ext) {
            Some((_, n)) => *n += 1,
            None => counts.push((ext, 1)),
        }
    }
    let rank = |e: &str| match e {
        "parquet" => 7,
        "lance" => 6,
        "vortex" => 5,
        "arrow" => 4,
        "jsonl" => 3,
        "json" => 2,
        "csv" => 1,
        _ => 0,
    };
    counts.sort_by(|(a, n), (b, m)| (m, rank(b), b).cmp(&(n, rank(a), a)));
    counts.iter().find_map(|(e, _)| builder_of(e))
}

/// Whether a file belongs to `builder` (one of its extensions names it, or it is an archive).
fn has_builder(name: &str, builder: &str) -> bool {
    extensions(name).any(|e| e == "zip" || builder_of(e) == Some(builder))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
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
