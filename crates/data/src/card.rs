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
//! `data_files` may also be one pattern or a list of patterns (all of them the `train` split);
//! `data_dir` puts a folder in front of them (without `data_files`, the folder's files are split
//! by the folder rules). As `datasets` does, a card whose configs break its rules is an error:
//! `split` / `path` entries with other keys or split names that are not words, a split named
//! twice, several defaults.
//!
//! The front matter is found as `huggingface_hub` finds it (a first line `---` after optional
//! blank space, up to a line `---`). The card's YAML is read by a small reader of block mappings,
//! block sequences, flow sequences and plain or quoted scalars; the top-level `configs` entry must
//! be made of these or it is an error (never a guess), as is a `configs` key written in another
//! form or given twice. Other entries of the front matter are skipped unread.

use serde_json::{Map, Value};

/// One subset of a dataset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CardConfig {
    /// `config_name`.
    pub name: String,
    /// `default: true` (or another YAML true).
    pub default: bool,
    /// `data_dir`: the folder the patterns (or the folder rules) apply in.
    pub data_dir: Option<String>,
    /// Each split with its file patterns, in the card's order; `None` without `data_files` (the
    /// folder rules then split `data_dir`).
    pub splits: Option<Vec<(String, Vec<String>)>>,
    /// The config's other keys: options of its builder (`sep` for CSV, ...), in name order.
    pub options: Vec<String>,
}

/// The keys of a config entry that say which files it holds.
const CONFIG_KEYS: [&str; 4] = ["config_name", "default", "data_dir", "data_files"];

/// The `configs` of a dataset card (`README.md` text); empty when the card has none.
pub fn configs(readme: &str) -> Result<Vec<CardConfig>, String> {
    let Some(block) = configs_block(readme)? else {
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
    let configs = items.iter().map(config).collect::<Result<Vec<_>, _>>()?;
    let defaults: Vec<&str> = configs
        .iter()
        .filter(|c| configs.len() == 1 || c.default || c.name == "default")
        .map(|c| c.name.as_str())
        .collect();
    if defaults.len() > 1 {
        return Err(format!(
            "several default configs: {} (a config named `default` or marked `default: true` is \
             the default; keep one)",
            defaults.join(", ")
        ));
    }
    Ok(configs)
}

/// A split name `datasets` accepts: words, possibly joined by dots.
pub(crate) fn is_split_name(s: &str) -> bool {
    !s.is_empty()
        && s.split('.')
            .all(|w| !w.is_empty() && w.chars().all(|c| c.is_alphanumeric() || c == '_'))
}

fn config(item: &Value) -> Result<CardConfig, String> {
    let name = match &item["config_name"] {
        Value::String(s) => s.clone(),
        _ => return Err("a config without a `config_name`".into()),
    };
    // Python's truth of the YAML value, as `datasets` tests it.
    let default = match &item["default"] {
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|x| x != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(m) => !m.is_empty(),
        Value::Null => false,
    };
    let data_dir = match &item["data_dir"] {
        Value::Null => None,
        Value::String(s) => Some(s.trim_end_matches('/').to_string()),
        _ => return Err(format!("config {name}: `data_dir` is not a folder name")),
    };
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
        Value::Null => None,
        Value::Array(entries) if entries.iter().any(Value::is_object) => {
            let mut splits: Vec<(String, Vec<String>)> = Vec::new();
            for e in entries {
                let entry = e
                    .as_object()
                    .filter(|m| m.len() == 2 && m.contains_key("split") && m.contains_key("path"));
                let Some(entry) = entry else {
                    return Err(format!(
                        "config {name}: each `data_files` entry needs exactly `split` and `path`"
                    ));
                };
                let split = entry["split"].as_str().unwrap_or_default().to_string();
                if !is_split_name(&split) {
                    return Err(format!(
                        "config {name}: split name `{split}`: only letters, digits and `_`, \
                         joined by dots"
                    ));
                }
                if splits.iter().any(|(s, _)| *s == split) {
                    return Err(format!("config {name}: split `{split}` is listed twice"));
                }
                splits.push((split, patterns(&entry["path"])?));
            }
            Some(splits)
        }
        other => Some(vec![("train".to_string(), patterns(other)?)]),
    };
    let options = item
        .as_object()
        .map(|m| m.keys().filter(|k| !CONFIG_KEYS.contains(&k.as_str())))
        .into_iter()
        .flatten()
        .cloned()
        .collect();
    Ok(CardConfig {
        name,
        default,
        data_dir,
        splits,
        options,
    })
}

