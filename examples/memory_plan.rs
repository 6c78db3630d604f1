//! Memory planner: the post's memory budget ("Memory budget for Gemma 4 12B with LoRA") for any
//! Gemma 4 config, sequence length, micro-batch, LoRA rank and world size, computed for our
//! training step (`Gemma4Model::forward_backward`: forward without graph saving each layer's input,
//! chunked fused linear + CE, per-layer recompute; fp32 adapters and AdamW over a flat bucket).
//!
//! Lines (GB = 10⁹ bytes, `b` micro-batch, `t` sequence length, `H` hidden, `L` layers):
//! - frozen weights: every text parameter in the weight dtype;
//! - LoRA state: fp32 params + AdamW m and v (12 B/param), plus DDP's flat fp32 gradient buckets,
//!   the only copy of the gradients (4 B/param);
//! - saved layer inputs: `L·b·t·H·bytes` (plus the K/V of KV-sharing producers);
//! - one layer's recompute working set (largest layer): its explicit-backward tape plus what is
//!   live at its largest moment (the `down_proj` backward, or the expert backward of a MoE layer);
//! - CE working set: one `(chunk_rows, V)` logits chunk in the weight dtype (d(logits) overwrite it
//!   in place), plus d(hidden) and the normed hidden of all `b·t` rows;
//! - communication per optimizer step and rank: `2(N−1)/N × 4 B × trainable` (ring all-reduce of
//!   the fp32 gradients);
//! - predicted peak: weights + LoRA state + saved inputs + max(recompute, CE) working set.
//!
//! ```text
//! cargo run --release --example memory_plan -- --config crates/gemma4/tests/configs/gemma-4-12B-it.json
//! ```

use anyhow::{bail, Context, Result};
use clap::Parser;
use g4ft_gemma4::{Config, Gemma4Model, KvSharing, LayerConfig};
use g4ft_lora::{count_trainable, LoraConfig, ProjectionShape, TargetModules};
use g4ft_trainer::cli::ShapeArgs;
use g4ft_trainer::config::POST_LORA_TARGETS;

/// Command line.
#[derive(Debug, Parser)]
#[command(about = "Print the LoRA training memory budget of a Gemma 4 config")]
struct Args {
    /// Config, sequence length, micro-batch, LoRA rank, dtype.
    #[command(flatten)]
    shape: ShapeArgs,
    /// Ranks (GPUs) in the DDP job.
    #[arg(long, default_value_t = 1)]
    world: usize,
}

const GB: f64 = 1e9;

/// Per-token widths of one layer: hidden, all query heads, all K (or V) heads, MLP.
struct Widths {
    h: u64,
    q: u64,
    kvd: u64,
    im: u64,
}

impl Widths {
    fn of(cfg: &Config, l: &LayerConfig) -> Self {
        let d = l.head_dim as u64;
        Widths {
            h: cfg.hidden_size as u64,
            q: cfg.num_attention_heads as u64 * d,
            kvd: l.num_key_value_heads as u64 * d,
            im: l.intermediate_size as u64,
        }
    }
}

/// Peak working set (elements of the weight dtype) of one layer's recompute + backward
/// (`decoder_layer/explicit.rs`): the tape (layer input, raw q/k/v of a layer with its own K/V,
/// K/V, attention output, the two residual-stream tensors, gate, up, their product, the MLP output,
/// the LoRA `low`s) plus, during the `down_proj` backward, the upstream gradient and one dropout
/// chunk (8M elements); d(MLP output) and d(product) take the memory of the MLP output and of the
/// product. A MoE layer adds the expert tape (router probabilities, the `n·k` grouped gate, up
/// and expert output rows, the branch's two outputs) and, at the expert backward, the grouped
/// gradients (d(output rows), d(act), d(gate‖up), d(input rows)); a per-layer-embedding layer its
/// gate, input and projection.
fn layer_working_elems(cfg: &Config, l: &LayerConfig, bt: u64, r: u64) -> u64 {
    let Widths { h, q, kvd, im } = Widths::of(cfg, l);
    let own_kv = if l.has_kv_proj() {
        kvd + if l.has_v_proj { kvd } else { 0 }
    } else {
        0
    };
    let tape = bt * (h + q + own_kv + 2 * kvd + q + 2 * h + 3 * im + h + 7 * r);
    let dense_peak = tape + bt * h + (8u64 << 20).min(bt * im);
    let p = cfg.hidden_size_per_layer_input as u64;
    let ple = bt * (2 * p + h);
    let moe = cfg.moe.as_ref().map_or(0, |m| {
        let (e, k, mi) = (
            m.num_experts as u64,
            m.top_k_experts as u64,
            m.moe_intermediate_size as u64,
        );
        // f32 values count twice in weight-dtype elements (bf16).
        let tape = bt * (2 * e + 3 * k + k * (2 * mi + h) + 2 * h);
        let backward = bt * k * (h + mi + 2 * mi + h);
        tape + backward
    });
    dense_peak + ple + moe
}

