//! Speed of the attention kernels at Gemma 4's shapes: µs per call and TFLOP/s of the forward
//! (`attention_saved`) and of the backward (`AttentionSaved::backward`), the two calls a training
//! step makes per layer, for the sliding layers (16 query heads, 8 kv heads, head dim 256, window
//! 1024) and the full ones (16 query heads, 1 kv head, head dim 512, causal) of the 12B, on random
//! inputs at each `--seqs` length and `--batches` size.
//!
//! TFLOP/s counts the products of the visible (query, key) pairs alone, as FlashAttention's
//! benchmarks do: 4·d FLOPs a pair per head forward (`Q·Kᵀ`, `P·V`), 10·d backward (`dV`, `dP`,
//! `dK`, `dQ` and the recomputed `S`), whatever the kernels execute beyond that (masked tiles, a
//! second recompute of `S` in the dQ kernel). Each row is the mean of `--iters` synchronised calls
//! after two warm-up calls. Prints a Markdown table.
//!
//! ```text
//! cargo run --release --features cuda --example bench_attention -- --seqs 2048,32768 --batches 1,2
//! ```

use std::time::Instant;

use anyhow::{Context, Result};
use candle_core::{DType, Device, Tensor};
use clap::Parser;
use g4ft::ops::{attention_saved, AttentionPlan, KeyMask};

#[derive(Parser, Debug)]
#[command(about = "µs and TFLOP/s of the attention forward and backward at Gemma 4 shapes")]
struct Args {
    /// Tokens per sequence, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "2048")]
    seqs: Vec<usize>,
    /// Sequences per call, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    batches: Vec<usize>,
    /// Timed calls per row.
    #[arg(long, default_value_t = 20)]
    iters: usize,
    /// Run the Hopper warpgroup-MMA kernels where they exist (`AttentionPlan::wgmma`).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    wgmma: bool,
    /// Device.
    #[arg(long, default_value = "cuda", value_parser = ["cpu", "cuda"])]
    device: String,
}

/// One attention layer kind of the 12B.
struct Layer {
    name: &'static str,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    window: Option<usize>,
}

const LAYERS: [Layer; 2] = [
    Layer {
        name: "sliding",
        heads: 16,
        kv_heads: 8,
        head_dim: 256,
        window: Some(1024),
    },
    Layer {
        name: "full",
        heads: 16,
        kv_heads: 1,
        head_dim: 512,
        window: None,
    },
];

/// Visible (query, key) pairs of one causal sequence of `t` tokens, each query seeing at most
/// `window` keys.
fn visible_pairs(t: usize, window: Option<usize>) -> f64 {
    (0..t)
        .map(|i| (i + 1).min(window.unwrap_or(t)) as f64)
        .sum()
}

/// Mean seconds of `f` over `iters` calls after two warm-up calls, synchronised.
fn seconds(dev: &Device, iters: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    for _ in 0..2 {
        f()?;
    }
    dev.synchronize()?;
    let start = Instant::now();
    for _ in 0..iters {
        f()?;
    }
    dev.synchronize()?;
    Ok(start.elapsed().as_secs_f64() / iters as f64)
}

fn main() -> Result<()> {
    let args = Args::parse();
    let dev = match args.device.as_str() {
        "cuda" => Device::new_cuda(0).context("--device cuda (build with --features cuda)")?,
        _ => Device::Cpu,
    };
    let plan = AttentionPlan {
        wgmma: args.wgmma,
        ..AttentionPlan::default()
    };
    let random = |dims: &[usize]| -> Result<Tensor> {
        Ok(Tensor::randn(0f32, 1.0, dims, &dev)?.to_dtype(DType::BF16)?)
    };
    println!("plan: {plan:?}");
    println!("\n| layer | batch | tokens | head dim | window | forward µs | TFLOP/s | backward µs | TFLOP/s |");
    println!("|---|---:|---:|---:|---|---:|---:|---:|---:|");
    for &t in &args.seqs {
        for layer in &LAYERS {
            for &b in &args.batches {
                let (nh, nkv, d) = (layer.heads, layer.kv_heads, layer.head_dim);
                let q = random(&[b, nh, t, d])?;
                let k = random(&[b, nkv, t, d])?;
                let v = random(&[b, nkv, t, d])?;
                let g = random(&[b, nh, t, d])?;
                let forward =
                    || attention_saved(&q, &k, &v, KeyMask::default(), layer.window, 1.0, &plan);
                let fwd_s = seconds(&dev, args.iters, || {
                    forward().map(|_| ()).map_err(Into::into)
                })?;
                let (o, saved) = forward()?;
                let bwd_s = seconds(&dev, args.iters, || {
                    saved
                        .backward(&q, &k, &v, &o, &g)
                        .map(|_| ())
                        .map_err(Into::into)
                })?;
                let pair_flops = visible_pairs(t, layer.window) * (b * nh * d) as f64;
                let tflops = |per_pair: f64, s: f64| per_pair * pair_flops / s / 1e12;
                println!(
                    "| {} | {b} | {t} | {d} | {} | {:.1} | {:.0} | {:.1} | {:.0} |",
                    layer.name,
                    layer.window.map_or("causal".to_string(), |w| w.to_string()),
                    fwd_s * 1e6,
                    tflops(4.0, fwd_s),
                    bwd_s * 1e6,
                    tflops(10.0, bwd_s),
                );
            }
        }
    }
    Ok(())
}
