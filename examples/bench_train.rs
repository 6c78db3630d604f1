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
//! boundary (`step::StepObserver`) and prints where its time goes: forward (embedding + layers),
//! the fused linear cross-entropy head, recompute + backward per layer type (the time between
//! the layer callbacks of `forward_backward`), gradient accumulation into the buckets, DDP's
//! finish, grad norm, AdamW. Forward and head run before the first layer callback, so they are
//! timed by separate probes on the same shapes and the last layer's backward is the remainder
//! (see `Profile`). The normal steps never synchronise inside a step.
//!
//! `--overlap` adds one more step that synchronises the device only at micro-batch boundaries:
//! the time `ddp.finish()` still waits after the synchronised micro-batch's compute has finished
//! is the communication the backward did not hide; beside it, the same buckets all-reduced with
//! nothing else running (time, algorithm and bus bandwidth, the post's 100 GB/s estimate).
//!
//! `--attention-forward` and `--attention-score-mib` run the step with another
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

use anyhow::{bail, Context, Result};
use candle_core::{Device, Tensor, Var};
use clap::Parser;
use g4ft_data::Batch;
use g4ft_ddp::{DdpOptions, DistributedDataParallel, GroupOptions, ProcessGroup, ReduceOp};
use g4ft_gemma4::{Config, Gemma4Model, LayerType};
use g4ft_hash::{mix64, GAMMA};
use g4ft_lora::{attach, lora_parameters, LoraConfig, LoraContext, TargetModules};
use g4ft_ops::{AttentionForward, AttentionPlan};
use g4ft_trainer::config::cli::ShapeArgs;
use g4ft_trainer::config::POST_LORA_TARGETS;
use g4ft_trainer::metrics::memory::{self, MemProbe};
use g4ft_trainer::metrics::mfu::mfu;
use g4ft_trainer::step::clip::{clip_coef, grad_norm};
use g4ft_trainer::step::optim::{AdamW, AdamWParams};
use g4ft_trainer::step::schedule::LrSchedule;
use g4ft_trainer::step::{self, LossWeighting, StepEvent, StepObserver};

/// The post's learning rate, warmup steps and clip norm.
const LR: f64 = 1e-4;
const WARMUP_STEPS: u64 = 20;
const MAX_GRAD_NORM: f64 = 1.0;

