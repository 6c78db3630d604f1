//! Memory planner: the post's memory budget ("Memory budget for Gemma 4 12B with LoRA") for any
//! Gemma 4 config, sequence length, micro-batch, LoRA rank, world size and recompute policy,
//! computed for our training step by the memory model `g4ft_gemma4::memory::MemoryModel` (its docs
//! list every term), which `train_ddp --recompute auto` uses too. Prints which layers keep their
//! activations and the predicted peak, and the communication per optimizer step:
//! `2(N−1)/N × 4 B × trainable` (ring all-reduce of the fp32 gradients).
//!
//! ```text
//! cargo run --release --example memory_plan -- --config crates/gemma4/tests/configs/gemma-4-12B-it.json
//! cargo run --release --example memory_plan -- --config crates/gemma4/tests/configs/gemma-4-12B-it.json \
//!     --seq 32768 --recompute auto --memory-budget-gb 130
//! cargo run --release --example memory_plan -- --config crates/gemma4/tests/configs/gemma-4-12B-it.json \
//!     --recompute all --longest-within-gb 139
//! ```
//! `--longest-within-gb` prints, instead of the budget, the longest sequence (a multiple of 1,024
//! tokens) whose step is predicted to fit that many GB under the recompute policy.
//! `--offload-checkpoints` parks each recomputed layer's input, block outputs and attention state
//! in host memory; with `--host-memory-gb` they must fit that much host RAM, and a step where they
//! do not parks less (`g4ft_gemma4::Parked`), as `train_ddp` does.

use anyhow::{bail, Context, Result};
use clap::Parser;
use g4ft_gemma4::memory::GB;
use g4ft_gemma4::{Config, MemoryBudget, MemoryModel, Parked, Recompute, RecomputePlan, StepShape};
use g4ft_lora::{count_trainable, LoraConfig, ProjectionShape, TargetModules};
use g4ft_trainer::config::cli::ShapeArgs;
use g4ft_trainer::config::POST_LORA_TARGETS;

/// Command line.
#[derive(Debug, Parser)]
#[command(about = "Print the LoRA training memory budget of a Gemma 4 config")]
struct Args {
    /// Config, sequence length, micro-batch, LoRA rank, dtype, recompute policy.
    #[command(flatten)]
    shape: ShapeArgs,
    /// Ranks (GPUs) in the DDP job.
    #[arg(long, default_value_t = 1)]
    world: usize,
    /// Print the longest sequence (a multiple of 1,024 tokens, `--seq` ignored) whose predicted
    /// peak under the recompute policy stays within this many GB, e.g. a card's memory.
    #[arg(long, value_name = "GB")]
    longest_within_gb: Option<f64>,
    /// With --offload-checkpoints: the parked tensors must fit this many GB of host RAM (per
    /// rank); less is parked where the most would not fit.
    #[arg(long, value_name = "GB")]
    host_memory_gb: Option<f64>,
}

/// Steps of the `--longest-within-gb` search, tokens.
const LONGEST_STEP: usize = 1024;

fn main() -> std::process::ExitCode {
    g4ft::trainer::config::cli::exit_code("", run(&Args::parse()))
}

fn run(args: &Args) -> Result<()> {
    let (a, world) = (&args.shape, args.world);
    if world == 0 || a.micro_batch == 0 || a.seq == 0 || a.lora_r == 0 {
        bail!("--seq, --micro-batch, --lora-r and --world must be >= 1");
    }
    let cfg = Config::from_file(&a.config)?;
    let shape = step_shape(a, &cfg)?;
    let policy = a.recompute_policy(|| {
        bail!("memory_plan reads no device: give --memory-budget-gb with --recompute auto")
    })?;
    let host_bytes = match args.host_memory_gb {
        Some(_) if !a.offload_checkpoints => {
            bail!("--host-memory-gb bounds the tensors --offload-checkpoints parks; add it")
        }
        Some(gb) => Some(positive_gb("--host-memory-gb", gb)?),
        None => None,
    };
    match args.longest_within_gb {
        Some(gb) => {
            let budget = MemoryBudget {
                device_bytes: positive_gb("--longest-within-gb", gb)?,
                host_bytes,
            };
            print_longest(args, &cfg, shape, policy, budget, gb)
        }
        None => {
            let plan = match host_bytes {
                Some(host) => MemoryModel::plan_within_host(&cfg, shape, policy, host)
                    .with_context(|| {
                        format!(
                            "not even the recomputed layers' inputs fit {} GB of host memory",
                            host as f64 / GB
                        )
                    })?,
                None => MemoryModel::new(&cfg, shape).plan(policy),
            };
            print_budget(args, &cfg, shape, &plan)
        }
    }
}

