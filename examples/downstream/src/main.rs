//! g4ft as a library: load a model, attach LoRA, wrap the adapters in DDP, train a few steps on
//! two CPU ranks.
//!
//! ```text
//! cargo run --manifest-path examples/downstream/Cargo.toml
//! ```
//! Started without the torchrun environment, the process is rank 0 and starts rank 1 itself (the
//! same binary with `RANK=1`, `WORLD_SIZE=2`, `MASTER_ADDR`, `MASTER_PORT`), so it also runs
//! unchanged under `torchrun --nproc_per_node=2 --no-python` or `ddprun`. Each rank trains on its
//! own tokens; DDP averages the gradients, so both ranks end with the same adapter, which the
//! last line checks.

use std::net::TcpListener;
use std::process::{Child, Command};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device};
use g4ft_ddp::{DdpOptions, DistEnv, DistributedDataParallel, GroupOptions, ProcessGroup};
use g4ft_gemma4::{Gemma4Model, TokenBatch};
use g4ft_lora::{attach, lora_parameters, LoraConfig, LoraContext, TargetModules};
use g4ft_trainer::step::clip::{clip_coef, grad_norm};
use g4ft_trainer::step::optim::{AdamW, AdamWParams};
use g4ft_trainer::step::{adamw_step, bucket_grads, bucket_lens};

/// The tiny Gemma-4-shaped model bundled with g4ft (random weights, vocabulary 512).
const MODEL_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../assets/tiny");
const STEPS: u64 = 4;
const SEQ: usize = 32;

fn main() -> Result<()> {
    // Under a launcher every rank reads its place from the environment; alone, become rank 0
    // of two and start rank 1.
    let (env, peer) = if std::env::var_os("WORLD_SIZE").is_some() {
        (DistEnv::from_env()?, None)
    } else {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let peer = spawn_rank(1, 2, port)?;
        let env = DistEnv::from_lookup(|k| launcher_var(k, 0, 2, port))?;
        (env, Some(peer))
    };
    let result = train(env);
    if let Some(mut peer) = peer {
        if result.is_err() {
            let _ = peer.kill();
        }
        let status = peer.wait()?;
        if result.is_ok() && !status.success() {
            bail!("rank 1 failed: {status}");
        }
    }
    result
}

fn train(env: DistEnv) -> Result<()> {
    let device = Device::Cpu;
    let opts = GroupOptions {
        timeout: Duration::from_secs(60),
        ..Default::default()
    };
    let group = ProcessGroup::new(env, &device, opts)?;
    let rank = group.rank();

    // 1. The frozen base model (a local directory or a Hugging Face model id).
    let mut model = Gemma4Model::load(MODEL_DIR, DType::F32, &device)?;

    // 2. LoRA r=8 on the attention and MLP projections, initialised as PEFT does; the same seed
    //    gives the same adapter on every rank.
    let targets = TargetModules::Regex(r".*\.(q|k|v|o|gate|up|down)_proj".into());
    let lora = LoraConfig::new(8, 16.0, targets);
    attach(&lora, model.projections_mut(), 0)?;

    // 3. DDP over the adapter parameters: rank 0's values are broadcast, gradients live in
    //    flat buckets that all-reduce while the backward runs.
    let params = lora_parameters(model.projections())
        .into_iter()
        .map(|p| (p.name, p.var))
        .collect();
    let mut ddp = DistributedDataParallel::new(&group, params, DdpOptions::default())?;
    let mut opt = AdamW::new(
        AdamWParams::with_weight_decay(0.0),
        &bucket_lens(&ddp)?,
        &device,
    )?;

    // 4. Training steps on this rank's tokens (labels = inputs: every next token is a target).
    let vocab = model.config().vocab_size as u32;
    let ids: Vec<u32> = (0..SEQ as u32)
        .map(|i| 3 + (i * 7 + rank as u32 * 11) % (vocab - 3))
        .collect();
    let labels: Vec<i64> = ids.iter().map(|&t| t as i64).collect();
    let batch = TokenBatch {
        input_ids: &ids,
        attention_mask: None,
        position_ids: None,
        batch: 1,
        seq_len: SEQ,
    };
    let mut losses = Vec::new();
    for step in 0..STEPS {
        let ctx = LoraContext {
            training: true,
            track_grad: true,
            seed: rank as u64,
            micro_step: step,
        };
        // Each layer's adapter gradients go to DDP as soon as the layer-wise backward has them.
        let stats = model.forward_backward(&batch, &labels, &ctx, 1.0, |_layer, grads| {
            ddp.grads_ready_with(|v| grads.get(v).cloned())
                .map(drop)
                .context("handing gradients to DDP")
        })?;
        ddp.finish()?; // the buckets hold the gradients averaged over the ranks
        let norm = grad_norm(&bucket_grads(&ddp)?)?;
        adamw_step(&mut opt, &ddp, 1e-2, clip_coef(norm, 1.0))?;
        let loss = stats.mean()?;
        println!(
            "[rank {rank}] step {} loss {loss:.4} grad_norm {norm:.4}",
            step + 1
        );
        losses.push(loss);
    }
    if losses[STEPS as usize - 1] >= losses[0] {
        bail!("[rank {rank}] the loss did not go down: {losses:?}");
    }

    // 5. Every rank must hold the same adapter: DDP compares checksums across ranks.
    let checksum = ddp.check_parameters()?;
    println!("[rank {rank}] adapter identical on all ranks: checksum {checksum:#018x}");
    Ok(())
}

/// The variables torchrun gives worker `rank` of `world` on this host.
fn launcher_var(key: &str, rank: usize, world: usize, port: u16) -> Option<String> {
    Some(match key {
        "RANK" | "LOCAL_RANK" => rank.to_string(),
        "WORLD_SIZE" | "LOCAL_WORLD_SIZE" => world.to_string(),
        "MASTER_ADDR" => "127.0.0.1".into(),
        "MASTER_PORT" => port.to_string(),
        _ => return None,
    })
}

/// Starts this binary again as worker `rank` of `world`.
fn spawn_rank(rank: usize, world: usize, port: u16) -> Result<Child> {
    let mut cmd = Command::new(std::env::current_exe()?);
    for key in [
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
    ] {
        cmd.env(
            key,
            launcher_var(key, rank, world, port).expect("a launcher variable"),
        );
    }
    cmd.spawn().context("starting rank 1")
}
