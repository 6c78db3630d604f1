//! Talks to a Gemma 4 checkpoint — the base, the base with a trained LoRA adapter (unmerged), or
//! a merged model — with the same model code training uses.
//!
//! ```text
//! cargo run --release --example generate -- --model DIR_OR_ID [--adapter DIR] \
//!     (--prompt TEXT | --chat FILE.jsonl | --input-ids FILE.jsonl | --interactive) \
//!     [--max-new-tokens N] [--greedy | --temperature T --top-p P --top-k K --seed S] \
//!     [--ignore-eos | --stop-ids ID,ID] [--batch-size B] [--dtype auto|f32|bf16] [--device auto|cpu|cuda]
//! ```
//! - `--prompt TEXT`: one user turn through the model's chat template (with the generation
//!   prompt); prints the decoded reply.
//! - `--chat FILE.jsonl`: rows `{"messages": [...]}` (the training format); a trailing assistant
//!   message (the training target) is left out of the prompt. Prints one JSON line per row,
//!   `{"reply": TEXT, "finish_reason": "stop"|"length"}`.
//! - `--input-ids FILE.jsonl`: rows `{"input_ids": [...]}` (other keys ignored), used as they are;
//!   prints one JSON line per row `{"output_ids": [...]}`: the new tokens only (a final stop token
//!   included).
//! - `--interactive`: a multi-turn chat on stdin, the template re-rendered each turn and the reply
//!   streamed; `/reset` starts over, an empty line or end of input quits.
//!
//! Decoding: without sampling flags, what `generation_config.json` asks for (greedy unless
//! `do_sample`); `--greedy` forces greedy; any of `--temperature/--top-k/--top-p` samples (defaults
//! from `generation_config.json`, else transformers' 1.0 / 50 / 1.0), seeded by `--seed` (batch `i`
//! of a file uses `seed + i`). Rows stop on the `eos_token_id`s of `generation_config.json` (Gemma 4
//! -it: `<eos>` and the end-of-turn `<turn|>`; without the file, `config.json`'s), replaced by
//! `--stop-ids`, or never with `--ignore-eos`. Rows go `--batch-size` at a time, left padded.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{ArgGroup, Parser};
use g4ft::data::rows::{self, Format, Row};
use g4ft::data::{Encoder, RenderOptions};
use g4ft::gemma4::{Gemma4Model, ModelFiles};
use g4ft::generate::{
    generate, FinishReason, GenerateOptions, Generation, GenerationConfig, Sampling, SamplingParams,
};
use g4ft::lora::LoraContext;
use serde_json::{json, Value};

#[derive(Parser, Debug)]
#[command(about = "Generate text with a Gemma 4 checkpoint, optionally with a LoRA adapter")]
#[command(group(ArgGroup::new("input").args(["prompt", "chat", "input_ids", "interactive"]).required(true)))]
pub struct Args {
    /// Model directory (config.json + safetensors + tokenizer) or Hugging Face Hub id.
    #[arg(long)]
    pub model: String,
    /// PEFT LoRA adapter directory, applied unmerged.
    #[arg(long)]
    pub adapter: Option<PathBuf>,
    /// One user message; prints the reply.
    #[arg(long)]
    pub prompt: Option<String>,
    /// Chat JSONL ({"messages": [...]} per line); prints {"reply", "finish_reason"} per line.
    #[arg(long)]
    pub chat: Option<PathBuf>,
    /// Token JSONL ({"input_ids": [...]} per line); prints {"output_ids"} per line.
    #[arg(long)]
    pub input_ids: Option<PathBuf>,
    /// Multi-turn chat on stdin.
    #[arg(long)]
    pub interactive: bool,
    /// New tokens per reply at most.
    #[arg(long, default_value_t = 256)]
    pub max_new_tokens: usize,
    /// Greedy decoding, whatever generation_config.json says.
    #[arg(long, conflicts_with_all = ["temperature", "top_p", "top_k"])]
    pub greedy: bool,
    /// Sampling temperature (> 0).
    #[arg(long)]
    pub temperature: Option<f64>,
    /// Nucleus sampling mass in (0, 1].
    #[arg(long)]
    pub top_p: Option<f64>,
    /// Sample among the K most likely tokens (0 = all).
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Sampling seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Never stop before --max-new-tokens.
    #[arg(long, conflicts_with = "stop_ids")]
    pub ignore_eos: bool,
    /// Stop ids replacing generation_config.json's eos_token_id, comma separated.
    #[arg(long, value_delimiter = ',')]
    pub stop_ids: Option<Vec<u32>>,
    /// Rows per forward.
    #[arg(long, default_value_t = 8)]
    pub batch_size: usize,
    #[command(flatten)]
    pub run_on: g4ft::InferenceSettings,
}

/// The loaded model with everything decoding needs.
struct Session {
    model: Gemma4Model,
    dir: PathBuf,
    opts: GenerateOptions,
}

