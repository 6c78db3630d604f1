//! Parsing and validating one JSONL line: chat rows and pre-tokenized rows.
//!
//! Chat rows are `{"messages": [{"role": ..., "content": ...}, ...]}` (other keys are ignored);
//! pre-tokenized rows are `{"input_ids": [...]}` with optional `"labels"` of the same length
//! (-100 = ignored; without labels every token is trained). The format is detected per file from
//! its first non-blank line. Errors are row-level reasons; the caller adds file and line.

use serde_json::Value;

use crate::template::Message;

/// Roles a chat row may use.
pub const ROLES: [&str; 4] = ["system", "developer", "user", "assistant"];

/// The two JSONL formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    /// `{"messages": [...]}`; needs a tokenizer and chat template.
    Chat,
    /// `{"input_ids": [...], "labels"?: [...]}`; needs no tokenizer.
    Tokens,
}

/// Detects the format from the first non-blank line.
pub fn detect(line: &str) -> Result<Format, String> {
    let v: Value = serde_json::from_str(line).map_err(|e| format!("invalid JSON: {e}"))?;
    let obj = v
        .as_object()
        .ok_or_else(|| format!("expected a JSON object, got {}", kind(&v)))?;
    if obj.contains_key("messages") {
        Ok(Format::Chat)
    } else if obj.contains_key("input_ids") {
        Ok(Format::Tokens)
    } else {
        let keys: Vec<&str> = obj.keys().map(String::as_str).collect();
        Err(format!("no `messages` or `input_ids` key (keys: {keys:?})"))
    }
}

/// Parses a chat row into messages.
pub fn parse_chat(line: &str) -> Result<Vec<Message>, String> {
    let v: Value = serde_json::from_str(line).map_err(|e| format!("invalid JSON: {e}"))?;
    let obj = v
        .as_object()
        .ok_or_else(|| format!("expected a JSON object, got {}", kind(&v)))?;
    let msgs = obj.get("messages").ok_or("missing `messages`")?;
    let msgs = msgs
        .as_array()
        .ok_or_else(|| format!("`messages` must be an array, got {}", kind(msgs)))?;
    if msgs.is_empty() {
        return Err("empty conversation (`messages` is [])".into());
    }
    msgs.iter()
        .enumerate()
        .map(|(i, m)| {
            let m = m
                .as_object()
                .ok_or_else(|| format!("messages[{i}] must be an object, got {}", kind(m)))?;
            let role = match m.get("role") {
                Some(Value::String(r)) if ROLES.contains(&r.as_str()) => r.clone(),
                Some(Value::String(r)) => {
                    return Err(format!(
                        "unknown role {r:?} in messages[{i}] (expected system, developer, user or assistant)"
                    ))
                }
                Some(other) => return Err(format!("messages[{i}].role must be a string, got {}", kind(other))),
                None => return Err(format!("messages[{i}] has no `role`")),
            };
            let content = match m.get("content") {
                Some(Value::String(c)) => c.clone(),
                Some(other) => {
                    return Err(format!("messages[{i}].content must be a string, got {}", kind(other)))
                }
                None => return Err(format!("messages[{i}] has no `content`")),
            };
            Ok(Message { role, content })
        })
        .collect()
}

/// A pre-tokenized row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRow {
    /// Token ids.
    pub input_ids: Vec<u32>,
    /// Labels of the same length, or `None` to train every token.
    pub labels: Option<Vec<i32>>,
}

