//! DDP all-reduce overlap (CPU backend): a backward-like workload that produces gradients layer
//! by layer; bucketed async all-reduce launched as buckets fill ("overlap") vs the same
//! all-reduces launched after the whole backward ("after backward").
//!
//! Two ranks run as two threads of this process (each with its own process group over
//! loopback TCP and its own comm thread), rank 1 mirroring rank 0's iteration counts. Prints a
//! summary (medians of manual timings: compute only, communication only, both modes, fraction
//! of communication hidden), then criterion measurements of the two modes.
//! `cargo bench --bench allreduce_overlap`. NCCL (`--features cuda`) is not wired in here yet.

use candle_core::{DType, Device, Tensor, Var};
use criterion::{criterion_group, criterion_main, Criterion};
use g4ft_ddp::store::StoreServer;
use g4ft_ddp::{DdpOptions, DistEnv, DistributedDataParallel, GroupOptions, ProcessGroup};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::time::{Duration, Instant};

const LAYERS: usize = 8;
const D: usize = 256; // each layer has two D×D fp32 params: 512 KiB of gradients per layer
const ROWS: usize = 96; // activation rows: sets compute per layer
const BUCKET_MB: f64 = 1.0;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    ComputeOnly,
    CommOnly,
    AfterBackward,
    Overlap,
}

struct Rank<'g> {
    ddp: DistributedDataParallel<'g>,
    names: Vec<String>,
    act: Tensor,
    w: Tensor,
    fixed: Vec<Tensor>,
}

fn group(rank: usize, port: u16) -> ProcessGroup {
    let mut env = DistEnv::single();
    env.rank = rank;
    env.world_size = 2;
    env.master_port = port;
    env.use_agent_store = true;
    let opts = GroupOptions {
        timeout: Duration::from_secs(60),
        name: Some("bench".into()),
        ..Default::default()
    };
    ProcessGroup::new(env, &Device::Cpu, opts).expect("process group")
}

fn rank_state(pg: &ProcessGroup) -> Rank<'_> {
    let dev = Device::Cpu;
    let mut params = Vec::new();
    for l in 0..LAYERS {
        for p in ["lora_A", "lora_B"] {
            let v = Var::zeros((D, D), DType::F32, &dev).expect("param");
            params.push((format!("layers.{l}.{p}"), v));
        }
    }
    let names = params.iter().map(|(n, _)| n.clone()).collect();
    let opts = DdpOptions {
        bucket_cap_mb: BUCKET_MB,
        ..Default::default()
    };
    let ddp = DistributedDataParallel::new(pg, params, opts).expect("ddp");
    let act = Tensor::randn(0f32, 1.0, (ROWS, D), &dev).expect("act");
    let w = Tensor::randn(0f32, 0.05, (D, D), &dev).expect("w");
    let fixed = (0..2 * LAYERS)
        .map(|_| Tensor::ones((D, D), DType::F32, &dev).expect("g"))
        .collect();
    Rank {
        ddp,
        names,
        act,
        w,
        fixed,
    }
}

/// One layer's backward: a few matmuls, then two D×D gradients.
fn layer_backward(r: &Rank) -> (Tensor, Tensor) {
    let mut h = r.act.clone();
    for _ in 0..3 {
        h = h.matmul(&r.w).expect("matmul").tanh().expect("tanh"); // (ROWS, D)
    }
    let g = h.t().expect("t").matmul(&r.act).expect("matmul"); // (D, D)
    let g2 = (&g * 0.5).expect("scale");
    (g, g2)
}