/// The step the flags describe: LoRA on the post's 7 projections at α = 2r, parking the most
/// with --offload-checkpoints.
fn step_shape(a: &ShapeArgs, cfg: &Config) -> Result<StepShape> {
    let lcfg = LoraConfig::new(
        a.lora_r,
        2.0 * a.lora_r as f64,
        TargetModules::Regex(POST_LORA_TARGETS.into()),
    );
    let shapes: Vec<ProjectionShape> = cfg
        .projection_shapes("model.language_model")
        .iter()
        .map(|s| ProjectionShape::new(s.path.clone(), s.in_features, s.out_features))
        .collect();
    Ok(StepShape {
        micro_batch: a.micro_batch,
        seq: a.seq,
        lora_r: a.lora_r,
        trainable: count_trainable(&lcfg, &shapes)?,
        dtype: a.dtype()?,
        parked: a.offload_checkpoints.then_some(Parked::MOST),
    })
}

/// `gb` in bytes, or an error naming `flag` unless it is a positive number.
fn positive_gb(flag: &str, gb: f64) -> Result<u64> {
    if gb.is_finite() && gb > 0.0 {
        Ok((gb * GB) as u64)
    } else {
        bail!("{flag}: expected a positive number of GB, got {gb}")
    }
}

/// `--longest-within-gb` (`gb`, as given): the longest sequence whose step fits `budget`, its
/// plan, and the predicted peak one step longer.
fn print_longest(
    args: &Args,
    cfg: &Config,
    shape: StepShape,
    policy: Recompute,
    budget: MemoryBudget,
    gb: f64,
) -> Result<()> {
    let a = &args.shape;
    let within = match args.host_memory_gb {
        Some(host) => format!("{gb} GB and {host} GB of host memory"),
        None => format!("{gb} GB"),
    };
    let Some((seq, plan)) = MemoryModel::longest_seq(cfg, shape, policy, budget, LONGEST_STEP)
    else {
        bail!(
            "not even {LONGEST_STEP} tokens per sample fit {within} under this policy (micro-batch {})",
            a.micro_batch
        );
    };
    println!(
        "longest sequence within {within}: {seq} tokens per sample, micro-batch {} ({})",
        a.micro_batch,
        a.config.display()
    );
    println!("{plan}");
    // One step longer, parking the same tensors.
    let next = MemoryModel::new(
        cfg,
        StepShape {
            seq: seq + LONGEST_STEP,
            parked: plan.parked.or(shape.parked),
            ..shape
        },
    )
    .plan(policy);
    let host = match a.offload_checkpoints {
        true => format!(", {:.3} GB in host memory", next.host_parked as f64 / GB),
        false => String::new(),
    };
    println!(
        "{} tokens: predicted peak {:.3} GB{host}",
        seq + LONGEST_STEP,
        next.peak.bytes as f64 / GB
    );
    Ok(())
}

