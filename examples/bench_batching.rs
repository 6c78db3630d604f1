//! Padding and training speed of the three batching modes (plain, `--group-by-length`,
//! `--packing`) on a long-tailed chat dataset made from the bundled sample data (the training step
//! of `train_ddp`: forward, layer-wise backward, no DDP). By default the tiny model on the CPU;
//! with `--config` a model of that size with random weights (`Gemma4Model::random_init`, as
//! `bench_train`), e.g. on a GPU. The data is always tokenized with the bundled tiny tokenizer,
//! whose ids (< 512) fit every Gemma 4 vocabulary.
//!
//! ```bash
//! cargo run --release --example bench_batching -- [--rows 2000] [--micro-batch 8] [--max-len 1024] [--batches 20]
//! cargo run --release --features cuda --example bench_batching -- \
//!     --config crates/gemma4/tests/configs/gemma-4-12B-it.json --device cuda --dtype bf16
//! ```
//! The dataset: row `i` joins `k` sample conversations, `k` Pareto-distributed (P(k >= x) =
//! x^-1.2, at most 40), so most rows are one or two short chats and a few are long, like real chat
//! data. Padding is counted over the whole epoch plan; tokens/s (non-padding tokens) over
//! `--batches` micro-batches of each mode spread evenly over the epoch (length grouping puts the
//! longest batches first in each window, so the first few would not be typical), after
//! `--warmup` untimed micro-batches per mode; each timed step ends with a device synchronize.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Parser;
use g4ft::data::{
    Batching, DataLoader, DatasetOptions, Encoder, LoaderConfig, PrepareOptions, TokenDataset,
};
use g4ft::ddp::DdpError;
use g4ft::gemma4::{Config, Gemma4Model};
use g4ft::lora::{self, AdapterGrads, LoraConfig, TargetModules};
use g4ft::trainer::config::{DTypeKind, DeviceKind, POST_LORA_TARGETS};
use g4ft::trainer::step::{self, GradSink};

#[derive(Parser, Debug)]
#[command(about = "Padding and tokens/s of plain, length-grouped and packed batches")]
struct Args {
    /// Rows of the generated dataset.
    #[arg(long, default_value_t = 2000)]
    rows: usize,
    /// Samples (or packed rows) per micro-batch.
    #[arg(long, default_value_t = 8)]
    micro_batch: usize,
    /// Truncation length, and the packed row length.
    #[arg(long, default_value_t = 1024)]
    max_len: usize,
    /// Micro-batches timed per mode, evenly spaced over the epoch.
    #[arg(long, default_value_t = 20)]
    batches: usize,
    /// Untimed micro-batches before each mode's timed ones (kernel loading, allocator warm-up).
    #[arg(long, default_value_t = 1)]
    warmup: usize,
    /// A Gemma 4 config.json (text or multimodal): time a model of that size with random
    /// weights instead of the bundled tiny model.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Where the step runs.
    #[arg(long, value_enum, default_value_t = DeviceKind::Cpu)]
    device: DeviceKind,
    /// Frozen weight / activation dtype.
    #[arg(long, value_enum, default_value_t = DTypeKind::F32)]
    dtype: DTypeKind,
    /// Where the dataset and its token cache go.
    #[arg(long, default_value = "target/bench-batching")]
    work: PathBuf,
}

/// Gradients go nowhere: one rank, no optimizer (the step's compute only).
struct Discard;

impl GradSink for Discard {
    fn report(&mut self, _: &AdapterGrads) -> std::result::Result<usize, DdpError> {
        Ok(0)
    }
}

fn main() -> std::process::ExitCode {
    g4ft::trainer::config::cli::exit_code("", run(&Args::parse()))
}

