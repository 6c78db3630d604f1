//! Folders written by `Dataset.save_to_disk` and `DatasetDict.save_to_disk`, resolved as
//! `datasets.load_from_disk` resolves them: a dataset's folder holds `state.json` (its Arrow
//! files, in order, under `_data_files`; the split it was saved from under `_split`) beside
//! `dataset_info.json`; a dataset dict's folder holds `dataset_dict.json` (`{"splits": [...]}`)
//! and one dataset folder per split. A saved dataset's format (`set_format`: output type and
//! columns) is how Python hands rows out, not data: every column is read.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::{DataError, Result};
use crate::files::{DataFiles, SplitChoice};

/// `dir` resolved as a saved dataset or dataset dict, with the split `choice` takes; `None` when
/// `dir` is neither.
pub(crate) fn resolve_saved(
    dir: &Path,
    spec: &str,
    choice: SplitChoice,
) -> Result<Option<DataFiles>> {
    let err = |msg: String| DataError::DataFiles {
        spec: spec.to_string(),
        msg,
    };
    let dict = dir.join("dataset_dict.json");
    let is_dict = dict.is_file();
    if !is_dict && !dir.join("state.json").is_file() {
        return Ok(None);
    }
    if let Some(c) = choice.config {
        return Err(err(format!(
            "a config (`{c}`) was asked for ({}), but a folder written by `save_to_disk` has no \
             configs",
            choice.config_flag
        )));
    }
    if !is_dict {
        let (split, files) = dataset_files(dir)?;
        if let Some(asked) = choice.asked {
            if split.as_deref() != Some(asked) {
                let saved = split
                    .as_ref()
                    .map(|s| format!(" (saved from split `{s}`)"))
                    .unwrap_or_default();
                return Err(err(format!(
                    "this folder holds one dataset written by `save_to_disk`{saved}, with no split \
                     `{asked}` ({}); pass the dataset dict's folder to choose a split",
                    choice.flag
                )));
            }
        }
        return Ok(Some(DataFiles {
            spec: spec.to_string(),
            config: None,
            split,
            files,
        }));
    }
    let splits = dict_splits(&dict)?;
    let wanted = choice.wanted();
    let Some(split) = wanted.iter().find(|w| splits.iter().any(|s| s == *w)) else {
        return Err(err(format!(
            "no split {} in this dataset dict (written by `save_to_disk`): it has {} (pick one \
             with {})",
            wanted
                .iter()
                .map(|w| format!("`{w}`"))
                .collect::<Vec<_>>()
                .join(" or "),
            splits.join(", "),
            choice.flag
        )));
    };
    let split_dir = dir.join(split);
    if !split_dir.join("state.json").is_file() {
        return Err(DataError::BadFile {
            path: dict,
            line: 0,
            reason: format!(
                "lists the split `{split}`, but {} holds no dataset written by `save_to_disk` \
                 (no state.json)",
                split_dir.display()
            ),
        });
    }
    let (_, files) = dataset_files(&split_dir)?;
    Ok(Some(DataFiles {
        spec: spec.to_string(),
        config: None,
        split: Some(split.to_string()),
        files,
    }))
}

/// The splits `dataset_dict.json` lists, in order.
fn dict_splits(path: &Path) -> Result<Vec<String>> {
    let json = read_json(path)?;
    let splits = json.get("splits").and_then(Value::as_array);
    let names: Option<Vec<String>> = splits.and_then(|list| {
        list.iter()
            .map(|s| s.as_str().map(str::to_string))
            .collect()
    });
    match names {
        Some(n) if !n.is_empty() => Ok(n),
        _ => Err(bad(
            path,
            "`splits` must be a non-empty list of split names",
        )),
    }
}

/// A saved dataset's split (`_split`, when saved from one) and Arrow files, in order.
fn dataset_files(dir: &Path) -> Result<(Option<String>, Vec<PathBuf>)> {
    let state_path = dir.join("state.json");
    let info = dir.join("dataset_info.json");
    if !info.is_file() {
        return Err(bad(
            &state_path,
            "there is no dataset_info.json beside it, which `save_to_disk` writes (`load_from_disk` \
             refuses the folder)",
        ));
    }
    let state = read_json(&state_path)?;
    let entries = state
        .get("_data_files")
        .and_then(Value::as_array)
        .filter(|list| !list.is_empty())
        .ok_or_else(|| bad(&state_path, "`_data_files` must be a non-empty list"))?;
    let mut files = Vec::with_capacity(entries.len());
    for (i, entry) in entries.iter().enumerate() {
        let name = entry
            .get("filename")
            .and_then(Value::as_str)
            .ok_or_else(|| {
                bad(
                    &state_path,
                    &format!("`_data_files[{i}].filename` must be a string"),
                )
            })?;
        let file = dir.join(name);
        if !file.is_file() {
            return Err(bad(
                &state_path,
                &format!(
                    "`_data_files[{i}]` names {name}, which is not in {}",
                    dir.display()
                ),
            ));
        }
        files.push(file);
    }
    let split = match state.get("_split") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(bad(&state_path, "`_split` must be a string or null")),
    };
    Ok((split, files))
}

fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|e| DataError::io(path, e))?;
    serde_json::from_str(&text).map_err(|e| DataError::BadFile {
        path: path.to_path_buf(),
        line: e.line() as u64,
        reason: format!("not valid JSON: {e}"),
    })
}

fn bad(path: &Path, reason: &str) -> DataError {
    DataError::BadFile {
        path: path.to_path_buf(),
        line: 0,
        reason: reason.to_string(),
    }
}
