//! Rows -> token ids and labels: template rendering, tokenization, labels, truncation.
//!
//! Conversations mirror the post's `ChatJsonl.__getitem__`: `apply_chat_template(messages,
//! tools=tools, tokenize=False)`, then `tokenizer(text, add_special_tokens=False)` (the template
//! already emits `<bos>`; exactly one BOS per sequence). Text rows follow TRL's language-modeling
//! convention: `bos_token + text + eos_token` (no EOS added when the text already ends with it);
//! a string prompt/completion pair is one text, `prompt + completion`. Labels are computed on the
//! full sequence, then ids and labels are truncated to `max_len` together. An `Encoder` is
//! `Sync`: rows encode in parallel.

use std::ops::Range;
use std::path::{Path, PathBuf};

use tokenizers::Tokenizer;

use crate::error::{DataError, Result, RowError, SkipReason};
use crate::hash::Fnv64;
use crate::labels::{self, LabelMode, TurnMarkers, IGNORE};
use crate::rows::{ChatRow, Row, TextRow, TokenRow};
use crate::template::{self, ChatTemplate, Conversation, RenderOptions};

/// Byte span `(start, end)` of each token in the tokenized text.
pub type ByteOffsets = Vec<(usize, usize)>;

/// Tokenizer, special tokens and chat template of a model directory.
pub struct Encoder {
    tokenizer: Tokenizer,
    template: Option<ChatTemplate>,
    render: RenderOptions,
    markers: TurnMarkers,
    pad_id: u32,
    bos: Option<(String, u32)>,
    eos: Option<(String, u32)>,
    fingerprint: u64,
    dir: PathBuf,
}

impl std::fmt::Debug for Encoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Encoder")
            .field("dir", &self.dir)
            .field("pad_id", &self.pad_id)
            .field("fingerprint", &format_args!("{:016x}", self.fingerprint))
            .finish()
    }
}

/// One encoded row: `input_ids` and `labels` of equal length (labels -100 where not trained).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Encoded {
    /// Token ids, at most `max_len`.
    pub input_ids: Vec<u32>,
    /// Labels (not shifted; the model shifts), -100 where ignored.
    pub labels: Vec<i32>,
    /// Whether `max_len` cut the row.
    pub truncated: bool,
}

