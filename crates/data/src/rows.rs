//! The dataset formats: one row (a JSONL line or a Parquet, Arrow or CSV row, as a JSON-like value)
//! parsed and checked into what the encoder needs. Errors name the field
//! (`messages[2].tool_calls[0]`); the caller adds the file and line.
//!
//! | format | row | trained by default |
//! |---|---|---|
//! | `chat` | `{"messages": [...], "tools"?: [...], "enable_thinking"?: bool}` | every token |
//! | `sharegpt` | `{"conversations": [{"from": "human"\|"gpt"\|"system", "value": ...}], "system"?: str, "tools"?: [...]}` | every token |
//! | `prompt_completion` | `{"prompt": str \| messages, "completion": str \| messages}` | the completion |
//! | `text` | `{"text": str}` | every token |
//! | `tokens` | `{"input_ids": [...], "labels"?: [...]}` | the row's labels (else every token) |
//!
//! Chat messages are passed to the template as their full JSON objects, as transformers passes
//! them: roles `system`, `developer`, `user`, `assistant`, `tool`; `content` a string or a list of
//! `{"type": "text", "text": ...}` parts (or null on an assistant message that calls tools);
//! `tool_calls` (`[{"function": {"name", "arguments"}}]`), `tool_call_id`, `name`,
//! `tool_responses`, `reasoning` / `reasoning_content` / `thinking` (aliased to one another as
//! transformers 5.23 does) and any other field. As `apply_chat_template` does, a message's
//! null-valued keys are dropped (`"name": null` is no `name`; nested values are kept as they are).
//! The format is detected from the first row's keys unless given (`--data-format`).

use minijinja::value::{Value, ValueKind};

use crate::error::{RowError, SkipReason};
use crate::template::Conversation;

/// Roles a chat message may have.
pub const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

/// The dataset formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    /// `{"messages": [...]}` (OpenAI / transformers chat format).
    Chat,
    /// `{"conversations": [{"from", "value"}]}`.
    #[serde(rename = "sharegpt")]
    ShareGpt,
    /// `{"prompt", "completion"}`, strings or message lists.
    PromptCompletion,
    /// `{"text"}`: plain text, one BOS, EOS appended.
    Text,
    /// `{"input_ids", "labels"?}`: pre-tokenized, needs no tokenizer.
    Tokens,
}

impl Format {
    /// Every format, in detection order.
    pub const ALL: [Format; 5] = [
        Format::Chat,
        Format::ShareGpt,
        Format::PromptCompletion,
        Format::Text,
        Format::Tokens,
    ];

    /// The name used by `--data-format` and in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Chat => "chat",
            Format::ShareGpt => "sharegpt",
            Format::PromptCompletion => "prompt_completion",
            Format::Text => "text",
            Format::Tokens => "tokens",
        }
    }

    /// The key whose presence selects this format.
    fn key(self) -> &'static str {
        match self {
            Format::Chat => "messages",
            Format::ShareGpt => "conversations",
            Format::PromptCompletion => "prompt",
            Format::Text => "text",
            Format::Tokens => "input_ids",
        }
    }
}

impl std::str::FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Format::ALL
            .into_iter()
            .find(|f| f.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Format::ALL.iter().map(|f| f.as_str()).collect();
                format!("unknown data format {s:?} (expected {})", names.join(", "))
            })
    }
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A parsed row.
#[derive(Debug, Clone)]
pub enum Row {
    /// A conversation (chat, ShareGPT, or message-list prompt/completion).
    Chat(ChatRow),
    /// Plain text, or a string prompt and its completion.
    Text(TextRow),
    /// Token ids and optional labels.
    Tokens(TokenRow),
}

/// A conversation and what its labels need.
#[derive(Debug, Clone)]
pub struct ChatRow {
    /// The whole conversation.
    pub conversation: Conversation,
    /// For prompt/completion rows: the prompt alone (its rendering is never trained).
    pub prompt: Option<Conversation>,
    /// Model turns the rendering must have: runs of assistant messages, not counting the tool
    /// messages between them (consecutive assistant messages share one turn).
    pub model_turns: usize,
}

/// Plain text, or a prompt and its completion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextRow {
    /// The prompt of a prompt/completion row (never trained by default).
    pub prompt: Option<String>,
    /// The text, or the completion.
    pub text: String,
}

