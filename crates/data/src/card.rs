//! A Hub dataset's `configs` (its subsets and their splits' files), from the YAML front matter of
//! its `README.md` (the dataset card), as `datasets.push_to_hub` writes it and people edit it:
//!
//! ```yaml
//! configs:
//! - config_name: default
//!   default: true
//!   data_files:
//!   - split: train
//!     path: data/train-*
//!   - split: test
//!     path: [data/test-0.jsonl, data/test-1.jsonl]
//! ```
//!
//! `data_files` may also be one pattern or a list of patterns (all of them the `train` split).
//! The card's YAML is read by a small reader of block mappings, block sequences, flow sequences
//! and plain or quoted scalars; the `configs` entry must be made of these or it is an error
//! (never a guess). Other entries of the front matter are skipped unread.

use serde_json::{Map, Value};

/// One subset of a dataset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CardConfig {
    /// `config_name`.
    pub name: String,
    /// `default: true`.
    pub default: bool,
    /// Each split with its file patterns, in the card's order.
    pub splits: Vec<(String, Vec<String>)>,
}

/// The `configs` of a dataset card (`README.md` text); empty when the card has none.
pub fn configs(readme: &str) -> Result<Vec<CardConfig>, String> {
    let Some(block) = configs_block(readme) else {
        return Ok(Vec::new());
    };
    let lines: Vec<Line> = block.iter().filter_map(|l| Line::of(l)).collect::<Vec<_>>();
    let (value, used) = parse_block(&lines, 0, lines.first().map_or(0, |l| l.indent))?;
    if used != lines.len() {
        return Err(format!("cannot read the line `{}`", lines[used].text));
    }
    let Value::Array(items) = value else {
        return Err("`configs` is not a list".into());
    };
    items.iter().map(config).collect()
}

fn config(item: &Value) -> Result<CardConfig, String> {
    let name = item["config_name"]
        .as_str()
        .ok_or("a config without a `config_name`")?
        .to_string();
    let default =
        matches!(&item["default"], Value::Bool(true)) || item["default"].as_str() == Some("true");
    let patterns = |v: &Value| -> Result<Vec<String>, String> {
        match v {
            Value::String(s) => Ok(vec![s.clone()]),
            Value::Array(a) => a
                .iter()
                .map(|p| p.as_str().map(str::to_string))
                .collect::<Option<_>>()
                .ok_or_else(|| format!("config {name}: a file pattern is not text")),
            _ => Err(format!("config {name}: `data_files` has no file pattern")),
        }
    };
    let splits = match &item["data_files"] {
        Value::Array(entries) if entries.iter().all(Value::is_object) => entries
            .iter()
            .map(|e| {
                let split = e["split"].as_str().unwrap_or("train").to_string();
                Ok((split, patterns(&e["path"])?))
            })
            .collect::<Result<_, String>>()?,
        Value::Null => Vec::new(),
        other => vec![("train".to_string(), patterns(other)?)],
    };
    Ok(CardConfig {
        name,
        default,
        splits,
    })
}

/// The lines of the front matter's top-level `configs` entry, after its key.
fn configs_block(readme: &str) -> Option<Vec<&str>> {
    let mut lines = readme.lines();
    if lines.next()?.trim_end() != "---" {
        return None;
    }
    let front: Vec<&str> = lines.take_while(|l| l.trim_end() != "---").collect();
    let start = front.iter().position(|l| l.trim_end() == "configs:")?;
    let rest = &front[start + 1..];
    let end = rest
        .iter()
        .position(|l| !l.is_empty() && !l.starts_with([' ', '-', '#']) && !l.trim().is_empty())
        .unwrap_or(rest.len());
    Some(rest[..end].to_vec())
}

/// A non-blank, non-comment line: its indent and its text.
struct Line<'a> {
    indent: usize,
    text: &'a str,
}

impl<'a> Line<'a> {
    fn of(line: &'a str) -> Option<Self> {
        let text = line.trim_start_matches(' ');
        let text = text.trim_end();
        (!text.is_empty() && !text.starts_with('#')).then(|| Line {
            indent: line.len() - line.trim_start_matches(' ').len(),
            text,
        })
    }
}