impl Encoder {
    /// Loads `tokenizer.json`, the special tokens of `tokenizer_config.json` and the chat
    /// template (optional: only conversations need it) of `dir`. The pad id is `pad_token`,
    /// else `<pad>`, else 0 (Gemma 4's).
    pub fn from_model_dir(dir: &Path) -> Result<Self> {
        let tok_path = dir.join("tokenizer.json");
        let bytes = std::fs::read(&tok_path).map_err(|e| DataError::io(&tok_path, e))?;
        let tokenizer = Tokenizer::from_bytes(&bytes).map_err(|e| DataError::Tokenizer {
            path: tok_path.clone(),
            msg: e.to_string(),
        })?;
        let template = ChatTemplate::from_model_dir(dir)?;
        let specials = template::special_tokens(dir)?;
        let special = |key: &str| {
            specials
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| v.clone())
        };
        let with_id = |key: &str| {
            let s = special(key)?;
            tokenizer.token_to_id(&s).map(|id| (s, id))
        };
        let pad_token = special("pad_token").unwrap_or_else(|| "<pad>".into());
        let pad_id = tokenizer.token_to_id(&pad_token).unwrap_or(0);
        let mut h = Fnv64::default();
        h.field(&bytes);
        if let Some(t) = &template {
            h.field(t.source().as_bytes());
        }
        for (k, v) in &specials {
            h.field(k.as_bytes());
            h.field(v.as_bytes());
        }
        Ok(Encoder {
            bos: with_id("bos_token"),
            eos: with_id("eos_token"),
            tokenizer,
            template,
            render: RenderOptions::default(),
            markers: TurnMarkers::default(),
            pad_id,
            fingerprint: h.finish(),
            dir: dir.to_path_buf(),
        })
    }

    /// Sets the `enable_thinking` template kwarg for every row that does not set its own
    /// (default: not passed).
    pub fn with_enable_thinking(mut self, on: bool) -> Self {
        self.render.enable_thinking = Some(on);
        self
    }

    /// Hash of the tokenizer, template, special tokens and render options (cache key part).
    pub fn fingerprint(&self) -> u64 {
        let mut h = Fnv64::default();
        h.update(&self.fingerprint.to_le_bytes());
        h.field(format!("{:?}", self.render.enable_thinking).as_bytes());
        h.field(format!("{:?}", self.markers).as_bytes());
        h.finish()
    }

    /// Id of the pad token.
    pub fn pad_id(&self) -> u32 {
        self.pad_id
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.tokenizer.get_vocab_size(true)
    }

    /// The underlying tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The chat template, or an error naming the model directory when it has none.
    pub fn template(&self) -> Result<&ChatTemplate> {
        self.template.as_ref().ok_or_else(|| DataError::Template {
            path: self.dir.join("tokenizer_config.json"),
            msg: "no chat_template.jinja beside it and no `chat_template` in it \
                  (conversations need the model's chat template)"
                .into(),
        })
    }

    /// Renders a conversation (no generation prompt) with this encoder's options.
    pub fn render(&self, conv: &Conversation) -> Result<String, RowError> {
        let template = self
            .template()
            .map_err(|e| RowError::new(SkipReason::Template, e.to_string()))?;
        template
            .render(conv, self.render)
            .map_err(|e| RowError::new(SkipReason::Template, format!("chat template: {e}")))
    }

    /// Tokenizes text without adding special tokens; returns ids and byte offsets.
    pub fn tokenize(&self, text: &str) -> Result<(Vec<u32>, ByteOffsets), RowError> {
        let enc = self
            .tokenizer
            .encode(text, false)
            .map_err(|e| RowError::new(SkipReason::Tokenizer, format!("tokenizer: {e}")))?;
        Ok((enc.get_ids().to_vec(), enc.get_offsets().to_vec()))
    }

    /// Encodes one row. Errors are row-level (the caller adds file and line): a render failure,
    /// model turns that do not match the assistant messages, labels the mode needs and the row
    /// lacks, or no trainable target left after masking and truncation to `max_len`.
    pub fn encode(&self, row: &Row, max_len: usize, mode: LabelMode) -> Result<Encoded, RowError> {
        let (ids, labels) = match row {
            Row::Chat(chat) => self.chat(chat, mode)?,
            Row::Text(text) => self.text(text, mode)?,
            Row::Tokens(_) => return encode_tokens(row, max_len, mode),
        };
        truncate(ids, labels, max_len)
    }

    fn chat(&self, row: &ChatRow, mode: LabelMode) -> Result<(Vec<u32>, Vec<i32>), RowError> {
        let text = self.render(&row.conversation)?;
        let (ids, offsets) = self.tokenize(&text)?;
        let trained_from = match (mode, &row.prompt) {
            (LabelMode::Full, _) | (LabelMode::Auto, None) => return Ok(all_trained(ids)),
            (_, None) => 0,
            (_, Some(prompt)) => {
                let prompt_text = self.render(prompt)?;
                if !text.starts_with(&prompt_text) {
                    return Err(RowError::new(
                        SkipReason::LabelSpans,
                        "the prompt's rendering is not a prefix of the whole conversation's, \
                         so the completion cannot be located",
                    ));
                }
                prompt_text.len()
            }
        };
        if let Some((place, marker)) = marker_in_data(&row.conversation, &self.markers) {
            return Err(RowError::new(
                SkipReason::LabelSpans,
                format!(
                    "{}: {place} contains `{}`, a turn marker of the chat format, which the \
                     assistant-only labels cannot tell from the template's own; remove it from \
                     the data or train on every token (`--labels full`)",
                    mode.as_str(),
                    marker.escape_debug(),
                ),
            ));
        }
        let found = labels::model_spans(&text, &self.markers);
        if found.turns != row.model_turns {
            return Err(RowError::new(
                SkipReason::LabelSpans,
                format!(
                    "{}: found {} model turn(s) (`{}` headers) in the rendering, expected {} \
                     (one per run of assistant messages); the template must write Gemma 4 turn \
                     markers and message text must not contain them",
                    mode.as_str(),
                    found.turns,
                    self.markers.model_header.escape_debug(),
                    row.model_turns
                ),
            ));
        }
        let spans = clip(&found.spans, trained_from);
        let labels = labels::mask_by_spans(&ids, &offsets, &spans);
        Ok((ids, labels))
    }

    fn text(&self, row: &TextRow, mode: LabelMode) -> Result<(Vec<u32>, Vec<i32>), RowError> {
        let missing = |what: &str| {
            RowError::new(
                SkipReason::Tokenizer,
                format!(
                    "text rows need `{what}` in {} with a token of the tokenizer",
                    self.dir.join("tokenizer_config.json").display()
                ),
            )
        };
        let (_, bos) = self.bos.as_ref().ok_or_else(|| missing("bos_token"))?;
        let (eos_text, _) = self.eos.as_ref().ok_or_else(|| missing("eos_token"))?;
        let prompt = row.prompt.as_deref().unwrap_or("");
        let mut text = format!("{prompt}{}", row.text);
        if !text.ends_with(eos_text.as_str()) {
            text.push_str(eos_text);
        }
        let (mut ids, mut offsets) = self.tokenize(&text)?;
        if ids.first() != Some(bos) {
            ids.insert(0, *bos);
            offsets.insert(0, (0, 0));
        }
        let labels =
            match (mode, &row.prompt) {
                (LabelMode::Full, _) | (LabelMode::Auto, None) => return Ok(all_trained(ids)),
                (LabelMode::AssistantOnly, None) => return Err(RowError::field(
                    "--labels assistant_only: a text row has no assistant part (use auto or full)",
                )),
                (_, Some(_)) => {
                    let completion = prompt.len()..text.len();
                    labels::mask_by_spans(&ids, &offsets, std::slice::from_ref(&completion))
                }
            };
        Ok((ids, labels))
    }
}