/// A pre-tokenized row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRow {
    /// Token ids.
    pub input_ids: Vec<u32>,
    /// Labels of the same length, or `None` when the row has none.
    pub labels: Option<Vec<i32>>,
}

/// Parses one JSONL line into an object (keys in file order).
pub fn parse_json(text: &str) -> Result<Value, RowError> {
    let v: Value = serde_json::from_str(text)
        .map_err(|e| RowError::new(SkipReason::InvalidJson, format!("invalid JSON: {e}")))?;
    if v.kind() != ValueKind::Map {
        return Err(RowError::new(
            SkipReason::InvalidJson,
            format!("expected a JSON object, got {}", kind(&v)),
        ));
    }
    Ok(v)
}

/// Detects the format from a row's keys.
pub fn detect(row: &Value) -> Result<Format, String> {
    if let Some(f) = Format::ALL
        .into_iter()
        .find(|f| non_null(row, f.key()).is_some())
    {
        return Ok(f);
    }
    if non_null(row, "completion").is_some() {
        return Ok(Format::PromptCompletion);
    }
    let keys: Vec<String> = row
        .try_iter()
        .map(|it| it.map(|k| k.to_string()).collect())
        .unwrap_or_default();
    Err(format!("no `messages`, `conversations`, `prompt`/`completion`, `text` or `input_ids` key (keys: {keys:?})"))
}

/// Parses a row of `format`; token ids must be `< vocab_size` when it is known.
pub fn parse(row: &Value, format: Format, vocab_size: Option<usize>) -> Result<Row, RowError> {
    match format {
        Format::Chat => {
            let messages = messages(&required(row, "messages")?, "messages")?;
            chat_row(row, messages, None)
        }
        Format::ShareGpt => {
            let mut messages = Vec::new();
            if let Some(system) = non_null(row, "system") {
                messages.push(Value::from_iter([
                    ("role", Value::from("system")),
                    ("content", Value::from(string(&system, "system")?)),
                ]));
            }
            messages.extend(sharegpt(&required(row, "conversations")?)?);
            chat_row(row, messages, None)
        }
        Format::PromptCompletion => prompt_completion(row),
        Format::Text => {
            let text = string(&required(row, "text")?, "text")?;
            if text.is_empty() {
                return Err(RowError::field("text: empty"));
            }
            Ok(Row::Text(TextRow { prompt: None, text }))
        }
        Format::Tokens => tokens(row, vocab_size).map(Row::Tokens),
    }
}

fn chat_row(row: &Value, messages: Vec<Value>, prompt_len: Option<usize>) -> Result<Row, RowError> {
    let tools = match non_null(row, "tools") {
        Some(t) => Some(tools(&t)?),
        None => None,
    };
    let enable_thinking = match non_null(row, "enable_thinking") {
        Some(v) if v.kind() == ValueKind::Bool => Some(v.is_true()),
        Some(v) => {
            return Err(RowError::field(format!(
                "enable_thinking: expected a boolean, got {}",
                kind(&v)
            )))
        }
        None => None,
    };
    let model_turns = model_turns(&messages);
    let conv = |msgs: &[Value]| Conversation {
        messages: Value::from(msgs.to_vec()),
        tools: tools.clone(),
        enable_thinking,
    };
    Ok(Row::Chat(ChatRow {
        prompt: prompt_len.map(|n| conv(&messages[..n])),
        conversation: conv(&messages),
        model_turns,
    }))
}

fn prompt_completion(row: &Value) -> Result<Row, RowError> {
    let prompt = required(row, "prompt")?;
    let completion = required(row, "completion")?;
    match (prompt.kind(), completion.kind()) {
        (ValueKind::String, ValueKind::String) => Ok(Row::Text(TextRow {
            prompt: Some(string(&prompt, "prompt")?),
            text: string(&completion, "completion")?,
        })),
        (ValueKind::Seq, ValueKind::Seq) => {
            let mut msgs = messages(&prompt, "prompt")?;
            let n = msgs.len();
            let completion = messages(&completion, "completion")?;
            if !completion.iter().any(|m| role(m) == "assistant") {
                return Err(RowError::field(
                    "completion: no assistant message (nothing to train)",
                ));
            }
            msgs.extend(completion);
            chat_row(row, msgs, Some(n))
        }
        (p, c) => Err(RowError::field(format!(
            "`prompt` and `completion` must both be strings or both be message lists, got {} and {}",
            kind_name(p),
            kind_name(c)
        ))),
    }
}

