//! Training-step benchmark: the real LoRA step on a Gemma 4 built from a config with random
//! weights (`Gemma4Model::random_init`) and random token ids, timed per optimizer step. The
//! same shape and settings as the PyTorch + PEFT baseline of `docs/benchmarks.md`:
//! LoRA r16/α32/dropout 0.05 on the 7 projections of the text decoder (the post's regex), exactly
//! `--seq` tokens per sample (no padding), `--accum` micro-batches per step, clip 1.0, AdamW
//! (lr 1e-4, wd 0), cosine schedule with 20 warmup steps, single device (world 1).
//!
//! One optimizer step is exactly `train_ddp`'s: the model's adapters are wrapped in
//! `DistributedDataParallel` (world 1 without launcher environment; under `ddprun`/`torchrun`
//! every rank runs its own random tokens), and `g4ft_trainer::step::accumulate_window` runs the
//! `--accum` micro-batches (`forward_backward` with `loss_scale = 1/accum`, each finished layer's
//! adapter gradients accumulated into DDP's flat fp32 buckets, the first `accum − 1` under
//! `no_sync`), `ddp.finish()`, then the global norm over the buckets
//! (`g4ft_trainer::step::clip::grad_norm`), the clip coefficient and `step::adamw_step` (AdamW over
//! the buckets, the fused op on CUDA). Each step ends with a device synchronize; the first
//! `--warmup-discard` steps are left out of the summary.
//!
//! `--profile` adds one more step after the summary that synchronises the device at every phase
//! boundary and prints where its time goes: forward (embedding + layers), the fused linear
//! cross-entropy head, recompute + backward per layer type, gradient accumulation into the
//! buckets, DDP's finish, grad norm, AdamW (`g4ft_trainer::step::profile::Profiler` and
//! `Probes`). `--overlap` adds one more step that synchronises the device only at micro-batch
//! boundaries and prints how much of the gradient all-reduce the backward hides, beside the same
//! buckets all-reduced alone (`OverlapProbe`, `CommAlone`). The normal steps never synchronise
//! inside a step.
//!
//! `--attention-forward`, `--attention-backward` and `--attention-score-mib` run the step with another
//! `g4ft_ops::AttentionPlan` (the attention kernels) than the default, to compare them.
//!
//! Peak memory: on CUDA the default memory pool's high-water mark (`CU_MEMPOOL_ATTR_USED_MEM_HIGH`,
//! reset after the model and adapters are built, as the baseline resets torch's peak stats), with
//! the pool's release threshold raised to `u64::MAX` at startup; on CPU the process's peak RSS.
//! `--recompute all|none|auto` (and `--memory-budget-gb`) as in `train_ddp`; the plan and its
//! predicted peak are printed before the first step and again in the summary, beside the
//! measured peak. MFU uses `g4ft_trainer::metrics::mfu::FlopsModel` both ways: `mfu_model` (the step's
//! work without recompute) and `mfu_hw` (what runs under the policy); the JSON also has the
//! baseline's `brief` convention (`MFU_brief`) for its tables.
//!
//! ```text
//! cargo run --release --example bench_train -- --config assets/tiny/config.json --seq 64 \
//!     --accum 2 --steps 4 --warmup-discard 1 --dtype f32 --device cpu
//! cargo run --release --features cuda --example bench_train -- \
//!     --config crates/gemma4/tests/configs/gemma-4-12B-it.json --peak-tflops 714.6 --profile
//! ```

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use candle_core::{DType, Device, Var};
use clap::Parser;
use g4ft_data::Batch;
use g4ft_ddp::{DdpOptions, DistEnv, DistributedDataParallel, GroupOptions, ProcessGroup};
use g4ft_gemma4::{Config, Gemma4Model, RecomputePlan};
use g4ft_hash::{mix64, GAMMA};
use g4ft_lora::{attach, lora_parameters, LoraConfig, TargetModules};
use g4ft_ops::{AttentionBackward, AttentionForward, AttentionPlan};
use g4ft_trainer::config::cli::ShapeArgs;
use g4ft_trainer::config::POST_LORA_TARGETS;
use g4ft_trainer::metrics::memory::{self, MemProbe};
use g4ft_trainer::metrics::mfu::mfu;
use g4ft_trainer::step::clip::{clip_coef, grad_norm};
use g4ft_trainer::step::optim::{AdamW, AdamWParams};
use g4ft_trainer::step::profile::{secs_between, CommAlone, OverlapProbe, Probes, Profiler};
use g4ft_trainer::step::schedule::LrSchedule;
use g4ft_trainer::step::{self, LossWeighting, StepObserver};

