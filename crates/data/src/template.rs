//! Chat templates from a model directory, rendered with minijinja like transformers renders them.
//!
//! Mirrors transformers 5.23 `apply_chat_template(..., tokenize=False)`: the template comes from
//! `chat_template.jinja`, else from `chat_template` in `tokenizer_config.json` (a string, or a
//! list of `{name, template}` where `default` is used); the environment has `trim_blocks` and
//! `lstrip_blocks` on, loop controls, Python string/dict methods (pycompat), `raise_exception`,
//! `strftime_now` and transformers' `tojson`. The context holds `messages` (each message's full JSON
//! object), the row's `tools` (else `None`), `documents=None`, `add_generation_prompt`, the special tokens of `tokenizer_config.json`
//! (`bos_token`, `eos_token`, `pad_token`, `unk_token`, `mask_token`), and `enable_thinking` only
//! when it was set (templates test `enable_thinking is defined`). Values print as Python prints
//! them (see [`crate::pyhelpers`]).

use std::path::{Path, PathBuf};

use minijinja::{Environment, Value};

use crate::error::{DataError, Result};
use crate::pyhelpers;

/// One conversation as the template sees it: every message as its full JSON object (`role`,
/// `content` as a string or a list of parts, `tool_calls`, `tool_call_id`, `name`, `reasoning`,
/// ... with reasoning fields aliased as transformers does), the row's `tools` and its
/// `enable_thinking`. Built by [`crate::rows::parse`].
#[derive(Debug, Clone)]
pub struct Conversation {
    /// The messages, a list of maps in their JSON key order.
    pub messages: Value,
    /// The row's tool declarations (OpenAI function schemas), `None` when it has none.
    pub tools: Option<Value>,
    /// The row's `enable_thinking`, overriding the run's.
    pub enable_thinking: Option<bool>,
}

/// Options that change the rendering (transformers' `add_generation_prompt` and template kwargs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RenderOptions {
    /// Append the prompt that opens a model turn (never used for training rows).
    pub add_generation_prompt: bool,
    /// `enable_thinking` template kwarg; `None` leaves it undefined, as when not passed. A row's
    /// own `enable_thinking` wins.
    pub enable_thinking: Option<bool>,
}

/// A compiled chat template plus the special-token strings it is rendered with.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    path: PathBuf,
    special_tokens: Vec<(&'static str, String)>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("path", &self.path)
            .field("special_tokens", &self.special_tokens)
            .finish()
    }
}

const SPECIAL_TOKEN_KEYS: [&str; 5] = [
    "bos_token",
    "eos_token",
    "pad_token",
    "unk_token",
    "mask_token",
];

/// The special tokens of `tokenizer_config.json` (`bos_token`, `eos_token`, ...); a missing file
/// has none. Errors name the file.
pub fn special_tokens(dir: &Path) -> Result<Vec<(&'static str, String)>> {
    let config = tokenizer_config(dir)?;
    Ok(SPECIAL_TOKEN_KEYS
        .iter()
        .filter_map(|&k| special_token(&config, k).map(|v| (k, v)))
        .collect())
}