/// Parses a pre-tokenized row; ids must be `< vocab_size` when it is known.
pub fn parse_tokens(line: &str, vocab_size: Option<usize>) -> Result<TokenRow, String> {
    let v: Value = serde_json::from_str(line).map_err(|e| format!("invalid JSON: {e}"))?;
    let obj = v
        .as_object()
        .ok_or_else(|| format!("expected a JSON object, got {}", kind(&v)))?;
    let ids = obj.get("input_ids").ok_or("missing `input_ids`")?;
    let ids = int_array(ids, "input_ids")?;
    if ids.is_empty() {
        return Err("empty `input_ids`".into());
    }
    let limit = vocab_size.map_or(i64::from(u32::MAX), |v| v as i64 - 1);
    let input_ids = ids
        .iter()
        .enumerate()
        .map(|(i, &id)| {
            if (0..=limit).contains(&id) {
                Ok(id as u32)
            } else {
                Err(format!("input_ids[{i}] = {id} is out of range 0..={limit}"))
            }
        })
        .collect::<Result<Vec<u32>, String>>()?;
    let labels = match obj.get("labels") {
        None | Some(Value::Null) => None,
        Some(l) => {
            let l = int_array(l, "labels")?;
            if l.len() != input_ids.len() {
                return Err(format!(
                    "`labels` has {} entries, `input_ids` has {}",
                    l.len(),
                    input_ids.len()
                ));
            }
            let labels = l
                .iter()
                .enumerate()
                .map(|(i, &x)| {
                    if x == -100 || (0..=limit).contains(&x) {
                        Ok(x as i32)
                    } else {
                        Err(format!(
                            "labels[{i}] = {x}: expected -100 or a token id 0..={limit}"
                        ))
                    }
                })
                .collect::<Result<Vec<i32>, String>>()?;
            Some(labels)
        }
    };
    Ok(TokenRow { input_ids, labels })
}

fn int_array(v: &Value, name: &str) -> Result<Vec<i64>, String> {
    let arr = v
        .as_array()
        .ok_or_else(|| format!("`{name}` must be an array of integers, got {}", kind(v)))?;
    arr.iter()
        .enumerate()
        .map(|(i, x)| {
            x.as_i64()
                .ok_or_else(|| format!("{name}[{i}] must be an integer, got {}", kind(x)))
        })
        .collect()
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_errors_name_the_problem() {
        let cases = [
            ("{\"messages\": [", "invalid JSON"),
            ("[1]", "expected a JSON object, got an array"),
            ("{\"msgs\": []}", "missing `messages`"),
            ("{\"messages\": {}}", "must be an array"),
            ("{\"messages\": []}", "empty conversation"),
            (
                "{\"messages\": [{\"role\": \"bot\", \"content\": \"x\"}]}",
                "unknown role \"bot\" in messages[0]",
            ),
            (
                "{\"messages\": [{\"role\": \"user\", \"content\": 3}]}",
                "messages[0].content must be a string, got a number",
            ),
            ("{\"messages\": [{\"role\": \"user\"}]}", "has no `content`"),
            ("{\"messages\": [{\"content\": \"x\"}]}", "has no `role`"),
        ];
        for (line, want) in cases {
            let err = parse_chat(line).unwrap_err();
            assert!(err.contains(want), "{line}: {err}");
        }
        let ok =
            parse_chat("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\", \"x\": 1}]}")
                .unwrap();
        assert_eq!(ok[0].content, "hi");
    }

    #[test]
    fn token_rows() {
        let r = parse_tokens(
            "{\"input_ids\": [2, 5, 7], \"labels\": [-100, 5, 7]}",
            Some(8),
        )
        .unwrap();
        assert_eq!(r.input_ids, vec![2, 5, 7]);
        assert_eq!(r.labels, Some(vec![-100, 5, 7]));
        for (line, want) in [
            ("{\"input_ids\": []}", "empty"),
            (
                "{\"input_ids\": [1, 9]}",
                "input_ids[1] = 9 is out of range",
            ),
            (
                "{\"input_ids\": [1, \"a\"]}",
                "input_ids[1] must be an integer",
            ),
            (
                "{\"input_ids\": [1, 2], \"labels\": [1]}",
                "`labels` has 1 entries",
            ),
            (
                "{\"input_ids\": [1, 2], \"labels\": [1, -5]}",
                "labels[1] = -5",
            ),
            ("{\"ids\": [1]}", "missing `input_ids`"),
        ] {
            let err = parse_tokens(line, Some(8)).unwrap_err();
            assert!(err.contains(want), "{line}: {err}");
        }
    }

    #[test]
    fn detection() {
        assert_eq!(detect("{\"messages\": []}"), Ok(Format::Chat));
        assert_eq!(detect("{\"input_ids\": [1]}"), Ok(Format::Tokens));
        assert!(detect("{\"text\": \"x\"}")
            .unwrap_err()
            .contains("keys: [\"text\"]"));
    }
}
