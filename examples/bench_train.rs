//! Training-step benchmark: the real LoRA step on a Gemma 4 built from a config with random
//! weights (`Gemma4Model::random_init`) and random token ids, timed per optimizer step. The
//! same shape and settings as the PyTorch anchor (`bench/pytorch-reference/train_ddp_anchor.py`):
//! LoRA r16/α32/dropout 0.05 on the 7 projections of the text decoder (the post's regex), exactly
//! `--seq` tokens per sample (no padding), `--accum` micro-batches per step, clip 1.0, AdamW
//! (lr 1e-4, wd 0), cosine schedule with 20 warmup steps, single device (world 1).
//!
//! One micro-batch = `forward_backward` (forward without graph, chunked fused head + CE,
//! layer-wise recompute backward) with `loss_scale = 1/accum`; each layer's adapter gradients are
//! added into per-parameter fp32 accumulators as soon as the layer reports them. The step
//! concatenates them into one flat buffer (a DDP bucket's layout), takes the global norm, clips
//! and runs `g4ft_trainer::optim::AdamW`. Each step ends with a device synchronize; the first
//! `--warmup-discard` steps are left out of the summary.
//!
//! Peak memory: on CUDA the default memory pool's high-water mark (`CU_MEMPOOL_ATTR_USED_MEM_HIGH`,
//! reset after the model and adapters are built, as the anchor resets torch's peak stats), with
//! the pool's release threshold raised to `u64::MAX` at startup; on CPU the process's peak RSS.
//! MFU uses `g4ft_trainer::mfu::FlopsModel` (the anchor's `brief` formula).
//!
//! ```text
//! cargo run --release --example bench_train -- --config assets/tiny/config.json --seq 64 \
//!     --accum 2 --steps 4 --warmup-discard 1 --dtype f32 --device cpu
//! cargo run --release --features cuda --example bench_train -- \
//!     --config crates/gemma4/tests/configs/gemma-4-12B-it.json --peak-tflops 714.6
//! ```

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor, Var};
use clap::Parser;
use g4ft_gemma4::{Config, Gemma4Model, LayerType, TokenBatch};
use g4ft_lora::{attach, lora_parameters, LoraConfig, LoraContext, TargetModules};
use g4ft_trainer::clip::{clip_coef, grad_norm};
use g4ft_trainer::memory::MemProbe;
use g4ft_trainer::mfu::{mfu, AttnLayer, FlopsModel};
use g4ft_trainer::optim::{AdamW, AdamWParams, FlatBucket};
use g4ft_trainer::schedule::CosineWithWarmup;

/// The post's LoRA target regex: the 7 projections of the text decoder.
const POST_TARGETS: &str =
    r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)";
/// The post's learning rate, warmup steps and clip norm.
const LR: f64 = 1e-4;
const WARMUP_STEPS: u64 = 20;
const MAX_GRAD_NORM: f64 = 1.0;

/// Command line.
#[derive(Debug, Parser)]
#[command(about = "Benchmark the LoRA training step on a random-weight Gemma 4")]
struct Args {
    /// Gemma 4 config.json (text or multimodal).
    #[arg(long)]
    config: PathBuf,
    /// Tokens per sample (every sample is exactly this long).
    #[arg(long, default_value_t = 2048)]
    seq: usize,
    /// Samples per micro-batch.
    #[arg(long, default_value_t = 1)]
    micro_batch: usize,
    /// Micro-batches per optimizer step.
    #[arg(long, default_value_t = 8)]
    accum: usize,
    /// Optimizer steps to run.
    #[arg(long, default_value_t = 10)]
    steps: usize,
    /// Steps left out of the steady-state window.
    #[arg(long, default_value_t = 2)]
    warmup_discard: usize,
    /// LoRA rank.
    #[arg(long, default_value_t = 16)]
    lora_r: usize,
    /// LoRA alpha.
    #[arg(long, default_value_t = 32.0)]
    lora_alpha: f64,
    /// LoRA dropout.
    #[arg(long, default_value_t = 0.05)]
    lora_dropout: f64,
    /// Frozen weight / activation dtype: bf16 or f32.
    #[arg(long, default_value = "bf16")]
    dtype: String,
    /// cuda or cpu.
    #[arg(long, default_value = "cuda")]
    device: String,
    /// Measured bf16 matmul ceiling in TFLOP/s for MFU (default: the vendor table on CUDA).
    #[arg(long)]
    peak_tflops: Option<f64>,
    /// Seed of the random weights, adapters, dropout and tokens.
    #[arg(long, default_value_t = 42)]
    seed: u64,
}