fn run(args: &Args) -> Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::fs::create_dir_all(&args.work)?;
    let data = args.work.join("long_tail.jsonl");
    write_long_tail(&root.join("assets/sample/chat.jsonl"), &data, args.rows)?;
    let tiny = root.join("assets/tiny");
    let encoder = Encoder::from_model_dir(&tiny)?;
    let opts = DatasetOptions {
        prepare: PrepareOptions {
            max_len: args.max_len,
            ..Default::default()
        },
        cache_dir: Some(args.work.join("cache")),
        ..Default::default()
    };
    let ds = Arc::new(TokenDataset::open(&data, Some(&encoder), &opts)?);
    println!("dataset {} ({} rows)", data.display(), ds.len());
    for line in ds.report().lines() {
        println!("  {line}");
    }

    let device = args.device.open(0)?;
    let dtype = args.dtype.dtype();
    let (mut model, what) = match &args.config {
        None => (
            Gemma4Model::load(tiny.to_str().context("utf-8 path")?, dtype, &device)?,
            "tiny".to_string(),
        ),
        Some(path) => {
            let cfg = Config::from_file(path)?;
            let name = path.file_stem().map_or_else(
                || path.display().to_string(),
                |s| s.to_string_lossy().into_owned(),
            );
            let model = Gemma4Model::random_init(&cfg, dtype, &device, 42)?;
            (model, format!("{name}, random"))
        }
    };
    let lora_cfg = LoraConfig::new(16, 32.0, TargetModules::Regex(POST_LORA_TARGETS.into()));
    lora::attach(&lora_cfg, model.projections_mut(), 42)?;
    let c = model.config();
    println!(
        "model {what}: {} layers, hidden {}, vocab {}, {dtype:?} on {:?}, every layer recomputed",
        c.num_hidden_layers,
        c.hidden_size,
        c.vocab_size,
        device.location()
    );
    let lower = |x: &dyn std::fmt::Debug| format!("{x:?}").to_lowercase();
    let on = format!("{}, {what}, {}", lower(&args.device), lower(&args.dtype));

    println!("\n| batching | micro-batches / epoch | tokens / epoch | padding | tokens/s ({on}) |");
    println!("|---|---:|---:|---:|---:|");
    let modes = [
        ("plain", Batching::Plain),
        (
            "group_by_length",
            Batching::GroupByLength {
                mega_batch_mult: 50,
            },
        ),
        (
            "packing",
            Batching::Packed {
                pack_len: args.max_len,
            },
        ),
    ];
    for (name, batching) in modes {
        let loader = DataLoader::new(
            Arc::clone(&ds),
            LoaderConfig {
                batch_size: args.micro_batch,
                seed: 42,
                batching,
                ..Default::default()
            },
        )?;
        let (mut real, mut slots) = (0usize, 0usize);
        for batch in loader.epoch(0, 0) {
            let b = batch?;
            real += b.n_tokens;
            slots += b.batch * b.seq_len;
        }
        let stride = (loader.len() / args.batches.max(1)).max(1);
        let warmup = loader.epoch(0, 0).enumerate().take(args.warmup);
        let timed = loader.epoch(0, 0).enumerate().step_by(stride);
        let (mut timed_tokens, mut secs) = (0usize, 0.0);
        for (n, (k, batch)) in warmup.chain(timed.take(args.batches)).enumerate() {
            let b = batch?;
            let ctx = step::train_context(42, 0, k as u64);
            let start = Instant::now();
            step::backward(&model, &mut Discard, &b, &ctx, 1.0)?;
            device.synchronize()?;
            if n >= args.warmup {
                secs += start.elapsed().as_secs_f64();
                timed_tokens += b.n_tokens;
            }
        }
        println!(
            "| {name} | {} | {real} | {:.1}% | {:.0} |",
            loader.len(),
            100.0 * (slots - real) as f64 / slots as f64,
            timed_tokens as f64 / secs
        );
    }
    Ok(())
}

/// Writes `rows` conversations, each joining a Pareto-distributed number of sample
/// conversations (system prompts after the first dropped), deterministically.
fn write_long_tail(sample: &Path, out: &Path, rows: usize) -> Result<()> {
    let convs: Vec<Vec<serde_json::Value>> = std::fs::read_to_string(sample)?
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l)?;
            Ok(v["messages"].as_array().cloned().unwrap_or_default())
        })
        .collect::<Result<_>>()?;
    // one random stream, drawn in order
    let key = g4ft::hash::stream_key(&[42]);
    let mut drawn = 0u64;
    let mut next = move || {
        drawn += 1;
        drawn - 1
    };
    let mut w = std::io::BufWriter::new(std::fs::File::create(out)?);
    for _ in 0..rows {
        // 1 - u is in (0, 1]
        let u = 1.0 - g4ft::hash::stream_unit_f64(key, next());
        let k = (u.powf(-1.0 / 1.2).floor() as usize).clamp(1, 40);
        let mut messages = Vec::new();
        for j in 0..k {
            let conv = &convs[(g4ft::hash::stream_u64(key, next()) % convs.len() as u64) as usize];
            messages.extend(
                conv.iter()
                    .filter(|m| j == 0 || m["role"] != "system")
                    .cloned(),
            );
        }
        serde_json::to_writer(&mut w, &serde_json::json!({ "messages": messages }))?;
        w.write_all(b"\n")?;
    }
    w.flush()?;
    Ok(())
}