/// Checks a message list and returns its messages, reasoning fields aliased.
fn messages(v: &Value, field: &str) -> Result<Vec<Value>, RowError> {
    if v.kind() != ValueKind::Seq {
        return Err(RowError::field(format!(
            "{field}: expected an array of messages, got {}",
            kind(v)
        )));
    }
    let msgs: Vec<Value> = v
        .try_iter()
        .map_err(|e| RowError::field(e.to_string()))?
        .collect();
    if msgs.is_empty() {
        return Err(RowError::field(format!(
            "{field}: empty conversation (`[]`)"
        )));
    }
    msgs.iter()
        .enumerate()
        .map(|(i, m)| message(m, &format!("{field}[{i}]")))
        .collect()
}

fn message(m: &Value, at: &str) -> Result<Value, RowError> {
    if m.kind() != ValueKind::Map {
        return Err(RowError::field(format!(
            "{at}: expected an object, got {}",
            kind(m)
        )));
    }
    let role = match get(m, "role") {
        Some(r) if r.kind() == ValueKind::String => r.as_str().unwrap_or_default().to_string(),
        Some(r) => {
            return Err(RowError::field(format!(
                "{at}.role: expected a string, got {}",
                kind(&r)
            )))
        }
        None => return Err(RowError::field(format!("{at}: no `role`"))),
    };
    if !ROLES.contains(&role.as_str()) {
        return Err(RowError::field(format!(
            "{at}.role: unknown role {role:?} (expected system, developer, user, assistant or tool)"
        )));
    }
    let tool_calls = non_null(m, "tool_calls");
    if let Some(calls) = &tool_calls {
        check_tool_calls(calls, &format!("{at}.tool_calls"))?;
    }
    if let Some(r) = non_null(m, "tool_responses") {
        list_of_objects(&r, &format!("{at}.tool_responses"))?;
    }
    for key in REASONING_FIELDS {
        if let Some(r) = non_null(m, key) {
            string(&r, &format!("{at}.{key}"))?;
        }
    }
    match non_null(m, "content") {
        Some(c) => content(&c, &format!("{at}.content"))?,
        None if role == "assistant"
            && (tool_calls.is_some() || non_null(m, "tool_responses").is_some()) => {}
        None => {
            return Err(RowError::field(format!(
                "{at}: no `content` (only an assistant message with tool_calls may omit it)"
            )))
        }
    }
    Ok(alias_reasoning(&without_nulls(m)))
}

/// The message without its null-valued keys (transformers 5.23 `apply_chat_template` drops them
/// before rendering).
fn without_nulls(m: &Value) -> Value {
    m.try_iter()
        .into_iter()
        .flatten()
        .filter_map(|k| {
            let v = m.get_item(&k).ok().filter(|v| !v.is_none())?;
            Some((k, v))
        })
        .collect()
}

fn content(c: &Value, at: &str) -> Result<(), RowError> {
    match c.kind() {
        ValueKind::String => Ok(()),
        ValueKind::Seq => {
            for (j, part) in c.try_iter().into_iter().flatten().enumerate() {
                let at = format!("{at}[{j}]");
                if part.kind() != ValueKind::Map {
                    return Err(RowError::field(format!(
                        "{at}: expected a content part object, got {}",
                        kind(&part)
                    )));
                }
                match get(&part, "type").as_ref().and_then(Value::as_str) {
                    Some("text") => {
                        string(&required_at(&part, "text", &at)?, &format!("{at}.text"))?;
                    }
                    Some(other) => {
                        return Err(RowError::field(format!(
                            "{at}.type: {other:?} parts are not supported (text-only training: \
                             only {{\"type\": \"text\", \"text\": ...}} parts)"
                        )))
                    }
                    None => {
                        return Err(RowError::field(format!(
                            "{at}: a content part needs a string `type`"
                        )))
                    }
                }
            }
            Ok(())
        }
        _ => Err(RowError::field(format!(
            "{at}: expected a string or a list of parts, got {}",
            kind(c)
        ))),
    }
}

