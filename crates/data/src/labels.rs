//! Label modes and the trained spans of a rendered Gemma 4 conversation.
//!
//! `auto` (the default) trains what the format implies: every token of chat, ShareGPT and text
//! rows (the post's `labels = input_ids`), the completion of prompt/completion rows, the labels of
//! pre-tokenized rows. `full` trains every token of every row. `assistant_only` trains the model
//! turns of conversations (for prompt/completion rows: those of the completion), the completion
//! of string prompt/completion rows, and the labels pre-tokenized rows carry (rows without labels
//! are an error); plain text has no assistant part and is rejected.
//!
//! Gemma 4's template has no `{% generation %}` markers, and its generation prompt is not a
//! prefix of the rendered conversation (the big models add an empty thought channel), so the
//! model's spans are found in the full rendering from its turn markers (docs/data.md states the
//! rule with examples). A model turn starts after each `<|turn>model\n` header. Trained: from
//! there up to and including the token that ends the model's segment: the `<turn|>` that closes
//! the turn, or, after a tool call, the `<|tool_response>` the model emits to hand over. Not
//! trained: the tool-response payload the template inserts after it (`response:...` through
//! `<tool_response|>`, and any further `<|tool_response>response:...<tool_response|>` blocks right
//! after); a handover that no `response:` follows (a call left unanswered) has no payload. The
//! model's text after the handover is trained again up to its `<turn|>`; a turn left open after
//! it (the next `<|turn>` follows, or the text ends) has nothing trained after it.
//! The newline after `<turn|>` is never trained (generation stops at `<turn|>`); when the same
//! turn continues after it (consecutive assistant messages share one header), the continuation is
//! trained. A token is trained when its byte span overlaps a trained span. The number of model
//! headers must equal the number of assistant-message runs, otherwise the row is rejected (a
//! template without these markers, or message text containing them).

use std::ops::Range;

/// Ignored label value (PyTorch's `ignore_index`).
pub const IGNORE: i32 = -100;

/// Which tokens are trained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LabelMode {
    /// What the format implies (see the module doc).
    #[default]
    Auto,
    /// Every token.
    Full,
    /// The model's turns (or completion) only, including their end-of-turn token.
    AssistantOnly,
}

impl std::str::FromStr for LabelMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(LabelMode::Auto),
            "full" => Ok(LabelMode::Full),
            "assistant_only" => Ok(LabelMode::AssistantOnly),
            other => Err(format!(
                "unknown label mode {other:?} (expected auto, full or assistant_only)"
            )),
        }
    }
}

impl LabelMode {
    /// `auto`, `full` or `assistant_only`.
    pub fn as_str(self) -> &'static str {
        match self {
            LabelMode::Auto => "auto",
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
    /// Opens a tool response; the model emits it to hand over after a tool call.
    pub response_start: String,
    /// Starts the payload the template writes after `response_start` (`response:`).
    pub payload_start: String,
    /// Ends a tool response.
    pub response_end: String,
}

impl Default for TurnMarkers {
    fn default() -> Self {
        TurnMarkers {
            turn_start: "<|turn>".into(),
            model_header: "<|turn>model\n".into(),
            turn_end: "<turn|>".into(),
            response_start: "<|tool_response>".into(),
            payload_start: "response:".into(),
            response_end: "<tool_response|>".into(),
        }
    }
}

impl TurnMarkers {
    /// The first marker the span scan looks for (turn start and end, tool response start and end)
    /// that `text` contains. Data text holding one would be read as the template's own.
    pub fn found_in(&self, text: &str) -> Option<&str> {
        [
            &self.turn_start,
            &self.turn_end,
            &self.response_start,
            &self.response_end,
        ]
        .into_iter()
        .find(|m| text.contains(m.as_str()))
        .map(String::as_str)
    }
}

/// The trained byte ranges of a rendering and the number of model turns they came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelSpans {
    /// Trained byte ranges, in order, not overlapping.
    pub spans: Vec<Range<usize>>,
    /// `<|turn>model\n` headers found.
    pub turns: usize,
}

/// What ends a trained stretch of a model turn.
enum Stop {
    TurnEnd,
    Handover,
    NextTurn,
}