/// Command line.
#[derive(Debug, Parser)]
#[command(about = "Benchmark the LoRA training step on a random-weight Gemma 4")]
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
    Batch {
        labels: input_ids.iter().map(|&x| x as i64).collect(),
        attention_mask: vec![1; b * t],
        input_ids,
        position_ids: None,
        batch: b,
        seq_len: t,
        n_tokens: b * t,
        n_label_tokens: b * (t - 1),
        samples: Vec::new(),
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    let shape = &args.shape;
    if args.steps == 0 || args.accum == 0 || shape.micro_batch == 0 || shape.seq < 2 {
        bail!("--steps, --accum, --micro-batch must be >= 1 and --seq >= 2");
    }
    let dtype = shape.dtype()?;
    let local_rank: usize = std::env::var("LOCAL_RANK")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let device = match args.device.as_str() {
        "cpu" => Device::Cpu,
        "cuda" => g4ft_trainer::device::cuda_training_device(local_rank)?,
        other => bail!("--device: expected cuda or cpu, got {other:?}"),
    };
    let probe = MemProbe::new(&device)?;
    let group = ProcessGroup::from_env(
        &device,
        GroupOptions {
            timeout: Duration::from_secs(1800),
            ..Default::default()
        },
    )?;
    let (rank, world) = (group.rank(), group.world_size());
    let cfg = Config::from_file(&shape.config)
        .with_context(|| format!("reading {}", shape.config.display()))?;

    let free_at_start = memory::free_memory(&device, group.env().local_world_size);
    let t0 = Instant::now();
    let mut model = Gemma4Model::random_init(&cfg, dtype, &device, args.seed)?;
    let default_plan = AttentionPlan::default();
    let attention = AttentionPlan {
        forward: args.attention_forward,
        score_bytes: args
            .attention_score_mib
            .map_or(default_plan.score_bytes, |mib| mib.saturating_mul(1 << 20)),
    };
    model.set_attention_plan(attention);
    let mut lcfg = LoraConfig::new(
        shape.lora_r,
        args.lora_alpha,
        TargetModules::Regex(POST_LORA_TARGETS.to_string()),
    );
    lcfg.lora_dropout = args.lora_dropout;
    let adapted = attach(&lcfg, model.projections_mut(), args.seed)?;
    let policy = shape.recompute_policy(|| free_at_start)?;
    let recompute = memory::apply_recompute(&mut model, policy, shape.micro_batch, shape.seq)?;
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
    let weights_bytes = probe.current()?;
    let main_rank = rank == 0;
    if main_rank {
        println!(
            "model layers={} hidden={} vocab={} dtype={:?} device={:?} world={world} built_in={:.1}s mem_after_build={:.2} GB attention={attention:?}",
            cfg.num_hidden_layers,
            cfg.hidden_size,
            cfg.vocab_size,
            dtype,
            device.location(),
            t0.elapsed().as_secs_f64(),
            weights_bytes as f64 / 1e9
        );
        println!(
            "lora r={} alpha={} dropout={} adapted={} trainable={trainable} buckets={}",
            shape.lora_r,
            args.lora_alpha,
            args.lora_dropout,
            adapted.len(),
            ddp.buckets()?.len(),
        );
        println!("{recompute}");
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
    let step_tokens = b * t * args.accum * world;
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
    for step in 0..args.steps {
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

    let n = args.steps;
    let lo = args.warmup_discard.min(n - 1);
    let window_s = (step_ends[n] - step_ends[lo]).as_secs_f64();
    let tps = (step_tokens * (n - lo)) as f64 / window_s;
    let s_per_step = window_s / (n - lo) as f64;
    let peak = probe.peak()?;
    let fl = step::flops_model(&model).flops_per_token(t);
    let peak_tflops = args
        .peak_tflops
        .or_else(|| g4ft_trainer::metrics::mfu::device_peak_tflops(&device));
    // MFU per GPU: tokens/s of this rank's device.
    let tps_device = tps / world as f64;
    let achieved = tps_device * fl.hardware / 1e12;
    let mfu_of = |flops: f64| peak_tflops.map(|p| mfu(tps_device, flops, p));
    let show = |m: Option<f64>| m.map_or_else(|| "-".to_string(), |m| format!("{m:.3}"));
    if main_rank {
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
            "s_per_step": s_per_step, "step_s_all": durs,
            "peak_GB": peak as f64 / 1e9, "peak_GiB": peak as f64 / (1u64 << 30) as f64,
            "peak_what": probe.what(), "mem_after_build_GB": weights_bytes as f64 / 1e9,
            "trainable_params": trainable, "flops_per_token_model": fl.model,
            "flops_per_token_hw": fl.hardware, "flops_per_token_brief": fl.brief,
            "attn_fwd_flops_per_token": fl.attention_forward,
            "achieved_TFLOPs_hw": achieved, "peak_matmul_TFLOPs": peak_tflops,
            "MFU_model": mfu_of(fl.model), "MFU_hw": mfu_of(fl.hardware),
            "MFU_brief": mfu_of(fl.brief),
            "recompute": recompute.to_string(), "kept_layers": recompute.keep.kept(),
            "predicted_peak_GB": recompute.peak.bytes as f64 / 1e9,
            "dtype": format!("{dtype:?}"), "lora_r": shape.lora_r,
            "bucket_cap_mb": args.bucket_cap_mb,
        });
        println!("RESULT_JSON {res}");
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

/// `--overlap`: synchronises the device only at micro-batch boundaries, so that the
/// synchronised micro-batch overlaps its all-reduces with its backward exactly as a normal step.
struct OverlapProbe<'a> {
    device: &'a Device,
    accum: usize,
    start: Instant,
    /// End of the last micro-batch's compute (device synchronised, before `ddp.finish()`).
    compute_end: Instant,
    /// Seconds of each `no_sync` micro-batch.
    no_sync_s: Vec<f64>,
    /// Seconds of the synchronised micro-batch, including `ddp.finish()`.
    sync_s: f64,
    /// Seconds `ddp.finish()` waited after the backward's compute had finished: the exposed
    /// communication.
    exposed_s: f64,
}

impl<'a> OverlapProbe<'a> {
    fn new(device: &'a Device, accum: usize) -> Self {
        let now = Instant::now();
        OverlapProbe {
            device,
            accum,
            start: now,
            compute_end: now,
            no_sync_s: Vec::new(),
            sync_s: 0.0,
            exposed_s: 0.0,
        }
    }

    /// The overlap table: exposed vs alone, and this rank's micro-batch times with and without
    /// sync. `exposed` is every rank's exposed time: a rank whose compute ends early also waits
    /// for the slower ranks, so the communication tail is what the last rank to finish waits
    /// (the smallest).
    fn report(&self, alone: &CommAlone, exposed: &[f64]) -> String {
        let world = exposed.len();
        let mut no_sync = self.no_sync_s.clone();
        no_sync.sort_by(f64::total_cmp);
        let median = no_sync.get(no_sync.len() / 2).copied().unwrap_or(f64::NAN);
        let tail = exposed.iter().copied().fold(f64::INFINITY, f64::min);
        // Exposed time above the communication alone (host overhead, one bucket) counts as 0%.
        let hidden = (1.0 - tail / alone.all_buckets_s).max(0.0);
        let mut out = format!(
            "OVERLAP world {world}: gradient all-reduce of {} buckets, {:.1} MB fp32\n",
            alone.buckets,
            alone.bytes as f64 / 1e6
        );
        out += &alone.render(world);
        let per_rank: Vec<String> = exposed.iter().map(|e| format!("{:.2}", e * 1e3)).collect();
        out += &format!(
            "exposed after the backward's compute: {:.2} ms (per rank: {} ms; the last rank to finish \
             waits the least) of {:.2} ms alone -> {:.1}% hidden behind backward\n\
             rank 0 micro-batch: synchronised {:.1} ms (incl. finish), no_sync median {:.1} ms (difference {:.2} ms)\n",
            tail * 1e3,
            per_rank.join(" / "),
            alone.all_buckets_s * 1e3,
            100.0 * hidden,
            self.sync_s * 1e3,
            median * 1e3,
            (self.sync_s - median) * 1e3
        );
        out += &format!(
            "OVERLAP_JSON {}\n",
            serde_json::json!({
                "world": world, "buckets": alone.buckets, "bytes": alone.bytes,
                "alone_all_buckets_s": alone.all_buckets_s, "alone_one_bucket_s": alone.one_bucket_s,
                "alone_flat_s": alone.flat_s, "exposed_s_by_rank": exposed, "hidden_fraction": hidden,
                "sync_micro_batch_s": self.sync_s, "no_sync_micro_batch_s": no_sync,
            })
        );
        out
    }
}

impl StepObserver for OverlapProbe<'_> {
    fn event(&mut self, event: StepEvent) -> Result<()> {
        match event {
            StepEvent::MicroBatchStart(_) => {
                self.device.synchronize()?;
                self.start = Instant::now();
            }
            StepEvent::MicroBatchEnd(k) => {
                self.device.synchronize()?;
                self.compute_end = Instant::now();
                if k + 1 < self.accum {
                    self.no_sync_s
                        .push((self.compute_end - self.start).as_secs_f64());
                }
            }
            StepEvent::Finished => {
                // finish() waits on the host for every bucket's all-reduce.
                let now = Instant::now();
                self.exposed_s = (now - self.compute_end).as_secs_f64();
                self.sync_s = (now - self.start).as_secs_f64();
            }
            StepEvent::LayerBackward(_) | StepEvent::LayerReported(_) => {}
        }
        Ok(())
    }
}

