//! Generation speed: prefill and decode tokens/s of `g4ft_generate::generate` (greedy, no early
//! stop) for each batch size, and the KV cache's memory, on a Gemma 4 built from a config with
//! random weights (`Gemma4Model::random_init`) or loaded from a checkpoint, with random prompt ids.
//!
//! Per batch size: one short warm-up generation; then the cache of one prefill (allocated bytes,
//! and bytes per token of the full-attention layers, the part that grows with the sequence; the
//! sliding layers hold a fixed window); then `--iters` timed generations of `--new-tokens`
//! tokens. A generation is timed from its call to the first step (prefill + first token: the
//! prefill time) and from the first to the last step (decode: `new_tokens − 1` steps, each one
//! forward + argmax, which synchronises the device). Prints a Markdown table (medians over the
//! iterations).
//!
//! ```text
//! cargo run --release --example bench_generate -- --config assets/tiny/config.json \
//!     --dtype f32 --device cpu --prompt-len 64 --new-tokens 16 --batch-sizes 1,2
//! cargo run --release --features cuda --example bench_generate -- \
//!     --config crates/gemma4/tests/configs/gemma-4-12B-it.json --dtype bf16 --device cuda \
//!     --prompt-len 512 --new-tokens 128 --batch-sizes 1,8 [--lora-r 16]
//! ```
//! `tools/reference/generate/bench_hf.py` times transformers' `generate` the same way;
//! `tools/gpu/run_generate_bench.sh` runs both in one call.

use std::time::Instant;

use anyhow::{bail, Result};
use clap::Parser;
use g4ft::gemma4::{Config, Gemma4Model};
use g4ft::generate::{generate, GenerateError, GenerateOptions, Sampling};
use g4ft::lora::{attach, InitLoraWeights, LoraConfig, LoraContext, TargetModules};

#[derive(Parser, Debug)]
#[command(about = "Prefill / decode speed and KV-cache memory of generation")]
struct Args {
    /// config.json to build a random-weight model from.
    #[arg(long, conflicts_with = "model", required_unless_present = "model")]
    config: Option<String>,
    /// Checkpoint directory or Hub id instead of random weights.
    #[arg(long)]
    model: Option<String>,
    #[command(flatten)]
    run_on: g4ft::InferenceSettings,
    /// Prompt tokens per row.
    #[arg(long, default_value_t = 512)]
    prompt_len: usize,
    /// New tokens per row.
    #[arg(long, default_value_t = 128)]
    new_tokens: usize,
    /// Batch sizes to measure, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "1,8")]
    batch_sizes: Vec<usize>,
    /// Timed generations per batch size.
    #[arg(long, default_value_t = 3)]
    iters: usize,
    /// Attach a random LoRA adapter of this rank to the seven projections (0 = none), unmerged.
    #[arg(long, visible_alias = "lora-rank", default_value_t = 0)]
    lora_r: usize,
    /// Seed of the weights, adapter and prompt ids.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn main() -> std::process::ExitCode {
    g4ft::trainer::config::cli::exit_code("", run(&Args::parse()))
}

fn run(args: &Args) -> Result<()> {
    if args.new_tokens < 2 || args.prompt_len == 0 || args.iters == 0 {
        bail!("--new-tokens must be >= 2, --prompt-len and --iters >= 1");
    }
    let (device, dtype, _) = args.run_on.resolve()?;
    let mut model = match (&args.config, &args.model) {
        (Some(cfg), _) => Gemma4Model::random_init(
            &Config::from_file(std::path::Path::new(cfg))?,
            dtype,
            &device,
            args.seed,
        )?,
        (None, Some(m)) => Gemma4Model::load(m, dtype, &device)?,
        (None, None) => unreachable!("clap requires --config or --model"),
    };
    if args.lora_r > 0 {
        let mut cfg = LoraConfig::new(
            args.lora_r,
            2.0 * args.lora_r as f64,
            TargetModules::Regex(
                r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"
                    .into(),
            ),
        );
        cfg.init_lora_weights = InitLoraWeights::Random;
        attach(&cfg, model.projections_mut(), args.seed)?;
    }
    let cfg = model.config().clone();
    println!(
        "model: {} layers, hidden {}, vocab {}, sliding window {}; {:?} on {}; LoRA rank {}",
        cfg.num_hidden_layers,
        cfg.hidden_size,
        cfg.vocab_size,
        cfg.sliding_window,
        dtype,
        if device.is_cuda() { "cuda" } else { "cpu" },
        args.lora_r
    );
    println!(
        "| batch | prompt | new | prefill ms | prefill tok/s | decode ms/step | decode tok/s | cache MiB | cache bytes/token |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let ctx = LoraContext::EVAL;
    for &b in &args.batch_sizes {
        // Random ids in [3, vocab): no pad / eos / bos inside, row-specific.
        let mut state = args.seed ^ 0x9e37_79b9_7f4a_7c15 ^ b as u64;
        let mut next = || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            3 + ((state >> 33) % (cfg.vocab_size as u64 - 3)) as u32
        };
        let prompts: Vec<Vec<u32>> = (0..b)
            .map(|_| (0..args.prompt_len).map(|_| next()).collect())
            .collect();
        let opts = |n: usize| GenerateOptions {
            max_new_tokens: n,
            sampling: Sampling::Greedy,
            stop_token_ids: Vec::new(),
            pad_token_id: cfg.pad_token_id,
        };
        generate(&model, &prompts, &opts(4), &ctx, |_| {
            Ok::<(), GenerateError>(())
        })?;
        let (ids, mask, t) = g4ft::generate::left_pad(&prompts, cfg.pad_token_id);
        let mut cache = model.new_cache(b, t + args.new_tokens)?;
        model.prefill(&mut cache, &ids, &mask, &ctx)?;
        let (cache_bytes, per_token) = (cache.bytes(), cache.bytes_per_token());
        drop(cache);
        let (mut prefill, mut decode) = (Vec::new(), Vec::new());
        for _ in 0..args.iters {
            let start = Instant::now();
            let (mut first, mut last) = (start, start);
            generate(&model, &prompts, &opts(args.new_tokens), &ctx, |s| {
                let now = Instant::now();
                if s.index == 0 {
                    first = now;
                }
                last = now;
                Ok::<(), GenerateError>(())
            })?;
            prefill.push((first - start).as_secs_f64());
            decode.push((last - first).as_secs_f64() / (args.new_tokens - 1) as f64);
        }
        let (p, d) = (median(prefill), median(decode));
        println!(
            "| {b} | {} | {} | {:.1} | {:.0} | {:.2} | {:.1} | {:.1} | {per_token} |",
            args.prompt_len,
            args.new_tokens,
            p * 1e3,
            (b * args.prompt_len) as f64 / p,
            d * 1e3,
            b as f64 / d,
            cache_bytes as f64 / (1 << 20) as f64,
        );
    }
    Ok(())
}