/// The trained spans of a rendering (see the module doc for the rule).
pub fn model_spans(text: &str, m: &TurnMarkers) -> ModelSpans {
    let mut spans = Vec::new();
    let mut turns = 0;
    let mut pos = 0;
    let push = |spans: &mut Vec<Range<usize>>, r: Range<usize>| {
        if !r.is_empty() {
            spans.push(r);
        }
    };
    while let Some(h) = text[pos..].find(&m.model_header) {
        turns += 1;
        let mut start = pos + h + m.model_header.len();
        loop {
            let rest = &text[start..];
            let next = [
                (rest.find(&m.turn_end), Stop::TurnEnd),
                (rest.find(&m.response_start), Stop::Handover),
                (rest.find(&m.turn_start), Stop::NextTurn),
            ]
            .into_iter()
            .filter_map(|(at, stop)| at.map(|a| (a, stop)))
            .min_by_key(|(a, _)| *a);
            let Some((at, stop)) = next else {
                push(&mut spans, start..text.len()); // unterminated turn (truncated text)
                pos = text.len();
                break;
            };
            let after = match stop {
                Stop::NextTurn => {
                    push(&mut spans, start..start + at);
                    pos = start + at;
                    break;
                }
                Stop::TurnEnd => {
                    let end = start + at + m.turn_end.len();
                    push(&mut spans, start..end);
                    end + usize::from(text[end..].starts_with('\n'))
                }
                Stop::Handover => {
                    let end = start + at + m.response_start.len();
                    push(&mut spans, start..end);
                    let mut p = end;
                    if text[p..].starts_with(&m.payload_start) {
                        p = past(text, p, &m.response_end);
                        let block = format!("{}{}", m.response_start, m.payload_start);
                        while text[p..].starts_with(&block) {
                            p = past(text, p + block.len(), &m.response_end);
                        }
                    }
                    p
                }
            };
            pos = after;
            if after == text.len() || text[after..].starts_with(&m.turn_start) {
                break; // the turn ended, or was left open after a payload
            }
            start = after; // the same model turn goes on
        }
    }
    ModelSpans { spans, turns }
}

/// The position right after the next `marker` at or after `from` (the end when there is none).
fn past(text: &str, from: usize, marker: &str) -> usize {
    text[from..]
        .find(marker)
        .map_or(text.len(), |i| from + i + marker.len())
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
        model_spans(text, &TurnMarkers::default())
            .spans
            .into_iter()
            .map(|r| &text[r])
            .collect()
    }

    #[test]
    fn finds_model_turns_and_continuations() {
        let t = "<bos><|turn>user\nq<turn|>\n<|turn>model\na<turn|>\nb<turn|>\n<|turn>user\nr<turn|>\n<|turn>model\n<turn|>\n";
        assert_eq!(spans_text(t), vec!["a<turn|>", "b<turn|>", "<turn|>"]);
        assert_eq!(model_spans(t, &TurnMarkers::default()).turns, 2);
    }

    #[test]
    fn tool_payloads_are_not_trained() {
        let call = "<|tool_call>call:f{x:1}<tool_call|>";
        // call, two responses, then the answer in the same turn
        let t = format!(
            "<|turn>user\nq<turn|>\n<|turn>model\n{call}<|tool_response>response:f{{v:1}}<tool_response|>\
             <|tool_response>response:g{{v:2}}<tool_response|>It is 1.<turn|>\n"
        );
        assert_eq!(
            spans_text(&t),
            vec![
                format!("{call}<|tool_response>").as_str(),
                "It is 1.<turn|>"
            ]
        );
        // a turn left open after the payload: nothing after it is trained
        let t = format!(
            "<|turn>model\n{call}<|tool_response>response:f{{}}<tool_response|><|turn>user\nok<turn|>\n"
        );
        assert_eq!(
            spans_text(&t),
            vec![format!("{call}<|tool_response>").as_str()]
        );
        // a second call after the first payload, and a payload that is never closed
        let t = format!(
            "<|turn>model\n{call}<|tool_response>response:r<tool_response|>{call}<|tool_response>response:r2"
        );
        assert_eq!(
            spans_text(&t),
            vec![
                format!("{call}<|tool_response>"),
                format!("{call}<|tool_response>")
            ]
        );
    }

    #[test]
    fn unanswered_call_has_no_payload() {
        let call = "<|tool_call>call:f{}<tool_call|>";
        // the next assistant message goes on in the same turn
        let t = format!("<|turn>model\n{call}<|tool_response>Done.<turn|>\n");
        assert_eq!(
            spans_text(&t),
            vec![format!("{call}<|tool_response>").as_str(), "Done.<turn|>"]
        );
        // the turn is left open; the next model turn counts and is trained
        let t = format!(
            "<|turn>model\n{call}<|tool_response><|turn>user\nok<turn|>\n<|turn>model\n\
             x<|tool_response>response:f{{}}<tool_response|>y<turn|>\n"
        );
        assert_eq!(
            spans_text(&t),
            vec![
                format!("{call}<|tool_response>").as_str(),
                "x<|tool_response>",
                "y<turn|>"
            ]
        );
        assert_eq!(model_spans(&t, &TurnMarkers::default()).turns, 2);
    }

    #[test]
    fn unterminated_turn_runs_to_end() {
        assert_eq!(spans_text("<|turn>model\nabc"), vec!["abc"]);
        assert!(spans_text("<|turn>user\nabc<turn|>\n").is_empty());
        assert_eq!(spans_text("<|turn>model\nab<|turn>user\n"), vec!["ab"]);
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
        assert_eq!("auto".parse::<LabelMode>(), Ok(LabelMode::Auto));
        assert!("all".parse::<LabelMode>().is_err());
    }
}