fn check_tool_calls(calls: &Value, at: &str) -> Result<(), RowError> {
    for (j, call) in list_of_objects(calls, at)?.iter().enumerate() {
        let at = format!("{at}[{j}]");
        let f = required_at(call, "function", &at)?;
        if f.kind() != ValueKind::Map {
            return Err(RowError::field(format!(
                "{at}.function: expected an object, got {}",
                kind(&f)
            )));
        }
        string(
            &required_at(&f, "name", &format!("{at}.function"))?,
            &format!("{at}.function.name"),
        )?;
        let args = required_at(&f, "arguments", &format!("{at}.function"))?;
        if !matches!(args.kind(), ValueKind::Map | ValueKind::String) {
            return Err(RowError::field(format!(
                "{at}.function.arguments: expected an object or a JSON string, got {}",
                kind(&args)
            )));
        }
    }
    Ok(())
}

fn tools(t: &Value) -> Result<Value, RowError> {
    for (j, tool) in list_of_objects(t, "tools")?.iter().enumerate() {
        let f = required_at(tool, "function", &format!("tools[{j}]"))?;
        string(
            &required_at(&f, "name", &format!("tools[{j}].function"))?,
            &format!("tools[{j}].function.name"),
        )?;
    }
    Ok(t.clone())
}

/// The reasoning fields transformers aliases (`_REASONING_FIELDS`, in priority order).
const REASONING_FIELDS: [&str; 3] = ["reasoning_content", "thinking", "reasoning"];

/// transformers 5.23 `_alias_reasoning_fields`: a message with reasoning becomes
/// `{"thinking": r, **message, "reasoning_content": r}`.
fn alias_reasoning(m: &Value) -> Value {
    let Some(r) = REASONING_FIELDS.iter().find_map(|k| non_null(m, k)) else {
        return m.clone();
    };
    let mut entries: Vec<(Value, Value)> = vec![(Value::from("thinking"), r.clone())];
    let mut has_reasoning_content = false;
    for k in m.try_iter().into_iter().flatten() {
        let v = m.get_item(&k).unwrap_or_default();
        match k.as_str() {
            Some("thinking") => entries[0].1 = v,
            Some("reasoning_content") => {
                has_reasoning_content = true;
                entries.push((k, r.clone()));
            }
            _ => entries.push((k, v)),
        }
    }
    if !has_reasoning_content {
        entries.push((Value::from("reasoning_content"), r));
    }
    Value::from_iter(entries)
}

fn sharegpt(v: &Value) -> Result<Vec<Value>, RowError> {
    let turns = list_of_objects(v, "conversations")?;
    if turns.is_empty() {
        return Err(RowError::field("conversations: empty conversation (`[]`)"));
    }
    // `role`/`content` turns under `conversations` (what Unsloth's `standardize_sharegpt` writes
    // back): chat messages.
    let first = &turns[0];
    if non_null(first, "role").is_some() && non_null(first, "from").is_none() {
        return messages(v, "conversations");
    }
    turns
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let at = format!("conversations[{i}]");
            let from = string(&required_at(t, "from", &at)?, &format!("{at}.from"))?;
            let role = match from.as_str() {
                "human" | "user" => "user",
                "gpt" | "assistant" | "model" => "assistant",
                "system" => "system",
                other => {
                    return Err(RowError::field(format!(
                        "{at}.from: unknown speaker {other:?} (expected human, user, gpt, \
                         assistant, model or system)"
                    )))
                }
            };
            let value = string(&required_at(t, "value", &at)?, &format!("{at}.value"))?;
            Ok(Value::from_iter([
                ("role", Value::from(role)),
                ("content", Value::from(value)),
            ]))
        })
        .collect()
}

fn tokens(row: &Value, vocab_size: Option<usize>) -> Result<TokenRow, RowError> {
    let ids = int_array(&required(row, "input_ids")?, "input_ids")?;
    if ids.is_empty() {
        return Err(RowError::field("input_ids: empty"));
    }
    let limit = vocab_size.map_or(i64::from(u32::MAX), |v| v as i64 - 1);
    let input_ids = ids
        .iter()
        .enumerate()
        .map(|(i, &id)| {
            if (0..=limit).contains(&id) {
                Ok(id as u32)
            } else {
                Err(RowError::field(format!(
                    "input_ids[{i}] = {id} is out of range 0..={limit}"
                )))
            }
        })
        .collect::<Result<Vec<u32>, RowError>>()?;
    let labels = match non_null(row, "labels") {
        None => None,
        Some(l) => {
            let l = int_array(&l, "labels")?;
            if l.len() != input_ids.len() {
                return Err(RowError::field(format!(
                    "labels: {} entries, `input_ids` has {}",
                    l.len(),
                    input_ids.len()
                )));
            }
            let labels = l
                .iter()
                .enumerate()
                .map(|(i, &x)| {
                    if x == -100 || (0..=limit).contains(&x) {
                        Ok(x as i32)
                    } else {
                        Err(RowError::field(format!(
                            "labels[{i}] = {x}: expected -100 or a token id 0..={limit}"
                        )))
                    }
                })
                .collect::<Result<Vec<i32>, RowError>>()?;
            Some(labels)
        }
    };
    Ok(TokenRow { input_ids, labels })
}