/// The post's learning rate, warmup steps and clip norm.
const LR: f64 = 1e-4;
const WARMUP_STEPS: u64 = 20;
const MAX_GRAD_NORM: f64 = 1.0;

/// Command line.
#[derive(Debug, Parser)]
/// An option given twice takes its last value, so that a script's settings can override its
/// defaults (`tools/gpu/ab.sh`).
#[command(
    about = "Benchmark the LoRA training step on a random-weight Gemma 4",
    args_override_self = true
)]
struct Args {
    /// Config, sequence length (every sample is exactly this long), micro-batch, LoRA rank, dtype.
    #[command(flatten)]
    shape: ShapeArgs,
    /// Micro-batches per optimizer step.
    #[arg(long, default_value_t = 8)]
    accum: usize,
    /// Optimizer steps to run.
    #[arg(long, default_value_t = 10)]
    steps: usize,
    /// Steps left out of the steady-state window.
    #[arg(long, default_value_t = 2)]
    warmup_discard: usize,
    /// LoRA alpha.
    #[arg(long, default_value_t = 32.0)]
    lora_alpha: f64,
    /// LoRA dropout.
    #[arg(long, default_value_t = 0.05)]
    lora_dropout: f64,
    /// cuda or cpu.
    #[arg(long, default_value = "cuda")]
    device: String,
    /// Measured bf16 matmul ceiling in TFLOP/s for MFU (default: the vendor table on CUDA).
    #[arg(long)]
    peak_tflops: Option<f64>,
    /// Seed of the random weights, adapters, dropout and tokens.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// DDP bucket capacity in MiB of fp32 gradients (train_ddp's default).
    #[arg(long, default_value_t = 25.0)]
    bucket_cap_mb: f64,
    /// Forward kernel of the causal attention on CUDA: fused-w8 (the default plan), fused-w4
    /// (4 warps per block at head dim 256 too) or blocked.
    #[arg(long, default_value = "fused-w8", value_parser = parse_attention_forward)]
    attention_forward: AttentionForward,
    /// Backward kernels of the causal attention on CUDA: auto (the default plan: fused at head
    /// dim 256, at 512 for long sequences), fused or blocked.
    #[arg(long, default_value = "auto", value_parser = parse_attention_backward)]
    attention_backward: AttentionBackward,
    /// Run the fused attention kernels that have a wgmma version on it (builds for compute
    /// capability 90; default: the plan's).
    #[arg(long)]
    attention_wgmma: Option<bool>,
    /// Bound of one fp32 score buffer of the blocked attention, MiB (default: the plan's 32).
    #[arg(long)]
    attention_score_mib: Option<usize>,
    /// After the summary, run one more step with the device synchronised around every phase
    /// and print the time breakdown.
    #[arg(long)]
    profile: bool,
    /// Bracket the last measured step with `cuProfilerStart`/`cuProfilerStop`, so that
    /// `ncu --profile-from-start off` records only that step (`tools/gpu/kernel_profile.sh`).
    #[arg(long)]
    cuda_profiler_last_step: bool,
    /// After the summary, run one more step synchronised only at micro-batch boundaries and
    /// print how much of the gradient all-reduce the backward hides, beside the all-reduce of
    /// the same buckets alone (time, algorithm and bus bandwidth).
    #[arg(long)]
    overlap: bool,
    /// Sample the host's call stacks (every thread, at 1 kHz of CPU time or the kernel timer's
    /// rate if lower: about 250 Hz on the GPU machine) over the steady steps and write them to
    /// this file in the folded format, one `thread;outer;…;inner count` line per
    /// stack (`tools/gpu/host_profile_table.py` sums them per function).
    #[cfg(feature = "host-profile")]
    #[arg(long)]
    host_profile: Option<std::path::PathBuf>,
}