impl Session {
    fn open(args: &Args) -> Result<Self> {
        if args.batch_size == 0 {
            bail!("--batch-size must be at least 1");
        }
        let (device, dtype, note) = args.run_on.resolve()?;
        if let Some(note) = note {
            eprintln!("{note}");
        }
        let model =
            g4ft::load_inference_model(&args.model, args.adapter.as_deref(), &device, dtype)?;
        let files = ModelFiles::resolve(&args.model)?;
        let dir = files
            .config
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        let gen_cfg = GenerationConfig::from_model_dir(&dir)?;
        let stop_token_ids = if args.ignore_eos {
            Vec::new()
        } else {
            args.stop_ids
                .clone()
                .unwrap_or_else(|| gen_cfg.eos_token_ids.clone())
        };
        let vocab = model.config().vocab_size;
        if let Some(bad) = stop_token_ids.iter().find(|&&id| id as usize >= vocab) {
            bail!("stop id {bad} is outside the vocabulary (size {vocab})");
        }
        let sampling = if args.greedy {
            Sampling::Greedy
        } else if args.temperature.is_some() || args.top_p.is_some() || args.top_k.is_some() {
            let p = SamplingParams {
                temperature: args.temperature.or(gen_cfg.temperature).unwrap_or(1.0),
                top_k: args.top_k.or(gen_cfg.top_k).unwrap_or(50),
                top_p: args.top_p.or(gen_cfg.top_p).unwrap_or(1.0),
                seed: args.seed,
            };
            p.validate()?;
            Sampling::Random(p)
        } else {
            gen_cfg.default_sampling(args.seed)
        };
        let pad_token_id = gen_cfg.pad_token_id.unwrap_or(model.config().pad_token_id);
        let opts = GenerateOptions {
            max_new_tokens: args.max_new_tokens,
            sampling,
            stop_token_ids,
            pad_token_id,
        };
        Ok(Session { model, dir, opts })
    }

    /// Generates for `rows`, `batch_size` at a time; batch `i` samples with `seed + i`.
    fn run_rows(&self, rows: &[Vec<u32>], batch_size: usize) -> Result<Vec<Generation>> {
        let mut out = Vec::with_capacity(rows.len());
        for (i, chunk) in rows.chunks(batch_size).enumerate() {
            let opts = self.batch_options(i as u64);
            out.extend(generate(
                &self.model,
                chunk,
                &opts,
                &LoraContext::EVAL,
                |_| Ok::<(), anyhow::Error>(()),
            )?);
        }
        Ok(out)
    }

    fn batch_options(&self, batch: u64) -> GenerateOptions {
        let mut opts = self.opts.clone();
        if let Sampling::Random(p) = &mut opts.sampling {
            p.seed = p.seed.wrapping_add(batch);
        }
        opts
    }

    fn encoder(&self) -> Result<Encoder> {
        Encoder::from_model_dir(&self.dir)
            .with_context(|| format!("tokenizer and chat template of {}", self.dir.display()))
    }
}

/// The prompt ids of a conversation (`messages`: a JSON list of message objects, as in training
/// rows): the chat template with the generation prompt, tokenized without special tokens (the
/// template writes `<bos>`).
pub(crate) fn chat_prompt(encoder: &Encoder, messages: &[Value]) -> Result<Vec<u32>, String> {
    let opts = RenderOptions {
        add_generation_prompt: true,
        enable_thinking: None,
    };
    let row =
        rows::parse_json(&json!({ "messages": messages }).to_string()).map_err(|e| e.reason)?;
    let conv = match rows::parse(&row, Format::Chat, None) {
        Ok(Row::Chat(chat)) => chat.conversation,
        Ok(_) => return Err("not a conversation".into()),
        Err(e) => return Err(e.reason),
    };
    let text = encoder
        .template()
        .map_err(|e| e.to_string())?
        .render(&conv, opts)?;
    Ok(encoder.tokenize(&text).map_err(|e| e.reason)?.0)
}

/// A message object `{"role": role, "content": text}`.
pub(crate) fn message(role: &str, text: &str) -> Value {
    json!({"role": role, "content": text})
}

/// One JSONL line parsed as `format` (`vocab` bounds token ids).
fn parse_line(line: &str, format: Format, vocab: Option<usize>) -> Result<Row, String> {
    let value = rows::parse_json(line).map_err(|e| e.reason)?;
    rows::parse(&value, format, vocab).map_err(|e| e.reason)
}

/// The reply text: new tokens without the stop token, special tokens skipped.
fn reply_text(encoder: &Encoder, g: &Generation) -> Result<String> {
    let n = g.tokens.len() - usize::from(g.finish_reason == FinishReason::Stop);
    encoder
        .tokenizer()
        .decode(&g.tokens[..n], true)
        .map_err(|e| anyhow::anyhow!("decoding the reply: {e}"))
}