fn main() -> Result<()> {
    let args = Args::parse();
    let (a, world) = (&args.shape, args.world);
    if world == 0 || a.micro_batch == 0 || a.seq == 0 || a.lora_r == 0 {
        bail!("--seq, --micro-batch, --lora-r and --world must be >= 1");
    }
    let wbytes = a.dtype()?.size_in_bytes() as u64;
    let cfg =
        Config::from_file(&a.config).with_context(|| format!("reading {}", a.config.display()))?;
    let (b, t, h, l, v) = (
        a.micro_batch as u64,
        a.seq as u64,
        cfg.hidden_size as u64,
        cfg.num_hidden_layers as u64,
        cfg.vocab_size as u64,
    );
    let bt = b * t;

    let n_params = cfg.num_text_parameters();
    let n_embed = v * h;
    let weights = n_params * wbytes;

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
    let trainable = count_trainable(&lcfg, &shapes)?;
    let lora_state = 12 * trainable;
    let flat_bucket = 4 * trainable;

    let mut saved = l * bt * h * wbytes;
    for layer in &cfg.layers {
        if layer.kv_sharing == KvSharing::Store {
            let n = if layer.has_v_proj { 2 } else { 1 };
            saved += n * bt * (layer.num_key_value_heads * layer.head_dim) as u64 * wbytes;
        }
    }
    let (worst_layer, layer_elems) = cfg
        .layers
        .iter()
        .enumerate()
        .map(|(i, ly)| (i, layer_working_elems(&cfg, ly, bt, a.lora_r as u64)))
        .max_by_key(|&(_, e)| e)
        .context("config has no layers")?;
    let recompute = layer_elems * wbytes;
    let chunk_rows = Gemma4Model::default_loss_chunk_rows(cfg.vocab_size) as u64;
    let ce_chunk = chunk_rows.min(bt) * v * wbytes;
    let ce = ce_chunk + bt * h * (wbytes + 4) + bt * h * wbytes;
    let n = world as f64;
    let ring = 2.0 * (n - 1.0) / n;
    let comm = ring * 4.0 * trainable as f64;
    let fixed = weights + lora_state + flat_bucket + saved;
    let peak = fixed + recompute.max(ce);

    println!(
        "memory plan: {} | {} layers, hidden {h}, vocab {v} | seq {t}, micro-batch {b}, LoRA r{} on 7 projections, world {} | weights {}",
        a.config.display(),
        l,
        a.lora_r,
        world,
        a.dtype
    );
    let row = |what: &str, bytes: f64, how: String| {
        println!("  {what:<38} {:>9.3} GB   {how}", bytes / GB);
    };
    row(
        "frozen weights",
        weights as f64,
        format!(
            "{n_params} params × {wbytes} B (embedding/head {n_embed}, decoder {})",
            n_params - n_embed
        ),
    );
    row(
        "LoRA params + AdamW m, v",
        lora_state as f64,
        format!("{trainable} trainable × 12 B (fp32)"),
    );
    row(
        "DDP fp32 gradient buckets",
        flat_bucket as f64,
        format!("{trainable} × 4 B"),
    );
    row(
        "saved layer inputs (checkpointing)",
        saved as f64,
        format!("L·b·t·H·bytes = {l}·{b}·{t}·{h}·{wbytes} (+ shared K/V)"),
    );
    row(
        "one layer recompute working set",
        recompute as f64,
        format!("largest: layer {worst_layer}, {layer_elems} elements (estimate)"),
    );
    row(
        "logits / CE working set",
        ce as f64,
        format!(
            "chunk {}×{v}×{wbytes} B = {:.3} GB + d(hidden), normed hidden",
            chunk_rows.min(bt),
            ce_chunk as f64 / GB
        ),
    );
    row(
        "predicted peak",
        peak as f64,
        "weights + LoRA state + bucket + saved + max(recompute, CE)".into(),
    );
    println!(
        "  {:<38} {:>9.3} GB   2(N−1)/N = {ring:.3} × {trainable} × 4 B per rank (fp32 ring all-reduce)",
        "communication per optimizer step",
        comm / GB
    );
    println!(
        "PLAN weights_gb={:.3} lora_state_gb={:.3} saved_gb={:.3} recompute_gb={:.3} ce_gb={:.3} comm_gb={:.4} peak_gb={:.3} trainable={trainable}",
        weights as f64 / GB,
        (lora_state + flat_bucket) as f64 / GB,
        saved as f64 / GB,
        recompute as f64 / GB,
        ce as f64 / GB,
        comm / GB,
        peak as f64 / GB
    );
    Ok(())
}