/// Encodes a pre-tokenized row (no tokenizer needed); other rows are an error.
pub fn encode_tokens(row: &Row, max_len: usize, mode: LabelMode) -> Result<Encoded, RowError> {
    let Row::Tokens(tokens) = row else {
        return Err(RowError::field("this row needs a tokenizer"));
    };
    let (ids, labels) = token_labels(tokens, mode)?;
    truncate(ids, labels, max_len)
}

/// Labels of a pre-tokenized row: its own (`auto`, `assistant_only`) or its ids (`full`, and
/// `auto` without labels).
fn token_labels(row: &TokenRow, mode: LabelMode) -> Result<(Vec<u32>, Vec<i32>), RowError> {
    let ids = row.input_ids.clone();
    match (mode, &row.labels) {
        (LabelMode::Full, _) | (LabelMode::Auto, None) => Ok(all_trained(ids)),
        (_, Some(labels)) => Ok((ids, labels.clone())),
        (LabelMode::AssistantOnly, None) => Err(RowError::field(
            "labels: missing; --labels assistant_only needs pre-tokenized rows that carry their \
             labels (-100 on prompt tokens), or use --labels auto/full to train every token",
        )),
    }
}

/// The first message (`message 3 (assistant)`, 1-based) or the tool declarations whose text, keys
/// included, contains one of `markers`, and the marker.
fn marker_in_data<'a>(conv: &Conversation, markers: &'a TurnMarkers) -> Option<(String, &'a str)> {
    let messages = conv.messages.try_iter().into_iter().flatten().enumerate();
    for (i, message) in messages {
        if let Some(marker) = marker_in_value(&message, markers) {
            let role = message.get_attr("role").ok().filter(|r| !r.is_undefined());
            let role = role.map_or(String::new(), |r| format!(" ({r})"));
            return Some((format!("message {}{role}", i + 1), marker));
        }
    }
    let tools = conv.tools.as_ref()?;
    marker_in_value(tools, markers).map(|marker| ("the tool declarations".into(), marker))
}

/// The first marker in any string of `v` (map keys included).
fn marker_in_value<'a>(v: &minijinja::Value, markers: &'a TurnMarkers) -> Option<&'a str> {
    if let Some(s) = v.as_str() {
        return markers.found_in(s);
    }
    let items = v.try_iter().ok()?;
    let is_map = v.kind() == minijinja::value::ValueKind::Map;
    items.into_iter().find_map(|item| {
        let value = if is_map { v.get_item(&item).ok() } else { None };
        marker_in_value(&item, markers).or_else(|| value.and_then(|x| marker_in_value(&x, markers)))
    })
}

fn all_trained(ids: Vec<u32>) -> (Vec<u32>, Vec<i32>) {
    let labels = ids.iter().map(|&i| i as i32).collect();
    (ids, labels)
}

/// The parts of `spans` at or after byte `from`.
fn clip(spans: &[Range<usize>], from: usize) -> Vec<Range<usize>> {
    spans
        .iter()
        .filter(|r| r.end > from)
        .map(|r| r.start.max(from)..r.end)
        .collect()
}

fn truncate(mut ids: Vec<u32>, mut labels: Vec<i32>, max_len: usize) -> Result<Encoded, RowError> {
    let truncated = ids.len() > max_len;
    ids.truncate(max_len);
    labels.truncate(max_len);
    check_trainable(&labels, max_len, truncated)?;
    Ok(Encoded {
        input_ids: ids,
        labels,
        truncated,
    })
}

/// Errors when no label after position 0 is trained (nothing for the shifted loss to learn).
pub fn check_trainable(labels: &[i32], max_len: usize, truncated: bool) -> Result<(), RowError> {
    if labels::count_targets(labels) == 0 {
        let why = if truncated {
            format!(" after truncation to max_len {max_len}")
        } else if labels.iter().all(|&l| l == IGNORE) {
            " (every label is -100)".to_string()
        } else {
            " (a target needs at least 2 tokens)".to_string()
        };
        return Err(RowError::new(
            SkipReason::NoTrainableToken,
            format!("no trainable token{why}"),
        ));
    }
    Ok(())
}