/// SplitMix64 finaliser, for the random token ids.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Random ids in `3..vocab` (no pad/eos/bos, as the anchor) for micro-batch `micro`.
fn random_tokens(seed: u64, micro: u64, n: usize, vocab: usize) -> Vec<u32> {
    let key = mix64(seed ^ mix64(micro.wrapping_add(1)));
    (0..n as u64)
        .map(|i| {
            (3 + mix64(key.wrapping_add(i.wrapping_mul(0x9E37_79B9_7F4A_7C15)))
                % (vocab as u64 - 3)) as u32
        })
        .collect()
}

/// The layer index in a module path `...layers.{i}....`.
fn layer_of(name: &str) -> Option<usize> {
    let rest = &name[name.find("layers.")? + "layers.".len()..];
    rest.split('.').next()?.parse().ok()
}

/// The FLOP model of the config: frozen decoder projections, tied head, attention shapes.
fn flops_model(model: &Gemma4Model) -> FlopsModel {
    let cfg = model.config();
    FlopsModel {
        n_linear: model
            .projections()
            .map(|p| p.weight().elem_count() as u64)
            .sum(),
        n_head: (cfg.vocab_size * cfg.hidden_size) as u64,
        layers: cfg
            .layers
            .iter()
            .map(|l| AttnLayer {
                n_heads: cfg.num_attention_heads,
                head_dim: l.head_dim,
                window: match l.layer_type {
                    LayerType::Sliding => Some(cfg.sliding_window),
                    LayerType::Full => None,
                },
            })
            .collect(),
    }
}

