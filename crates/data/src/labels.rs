//! Label modes and the assistant spans of a rendered Gemma 4 conversation.
//!
//! `full` trains every token (the post's `labels = input_ids` before padding). `assistant_only`
//! trains the tokens of assistant turns including their `<turn|>` end token; everything else is
//! -100. Gemma 4's template has no `{% generation %}` markers, and its generation prompt
//! (`<|turn>model\n<|channel>thought\n<channel|>` with thinking off) is not a prefix of the
//! rendered conversation, so the spans are found in the full rendering: each `<|turn>model\n`
//! header opens a span that ends after the next `<turn|>`; when the template continues the same
//! model turn (consecutive assistant messages share one header), the text after `<turn|>\n`
//! that does not start a new `<|turn>` is another span. The newline after `<turn|>` is not
//! trained (generation stops at `<turn|>`). A token is trained when its byte span overlaps a
//! span. The number of spans must equal the number of assistant messages, otherwise the row is
//! rejected (a template without these markers, or user text containing them).

use std::ops::Range;

/// Ignored label value (PyTorch's `ignore_index`).
pub const IGNORE: i32 = -100;

/// Which tokens are trained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LabelMode {
    /// Every token (as in the post).
    #[default]
    Full,
    /// Only assistant-turn tokens, including their end-of-turn token.
    AssistantOnly,
}

impl std::str::FromStr for LabelMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "full" => Ok(LabelMode::Full),
            "assistant_only" => Ok(LabelMode::AssistantOnly),
            other => Err(format!(
                "unknown label mode {other:?} (expected full or assistant_only)"
            )),
        }
    }
}

impl LabelMode {
    /// `full` or `assistant_only`.
    pub fn as_str(self) -> &'static str {
        match self {
            LabelMode::Full => "full",
            LabelMode::AssistantOnly => "assistant_only",
        }
    }
}

/// The turn markers of the chat format (Gemma 4's by default).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnMarkers {
    /// Opens every turn: `<|turn>`.
    pub turn_start: String,
    /// Opens a model turn: `<|turn>model\n`.
    pub model_header: String,
    /// Ends a turn: `<turn|>`.
    pub turn_end: String,
}

impl Default for TurnMarkers {
    fn default() -> Self {
        TurnMarkers {
            turn_start: "<|turn>".into(),
            model_header: "<|turn>model\n".into(),
            turn_end: "<turn|>".into(),
        }
    }
}

/// Byte ranges of trained assistant text (content through `<turn|>`) in a rendering.
pub fn assistant_spans(text: &str, m: &TurnMarkers) -> Vec<Range<usize>> {
    let mut spans = Vec::new();
    let mut pos = 0;
    while let Some(h) = text[pos..].find(&m.model_header) {
        let mut start = pos + h + m.model_header.len();
        loop {
            let end = text[start..]
                .find(&m.turn_end)
                .map_or(text.len(), |e| start + e + m.turn_end.len());
            spans.push(start..end);
            pos = end;
            let rest = text[end..].strip_prefix('\n').unwrap_or(&text[end..]);
            if rest.is_empty() || rest.starts_with(&m.turn_start) {
                break;
            }
            start = text.len() - rest.len(); // same model turn continues without a header
        }
    }
    spans
}

/// Labels for token byte `offsets`: the token id where the token overlaps a span, else -100.
pub fn mask_by_spans(ids: &[u32], offsets: &[(usize, usize)], spans: &[Range<usize>]) -> Vec<i32> {
    let mut k = 0;
    ids.iter()
        .zip(offsets)
        .map(|(&id, &(a, b))| {
            while k < spans.len() && spans[k].end <= a {
                k += 1;
            }
            let trained = k < spans.len() && spans[k].start < b && a < spans[k].end;
            if trained {
                id as i32
            } else {
                IGNORE
            }
        })
        .collect()
}

/// Number of targets a shifted causal-LM loss uses: labels after position 0 that are not -100.
pub fn count_targets(labels: &[i32]) -> usize {
    labels.iter().skip(1).filter(|&&l| l != IGNORE).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spans_text(text: &str) -> Vec<&str> {
        assistant_spans(text, &TurnMarkers::default())
            .into_iter()
            .map(|r| &text[r])
            .collect()
    }

    #[test]
    fn finds_model_turns_and_continuations() {
        let t = "<bos><|turn>user\nq<turn|>\n<|turn>model\na<turn|>\nb<turn|>\n<|turn>user\nr<turn|>\n<|turn>model\n<turn|>\n";
        assert_eq!(spans_text(t), vec!["a<turn|>", "b<turn|>", "<turn|>"]);
    }

    #[test]
    fn unterminated_turn_runs_to_end() {
        assert_eq!(spans_text("<|turn>model\nabc"), vec!["abc"]);
        assert!(spans_text("<|turn>user\nabc<turn|>\n").is_empty());
    }

    #[test]
    fn mask_uses_overlap() {
        // tokens: [0,2) [2,4) [4,6); span [3,5) overlaps tokens 1 and 2
        let labels = mask_by_spans(
            &[7, 8, 9],
            &[(0, 2), (2, 4), (4, 6)],
            &[Range { start: 3, end: 5 }],
        );
        assert_eq!(labels, vec![-100, 8, 9]);
        assert_eq!(count_targets(&labels), 2);
        assert_eq!(count_targets(&[5, -100]), 0);
    }

    #[test]
    fn parse_mode() {
        assert_eq!(
            "assistant_only".parse::<LabelMode>(),
            Ok(LabelMode::AssistantOnly)
        );
        assert!("all".parse::<LabelMode>().is_err());
    }
}