/// Non-blank lines of a JSONL file with their 1-based numbers.
fn jsonl_lines(path: &Path) -> Result<Vec<(usize, String)>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let lines: Vec<(usize, String)> = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| (i + 1, l.to_string()))
        .collect();
    if lines.is_empty() {
        bail!("{}: no rows", path.display());
    }
    Ok(lines)
}

/// Runs the command on `args`, reading the interactive chat from `input` and writing to `out`.
pub fn run(args: &Args, input: &mut dyn BufRead, out: &mut dyn Write) -> Result<()> {
    let s = Session::open(args)?;
    if let Some(path) = &args.input_ids {
        let vocab = s.model.config().vocab_size;
        let rows = jsonl_lines(path)?
            .into_iter()
            .map(|(n, line)| {
                match parse_line(&line, Format::Tokens, Some(vocab)) {
                    Ok(Row::Tokens(r)) => Ok(r.input_ids),
                    Ok(_) => Err("expected {\"input_ids\": [...]}".to_string()),
                    Err(e) => Err(e),
                }
                .map_err(|e| anyhow::anyhow!("{}:{n}: {e}", path.display()))
            })
            .collect::<Result<Vec<_>>>()?;
        for g in s.run_rows(&rows, args.batch_size)? {
            writeln!(out, "{}", serde_json::json!({"output_ids": g.tokens}))?;
        }
    } else if let Some(path) = &args.chat {
        let encoder = s.encoder()?;
        let rows = jsonl_lines(path)?
            .into_iter()
            .map(|(n, line)| {
                let messages = serde_json::from_str::<Value>(&line)
                    .map_err(|e| e.to_string())
                    .and_then(|row| match row.get("messages") {
                        Some(Value::Array(m)) => Ok(m.clone()),
                        _ => Err("expected {\"messages\": [...]}".to_string()),
                    });
                let prompt = messages.and_then(|mut messages| {
                    if messages
                        .last()
                        .and_then(|m| m.get("role"))
                        .and_then(Value::as_str)
                        == Some("assistant")
                    {
                        messages.pop();
                    }
                    if messages.is_empty() {
                        return Err("no message before the assistant reply".to_string());
                    }
                    chat_prompt(&encoder, &messages)
                });
                prompt.map_err(|e| anyhow::anyhow!("{}:{n}: {e}", path.display()))
            })
            .collect::<Result<Vec<_>>>()?;
        for g in s.run_rows(&rows, args.batch_size)? {
            let line = serde_json::json!({
                "reply": reply_text(&encoder, &g)?,
                "finish_reason": g.finish_reason.as_str(),
            });
            writeln!(out, "{line}")?;
        }
    } else if let Some(text) = &args.prompt {
        let encoder = s.encoder()?;
        let messages = [message("user", text)];
        let ids = chat_prompt(&encoder, &messages).map_err(|e| anyhow::anyhow!("--prompt: {e}"))?;
        let g = s.run_rows(&[ids], 1)?.remove(0);
        writeln!(out, "{}", reply_text(&encoder, &g)?)?;
    } else {
        interactive(&s, input, out)?;
    }
    Ok(())
}

/// The multi-turn chat: each reply streamed as it is decoded, then kept in the history.
fn interactive(s: &Session, input: &mut dyn BufRead, out: &mut dyn Write) -> Result<()> {
    let encoder = s.encoder()?;
    let mut messages: Vec<Value> = Vec::new();
    for turn in 0u64.. {
        write!(out, "> ")?;
        out.flush()?;
        let mut line = String::new();
        if input.read_line(&mut line)? == 0 || line.trim().is_empty() {
            break;
        }
        if line.trim() == "/reset" {
            messages.clear();
            continue;
        }
        messages.push(message("user", line.trim()));
        let ids = chat_prompt(&encoder, &messages).map_err(|e| anyhow::anyhow!("{e}"))?;
        let (mut shown, mut tokens) = (String::new(), Vec::new());
        let opts = s.batch_options(turn);
        let g = generate(&s.model, &[ids], &opts, &LoraContext::EVAL, |step| {
            if !opts.stop_token_ids.contains(&step.tokens[0]) {
                tokens.push(step.tokens[0]);
                let text = encoder
                    .tokenizer()
                    .decode(&tokens, true)
                    .unwrap_or_default();
                // Print what was added, once it decodes to whole characters.
                if let Some(new) = text.strip_prefix(shown.as_str()) {
                    if !new.is_empty() && !new.ends_with('\u{fffd}') {
                        write!(out, "{new}")?;
                        out.flush()?;
                        shown = text;
                    }
                }
            }
            Ok::<(), anyhow::Error>(())
        })?
        .remove(0);
        let reply = reply_text(&encoder, &g)?;
        writeln!(out, "{}", reply.strip_prefix(shown.as_str()).unwrap_or(""))?;
        messages.push(message("assistant", &reply));
    }
    Ok(())
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let result = run(
        &args,
        &mut std::io::stdin().lock(),
        &mut std::io::stdout().lock(),
    );
    g4ft::trainer::config::cli::exit_code("", result)
}