/// The memory budget of one step under `plan`, term by term, the communication per optimizer
/// step, the plan, and a `PLAN` line of the same numbers for scripts.
fn print_budget(args: &Args, cfg: &Config, shape: StepShape, plan: &RecomputePlan) -> Result<()> {
    let (a, world) = (&args.shape, args.world);
    let trainable = shape.trainable;
    let wbytes = shape.dtype.size_in_bytes();
    let shape = StepShape {
        parked: plan.parked.or(shape.parked),
        ..shape
    };
    let memory = MemoryModel::new(cfg, shape);
    let (saved, tapes) = memory.held_by_kind(&plan.keep);
    let (worst_layer, worst) = memory
        .layers
        .iter()
        .enumerate()
        .map(|(i, l)| (i, l.tape + l.backward))
        .max_by_key(|&(_, bytes)| bytes)
        .context("config has no layers")?;

    let (b, t, h, l, v) = (
        a.micro_batch,
        a.seq,
        cfg.hidden_size,
        cfg.num_hidden_layers,
        cfg.vocab_size,
    );
    let n = world as f64;
    let ring = 2.0 * (n - 1.0) / n;
    let comm = ring * 4.0 * trainable as f64;
    println!(
        "memory plan: {} | {l} layers, hidden {h}, vocab {v} | seq {t}, micro-batch {b}, LoRA r{} on 7 projections, world {world} | weights {}",
        a.config.display(),
        a.lora_r,
        a.dtype
    );
    let row = |what: &str, bytes: u64, how: String| {
        println!("  {what:<38} {:>9.3} GB   {how}", bytes as f64 / GB);
    };
    let n_params = memory.n_params;
    let n_embed = (v * h) as u64;
    row(
        "frozen weights",
        memory.weights,
        format!(
            "{n_params} params × {wbytes} B (embedding/head {n_embed}, decoder {})",
            n_params - n_embed
        ),
    );
    row(
        "LoRA params + AdamW m, v",
        memory.lora_state,
        format!("{trainable} trainable × 12 B (fp32)"),
    );
    row(
        "DDP fp32 gradient buckets",
        memory.grad_buckets,
        format!("{trainable} × 4 B"),
    );
    let kept = plan.keep.kept();
    let inputs = format!(
        "{} recomputed layers × b·t·H·bytes = {b}·{t}·{h}·{wbytes}",
        l - kept
    );
    let on_device = match a.offload_checkpoints {
        true => "on the device: the adapters' down products, the shared K/V (+ one layer's in flight, in the peak)".into(),
        false => format!("{inputs} (+ the adapters' down products, shared K/V)"),
    };
    row("saved layer inputs (checkpointing)", saved, on_device);
    if let Some(parked) = plan.parked {
        let outputs = format!("{inputs} × 3 (input, attention and MLP outputs)");
        let what = match parked {
            Parked::Inputs => inputs.clone(),
            Parked::InputsAndOutputs => outputs,
            Parked::InputsOutputsAndAttention => {
                format!("{outputs} + raw q/k/v, attention output and log-sum-exp")
            }
        };
        row(
            "offloaded checkpoints (host memory)",
            plan.host_parked,
            format!("{what}, page-locked host RAM"),
        );
    }
    row(
        "kept activations (no recompute)",
        tapes,
        format!(
            "{kept} layers' tapes (with their adapter copies): {}",
            plan.keep.describe_kept()
        ),
    );
    row(
        "one layer's backward working set",
        worst,
        format!("largest: layer {worst_layer}, tape (with adapter copies) + backward"),
    );
    row(
        "batch inputs: RoPE tables, PLE inputs",
        memory.prepared,
        "cos, sin per layer type: the batch's and the rows kept (+ b·t·L·P per-layer-embedding inputs)"
            .into(),
    );
    row(
        "logits / CE working set",
        memory.ce,
        format!(
            "chunk {}×{v}×{wbytes} B + d(hidden), normed hidden",
            memory.ce_chunk_rows.min((b * t) as u64)
        ),
    );
    row(
        "predicted peak",
        plan.peak.bytes,
        format!(
            "weights, LoRA state, buckets, batch inputs, held activations, working set {}",
            plan.peak.at
        ),
    );
    println!(
        "  {:<38} {:>9.3} GB   2(N−1)/N = {ring:.3} × {trainable} × 4 B per rank (fp32 ring all-reduce)",
        "communication per optimizer step",
        comm / GB
    );
    println!("{plan}");
    println!(
        "PLAN weights_gb={:.3} lora_state_gb={:.3} saved_gb={:.3} kept_gb={:.3} kept_layers={kept} recompute_gb={:.3} ce_gb={:.3} comm_gb={:.4} peak_gb={:.3} trainable={trainable} host_gb={:.3}",
        memory.weights as f64 / GB,
        (memory.lora_state + memory.grad_buckets) as f64 / GB,
        saved as f64 / GB,
        tapes as f64 / GB,
        worst as f64 / GB,
        memory.ce as f64 / GB,
        comm / GB,
        plan.peak.bytes as f64 / GB,
        plan.host_parked as f64 / GB
    );
    Ok(())
}