fn tokenizer_config(dir: &Path) -> Result<serde_json::Value> {
    let config_path = dir.join("tokenizer_config.json");
    match std::fs::read_to_string(&config_path) {
        Ok(text) => serde_json::from_str(&text).map_err(|e| DataError::Template {
            path: config_path.clone(),
            msg: format!("invalid JSON: {e}"),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(serde_json::Value::Null),
        Err(e) => Err(DataError::io(&config_path, e)),
    }
}

impl ChatTemplate {
    /// Loads the template and special tokens of a model directory (see the module doc for the
    /// search order); `None` when the directory has none (a base model: fine for text and token
    /// data). Errors name the file that is unreadable or fails to compile.
    pub fn from_model_dir(dir: &Path) -> Result<Option<Self>> {
        let config_path = dir.join("tokenizer_config.json");
        let config = tokenizer_config(dir)?;
        let jinja_path = dir.join("chat_template.jinja");
        let (source, path) = match std::fs::read_to_string(&jinja_path) {
            Ok(text) => (text, jinja_path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                match template_from_config(&config, &config_path)? {
                    Some(text) => (text, config_path),
                    None => return Ok(None),
                }
            }
            Err(e) => return Err(DataError::io(&jinja_path, e)),
        };
        Self::new(source, path, special_tokens(dir)?).map(Some)
    }

    /// Compiles `source` (named `path` in errors) with the given special-token strings,
    /// e.g. `[("bos_token", "<bos>".into())]`.
    pub fn new(
        source: String,
        path: PathBuf,
        special_tokens: Vec<(&'static str, String)>,
    ) -> Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_debug(false); // errors are one line: the message and the template line
        env.set_unknown_method_callback(pyhelpers::unknown_method);
        env.set_formatter(pyhelpers::formatter);
        env.add_function("raise_exception", pyhelpers::raise_exception);
        env.add_function("strftime_now", pyhelpers::strftime_now);
        env.add_filter("tojson", pyhelpers::tojson);
        env.add_filter("string", pyhelpers::string);
        env.add_filter("trim", pyhelpers::trim);
        env.add_filter("dictsort", pyhelpers::dictsort);
        env.add_test("sequence", pyhelpers::is_sequence);
        env.add_template_owned("chat", source.clone())
            .map_err(|e| DataError::Template {
                path: path.clone(),
                msg: format!("does not compile: {e:#}"),
            })?;
        Ok(ChatTemplate {
            env,
            source,
            path,
            special_tokens,
        })
    }

    /// The template text (hashed into the token-cache key).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The special-token strings the template is rendered with.
    pub fn special_tokens(&self) -> &[(&'static str, String)] {
        &self.special_tokens
    }

    /// Renders a conversation to text, as `apply_chat_template(messages, tools=tools,
    /// tokenize=False, **kwargs)`. The error is the template's message (e.g. from
    /// `raise_exception`) with the template line, so callers can attach the data row.
    pub fn render(&self, conv: &Conversation, opts: RenderOptions) -> Result<String, String> {
        let tmpl = self.env.get_template("chat").map_err(|e| e.to_string())?;
        let mut ctx: Vec<(&str, Value)> = vec![
            ("messages", conv.messages.clone()),
            ("tools", conv.tools.clone().unwrap_or(Value::from(()))),
            ("documents", Value::from(())),
            (
                "add_generation_prompt",
                Value::from(opts.add_generation_prompt),
            ),
        ];
        for (k, v) in &self.special_tokens {
            ctx.push((k, Value::from(v.as_str())));
        }
        if let Some(t) = conv.enable_thinking.or(opts.enable_thinking) {
            ctx.push(("enable_thinking", Value::from(t)));
        }
        let ctx: Value = ctx.into_iter().collect();
        tmpl.render(ctx).map_err(|e| {
            let mut msg = e.to_string();
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                msg = format!("{msg}: {s}");
                src = s.source();
            }
            msg
        })
    }
}

fn template_from_config(config: &serde_json::Value, path: &Path) -> Result<Option<String>> {
    match config.get("chat_template") {
        Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
        Some(serde_json::Value::Array(named)) => named
            .iter()
            .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
            .and_then(|t| t.get("template")?.as_str().map(|s| Some(s.to_string())))
            .ok_or_else(|| DataError::Template {
                path: path.to_path_buf(),
                msg: "`chat_template` is a list without a `default` entry".into(),
            }),
        _ => Ok(None),
    }
}

/// A special token from `tokenizer_config.json`: a string or `{"content": "..."}`.
fn special_token(config: &serde_json::Value, key: &str) -> Option<String> {
    match config.get(key)? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpl(src: &str) -> ChatTemplate {
        ChatTemplate::new(
            src.into(),
            "t.jinja".into(),
            vec![("bos_token", "<s>".into())],
        )
        .unwrap()
    }

    fn conv(json: &str) -> Conversation {
        Conversation {
            messages: serde_json::from_str(json).unwrap(),
            tools: None,
            enable_thinking: None,
        }
    }

    #[test]
    fn python_helpers_and_loop_controls() {
        let t = tmpl(
            "{{ bos_token }}{% for m in messages %}{% if loop.index0 == 1 %}{% break %}{% endif %}\
             {{ m.content.strip().split(' ')[0] }}|{{ m.get('missing', 'd') }}{% endfor %}",
        );
        let c = conv(
            r#"[{"role": "user", "content": "  hi there "}, {"role": "user", "content": "second"}]"#,
        );
        assert_eq!(t.render(&c, RenderOptions::default()).unwrap(), "<s>hi|d");
    }

    #[test]
    fn messages_keep_every_field_in_order() {
        let t = tmpl("{% for k, v in messages[0].items() %}{{ k }}={{ v }};{% endfor %}");
        let c = conv(r#"[{"role": "assistant", "z": 1.5e-7, "content": null, "a": [true, "x"]}]"#);
        assert_eq!(
            t.render(&c, RenderOptions::default()).unwrap(),
            "role=assistant;z=1.5e-07;content=None;a=[True, 'x'];"
        );
    }

    #[test]
    fn raise_exception_message_surfaces() {
        let t = tmpl("\n{{ raise_exception('bad role: ' ~ messages[0].role) }}");
        let err = t
            .render(&conv(r#"[{"role": "bot"}]"#), RenderOptions::default())
            .unwrap_err();
        assert!(
            err.contains("bad role: bot") && err.contains("chat:2"),
            "{err}"
        );
    }

    #[test]
    fn enable_thinking_is_undefined_unless_set_and_a_row_overrides_it() {
        let t = tmpl("{{ enable_thinking if enable_thinking is defined else 'no' }}");
        let on = RenderOptions {
            enable_thinking: Some(false),
            ..Default::default()
        };
        let mut c = conv("[]");
        assert_eq!(t.render(&c, RenderOptions::default()).unwrap(), "no");
        assert_eq!(t.render(&c, on).unwrap(), "False");
        c.enable_thinking = Some(true);
        assert_eq!(t.render(&c, on).unwrap(), "True");
    }

    #[test]
    fn compile_error_names_file() {
        let err = ChatTemplate::new("{% if %}".into(), "x.jinja".into(), vec![]).unwrap_err();
        assert!(err.to_string().contains("x.jinja"), "{err}");
    }
}