fn step(r: &mut Rank, mode: Mode) {
    let mut later = Vec::new();
    for l in (0..LAYERS).rev() {
        let (ga, gb) = match mode {
            Mode::CommOnly => (r.fixed[2 * l].clone(), r.fixed[2 * l + 1].clone()),
            _ => layer_backward(r),
        };
        let names = [r.names[2 * l + 1].clone(), r.names[2 * l].clone()];
        match mode {
            Mode::ComputeOnly => {}
            Mode::AfterBackward => later.extend([(names[0].clone(), gb), (names[1].clone(), ga)]),
            Mode::Overlap | Mode::CommOnly => {
                r.ddp.grad_ready(&names[0], &gb).expect("grad_ready");
                r.ddp.grad_ready(&names[1], &ga).expect("grad_ready");
            }
        }
    }
    for (n, g) in &later {
        r.ddp.grad_ready(n, g).expect("grad_ready");
    }
    if mode != Mode::ComputeOnly {
        r.ddp.finish().expect("finish");
    }
}

fn peer(port: u16, rx: Receiver<(Mode, u64)>, done: Sender<()>) {
    let pg = group(1, port);
    let mut r = rank_state(&pg);
    for (mode, iters) in rx {
        for _ in 0..iters {
            step(&mut r, mode);
        }
        done.send(()).expect("bench main thread gone");
    }
}

fn run(
    r: &mut Rank,
    tx: &Sender<(Mode, u64)>,
    done: &Receiver<()>,
    mode: Mode,
    iters: u64,
) -> Duration {
    tx.send((mode, iters)).expect("peer gone");
    let t0 = Instant::now();
    for _ in 0..iters {
        step(r, mode);
    }
    let dt = t0.elapsed();
    done.recv().expect("peer gone");
    dt
}

fn median_ms(r: &mut Rank, tx: &Sender<(Mode, u64)>, done: &Receiver<()>, mode: Mode) -> f64 {
    let mut v: Vec<f64> = (0..25)
        .map(|_| run(r, tx, done, mode, 1).as_secs_f64() * 1e3)
        .collect();
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn bench(c: &mut Criterion) {
    // One gemm thread per rank: the machine's cores go to the ranks and their comm threads.
    std::env::set_var("RAYON_NUM_THREADS", "1");
    let server = StoreServer::bind("127.0.0.1", 0).expect("store");
    let port = server.port();
    let (tx, prx) = channel();
    let (dtx, done) = channel();
    let peer = std::thread::spawn(move || peer(port, prx, dtx));
    let pg = group(0, port);
    let mut r = rank_state(&pg);
    run(&mut r, &tx, &done, Mode::Overlap, 3); // warm-up
    let m: Vec<(Mode, f64)> = [
        Mode::ComputeOnly,
        Mode::CommOnly,
        Mode::AfterBackward,
        Mode::Overlap,
    ]
    .into_iter()
    .map(|mode| (mode, median_ms(&mut r, &tx, &done, mode)))
    .collect();
    let (compute, comm, after, overlap) = (m[0].1, m[1].1, m[2].1, m[3].1);
    let exposed_after = (after - compute).max(1e-9);
    let hidden = 1.0 - (overlap - compute).max(0.0) / exposed_after;
    println!("\nDDP all-reduce overlap, CPU ring, 2 ranks (threads), {LAYERS} layers x 2 x {D}x{D} fp32 grads, {BUCKET_MB} MiB buckets");
    println!("| mode | median step ms |\n|---|---|");
    for (mode, ms) in &m {
        println!("| {mode:?} | {ms:.2} |");
    }
    println!(
        "communication alone {comm:.2} ms; exposed after backward {:.2} ms; with overlap {:.2} ms",
        after - compute,
        overlap - compute
    );
    println!(
        "communication hidden by overlap: {:.0}% (1 - (overlap - compute) / (after - compute))\n",
        hidden * 100.0
    );
    let mut g = c.benchmark_group("ddp_allreduce_overlap");
    g.sample_size(10);
    for mode in [Mode::AfterBackward, Mode::Overlap] {
        g.bench_function(format!("{mode:?}"), |b| {
            b.iter_custom(|iters| run(&mut r, &tx, &done, mode, iters))
        });
    }
    g.finish();
    drop(tx);
    peer.join().expect("peer thread");
}

criterion_group!(benches, bench);
criterion_main!(benches);