impl Marks for OverlapProbe<'_> {
    fn mark(&mut self) -> Result<Option<Instant>> {
        Ok(None)
    }
}

/// All-reduce (average) times with nothing else running, median of 5 after one warm-up:
/// one bucket, every bucket back to back as DDP launches them, and one flat buffer of the same
/// total size.
struct CommAlone {
    backend: String,
    buckets: usize,
    first_bucket_bytes: usize,
    bytes: usize,
    one_bucket_s: f64,
    all_buckets_s: f64,
    flat_s: f64,
}

impl CommAlone {
    fn measure(ddp: &DistributedDataParallel<'_>, device: &Device) -> Result<Self> {
        let lens = step::bucket_lens(ddp)?;
        let total: usize = lens.iter().sum();
        let group = ddp.group();
        let zeros = |n: usize| Tensor::zeros(n, candle_core::DType::F32, device);
        let bufs = lens
            .iter()
            .map(|&n| zeros(n))
            .collect::<candle_core::Result<Vec<_>>>()?;
        let time = |bufs: &[Tensor]| -> Result<f64> {
            let mut times = Vec::new();
            for _ in 0..6 {
                device.synchronize()?;
                let t = Instant::now();
                let works = bufs
                    .iter()
                    .map(|b| group.all_reduce_async(b, ReduceOp::Avg))
                    .collect::<Result<Vec<_>, _>>()?;
                for w in works {
                    w.wait()?;
                }
                device.synchronize()?;
                times.push(t.elapsed().as_secs_f64());
            }
            times.remove(0);
            times.sort_by(f64::total_cmp);
            Ok(times[times.len() / 2])
        };
        Ok(CommAlone {
            backend: format!("{:?}", group.backend()),
            buckets: lens.len(),
            first_bucket_bytes: lens.first().copied().unwrap_or(0) * 4,
            bytes: total * 4,
            one_bucket_s: time(&bufs[..1])?,
            all_buckets_s: time(&bufs)?,
            flat_s: time(&[zeros(total)?])?,
        })
    }

