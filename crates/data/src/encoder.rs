//! Chat row -> token ids and labels: template rendering, tokenization, labels, truncation.
//!
//! Mirrors the post's `ChatJsonl.__getitem__`: `apply_chat_template(messages, tokenize=False)`,
//! then `tokenizer(text, add_special_tokens=False, truncation=True, max_length=max_len)` (the
//! template already emits `<bos>`; exactly one BOS per sequence). Labels are computed on the
//! full rendering and truncated with the ids. An `Encoder` is `Sync`: rows encode in parallel.

use std::path::{Path, PathBuf};

use tokenizers::Tokenizer;

use crate::error::{DataError, Result};
use crate::hash::Fnv64;
use crate::labels::{self, LabelMode, TurnMarkers, IGNORE};
use crate::template::{ChatTemplate, Message, RenderOptions};

/// Byte span `(start, end)` of each token in the tokenized text.
pub type ByteOffsets = Vec<(usize, usize)>;

/// Tokenizer + chat template of a model directory.
pub struct Encoder {
    tokenizer: Tokenizer,
    template: ChatTemplate,
    render: RenderOptions,
    markers: TurnMarkers,
    pad_id: u32,
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
    /// Loads `tokenizer.json`, the chat template and the special tokens of `dir`. The pad id is
    /// `pad_token` of `tokenizer_config.json`, else `<pad>`, else 0 (Gemma 4's).
    pub fn from_model_dir(dir: &Path) -> Result<Self> {
        let tok_path = dir.join("tokenizer.json");
        let bytes = std::fs::read(&tok_path).map_err(|e| DataError::io(&tok_path, e))?;
        let tokenizer = Tokenizer::from_bytes(&bytes).map_err(|e| DataError::Tokenizer {
            path: tok_path.clone(),
            msg: e.to_string(),
        })?;
        let template = ChatTemplate::from_model_dir(dir)?;
        let pad_token = template
            .special_tokens()
            .iter()
            .find(|(k, _)| *k == "pad_token")
            .map(|(_, v)| v.as_str())
            .unwrap_or("<pad>");
        let pad_id = tokenizer.token_to_id(pad_token).unwrap_or(0);
        let mut h = Fnv64::default();
        h.field(&bytes);
        h.field(template.source().as_bytes());
        for (k, v) in template.special_tokens() {
            h.field(k.as_bytes());
            h.field(v.as_bytes());
        }
        Ok(Encoder {
            tokenizer,
            template,
            render: RenderOptions::default(),
            markers: TurnMarkers::default(),
            pad_id,
            fingerprint: h.finish(),
            dir: dir.to_path_buf(),
        })
    }

    /// Sets the `enable_thinking` template kwarg for every row (default: not passed).
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

    /// The chat template.
    pub fn template(&self) -> &ChatTemplate {
        &self.template
    }

    /// Renders a conversation (no generation prompt) with this encoder's options.
    pub fn render(&self, messages: &[Message]) -> Result<String, String> {
        self.template.render(messages, self.render)
    }

    /// Tokenizes text without adding special tokens; returns ids and byte offsets.
    pub fn tokenize(&self, text: &str) -> Result<(Vec<u32>, ByteOffsets), String> {
        let enc = self
            .tokenizer
            .encode(text, false)
            .map_err(|e| format!("tokenizer: {e}"))?;
        Ok((enc.get_ids().to_vec(), enc.get_offsets().to_vec()))
    }

    /// Encodes one conversation. Errors are row-level reasons (the caller adds file and line):
    /// a render failure, assistant spans that do not match the assistant messages, or no
    /// trainable target left after masking and truncation to `max_len`.
    pub fn encode_chat(
        &self,
        messages: &[Message],
        max_len: usize,
        mode: LabelMode,
    ) -> Result<Encoded, String> {
        let text = self.render(messages)?;
        let (mut ids, offsets) = self.tokenize(&text)?;
        let mut labels = match mode {
            LabelMode::Full => ids.iter().map(|&i| i as i32).collect(),
            LabelMode::AssistantOnly => {
                let spans = labels::assistant_spans(&text, &self.markers);
                let want = messages.iter().filter(|m| m.role == "assistant").count();
                if spans.len() != want {
                    return Err(format!(
                        "assistant_only: found {} model turn span(s) in the rendering, expected {want} \
                         (one per assistant message); the template must write Gemma 4 turn markers \
                         and contents must not contain them",
                        spans.len()
                    ));
                }
                labels::mask_by_spans(&ids, &offsets, &spans)
            }
        };
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
}

/// Errors when no label after position 0 is trained (nothing for the shifted loss to learn).
pub fn check_trainable(labels: &[i32], max_len: usize, truncated: bool) -> Result<(), String> {
    if labels::count_targets(labels) == 0 {
        let why = if truncated {
            format!(" after truncation to max_len {max_len}")
        } else if labels.iter().all(|&l| l == IGNORE) {
            " (every label is -100)".to_string()
        } else {
            " (a target needs at least 2 tokens)".to_string()
        };
        return Err(format!("no trainable token{why}"));
    }
    Ok(())
}