/// `--attention-forward`'s values.
fn parse_attention_forward(s: &str) -> std::result::Result<AttentionForward, String> {
    match s {
        "fused-w8" => Ok(AttentionForward::FusedW8),
        "fused-w4" => Ok(AttentionForward::FusedW4),
        "blocked" => Ok(AttentionForward::Blocked),
        other => Err(format!(
            "expected fused-w8, fused-w4 or blocked, got {other:?}"
        )),
    }
}

/// `--attention-backward`'s values.
fn parse_attention_backward(s: &str) -> std::result::Result<AttentionBackward, String> {
    match s {
        "auto" => Ok(AttentionBackward::Auto),
        "fused" => Ok(AttentionBackward::Fused),
        "blocked" => Ok(AttentionBackward::Blocked),
        other => Err(format!("expected auto, fused or blocked, got {other:?}")),
    }
}

/// `cudaProfilerStart` (`start`) or `cudaProfilerStop` (CUDA runtime, linked by the `cuda` build;
/// the driver stub library has no `cuProfilerStart`).
#[cfg(feature = "cuda")]
fn cuda_profiler(start: bool) -> Result<()> {
    extern "C" {
        fn cudaProfilerStart() -> i32;
        fn cudaProfilerStop() -> i32;
    }
    // SAFETY: plain runtime calls without arguments.
    let r = unsafe {
        if start {
            cudaProfilerStart()
        } else {
            cudaProfilerStop()
        }
    };
    if r != 0 {
        bail!(
            "cudaProfiler{}: error {r}",
            if start { "Start" } else { "Stop" }
        );
    }
    Ok(())
}

/// Without CUDA there is no profiler range to open.
#[cfg(not(feature = "cuda"))]
fn cuda_profiler(_start: bool) -> Result<()> {
    bail!("--cuda-profiler-last-step needs a build with --features cuda")
}

/// The host sampler of `--host-profile`: started before the first steady step, written after
/// the last.
#[cfg(feature = "host-profile")]
mod host_profile {
    use std::collections::HashMap;
    use std::fmt::Write as _;
    use std::path::Path;

    use anyhow::{Context, Result};

    /// Samples per second of the process's CPU time asked for (the kernel's timer may tick slower).
    const HZ: i32 = 1000;