    /// One row per measurement: bytes, ms, algorithm bandwidth and bus bandwidth (the ring's
    /// 2(N-1)/N factor), beside the post's estimate (0.26 GB at 100 GB/s ≈ 5 ms).
    fn render(&self, world: usize) -> String {
        let factor = 2.0 * (world as f64 - 1.0) / world as f64;
        let mut out = format!(
            "{:<40} {:>10} {:>9} {:>12} {:>12}\n",
            format!("all-reduce alone ({} backend)", self.backend),
            "MB",
            "ms",
            "algbw GB/s",
            "busbw GB/s"
        );
        for (what, bytes, s) in [
            ("first bucket", self.first_bucket_bytes, self.one_bucket_s),
            (
                "all buckets, back to back (DDP)",
                self.bytes,
                self.all_buckets_s,
            ),
            ("one flat buffer, same bytes", self.bytes, self.flat_s),
        ] {
            let alg = bytes as f64 / s / 1e9;
            out += &format!(
                "{what:<40} {:>10.1} {:>9.3} {:>12.1} {:>12.1}\n",
                bytes as f64 / 1e6,
                s * 1e3,
                alg,
                alg * factor
            );
        }
        out += &format!(
            "post's estimate: {:.1} MB at 100 GB/s = {:.2} ms\n",
            self.bytes as f64 / 1e6,
            self.bytes as f64 / 100e9 * 1e3
        );
        out
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
    fn step<O: StepObserver + Marks>(&mut self, batches: &[Batch], obs: &mut O) -> Result<StepOut> {
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
            norm_s: secs(t, t_norm),
            optim_s: secs(t_norm, t_optim),
        })
    }
}

/// Optional clock marks around the host-side phases of [`Stepper::step`]: `None` on the normal
/// path, after a device synchronize when profiling.
trait Marks {
    /// The time now, or `None` when not measuring.
    fn mark(&mut self) -> Result<Option<Instant>>;
}

impl Marks for step::NoObserver {
    fn mark(&mut self) -> Result<Option<Instant>> {
        Ok(None)
    }
}

/// Seconds from `a` to `b` (0 when either is missing).
fn secs(a: Option<Instant>, b: Option<Instant>) -> f64 {
    match (a, b) {
        (Some(a), Some(b)) => (b - a).as_secs_f64(),
        _ => 0.0,
    }
}

/// `--profile`: synchronises the device at every [`StepEvent`] and charges the time since the
/// previous event to the phase that just ended.
struct Profiler<'a> {
    device: &'a Device,
    /// 0 = sliding, 1 = full, per layer.
    kind: Vec<usize>,
    last: Instant,
    prev: Option<StepEvent>,
    /// Per micro-batch: start → the last layer's callback (forward + head + that layer's
    /// backward), and which kind that layer is.
    first: Vec<f64>,
    /// Recompute + backward seconds and calls per layer kind.
    backward: [(f64, usize); 2],
    accumulate: (f64, usize),
    finish: f64,
    other: f64,
}

