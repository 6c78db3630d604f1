//! Chat templates from a model directory, rendered with minijinja like transformers renders them.
//!
//! Mirrors transformers 5.23 `apply_chat_template(..., tokenize=False)`: the template comes from
//! `chat_template.jinja`, else from `chat_template` in `tokenizer_config.json` (a string, or a
//! list of `{name, template}` where `default` is used); the environment has `trim_blocks` and
//! `lstrip_blocks` on, loop controls, Python string/dict methods (pycompat), `raise_exception`,
//! `strftime_now` and transformers' `tojson`. The context holds `messages`, `tools=None`,
//! `documents=None`, `add_generation_prompt`, the special tokens of `tokenizer_config.json`
//! (`bos_token`, `eos_token`, `pad_token`, `unk_token`, `mask_token`), and `enable_thinking` only
//! when it was set (templates test `enable_thinking is defined`).

use std::path::{Path, PathBuf};

use minijinja::{Environment, Value};
use serde::Serialize;

use crate::error::{DataError, Result};
use crate::pyhelpers;

/// One chat message, as in the JSONL rows (`role` is system, developer, user or assistant).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Message {
    /// `system`, `developer`, `user` or `assistant`.
    pub role: String,
    /// The text; the Gemma 4 template trims it, and strips thinking-channel spans from assistants.
    pub content: String,
}

/// Options that change the rendering (transformers' `add_generation_prompt` and template kwargs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RenderOptions {
    /// Append the prompt that opens a model turn (never used for training rows).
    pub add_generation_prompt: bool,
    /// `enable_thinking` template kwarg; `None` leaves it undefined, as when not passed.
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

impl ChatTemplate {
    /// Loads the template and special tokens of a model directory (see the module doc for the
    /// search order). Errors name the file and say what is missing or fails to compile.
    pub fn from_model_dir(dir: &Path) -> Result<Self> {
        let config_path = dir.join("tokenizer_config.json");
        let config: serde_json::Value = match std::fs::read_to_string(&config_path) {
            Ok(text) => serde_json::from_str(&text).map_err(|e| DataError::Template {
                path: config_path.clone(),
                msg: format!("invalid JSON: {e}"),
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => serde_json::Value::Null,
            Err(e) => return Err(DataError::io(&config_path, e)),
        };
        let jinja_path = dir.join("chat_template.jinja");
        let (source, path) = match std::fs::read_to_string(&jinja_path) {
            Ok(text) => (text, jinja_path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                (template_from_config(&config, &config_path)?, config_path)
            }
            Err(e) => return Err(DataError::io(&jinja_path, e)),
        };
        let special_tokens = SPECIAL_TOKEN_KEYS
            .iter()
            .filter_map(|&k| special_token(&config, k).map(|v| (k, v)))
            .collect();
        Self::new(source, path, special_tokens)
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
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", pyhelpers::raise_exception);
        env.add_function("strftime_now", pyhelpers::strftime_now);
        env.add_filter("tojson", pyhelpers::tojson);
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

    /// Renders a conversation to text. The error is the template's message (e.g. from
    /// `raise_exception`), without a location, so callers can attach the JSONL line.
    pub fn render(&self, messages: &[Message], opts: RenderOptions) -> Result<String, String> {
        let tmpl = self.env.get_template("chat").map_err(|e| e.to_string())?;
        let mut ctx: Vec<(&str, Value)> = vec![
            ("messages", Value::from_serialize(messages)),
            ("tools", Value::from(())),
            ("documents", Value::from(())),
            (
                "add_generation_prompt",
                Value::from(opts.add_generation_prompt),
            ),
        ];
        for (k, v) in &self.special_tokens {
            ctx.push((k, Value::from(v.as_str())));
        }
        if let Some(t) = opts.enable_thinking {
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

fn template_from_config(config: &serde_json::Value, path: &Path) -> Result<String> {
    let missing = || DataError::Template {
        path: path.to_path_buf(),
        msg: "no chat_template.jinja beside it and no `chat_template` in it".into(),
    };
    match config.get("chat_template") {
        Some(serde_json::Value::String(s)) => Ok(s.clone()),
        Some(serde_json::Value::Array(named)) => named
            .iter()
            .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
            .and_then(|t| t.get("template")?.as_str().map(str::to_string))
            .ok_or_else(|| DataError::Template {
                path: path.to_path_buf(),
                msg: "`chat_template` is a list without a `default` entry".into(),
            }),
        _ => Err(missing()),
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

    #[test]
    fn python_helpers_and_loop_controls() {
        let t = tmpl(
            "{{ bos_token }}{% for m in messages %}{% if loop.index0 == 1 %}{% break %}{% endif %}\
             {{ m.content.strip().split(' ')[0] }}|{{ m.get('missing', 'd') }}{% endfor %}",
        );
        let msgs = [
            Message {
                role: "user".into(),
                content: "  hi there ".into(),
            },
            Message {
                role: "user".into(),
                content: "second".into(),
            },
        ];
        assert_eq!(
            t.render(&msgs, RenderOptions::default()).unwrap(),
            "<s>hi|d"
        );
    }

    #[test]
    fn raise_exception_message_surfaces() {
        let t = tmpl("{{ raise_exception('bad role: ' ~ messages[0].role) }}");
        let msgs = [Message {
            role: "bot".into(),
            content: String::new(),
        }];
        let err = t.render(&msgs, RenderOptions::default()).unwrap_err();
        assert!(err.contains("bad role: bot"), "{err}");
    }

    #[test]
    fn enable_thinking_is_undefined_unless_set() {
        let t = tmpl("{{ 'yes' if enable_thinking is defined else 'no' }}");
        let on = RenderOptions {
            enable_thinking: Some(false),
            ..Default::default()
        };
        assert_eq!(t.render(&[], RenderOptions::default()).unwrap(), "no");
        assert_eq!(t.render(&[], on).unwrap(), "yes");
    }

    #[test]
    fn compile_error_names_file() {
        let err = ChatTemplate::new("{% if %}".into(), "x.jinja".into(), vec![]).unwrap_err();
        assert!(err.to_string().contains("x.jinja"), "{err}");
    }
}