/// Runs of assistant messages, skipping tool messages: one model turn each.
fn model_turns(messages: &[Value]) -> usize {
    let mut prev = "";
    let mut turns = 0;
    for m in messages {
        let r = role(m);
        if r == "tool" {
            continue;
        }
        if r == "assistant" && prev != "assistant" {
            turns += 1;
        }
        prev = r;
    }
    turns
}

/// The role of a checked message (one of [`ROLES`]).
fn role(m: &Value) -> &'static str {
    m.get_attr("role").ok().map_or("", |r| {
        ROLES
            .iter()
            .find(|&&k| Some(k) == r.as_str())
            .copied()
            .unwrap_or("")
    })
}

/// `obj[key]` unless missing.
fn get(obj: &Value, key: &str) -> Option<Value> {
    obj.get_attr(key).ok().filter(|v| !v.is_undefined())
}

/// `obj[key]` unless missing or null (Parquet writes null for absent struct fields).
fn non_null(obj: &Value, key: &str) -> Option<Value> {
    get(obj, key).filter(|v| !v.is_none())
}

fn required(obj: &Value, key: &str) -> Result<Value, RowError> {
    non_null(obj, key).ok_or_else(|| RowError::field(format!("missing `{key}`")))
}

fn required_at(obj: &Value, key: &str, at: &str) -> Result<Value, RowError> {
    non_null(obj, key).ok_or_else(|| RowError::field(format!("{at}: no `{key}`")))
}

fn string(v: &Value, at: &str) -> Result<String, RowError> {
    v.as_str()
        .map(str::to_string)
        .ok_or_else(|| RowError::field(format!("{at}: expected a string, got {}", kind(v))))
}

fn list_of_objects(v: &Value, at: &str) -> Result<Vec<Value>, RowError> {
    if v.kind() != ValueKind::Seq {
        return Err(RowError::field(format!(
            "{at}: expected an array of objects, got {}",
            kind(v)
        )));
    }
    let items: Vec<Value> = v
        .try_iter()
        .map_err(|e| RowError::field(e.to_string()))?
        .collect();
    if let Some((j, bad)) = items
        .iter()
        .enumerate()
        .find(|(_, x)| x.kind() != ValueKind::Map)
    {
        return Err(RowError::field(format!(
            "{at}[{j}]: expected an object, got {}",
            kind(bad)
        )));
    }
    Ok(items)
}

fn int_array(v: &Value, name: &str) -> Result<Vec<i64>, RowError> {
    if v.kind() != ValueKind::Seq {
        return Err(RowError::field(format!(
            "{name}: expected an array of integers, got {}",
            kind(v)
        )));
    }
    v.try_iter()
        .map_err(|e| RowError::field(e.to_string()))?
        .enumerate()
        .map(|(i, x)| {
            x.as_i64().filter(|_| x.is_integer()).ok_or_else(|| {
                RowError::field(format!(
                    "{name}[{i}]: expected an integer, got {}",
                    kind(&x)
                ))
            })
        })
        .collect()
}

fn kind(v: &Value) -> &'static str {
    kind_name(v.kind())
}