impl<'a> Profiler<'a> {
    fn new(device: &'a Device, cfg: &Config) -> Self {
        Profiler {
            device,
            kind: cfg
                .layers
                .iter()
                .map(|l| usize::from(l.layer_type == LayerType::Full))
                .collect(),
            last: Instant::now(),
            prev: None,
            first: Vec::new(),
            backward: [(0.0, 0); 2],
            accumulate: (0.0, 0),
            finish: 0.0,
            other: 0.0,
        }
    }

    /// Synchronises and starts the clock.
    fn restart(&mut self) -> Result<()> {
        self.device.synchronize()?;
        self.last = Instant::now();
        self.prev = None;
        Ok(())
    }

    /// The table, with the forward and the head taken from `probes` (per micro-batch) and the
    /// last layer's backward as the remainder of each micro-batch's first interval.
    fn finish(&self, probes: &Probes, norm_s: f64, optim_s: f64, wall_s: f64) -> Table {
        let micro = self.first.len();
        let last_kind = self.kind.last().copied().unwrap_or(0);
        let mut backward = self.backward;
        for f in &self.first {
            backward[last_kind].0 += f - probes.forward_s - probes.head_s;
            backward[last_kind].1 += 1;
        }
        let n_kind = |k: usize| self.kind.iter().filter(|&&x| x == k).count();
        let rows = vec![
            Row::new(
                format!(
                    "forward: embedding + {} layers (probe: loss() - head fwd)",
                    self.kind.len()
                ),
                probes.forward_s * micro as f64,
                micro,
            ),
            Row::new(
                "loss head: fused linear CE fwd+bwd (probe)".into(),
                probes.head_s * micro as f64,
                micro,
            ),
            Row::new(
                format!("backward sliding ({}): recompute + bwd", n_kind(0)),
                backward[0].0,
                backward[0].1,
            ),
            Row::new(
                format!("backward full ({}): recompute + bwd", n_kind(1)),
                backward[1].0,
                backward[1].1,
            ),
            Row::new(
                "grad accumulation into DDP buckets".into(),
                self.accumulate.0,
                self.accumulate.1,
            ),
            Row::new("DDP finish (all-reduce wait)".into(), self.finish, 1),
            Row::new("clip: grad norm over buckets".into(), norm_s, 1),
            Row::new("AdamW over buckets".into(), optim_s, 1),
            Row::new("other (between phases)".into(), self.other, 1),
        ];
        Table {
            rows,
            wall_s,
            micro,
        }
    }
}

impl StepObserver for Profiler<'_> {
    fn event(&mut self, event: StepEvent) -> anyhow::Result<()> {
        self.device.synchronize()?;
        let now = Instant::now();
        let dt = (now - self.last).as_secs_f64();
        self.last = now;
        match (self.prev, event) {
            (Some(StepEvent::MicroBatchStart(_)), StepEvent::LayerBackward(_)) => {
                self.first.push(dt)
            }
            (Some(StepEvent::LayerReported(_)), StepEvent::LayerBackward(i)) => {
                let k = self.kind.get(i).copied().unwrap_or(0);
                self.backward[k].0 += dt;
                self.backward[k].1 += 1;
            }
            (Some(StepEvent::LayerBackward(_)), StepEvent::LayerReported(_)) => {
                self.accumulate.0 += dt;
                self.accumulate.1 += 1;
            }
            (Some(StepEvent::MicroBatchEnd(_)), StepEvent::Finished) => self.finish += dt,
            _ => self.other += dt,
        }
        self.prev = Some(event);
        Ok(())
    }
}

impl Marks for Profiler<'_> {
    fn mark(&mut self) -> Result<Option<Instant>> {
        self.device.synchronize()?;
        Ok(Some(Instant::now()))
    }
}

/// Separate timings of what runs before the first layer callback, on the profiled step's
/// first micro-batch shape (best of two, synchronised).
struct Probes {
    /// Embedding + every layer's forward without graph (`loss()` minus the forward-only head).
    forward_s: f64,
    /// Host time until `loss()` returns, before the device finishes: when close to the synchronised
    /// time of `loss()`, the GPU waits for the host (launch-bound), otherwise the host runs ahead.
    loss_host_s: f64,
    /// Synchronised time of `loss()` (forward + forward-only head).
    loss_s: f64,
    /// The fused linear cross-entropy with d(hidden) (tracked hidden) + its backward, on a random
    /// hidden and a random `(vocab, hidden)` weight in the model dtype.
    head_s: f64,
}