    /// A running sampler.
    pub struct HostProfile(pprof::ProfilerGuard<'static>);

    impl HostProfile {
        /// Starts sampling every thread of the process.
        pub fn start() -> Result<Self> {
            Ok(Self(
                pprof::ProfilerGuardBuilder::default()
                    .frequency(HZ)
                    .build()
                    .context("starting the host sampler")?,
            ))
        }

        /// Stops sampling and writes the stacks, outermost frame first, with their sample
        /// counts; returns the number of samples.
        pub fn write(self, path: &Path) -> Result<isize> {
            let report = self.0.report().build().context("host sampler report")?;
            let mut folded: HashMap<String, isize> = HashMap::new();
            for (frames, count) in &report.data {
                let mut line = frames.thread_name_or_id();
                for symbols in frames.frames.iter().rev() {
                    for symbol in symbols.iter().rev() {
                        line.push(';');
                        line.push_str(&symbol.name().replace(';', ":"));
                    }
                }
                *folded.entry(line).or_default() += count;
            }
            let mut lines: Vec<_> = folded.into_iter().collect();
            lines.sort_by_key(|l| std::cmp::Reverse(l.1));
            let mut text = String::new();
            for (stack, count) in &lines {
                writeln!(text, "{stack} {count}")?;
            }
            std::fs::write(path, text)
                .with_context(|| format!("writing the host profile {}", path.display()))?;
            Ok(lines.iter().map(|(_, c)| c).sum())
        }
    }
}

/// Random ids in `3..vocab` (no pad/eos/bos, as the baseline) for micro-batch `micro`.
fn random_tokens(seed: u64, micro: u64, n: usize, vocab: usize) -> Vec<u32> {
    let key = mix64(seed ^ mix64(micro.wrapping_add(1)));
    (0..n as u64)
        .map(|i| (3 + mix64(key.wrapping_add(i.wrapping_mul(GAMMA))) % (vocab as u64 - 3)) as u32)
        .collect()
}

/// Micro-batch `micro` of random tokens as the data loader would collate it: no padding,
/// labels = inputs (every position after the first is a target).
fn random_batch(seed: u64, micro: u64, b: usize, t: usize, vocab: usize) -> Batch {
    let input_ids = random_tokens(seed, micro, b * t, vocab);
    Batch::full_rows(input_ids, b, t)
}

fn main() -> std::process::ExitCode {
    let prefix = g4ft::ddp::env::message_prefix(|k| std::env::var(k).ok());
    g4ft::trainer::config::cli::exit_code(&prefix, run(&Args::parse()))
}

fn run(args: &Args) -> Result<()> {
    let shape = &args.shape;
    if args.steps == 0 || args.accum == 0 || shape.micro_batch == 0 || shape.seq < 2 {
        bail!("--steps, --accum, --micro-batch must be >= 1 and --seq >= 2");
    }
    let dtype = shape.dtype()?;
    let env = DistEnv::from_env()?;
    let device = match args.device.as_str() {
        "cpu" => g4ft_trainer::device::cpu_training_device(),
        "cuda" => g4ft_trainer::device::cuda_training_device(env.local_rank)?,
        other => bail!("--device: expected cuda or cpu, got {other:?}"),
    };
    let probe = MemProbe::new(&device)?;
    let group = ProcessGroup::new(
        env,
        &device,
        GroupOptions {
            timeout: Duration::from_secs(1800),
            ..Default::default()
        },
    )?;
    let (rank, world) = (group.rank(), group.world_size());
    let cfg = Config::from_file(&shape.config)?;

    let free_at_start = memory::free_memory(&device, group.env().local_world_size);
    let t0 = Instant::now();
    let mut model = Gemma4Model::random_init(&cfg, dtype, &device, args.seed)?;
    let attention = attention_plan(args);
    model.set_attention_plan(attention);
    let mut lcfg = LoraConfig::new(
        shape.lora_r,
        args.lora_alpha,
        TargetModules::Regex(POST_LORA_TARGETS.to_string()),
    );
    lcfg.lora_dropout = args.lora_dropout;
    let adapted = attach(&lcfg, model.projections_mut(), args.seed)?.len();
    let policy = shape.recompute_policy(|| free_at_start)?;
    let (recompute, parked_note) = memory::apply_recompute(
        &mut model,
        policy,
        shape.offload_checkpoints,
        shape.micro_batch,
        shape.seq,
        || memory::host_room(group.env().local_world_size),
    )?;
    let params: Vec<(String, Var)> = lora_parameters(model.projections())
        .into_iter()
        .map(|p| (p.name, p.var))
        .collect();
    let trainable: usize = params.iter().map(|(_, v)| v.elem_count()).sum();
    // train_ddp's wrap: reverse-order fp32 buckets that hold the gradients.
    let ddp = DistributedDataParallel::new(
        &group,
        params,
        DdpOptions {
            bucket_cap_mb: args.bucket_cap_mb,
            ..Default::default()
        },
    )?;
    device.synchronize()?;
    let setup = Setup {
        args,
        cfg: &cfg,
        dtype,
        device: &device,
        world,
        built_s: t0.elapsed().as_secs_f64(),
        weights_bytes: probe.current()?,
        attention,
        adapted,
        trainable,
        buckets: ddp.buckets()?.len(),
        recompute,
    };
    let main_rank = rank == 0;
    if main_rank {
        setup.print(parked_note.as_deref());
    }

    let optim = AdamW::new(
        AdamWParams::with_weight_decay(0.0),
        &step::bucket_lens(&ddp)?,
        &device,
    )?;
    let total_steps = (args.steps + usize::from(args.profile) + usize::from(args.overlap)) as u64;
    let mut stepper = Stepper {
        model: &model,
        ddp,
        optim,
        sched: LrSchedule::cosine(LR, WARMUP_STEPS, total_steps),
        weighting: LossWeighting::MeanPerMicroBatch { accum: args.accum },
        seed: args.seed,
        micro_step: 0,
    };
    let (b, t) = (shape.micro_batch, shape.seq);
    let step_tokens = setup.step_tokens();
    let token_seed = args.seed.wrapping_add(rank as u64);
    let window = |step: usize| -> Vec<Batch> {
        (0..args.accum)
            .map(|k| {
                let micro = (step * args.accum + k) as u64;
                random_batch(token_seed, micro, b, t, cfg.vocab_size)
            })
            .collect()
    };

    probe.reset_peak()?;
    device.synchronize()?;
    let mut step_ends = vec![Instant::now()];
    let mut durs = Vec::new();
    // The summary's steady window: steps lo..n.
    let n = args.steps;
    let lo = args.warmup_discard.min(n - 1);
    #[cfg(feature = "host-profile")]
    let mut host_sampler = None;
    for step in 0..args.steps {
        #[cfg(feature = "host-profile")]
        if step == lo && args.host_profile.is_some() {
            host_sampler = Some(host_profile::HostProfile::start()?);
        }
        let profiled = args.cuda_profiler_last_step && step + 1 == args.steps;
        if profiled {
            cuda_profiler(true)?;
        }
        let ts = Instant::now();
        let batches = window(step);
        let out = stepper.step(&batches, &mut step::NoObserver)?;
        device.synchronize()?;
        let end = Instant::now();
        if profiled {
            cuda_profiler(false)?;
        }
        let dt = (end - ts).as_secs_f64();
        step_ends.push(end);
        durs.push(dt);
        if main_rank {
            println!(
                "step={step} loss={:.4} grad_norm={:.3} lr={:.2e} tok/s={:.0} step_s={dt:.3} peak_gb={:.2}",
                out.loss,
                out.norm,
                out.lr,
                step_tokens as f64 / dt,
                probe.peak()? as f64 / 1e9
            );
        }
    }

    #[cfg(feature = "host-profile")]
    if let (Some(sampler), Some(path)) = (host_sampler, &args.host_profile) {
        let samples = sampler.write(path)?;
        println!("host profile: {samples} samples in {}", path.display());
    }
    if main_rank {
        let steady = Steady {
            lo,
            n,
            window_s: (step_ends[n] - step_ends[lo]).as_secs_f64(),
            step_s: durs,
            peak_bytes: probe.peak()?,
            peak_what: probe.what(),
        };
        setup.print_summary(&model, &steady);
    }

    if args.profile {
        let batches = window(n);
        let mut prof = Profiler::new(&device, &cfg);
        let ts = Instant::now();
        prof.restart()?;
        let out = stepper.step(&batches, &mut prof)?;
        let wall = ts.elapsed().as_secs_f64();
        let probes = Probes::measure(&model, &batches[0], args.seed)?;
        if main_rank {
            let table = prof.finish(&probes, out.norm_s, out.optim_s, wall);
            print!("{}", table.render());
            println!(
                "host enqueue of loss() (forward + head): {:.1} ms, synchronised {:.1} ms",
                probes.loss_host_s * 1e3,
                probes.loss_s * 1e3
            );
            println!("PROFILE_JSON {}", table.json());
        }
    }
    if args.overlap {
        let batches = window(n + usize::from(args.profile));
        let mut probe = OverlapProbe::new(&device, args.accum);
        stepper.step(&batches, &mut probe)?;
        let alone = CommAlone::measure(&stepper.ddp, &device)?;
        let exposed = group.all_gather_object(&probe.exposed_s)?;
        if main_rank {
            print!("{}", probe.report(&alone, &exposed));
        }
    }
    drop(stepper);
    drop(group);
    Ok(())
}

/// The attention kernels of the flags: the default plan with each given flag's choice.
fn attention_plan(args: &Args) -> AttentionPlan {
    let default_plan = AttentionPlan::default();
    AttentionPlan {
        forward: args.attention_forward,
        backward: args.attention_backward,
        score_bytes: args
            .attention_score_mib
            .map_or(default_plan.score_bytes, |mib| mib.saturating_mul(1 << 20)),
        wgmma: args.attention_wgmma.unwrap_or(default_plan.wgmma),
    }
}

/// The job as built: what the setup lines and the summary report besides the timings.
struct Setup<'a> {
    args: &'a Args,
    cfg: &'a Config,
    dtype: DType,
    device: &'a Device,
    world: usize,
    /// Seconds to build the model and its adapters.
    built_s: f64,
    /// Device memory in use once the model, the adapters and the buckets are built.
    weights_bytes: u64,
    attention: AttentionPlan,
    /// Projections with an adapter.
    adapted: usize,
    trainable: usize,
    buckets: usize,
    recompute: RecomputePlan,
}