/// The CUDA device name for the vendor-peak fallback.
fn device_name(device: &Device) -> Option<String> {
    match device {
        #[cfg(feature = "cuda")]
        Device::Cuda(d) => d.cuda_stream().context().name().ok(),
        _ => None,
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    if args.steps == 0 || args.accum == 0 || args.micro_batch == 0 || args.seq < 2 {
        bail!("--steps, --accum, --micro-batch must be >= 1 and --seq >= 2");
    }
    let dtype = match args.dtype.as_str() {
        "bf16" => DType::BF16,
        "f32" => DType::F32,
        other => bail!("--dtype: expected bf16 or f32, got {other:?}"),
    };
    let device = match args.device.as_str() {
        "cpu" => Device::Cpu,
        "cuda" => Device::new_cuda(0).context("--device cuda (built with --features cuda?)")?,
        other => bail!("--device: expected cuda or cpu, got {other:?}"),
    };
    let probe = MemProbe::new(&device)?;
    let cfg = Config::from_file(&args.config)
        .with_context(|| format!("reading {}", args.config.display()))?;

    let t0 = Instant::now();
    let mut model = Gemma4Model::random_init(&cfg, dtype, &device, args.seed)?;
    let mut lcfg = LoraConfig::new(
        args.lora_r,
        args.lora_alpha,
        TargetModules::Regex(POST_TARGETS.to_string()),
    );
    lcfg.lora_dropout = args.lora_dropout;
    let adapted = attach(&lcfg, model.projections_mut(), args.seed)?;
    let params = lora_parameters(model.projections());
    let vars: Vec<Var> = params.iter().map(|p| p.var.clone()).collect();
    let lens: Vec<usize> = vars.iter().map(|v| v.elem_count()).collect();
    let trainable: usize = lens.iter().sum();
    // Parameter indices per layer, for the layer-wise gradient callback.
    let mut by_layer = vec![Vec::new(); cfg.num_hidden_layers];
    for (k, p) in params.iter().enumerate() {
        let l = layer_of(&p.name).with_context(|| format!("no layer index in {}", p.name))?;
        by_layer[l].push(k);
    }
    device.synchronize()?;
    let weights_bytes = probe.current()?;
    println!(
        "model layers={} hidden={} vocab={} dtype={:?} device={:?} built_in={:.1}s mem_after_build={:.2} GB",
        cfg.num_hidden_layers,
        cfg.hidden_size,
        cfg.vocab_size,
        dtype,
        device.location(),
        t0.elapsed().as_secs_f64(),
        weights_bytes as f64 / 1e9
    );
    println!(
        "lora r={} alpha={} dropout={} adapted={} trainable={trainable}",
        args.lora_r,
        args.lora_alpha,
        args.lora_dropout,
        adapted.len()
    );

    let mut optim = AdamW::new(AdamWParams::with_weight_decay(0.0), &[trainable], &device)?;
    let mut sched = CosineWithWarmup::new(LR, WARMUP_STEPS, args.steps as u64);
    let (b, t) = (args.micro_batch, args.seq);
    let loss_scale = 1.0 / args.accum as f64;
    let step_tokens = b * t * args.accum;

    probe.reset_peak()?;
    device.synchronize()?;
    let mut step_ends = vec![Instant::now()];
    let mut durs = Vec::new();
    let mut micro_step = 0u64;
    for step in 0..args.steps {
        let ts = Instant::now();
        let mut acc: Vec<Option<Tensor>> = vec![None; vars.len()];
        let mut loss_sum = 0.0;
        for _ in 0..args.accum {
            let ids = random_tokens(args.seed, micro_step, b * t, cfg.vocab_size);
            let labels: Vec<i64> = ids.iter().map(|&x| x as i64).collect();
            let batch = TokenBatch {
                input_ids: &ids,
                attention_mask: None,
                position_ids: None,
                batch: b,
                seq_len: t,
            };
            let ctx = LoraContext {
                training: true,
                track_grad: true,
                seed: args.seed,
                micro_step,
            };
            let stats =
                model.forward_backward(&batch, &labels, &ctx, loss_scale, |layer, grads| {
                    for &k in &by_layer[layer] {
                        let Some(g) = grads.get(&vars[k]) else {
                            continue;
                        };
                        let g = g.detach().flatten_all()?;
                        acc[k] = Some(match acc[k].take() {
                            Some(a) => (a + g)?,
                            None => g,
                        });
                    }
                    Ok::<(), anyhow::Error>(())
                })?;
            loss_sum += stats.mean() * loss_scale;
            micro_step += 1;
        }
        let flat_parts = acc
            .into_iter()
            .zip(&vars)
            .map(|(a, v)| match a {
                Some(a) => Ok(a),
                None => Tensor::zeros(v.elem_count(), DType::F32, &device),
            })
            .collect::<candle_core::Result<Vec<_>>>()?;
        let flat = Tensor::cat(&flat_parts, 0)?;
        drop(flat_parts);
        let norm = grad_norm(std::slice::from_ref(&flat))?;
        let coef = clip_coef(norm, MAX_GRAD_NORM);
        sched.advance();
        let lr = sched.lr();
        optim.step(
            lr,
            coef,
            &[FlatBucket {
                params: &vars,
                grads: &flat,
            }],
        )?;
        drop(flat);
        device.synchronize()?;
        let end = Instant::now();
        let dt = (end - ts).as_secs_f64();
        step_ends.push(end);
        durs.push(dt);
        println!(
            "step={step} loss={loss_sum:.4} grad_norm={norm:.3} lr={lr:.2e} tok/s={:.0} step_s={dt:.3} peak_gb={:.2}",
            step_tokens as f64 / dt,
            probe.peak()? as f64 / 1e9
        );
    }

    let n = args.steps;
    let lo = args.warmup_discard.min(n - 1);
    let window_s = (step_ends[n] - step_ends[lo]).as_secs_f64();
    let tps = (step_tokens * (n - lo)) as f64 / window_s;
    let s_per_step = window_s / (n - lo) as f64;
    let peak = probe.peak()?;
    let fl = flops_model(&model).flops_per_token(t);
    let peak_tflops = args
        .peak_tflops
        .or_else(|| device_name(&device).and_then(|n| g4ft_trainer::mfu::peak_tflops_for(&n)));
    let achieved = tps * fl.brief / 1e12;
    let mfu_v = peak_tflops.map_or(f64::NAN, |p| mfu(tps, fl.brief, p));
    println!(
        "SUMMARY tokens_per_s={tps:.0} s_per_step={s_per_step:.3} (steps {lo}..{}) peak_gb={:.2} mfu={mfu_v:.3} achieved_tflops={achieved:.1} trainable={trainable}",
        n - 1,
        peak as f64 / 1e9
    );
    let res = serde_json::json!({
        "seq": t, "micro_batch": b, "accum": args.accum, "world": 1, "steps": n,
        "window_steps": n - lo, "window_s": window_s, "tokens_per_s": tps,
        "s_per_step": s_per_step, "step_s_all": durs,
        "peak_GB": peak as f64 / 1e9, "peak_GiB": peak as f64 / (1u64 << 30) as f64,
        "peak_what": probe.what(), "mem_after_build_GB": weights_bytes as f64 / 1e9,
        "trainable_params": trainable, "flops_per_token_brief": fl.brief,
        "flops_per_token_exact": fl.exact, "attn_flops_per_token": fl.attention,
        "achieved_TFLOPs_brief": achieved, "peak_matmul_TFLOPs": peak_tflops,
        "MFU_brief": peak_tflops.map(|p| mfu(tps, fl.brief, p)),
        "dtype": format!("{dtype:?}"), "lora_r": args.lora_r,
    });
    println!("RESULT_JSON {res}");
    Ok(())
}