fn kind_name(k: ValueKind) -> &'static str {
    match k {
        ValueKind::Undefined => "nothing",
        ValueKind::None => "null",
        ValueKind::Bool => "a boolean",
        ValueKind::Number => "a number",
        ValueKind::String => "a string",
        ValueKind::Seq => "an array",
        ValueKind::Map => "an object",
        _ => "an unsupported value",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_line(line: &str) -> Result<Row, RowError> {
        let v = parse_json(line)?;
        let f = detect(&v).map_err(RowError::field)?;
        parse(&v, f, Some(8))
    }

    fn err(line: &str) -> String {
        parse_line(line).unwrap_err().reason
    }

    #[test]
    fn chat_errors_name_the_field() {
        let cases = [
            ("{\"messages\": [", "invalid JSON"),
            ("[1]", "expected a JSON object, got an array"),
            (
                "{\"messages\": {}}",
                "messages: expected an array of messages, got an object",
            ),
            ("{\"messages\": []}", "empty conversation"),
            (
                r#"{"messages": [{"role": "bot", "content": "x"}]}"#,
                "messages[0].role: unknown role \"bot\"",
            ),
            (
                r#"{"messages": [{"role": "user", "content": 3}]}"#,
                "messages[0].content: expected a string or a list of parts, got a number",
            ),
            (
                r#"{"messages": [{"role": "user"}]}"#,
                "messages[0]: no `content`",
            ),
            (
                r#"{"messages": [{"content": "x"}]}"#,
                "messages[0]: no `role`",
            ),
            (
                r#"{"messages": [{"role": "user", "content": [{"type": "image", "url": "x"}]}]}"#,
                "messages[0].content[0].type: \"image\" parts are not supported",
            ),
            (
                r#"{"messages": [{"role": "user", "content": [{"type": "text"}]}]}"#,
                "messages[0].content[0]: no `text`",
            ),
            (
                r#"{"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f"}}]}]}"#,
                "messages[0].tool_calls[0].function: no `arguments`",
            ),
            (
                r#"{"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 3}}]}]}"#,
                "arguments: expected an object or a JSON string, got a number",
            ),
            (
                r#"{"messages": [{"role": "assistant", "content": "x", "reasoning": 1}]}"#,
                "messages[0].reasoning: expected a string",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "tools": "[]"}"#,
                "tools: expected an array of objects, got a string",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}"#,
                "tools[0]: no `function`",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "enable_thinking": "yes"}"#,
                "enable_thinking: expected a boolean",
            ),
        ];
        for (line, want) in cases {
            let e = err(line);
            assert!(e.contains(want), "{line}: {e}");
        }
    }

    #[test]
    fn chat_rows_keep_fields_and_count_model_turns() {
        let Row::Chat(c) = parse_line(
            r#"{"messages": [{"role": "user", "content": "q", "x": 1},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "1", "function": {"name": "f", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "1", "content": "r"},
                {"role": "assistant", "content": [{"type": "text", "text": "a"}], "reasoning": "why"},
                {"role": "user", "content": "q2"}, {"role": "assistant", "content": "b"}],
                "tools": [{"type": "function", "function": {"name": "f"}}], "enable_thinking": true}"#,
        )
        .unwrap() else {
            panic!("not a chat row")
        };
        assert_eq!(c.model_turns, 2);
        assert_eq!(c.conversation.enable_thinking, Some(true));
        assert!(c.conversation.tools.is_some() && c.prompt.is_none());
        let msgs = &c.conversation.messages;
        assert_eq!(
            msgs.get_item(&Value::from(0))
                .unwrap()
                .get_attr("x")
                .unwrap(),
            Value::from(1)
        );
        // transformers' aliasing: {"thinking": r, **message, "reasoning_content": r}
        let keys: Vec<String> = msgs
            .get_item(&Value::from(3))
            .unwrap()
            .try_iter()
            .unwrap()
            .map(|k| k.to_string())
            .collect();
        assert_eq!(
            keys,
            [
                "thinking",
                "role",
                "content",
                "reasoning",
                "reasoning_content"
            ]
        );
    }

    #[test]
    fn null_keys_are_dropped_before_reasoning_is_aliased() {
        let Row::Chat(c) = parse_line(
            r#"{"messages": [{"role": "user", "content": "q", "name": null},
                {"role": "assistant", "thinking": null, "content": "a", "tool_calls": null,
                 "reasoning": "why", "reasoning_content": null, "x": {"y": null}}]}"#,
        )
        .unwrap() else {
            panic!("not a chat row")
        };
        // Python: repr() of the message transformers 5.23 renders: {k: v for k, v in m.items()
        // if v is not None}, then {"thinking": r, **m, "reasoning_content": r}
        let msg = |i: usize| {
            crate::pyhelpers::py_repr(&c.conversation.messages.get_item(&Value::from(i)).unwrap())
        };
        assert_eq!(msg(0), "{'role': 'user', 'content': 'q'}");
        assert_eq!(
            msg(1),
            "{'thinking': 'why', 'role': 'assistant', 'content': 'a', 'reasoning': 'why', \
             'x': {'y': None}, 'reasoning_content': 'why'}"
        );
    }

    #[test]
    fn sharegpt_prompt_completion_and_text() {
        let Row::Chat(c) = parse_line(
            r#"{"system": "s", "conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}"#,
        )
        .unwrap() else {
            panic!()
        };
        assert_eq!(c.model_turns, 1);
        assert_eq!(c.conversation.messages.len(), Some(3));
        assert!(err(r#"{"conversations": [{"from": "bot", "value": "q"}]}"#)
            .contains("conversations[0].from: unknown speaker \"bot\""));
        assert!(
            err(r#"{"conversations": [{"from": "gpt"}]}"#).contains("conversations[0]: no `value`")
        );
        // role/content turns under `conversations` are chat messages
        let Row::Chat(c) = parse_line(
            r#"{"conversations": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}"#,
        )
        .unwrap() else {
            panic!()
        };
        assert_eq!((c.model_turns, c.conversation.messages.len()), (1, Some(2)));
        let Row::Text(t) = parse_line(r#"{"prompt": "p", "completion": "c"}"#).unwrap() else {
            panic!()
        };
        assert_eq!((t.prompt.as_deref(), t.text.as_str()), (Some("p"), "c"));
        let Row::Chat(c) = parse_line(
            r#"{"prompt": [{"role": "user", "content": "q"}], "completion": [{"role": "assistant", "content": "a"}]}"#,
        )
        .unwrap() else {
            panic!()
        };
        assert_eq!(c.prompt.unwrap().messages.len(), Some(1));
        assert!(
            err(r#"{"prompt": "p", "completion": [{"role": "assistant", "content": "a"}]}"#)
                .contains("both be strings or both be message lists, got a string and an array")
        );
        assert!(err(r#"{"prompt": [{"role": "user", "content": "q"}], "completion": [{"role": "user", "content": "a"}]}"#)
            .contains("completion: no assistant message"));
        assert!(err(r#"{"completion": "c"}"#).contains("missing `prompt`"));
        assert!(err(r#"{"text": 3}"#).contains("text: expected a string, got a number"));
        assert!(err(r#"{"text": ""}"#).contains("text: empty"));
    }

    #[test]
    fn token_rows() {
        let Row::Tokens(r) =
            parse_line(r#"{"input_ids": [2, 5, 7], "labels": [-100, 5, 7]}"#).unwrap()
        else {
            panic!()
        };
        assert_eq!(r.input_ids, vec![2, 5, 7]);
        assert_eq!(r.labels, Some(vec![-100, 5, 7]));
        for (line, want) in [
            (r#"{"input_ids": []}"#, "input_ids: empty"),
            (
                r#"{"input_ids": [1, 9]}"#,
                "input_ids[1] = 9 is out of range",
            ),
            (
                r#"{"input_ids": [1, "a"]}"#,
                "input_ids[1]: expected an integer, got a string",
            ),
            (
                r#"{"input_ids": [1, 2.0]}"#,
                "input_ids[1]: expected an integer, got a number",
            ),
            (
                r#"{"input_ids": [1, 2], "labels": [1]}"#,
                "labels: 1 entries",
            ),
            (
                r#"{"input_ids": [1, 2], "labels": [1, -5]}"#,
                "labels[1] = -5",
            ),
        ] {
            let e = err(line);
            assert!(e.contains(want), "{line}: {e}");
        }
    }

    #[test]
    fn detection_and_names() {
        let d = |l: &str| detect(&parse_json(l).unwrap());
        assert_eq!(d(r#"{"messages": []}"#), Ok(Format::Chat));
        assert_eq!(d(r#"{"conversations": []}"#), Ok(Format::ShareGpt));
        assert_eq!(d(r#"{"completion": "x"}"#), Ok(Format::PromptCompletion));
        assert_eq!(d(r#"{"text": "x"}"#), Ok(Format::Text));
        assert_eq!(d(r#"{"input_ids": [1]}"#), Ok(Format::Tokens));
        assert!(d(r#"{"txt": "x"}"#)
            .unwrap_err()
            .contains("keys: [\"txt\"]"));
        for f in Format::ALL {
            assert_eq!(f.as_str().parse::<Format>(), Ok(f));
        }
        assert!("csv"
            .parse::<Format>()
            .unwrap_err()
            .contains("expected chat, sharegpt"));
    }
}
