//! Globs as `datasets` resolves them (through fsspec): `*`, `?` and `[...]` within one path
//! component, a `**` component across any number of folders, hidden and special files left out
//! unless a pattern names them; and the listing of a folder the patterns are matched against.

use std::path::{Path, PathBuf};

use crate::error::{DataError, Result};

/// Whether a glob has a wildcard.
pub(crate) fn has_wildcard(spec: &str) -> bool {
    spec.contains(['*', '?', '['])
}

/// A glob's leading folders without wildcards, and the rest as components.
pub(crate) fn split_glob(spec: &str) -> (PathBuf, Vec<String>) {
    let parts = components(spec);
    let fixed = parts.iter().take_while(|p| !has_wildcard(p)).count();
    let fixed = fixed.min(parts.len().saturating_sub(1));
    let mut base: PathBuf = parts[..fixed].iter().collect();
    if spec.starts_with('/') {
        base = Path::new("/").join(base);
    }
    (base, parts[fixed..].to_vec())
}

pub(crate) fn components(pattern: &str) -> Vec<String> {
    pattern
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .map(str::to_string)
        .collect()
}

/// Whether the `/`-separated `path` of a file matches the glob `pattern` (as components): a `**`
/// component matches any number of path components (at the end, at least one: `dir/**` is what is
/// under `dir`), any other one exactly one.
pub(crate) fn glob_matches(pattern: &[String], path: &str) -> bool {
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

/// `fnmatch` on one name: `*` any run, `?` one character, `[...]` a class (`!` negates, `a-z`
/// ranges; `^` is a character like any other, as in Python's `fnmatch`).
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
    let negated = p.first() == Some(&b'!');
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

/// Whether `path` is hidden where `pattern` does not ask for it, by `datasets`' rules: it has
/// another number of hidden components (`.x`, the file name included) than the pattern names, or
/// another number of special folders (`__x`, folders only).
pub(crate) fn unrequested_hidden(pattern: &[String], path: &str) -> bool {
    let hidden = |parts: &mut dyn Iterator<Item = &str>| {
        parts
            .filter(|c| c.starts_with('.') && c.chars().any(|ch| ch != '.'))
            .count()
    };
    let special = |parts: &[&str]| {
        let folders = &parts[..parts.len().saturating_sub(1)];
        folders.iter().filter(|c| c.starts_with("__")).count()
    };
    let path_parts: Vec<&str> = path.split('/').collect();
    let pattern_parts: Vec<&str> = pattern.iter().map(String::as_str).collect();
    hidden(&mut path_parts.iter().copied()) != hidden(&mut pattern_parts.iter().copied())
        || special(&path_parts) != special(&pattern_parts)
}

/// Every file under `root`, as `/`-separated paths relative to it, sorted. Links to files count
/// as files; links to folders are not followed (as `datasets`' glob does not follow them).
pub(crate) fn walk(root: &Path) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = root.join(&rel);
        for entry in std::fs::read_dir(&dir).map_err(|e| DataError::io(&dir, e))? {
            let entry = entry.map_err(|e| DataError::io(&dir, e))?;
            let child = rel.join(entry.file_name());
            let kind = entry.file_type().map_err(|e| DataError::io(&dir, e))?;
            if kind.is_dir() {
                stack.push(child);
            } else if kind.is_file() || (kind.is_symlink() && root.join(&child).is_file()) {
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

    #[test]
    fn names_match_like_fnmatch() {
        assert!(name_matches(b"train[-._ 0-9]*", b"train-00.jsonl"));
        assert!(!name_matches(b"train[-._ 0-9]*", b"training.jsonl"));
        assert!(name_matches(b"*[-._ 0-9]test[-._ 0-9]*", b"my_test.json"));
        assert!(name_matches(b"[!a]?", b"bc"));
        assert!(!name_matches(b"[!a]?", b"ac"));
        assert!(name_matches(b"a[b", b"a[b"));
        assert!(
            name_matches(b"[^a]", b"^")
                && name_matches(b"[^a]", b"a")
                && !name_matches(b"[^a]", b"b")
        );
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
    fn hidden_and_special_parts_count_as_datasets_counts_them() {
        let none: Vec<String> = Vec::new();
        assert!(unrequested_hidden(&none, ".cache/x.jsonl"));
        assert!(unrequested_hidden(&none, "a/.x.jsonl"));
        assert!(unrequested_hidden(&none, "__pycache__/x.jsonl"));
        assert!(!unrequested_hidden(&none, "__init__.jsonl"));
        assert!(!unrequested_hidden(&none, "sub/__x.jsonl"));
        assert!(!unrequested_hidden(
            &components(".cache/*.jsonl"),
            ".cache/x.jsonl"
        ));
    }
}