impl Probes {
    fn measure(model: &Gemma4Model, batch: &Batch, seed: u64) -> Result<Self> {
        let dev = model.device();
        let best = |f: &mut dyn FnMut() -> Result<()>| -> Result<f64> {
            let mut best = f64::INFINITY;
            for _ in 0..2 {
                dev.synchronize()?;
                let t = Instant::now();
                f()?;
                dev.synchronize()?;
                best = best.min(t.elapsed().as_secs_f64());
            }
            Ok(best)
        };
        let ctx = LoraContext {
            training: true,
            track_grad: false,
            seed,
            micro_step: 0,
        };
        let mut loss_host_s = f64::INFINITY;
        let loss_s = best(&mut || {
            let t = Instant::now();
            let out = model.loss(&step::token_batch(batch), &batch.labels, &ctx)?;
            loss_host_s = loss_host_s.min(t.elapsed().as_secs_f64());
            out.sum.to_scalar::<f32>()?;
            Ok(())
        })?;
        let cfg = model.config();
        let (n, h) = (batch.batch * batch.seq_len, cfg.hidden_size);
        let (targets, n_targets) =
            g4ft_gemma4::shift_labels(&batch.labels, (batch.batch, batch.seq_len), cfg.vocab_size)?;
        let targets = Tensor::from_vec(targets, n, dev)?;
        let x = Tensor::randn(0f32, 1.0, (n, h), dev)?.to_dtype(model.dtype())?;
        let w = Tensor::randn(0f32, 0.02, (cfg.vocab_size, h), dev)?.to_dtype(model.dtype())?;
        let (cap, chunk) = (cfg.final_logit_softcapping, model.loss_chunk_rows());
        let head_fwd_s = best(&mut || {
            g4ft_ops::linear_cross_entropy(&x, &w, &targets, cap, chunk)?.to_scalar::<f32>()?;
            Ok(())
        })?;
        let head_s = best(&mut || {
            let xv = Var::from_tensor(&x)?;
            let loss = g4ft_ops::linear_cross_entropy(xv.as_tensor(), &w, &targets, cap, chunk)?;
            loss.to_scalar::<f32>()?;
            let grads = (loss / n_targets.max(1) as f64)?.backward()?;
            grads.get(&xv).context("the head gives d(hidden)")?;
            Ok(())
        })?;
        Ok(Probes {
            forward_s: loss_s - head_fwd_s,
            loss_host_s,
            loss_s,
            head_s,
        })
    }
}

/// One row of the profile.
struct Row {
    name: String,
    total_s: f64,
    calls: usize,
}

impl Row {
    fn new(name: String, total_s: f64, calls: usize) -> Self {
        Row {
            name,
            total_s,
            calls,
        }
    }
}

/// The profile of one step.
struct Table {
    rows: Vec<Row>,
    wall_s: f64,
    micro: usize,
}

impl Table {
    fn render(&self) -> String {
        let sum: f64 = self.rows.iter().map(|r| r.total_s).sum();
        let mut out = format!(
            "PROFILE one step of {} micro-batches, device synchronised at every phase boundary\n{:<58} {:>10} {:>6} {:>10} {:>7}\n",
            self.micro, "phase", "total ms", "calls", "ms/call", "share"
        );
        for r in &self.rows {
            out += &format!(
                "{:<58} {:>10.2} {:>6} {:>10.3} {:>6.1}%\n",
                r.name,
                r.total_s * 1e3,
                r.calls,
                r.total_s * 1e3 / r.calls.max(1) as f64,
                100.0 * r.total_s / sum
            );
        }
        out += &format!(
            "{:<58} {:>10.2}\n{:<58} {:>10.2}\n",
            "sum of phases",
            sum * 1e3,
            "step wall (synchronised)",
            self.wall_s * 1e3
        );
        out += "note: forward is not split per layer type (no per-layer forward hook in \
                forward_backward); the last layer's backward = first callback interval - \
                forward probe - head probe\n";
        out
    }

    fn json(&self) -> serde_json::Value {
        let rows: Vec<serde_json::Value> = self
            .rows
            .iter()
            .map(|r| serde_json::json!({"phase": r.name, "total_s": r.total_s, "calls": r.calls}))
            .collect();
        serde_json::json!({"micro_batches": self.micro, "wall_s": self.wall_s, "rows": rows})
    }
}
