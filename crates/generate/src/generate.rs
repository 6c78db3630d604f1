//! The decoding loop: left-pad the prompts, prefill them in one forward, then one token per row
//! and step until every row has stopped or `max_new_tokens` are out (transformers `generate`).
//!
//! A row stops on the first token in `stop_token_ids` (kept in its output, as transformers keeps
//! the EOS); rows that stopped are fed the pad token until the batch is done, as transformers
//! does, and their outputs end at the stop token.

use candle_core::{Tensor, D};
use g4ft_gemma4::Gemma4Model;
use g4ft_lora::LoraContext;

use crate::error::GenerateError;
use crate::sampling::{Sampler, Sampling};

/// What [`generate`] does.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateOptions {
    /// New tokens per row at most.
    pub max_new_tokens: usize,
    /// Greedy or sampling.
    pub sampling: Sampling,
    /// Tokens that end a row (empty: never stop early).
    pub stop_token_ids: Vec<u32>,
    /// Left padding of the prompts and the token fed to rows that stopped.
    pub pad_token_id: u32,
}

/// Why a row ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// It produced a stop token (the last of its tokens).
    Stop,
    /// It reached `max_new_tokens`.
    Length,
}

impl FinishReason {
    /// `stop` or `length` (the OpenAI / transformers-serve wording).
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// The new tokens of one row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Generation {
    /// New token ids, the stop token included.
    pub tokens: Vec<u32>,
    /// Why the row ended.
    pub finish_reason: FinishReason,
}

/// One decoding step, passed to the observer of [`generate`].
#[derive(Debug)]
pub struct Step<'a> {
    /// 0 for the first new token.
    pub index: usize,
    /// The softcapped fp32 logits `(b, vocab)` the tokens were chosen from.
    pub logits: &'a Tensor,
    /// The token of each row (the pad token for rows that had stopped before this step).
    pub tokens: &'a [u32],
    /// Whether each row had stopped before this step.
    pub stopped: &'a [bool],
}

/// Left-pads `prompts` with `pad`: row-major ids and attention mask `(b, t)` and `t`.
pub fn left_pad(prompts: &[Vec<u32>], pad: u32) -> (Vec<u32>, Vec<u32>, usize) {
    let t = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let (mut ids, mut mask) = (Vec::new(), Vec::new());
    for p in prompts {
        ids.extend(std::iter::repeat_n(pad, t - p.len()).chain(p.iter().copied()));
        mask.extend(std::iter::repeat_n(0, t - p.len()).chain(std::iter::repeat_n(1, p.len())));
    }
    (ids, mask, t)
}

/// Generates a continuation of every prompt (one batch, left padded). `on_step` sees every step
/// (streaming, tests); an error from it ends generation and is returned.
pub fn generate<E: From<GenerateError>>(
    model: &Gemma4Model,
    prompts: &[Vec<u32>],
    opts: &GenerateOptions,
    ctx: &LoraContext,
    mut on_step: impl FnMut(&Step) -> Result<(), E>,
) -> Result<Vec<Generation>, E> {
    let mut sampler = match opts.sampling {
        Sampling::Greedy => None,
        Sampling::Random(p) => Some(Sampler::new(p)?),
    };
    let b = prompts.len();
    let mut out: Vec<Generation> = (0..b)
        .map(|_| Generation {
            tokens: Vec::new(),
            finish_reason: FinishReason::Length,
        })
        .collect();
    if b == 0 || opts.max_new_tokens == 0 {
        return Ok(out);
    }
    if let Some(i) = prompts.iter().position(Vec::is_empty) {
        return Err(GenerateError::Option {
            option: "prompts",
            msg: format!("prompt {i} is empty"),
        }
        .into());
    }
    let (ids, mask, t) = left_pad(prompts, opts.pad_token_id);
    // The cache is allocated for the whole length at once: bound it by the model's.
    let limit = model.config().max_position_embeddings;
    if t.checked_add(opts.max_new_tokens).is_none_or(|n| n > limit) {
        return Err(GenerateError::Option {
            option: "max_new_tokens",
            msg: format!(
                "{} new tokens after a prompt of {t} exceed the model's max_position_embeddings \
                 ({limit})",
                opts.max_new_tokens
            ),
        }
        .into());
    }
    let model_err = |e: g4ft_gemma4::Error| E::from(GenerateError::from(e));
    let candle_err = |e: candle_core::Error| E::from(GenerateError::from(e));
    let mut cache = model
        .new_cache(b, t + opts.max_new_tokens)
        .map_err(model_err)?;
    let mut logits = model
        .prefill(&mut cache, &ids, &mask, ctx)
        .map_err(model_err)?;
    let mut stopped = vec![false; b];
    for index in 0..opts.max_new_tokens {
        let mut tokens = match &mut sampler {
            None => logits
                .argmax(D::Minus1)
                .and_then(|t| t.to_vec1::<u32>())
                .map_err(candle_err)?,
            Some(s) => logits
                .to_vec2::<f32>()
                .map_err(candle_err)?
                .iter()
                .map(|row| s.sample(row))
                .collect(),
        };
        for (tok, &done) in tokens.iter_mut().zip(&stopped) {
            if done {
                *tok = opts.pad_token_id;
            }
        }
        on_step(&Step {
            index,
            logits: &logits,
            tokens: &tokens,
            stopped: &stopped,
        })?;
        for r in 0..b {
            if stopped[r] {
                continue;
            }
            out[r].tokens.push(tokens[r]);
            if opts.stop_token_ids.contains(&tokens[r]) {
                stopped[r] = true;
                out[r].finish_reason = FinishReason::Stop;
            }
        }
        if stopped.iter().all(|&s| s) || index + 1 == opts.max_new_tokens {
            break;
        }
        logits = model
            .decode_step(&mut cache, &tokens, ctx)
            .map_err(model_err)?;
    }
    Ok(out)
}