/// Parses the block (a sequence or a mapping) that starts at `lines[at]` with `indent`; returns
/// it and the index of the first line after it.
fn parse_block(lines: &[Line], at: usize, indent: usize) -> Result<(Value, usize), String> {
    let Some(first) = lines.get(at) else {
        return Ok((Value::Null, at));
    };
    if first.text.starts_with("- ") || first.text == "-" {
        let mut items = Vec::new();
        let mut i = at;
        while let Some(l) = lines.get(i).filter(|l| l.indent == indent) {
            let Some(rest) = l.text.strip_prefix('-') else {
                break;
            };
            let rest = rest.trim_start();
            // `- key: value` opens a mapping whose other keys sit under `key`.
            let inner = indent + (l.text.len() - rest.len());
            if rest.is_empty() {
                let (v, next) =
                    parse_block(lines, i + 1, lines.get(i + 1).map_or(0, |n| n.indent))?;
                items.push(v);
                i = next;
            } else if key_value(rest).is_some() {
                let mut sub: Vec<Line> = vec![Line {
                    indent: inner,
                    text: rest,
                }];
                let mut j = i + 1;
                while let Some(n) = lines.get(j).filter(|n| n.indent > indent) {
                    sub.push(Line {
                        indent: n.indent,
                        text: n.text,
                    });
                    j += 1;
                }
                let (v, used) = parse_block(&sub, 0, inner)?;
                if used != sub.len() {
                    return Err(format!("cannot read the line `{}`", sub[used].text));
                }
                items.push(v);
                i = j;
            } else {
                items.push(scalar(rest)?);
                i += 1;
            }
        }
        return Ok((Value::Array(items), i));
    }
    let mut map = Map::new();
    let mut i = at;
    while let Some(l) = lines.get(i).filter(|l| l.indent == indent) {
        let (key, value) =
            key_value(l.text).ok_or_else(|| format!("cannot read the line `{}`", l.text))?;
        if value.is_empty() {
            match lines.get(i + 1) {
                Some(n) if n.indent > indent || (n.indent == indent && n.text.starts_with('-')) => {
                    let (v, next) = parse_block(lines, i + 1, n.indent)?;
                    map.insert(key.to_string(), v);
                    i = next;
                }
                _ => {
                    map.insert(key.to_string(), Value::Null);
                    i += 1;
                }
            }
        } else {
            map.insert(key.to_string(), scalar(value)?);
            i += 1;
        }
    }
    Ok((Value::Object(map), i))
}

/// `key: value` (value possibly empty), the key plain or quoted.
fn key_value(text: &str) -> Option<(&str, &str)> {
    let (key, value) = if let Some(rest) = text.strip_prefix(['"', '\'']) {
        let q = text.as_bytes()[0] as char;
        let end = rest.find(q)?;
        let after = rest[end + 1..].strip_prefix(':')?;
        (&rest[..end], after)
    } else {
        let (k, v) = text.split_once(':')?;
        if !(v.is_empty() || v.starts_with(' ')) || k.contains([' ', '[', '{']) {
            return None;
        }
        (k, v)
    };
    Some((key, value.trim()))
}

/// A plain, quoted or flow-sequence scalar.
fn scalar(text: &str) -> Result<Value, String> {
    let text = match text.find(" #") {
        Some(i) if !text.starts_with(['"', '\'']) => text[..i].trim_end(),
        _ => text,
    };
    if let Some(inner) = text.strip_prefix('[').and_then(|t| t.strip_suffix(']')) {
        return inner
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(scalar)
            .collect::<Result<Vec<_>, _>>()
            .map(Value::Array);
    }
    if let Some(inner) = text.strip_prefix('"').and_then(|t| t.strip_suffix('"')) {
        return serde_json::from_str::<String>(&format!("\"{inner}\""))
            .map(Value::String)
            .map_err(|e| format!("`{text}`: {e}"));
    }
    if let Some(inner) = text.strip_prefix('\'').and_then(|t| t.strip_suffix('\'')) {
        return Ok(Value::String(inner.replace("''", "'")));
    }
    if text.starts_with(['{', '&', '*', '!', '|', '>']) {
        return Err(format!("`{text}`: this YAML form is not read here"));
    }
    Ok(match text {
        "true" | "True" => Value::Bool(true),
        "false" | "False" => Value::Bool(false),
        _ => Value::String(text.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_to_hub_cards_and_hand_written_ones_read_alike() {
        let card = "---\ndataset_info:\n  features:\n  - name: text\n    dtype: string\nconfigs:\n\
            - config_name: default\n  data_files:\n  - split: train_sft\n    path: data/train_sft-*\n\
            \x20 - split: test_sft\n    path: data/test_sft-*\nlicense: mit\n---\n# Title\n";
        let got = configs(card).unwrap();
        assert_eq!(
            got,
            [CardConfig {
                name: "default".into(),
                default: false,
                splits: vec![
                    ("train_sft".into(), vec!["data/train_sft-*".into()]),
                    ("test_sft".into(), vec!["data/test_sft-*".into()]),
                ],
            }]
        );
        let card = "---\nconfigs:\n  - config_name: \"main\"\n    default: true\n    data_files:\n\
            \x20     - split: train\n        path:\n          - 'main/a.jsonl'\n          - main/b.jsonl  # two\n\
            \x20 - config_name: socratic\n    data_files: [socratic/x.parquet, socratic/y.parquet]\n---\n";
        let got = configs(card).unwrap();
        assert_eq!(got[0].name, "main");
        assert!(got[0].default);
        assert_eq!(
            got[0].splits,
            [(
                "train".into(),
                vec!["main/a.jsonl".into(), "main/b.jsonl".into()]
            )]
        );
        assert_eq!(
            got[1].splits,
            [(
                "train".into(),
                vec!["socratic/x.parquet".into(), "socratic/y.parquet".into()]
            )]
        );
        assert!(configs("# no front matter\n").unwrap().is_empty());
        assert!(configs("---\nlicense: mit\n---\n").unwrap().is_empty());
        let err = configs("---\nconfigs:\n- config_name: a\n  data_files: &x data/*\n---\n");
        assert!(err.unwrap_err().contains("not read here"));
    }
}