/// The lines of the front matter's top-level `configs` entry, after its key; `None` when there
/// is none; an error for a `configs` key this reader does not read, or two of them.
fn configs_block(readme: &str) -> Result<Option<Vec<String>>, String> {
    let text = readme.replace("\r\n", "\n");
    let body = text.trim_start();
    let Some(body) = body.strip_prefix("---\n") else {
        return Ok(None);
    };
    // The front matter ends at the next line `---` (a first line `---` right after the opening
    // one is YAML's document start, inside it).
    let lines: Vec<&str> = body.split('\n').collect();
    let Some(end) = lines
        .iter()
        .skip(1)
        .position(|l| l.trim_end() == "---")
        .map(|i| i + 1)
    else {
        return Ok(None);
    };
    let front = &lines[..end];
    if let Some(l) = front
        .iter()
        .find(|l| l.trim_start_matches(' ').starts_with('\t'))
    {
        return Err(format!(
            "`{}`: a tab in the indentation (YAML allows spaces only)",
            l.trim()
        ));
    }
    let top = front
        .iter()
        .filter_map(|l| Line::of(l))
        .map(|l| l.indent)
        .next()
        .unwrap_or(0);
    let is_top_key =
        |l: &&str| Line::of(l).is_some_and(|l| l.indent == top && !l.text.starts_with(['-', '#']));
    let mut found: Option<usize> = None;
    for (i, l) in front.iter().enumerate().filter(|(_, l)| is_top_key(l)) {
        let text = l.trim();
        let unquoted = text.trim_start_matches(['"', '\'']);
        if !unquoted.starts_with("configs") || text.starts_with('{') {
            if text.starts_with('{') && text.contains("configs") {
                return Err("front matter in flow (JSON) form: not read here".into());
            }
            continue;
        }
        let after = &unquoted["configs".len()..];
        let after = after.trim_start_matches(['"', '\'']);
        if !after.trim_start().starts_with(':') {
            continue; // another key that starts with `configs`
        }
        let value = scalar_text(after.trim_start()[1..].trim());
        if text.starts_with(['"', '\'']) || after.starts_with(' ') || !value.is_empty() {
            return Err(format!(
                "`{text}`: a `configs` entry in this form is not read here (write `configs:` \
                 followed by a block list)"
            ));
        }
        if found.replace(i).is_some() {
            return Err("`configs` is given twice".into());
        }
    }
    let Some(start) = found else {
        return Ok(None);
    };
    let rest = &front[start + 1..];
    let end = rest.iter().position(is_top_key).unwrap_or(rest.len());
    Ok(Some(rest[..end].iter().map(|l| l.to_string()).collect()))
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
            if scalar_text(rest).is_empty() {
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
        if scalar_text(value).is_empty() {
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

/// `text` without a trailing ` # comment` (a `#` inside quotes or a flow list is text).
fn scalar_text(text: &str) -> &str {
    let text = text.trim();
    if text.starts_with('#') {
        return "";
    }
    let mut quote: Option<char> = None;
    let mut prev = ' ';
    for (i, c) in text.char_indices() {
        match quote {
            Some('"') if c == '"' && prev != '\\' => quote = None,
            Some('\'') if c == '\'' => quote = None,
            Some(_) => {}
            None if c == '"' || c == '\'' => quote = Some(c),
            None if c == '#' && prev.is_whitespace() => return text[..i].trim_end(),
            None => {}
        }
        prev = c;
    }
    text
}

/// `inner` split at the commas outside quotes.
fn flow_items(inner: &str) -> Vec<&str> {
    let (mut items, mut start, mut quote) = (Vec::new(), 0, None::<char>);
    for (i, c) in inner.char_indices() {
        match (quote, c) {
            (Some(q), _) if c == q => quote = None,
            (None, '"' | '\'') => quote = Some(c),
            (None, ',') => {
                items.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&inner[start..]);
    items
}

/// A plain, quoted or flow-sequence scalar.
fn scalar(text: &str) -> Result<Value, String> {
    let text = scalar_text(text);
    if let Some(inner) = text.strip_prefix('[').and_then(|t| t.strip_suffix(']')) {
        return flow_items(inner)
            .into_iter()
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(scalar)
            .collect::<Result<Vec<_>, _>>()
            .map(Value::Array);
    }
    if text.starts_with('"') {
        return serde_json::from_str::<String>(text)
            .map(Value::String)
            .map_err(|e| format!("`{text}`: {e}"));
    }
    if let Some(inner) = text.strip_prefix('\'') {
        let inner = inner
            .strip_suffix('\'')
            .filter(|i| !i.replace("''", "").contains('\''))
            .ok_or_else(|| format!("`{text}`: not one quoted text"))?;
        return Ok(Value::String(inner.replace("''", "'")));
    }
    if text.starts_with(['{', '&', '*', '!', '|', '>', '[', '%', '@', '`'])
        || text.contains(": ")
        || text.ends_with(':')
    {
        return Err(format!("`{text}`: this YAML form is not read here"));
    }
    // Plain text is typed as YAML 1.1 types it (PyYAML's reading, which `datasets` uses).
    Ok(match text {
        "true" | "True" | "TRUE" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" => Value::Bool(true),
        "false" | "False" | "FALSE" | "no" | "No" | "NO" | "off" | "Off" | "OFF" => {
            Value::Bool(false)
        }
        "null" | "Null" | "NULL" | "~" | "" => Value::Null,
        _ => match text.parse::<i64>().ok().map(Value::from) {
            Some(n) => n,
            None => match text.parse::<f64>().ok().filter(|x| x.is_finite()) {
                Some(x) if text.contains('.') => Value::from(x),
                _ => Value::String(text.to_string()),
            },
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn splits(list: &[(&str, &[&str])]) -> Option<Vec<(String, Vec<String>)>> {
        Some(
            list.iter()
                .map(|(s, p)| (s.to_string(), p.iter().map(|p| p.to_string()).collect()))
                .collect(),
        )
    }

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
                data_dir: None,
                splits: splits(&[
                    ("train_sft", &["data/train_sft-*"]),
                    ("test_sft", &["data/test_sft-*"])
                ]),
                options: vec![],
            }]
        );
        let card = "\n  ---\r\nconfigs: # the subsets\r\n  - config_name: \"main\"\r\n    default: true\r\n    data_files:\r\n\
            \x20     - split: train\r\n        path:\r\n          - 'main/a.jsonl' # one\r\n          - main/b.jsonl  # two\r\n\
            \x20 - config_name: socratic\r\n    data_dir: soc/\r\n    data_files: [\"x, y.parquet\", '*.parquet']\r\n---\r\n";
        let got = configs(card).unwrap();
        assert_eq!((got[0].name.as_str(), got[0].default), ("main", true));
        assert_eq!(
            got[0].splits,
            splits(&[("train", &["main/a.jsonl", "main/b.jsonl"])])
        );
        assert_eq!(got[1].data_dir.as_deref(), Some("soc"));
        assert_eq!(
            got[1].splits,
            splits(&[("train", &["x, y.parquet", "*.parquet"])])
        );
        assert!(configs("# no front matter\n").unwrap().is_empty());
        assert!(configs("---\nlicense: mit\n---\n").unwrap().is_empty());
        assert!(configs("--- \nconfigs:\n- config_name: a\n---\n")
            .unwrap()
            .is_empty());
    }

    #[test]
    fn what_datasets_refuses_or_this_reader_cannot_read_is_an_error() {
        let err = |card: &str| configs(card).unwrap_err();
        let e = err("---\nconfigs:\n- config_name: a\n  data_files: &x data/*\n---\n");
        assert!(e.contains("not read here"), "{e}");
        for form in ["\"configs\":", "configs :", "configs: [{config_name: a}]"] {
            let e = err(&format!("---\n{form}\n- config_name: a\n---\n"));
            assert!(e.contains("not read here"), "{form}: {e}");
        }
        let e = err("---\nconfigs:\n- config_name: a\nconfigs:\n- config_name: b\n---\n");
        assert!(e.contains("given twice"), "{e}");
        let e =
            err("---\nconfigs:\n- config_name: a\n  default: true\n- config_name: default\n---\n");
        assert!(e.contains("several default configs: a, default"), "{e}");
        let e = err("---\nconfigs:\n- config_name: a\n  data_files:\n  - path: x.jsonl\n---\n");
        assert!(e.contains("exactly `split` and `path`"), "{e}");
        let e = err("---\nconfigs:\n- config_name: a\n  data_files:\n  - split: train-v2\n    path: x\n---\n");
        assert!(e.contains("split name `train-v2`"), "{e}");
        let e = err("---\nconfigs:\n- config_name: a\n  data_files:\n  - split: t\n    path: x\n  - split: t\n    path: y\n---\n");
        assert!(e.contains("listed twice"), "{e}");
        let e = err("---\nconfigs:\n- config_name: a\n\tdata_files: x\n---\n");
        assert!(e.contains("a tab in the indentation"), "{e}");
        let e = err("---\nconfigs:\n- config_name: a\n  data_files: a: b\n---\n");
        assert!(e.contains("not read here"), "{e}");
    }
}