/// The measured steps' timings: the steady window is steps `lo..n`.
struct Steady {
    lo: usize,
    n: usize,
    window_s: f64,
    /// Every step's seconds, warm-up included.
    step_s: Vec<f64>,
    peak_bytes: u64,
    peak_what: &'static str,
}

impl Setup<'_> {
    /// Tokens of one optimizer step over all ranks.
    fn step_tokens(&self) -> usize {
        let shape = &self.args.shape;
        shape.micro_batch * shape.seq * self.args.accum * self.world
    }

    /// The model, LoRA, recompute and attention lines printed before the first step.
    fn print(&self, parked_note: Option<&str>) {
        let (args, cfg, shape) = (self.args, self.cfg, &self.args.shape);
        println!(
            "model layers={} hidden={} vocab={} dtype={:?} device={:?} world={} built_in={:.1}s mem_after_build={:.2} GB attention={:?}",
            cfg.num_hidden_layers,
            cfg.hidden_size,
            cfg.vocab_size,
            self.dtype,
            self.device.location(),
            self.world,
            self.built_s,
            self.weights_bytes as f64 / 1e9,
            self.attention
        );
        println!(
            "lora r={} alpha={} dropout={} adapted={} trainable={} buckets={}",
            shape.lora_r,
            args.lora_alpha,
            args.lora_dropout,
            self.adapted,
            self.trainable,
            self.buckets,
        );
        println!("{}", self.recompute);
        if let Some(note) = parked_note {
            println!("{note}");
        }
        if !self.device.is_cuda() {
            return;
        }
        let head_dims: std::collections::BTreeSet<usize> =
            cfg.layers.iter().map(|l| l.head_dim).collect();
        let backward: Vec<String> = head_dims
            .iter()
            .map(|&d| {
                let dims = (shape.micro_batch, cfg.num_attention_heads, shape.seq, d);
                format!(
                    "head dim {d} {:?}",
                    self.attention.backward_for(self.dtype, dims)
                )
            })
            .collect();
        println!("attention backward on CUDA: {}", backward.join(", "));
    }

    /// The `SUMMARY` line and the `RESULT_JSON` line of the steady window (MFU per GPU, both
    /// ways, against --peak-tflops or the device's data-sheet peak).
    fn print_summary(&self, model: &Gemma4Model, steady: &Steady) {
        let (args, shape, world) = (self.args, &self.args.shape, self.world);
        let (b, t) = (shape.micro_batch, shape.seq);
        let Steady {
            lo, n, window_s, ..
        } = *steady;
        let tps = (self.step_tokens() * (n - lo)) as f64 / window_s;
        let s_per_step = window_s / (n - lo) as f64;
        let peak = steady.peak_bytes;
        let fl = step::flops_model(model).flops_per_token(t);
        let peak_tflops = args
            .peak_tflops
            .or_else(|| g4ft_trainer::metrics::mfu::device_peak_tflops(self.device));
        // MFU per GPU: tokens/s of this rank's device.
        let tps_device = tps / world as f64;
        let achieved = tps_device * fl.hardware / 1e12;
        let mfu_of = |flops: f64| peak_tflops.map(|p| mfu(tps_device, flops, p));
        let show = |m: Option<f64>| m.map_or_else(|| "-".to_string(), |m| format!("{m:.3}"));
        let recompute = &self.recompute;
        let trainable = self.trainable;
        println!(
            "SUMMARY tokens_per_s={tps:.0} s_per_step={s_per_step:.3} (steps {lo}..{}) peak_gb={:.2} mfu_model={} mfu_hw={} achieved_tflops_hw={achieved:.1} predicted_peak_gb={:.2} kept_layers={}/{} trainable={trainable} world={world}",
            n - 1,
            peak as f64 / 1e9,
            show(mfu_of(fl.model)),
            show(mfu_of(fl.hardware)),
            recompute.peak.bytes as f64 / 1e9,
            recompute.keep.kept(),
            recompute.keep.len(),
        );
        let res = serde_json::json!({
            "seq": t, "micro_batch": b, "accum": args.accum, "world": world, "steps": n,
            "window_steps": n - lo, "window_s": window_s, "tokens_per_s": tps,
            "s_per_step": s_per_step, "step_s_all": steady.step_s,
            "peak_GB": peak as f64 / 1e9, "peak_GiB": peak as f64 / (1u64 << 30) as f64,
            "peak_what": steady.peak_what, "mem_after_build_GB": self.weights_bytes as f64 / 1e9,
            "trainable_params": trainable, "flops_per_token_model": fl.model,
            "flops_per_token_hw": fl.hardware, "flops_per_token_brief": fl.brief,
            "attn_fwd_flops_per_token": fl.attention_forward,
            "achieved_TFLOPs_hw": achieved, "peak_matmul_TFLOPs": peak_tflops,
            "MFU_model": mfu_of(fl.model), "MFU_hw": mfu_of(fl.hardware),
            "MFU_brief": mfu_of(fl.brief),
            "recompute": recompute.to_string(), "kept_layers": recompute.keep.kept(),
            "predicted_peak_GB": recompute.peak.bytes as f64 / 1e9,
            "dtype": format!("{:?}", self.dtype), "lora_r": shape.lora_r,
            "bucket_cap_mb": args.bucket_cap_mb,
        });
        println!("RESULT_JSON {res}");
    }
}

/// What one [`Stepper::step`] reports.
struct StepOut {
    loss: f64,
    norm: f32,
    lr: f64,
    /// Seconds of the grad norm and of AdamW, measured only when the observer synchronises
    /// (0 otherwise).
    norm_s: f64,
    optim_s: f64,
}

/// What one optimizer step needs besides its batches: the model, the DDP wrap, AdamW, the
/// schedule, the loss weighting and the dropout seed and micro-step counter.
struct Stepper<'m, 'g> {
    model: &'m Gemma4Model,
    ddp: DistributedDataParallel<'g>,
    optim: AdamW,
    sched: LrSchedule,
    weighting: LossWeighting,
    seed: u64,
    micro_step: u64,
}

impl Stepper<'_, '_> {
    /// One optimizer step exactly as `train_ddp` runs it (without the non-finite decision, the
    /// logging and the checkpoints): the window through DDP, norm after the reduce, clip folded
    /// into AdamW over the buckets, schedule.
    fn step(&mut self, batches: &[Batch], obs: &mut impl StepObserver) -> Result<StepOut> {
        let (model, ddp) = (self.model, &mut self.ddp);
        let share = step::accumulate_window(
            model,
            ddp,
            batches,
            self.weighting,
            self.seed,
            &mut self.micro_step,
            obs,
        )?;
        let loss = step::all_reduce_sum(ddp.group(), &[share], model.device())?[0];
        let t = obs.mark()?;
        let norm = grad_norm(&step::bucket_grads(ddp)?)?;
        let t_norm = obs.mark()?;
        let lr = self.sched.lr();
        step::adamw_step(&mut self.optim, ddp, lr, clip_coef(norm, MAX_GRAD_NORM))?;
        self.sched.advance();
        let t_optim = obs.mark()?;
        Ok(StepOut {
            loss,
            norm,
            lr,
            norm_s: secs_between(t, t_norm),
            optim_s: secs_between(t_norm, t_optim),
        })
    }
}
