//! DDP all-reduce overlap: a backward-like workload that produces gradients layer by layer;
//! bucketed async all-reduce launched as buckets fill ("overlap") vs the same all-reduces
//! launched after the whole backward ("after backward").
//!
//! Default (CPU backend): two ranks run as two threads of this process (each with its own process
//! group over loopback TCP and its own comm thread), rank 1 mirroring rank 0's iteration counts;
//! 8 layers of two 256×256 fp32 gradients, 1 MiB buckets.
//!
//! `--features cuda` (NCCL backend): one rank per GPU, as processes under `ddprun`/`torchrun`
//! (`ddprun --standalone --nproc-per-node N -- <bench exe> --bench`); started without a torchrun
//! environment it is one rank on `cuda:0` with the forced one-rank NCCL communicator
//! (`GroupOptions::force_nccl`). Workload close to a LoRA step: 48 layers, each a chain of bf16
//! (2048×5120)·(5120×5120) matmuls (`G4FT_BENCH_REPS`, default 12, ≈ 1-3 ms on an H200) and four
//! rank-16 LoRA gradients of 16×5120 fp32 (1.25 MiB per layer, 60 MiB per step), 25 MiB buckets.
//! Rank 0 runs criterion; the other ranks follow its (mode, iterations) commands, which rank 0
//! broadcasts through the process group before each timed run.
//!
//! Prints a summary (medians of manual timings: compute only, communication only, both modes,
//! fraction of communication hidden), then criterion measurements of the two modes.
//! `cargo bench --bench allreduce_overlap [--features cuda]`.

use candle_core::{DType, Device, Tensor, Var};
use criterion::{criterion_group, criterion_main, Criterion};
use g4ft_ddp::{DdpOptions, DistributedDataParallel, ProcessGroup};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    ComputeOnly,
    CommOnly,
    AfterBackward,
    Overlap,
}

const MODES: [Mode; 4] = [
    Mode::ComputeOnly,
    Mode::CommOnly,
    Mode::AfterBackward,
    Mode::Overlap,
];

/// One layer's backward: its parameters' gradients, in model order.
type LayerBackward = Box<dyn Fn(usize) -> Vec<Tensor>>;

/// One rank's state: DDP over `layers × per_layer` parameters and the layer backward.
struct Rank<'g> {
    ddp: DistributedDataParallel<'g>,
    names: Vec<String>,
    per_layer: usize,
    layers: usize,
    /// Precomputed gradients (model order) for the communication-only mode.
    fixed: Vec<Tensor>,
    backward: LayerBackward,
    dev: Device,
}

impl Rank<'_> {
    fn new<'g>(
        pg: &'g ProcessGroup,
        dev: &Device,
        layers: usize,
        shapes: &[(&str, (usize, usize))],
        bucket_mb: f64,
        backward: LayerBackward,
    ) -> Rank<'g> {
        let mut params = Vec::new();
        for l in 0..layers {
            for (p, shape) in shapes {
                let v = Var::zeros(*shape, DType::F32, dev).expect("param");
                params.push((format!("layers.{l}.{p}"), v));
            }
        }
        let names = params.iter().map(|(n, _)| n.clone()).collect();
        let fixed = params
            .iter()
            .map(|(_, v)| Tensor::ones(v.shape(), DType::F32, dev).expect("fixed grad"))
            .collect();
        let opts = DdpOptions {
            bucket_cap_mb: bucket_mb,
            ..Default::default()
        };
        let ddp = DistributedDataParallel::new(pg, params, opts).expect("ddp");
        Rank {
            ddp,
            names,
            per_layer: shapes.len(),
            layers,
            fixed,
            backward,
            dev: dev.clone(),
        }
    }
}

/// One step: layers in reverse order, each layer's gradients reported in reverse parameter
/// order (as they are produced) or kept for after the backward; ends synchronised.
fn step(r: &mut Rank, mode: Mode) {
    let k = r.per_layer;
    let mut later = Vec::new();
    for l in (0..r.layers).rev() {
        let grads = match mode {
            Mode::CommOnly => r.fixed[l * k..(l + 1) * k].to_vec(),
            _ => (r.backward)(l),
        };
        for (j, g) in grads.into_iter().enumerate().rev() {
            let name = &r.names[l * k + j];
            match mode {
                Mode::ComputeOnly => {}
                Mode::AfterBackward => later.push((name.clone(), g)),
                Mode::Overlap | Mode::CommOnly => r.ddp.grad_ready(name, &g).expect("grad_ready"),
            }
        }
    }
    for (n, g) in &later {
        r.ddp.grad_ready(n, g).expect("grad_ready");
    }
    if mode != Mode::ComputeOnly {
        r.ddp.finish().expect("finish");
    }
    r.dev.synchronize().expect("synchronize");
}

/// Runs `iters` steps of `mode` on every rank; returns this rank's wall time.
type Driver<'a, 'g> = dyn FnMut(&mut Rank<'g>, Mode, u64) -> Duration + 'a;

fn median_ms<'g>(r: &mut Rank<'g>, drive: &mut Driver<'_, 'g>, mode: Mode) -> f64 {
    let mut v: Vec<f64> = (0..25)
        .map(|_| drive(r, mode, 1).as_secs_f64() * 1e3)
        .collect();
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Warm-up, the summary table, then criterion for the two modes (rank 0 only).
fn measure<'g>(c: &mut Criterion, r: &mut Rank<'g>, drive: &mut Driver<'_, 'g>, title: &str) {
    drive(r, Mode::Overlap, 3); // warm-up
    let m: Vec<(Mode, f64)> = MODES
        .into_iter()
        .map(|mode| (mode, median_ms(r, drive, mode)))
        .collect();
    let (compute, comm, after, overlap) = (m[0].1, m[1].1, m[2].1, m[3].1);
    println!("\n{title}");
    println!("| mode | median step ms |\n|---|---|");
    for (mode, ms) in &m {
        println!("| {mode:?} | {ms:.2} |");
    }
    println!(
        "compute per layer {:.3} ms; communication alone {comm:.2} ms; exposed after backward {:.2} ms; with overlap {:.2} ms",
        compute / r.layers as f64,
        after - compute,
        overlap - compute
    );
    let exposed_after = after - compute;
    if exposed_after > 0.02 * compute.max(1e-9) {
        let hidden = 1.0 - (overlap - compute).max(0.0) / exposed_after;
        println!(
            "communication hidden by overlap: {:.0}% (1 - (overlap - compute) / (after - compute))\n",
            hidden * 100.0
        );
    } else {
        println!("communication hidden by overlap: n/a (exposed communication after backward is < 2% of compute, within noise)\n");
    }
    let mut g = c.benchmark_group("ddp_allreduce_overlap");
    g.sample_size(10);
    for mode in [Mode::AfterBackward, Mode::Overlap] {
        g.bench_function(format!("{mode:?}"), |b| {
            b.iter_custom(|iters| drive(r, mode, iters))
        });
    }
    g.finish();
}

#[cfg(not(feature = "cuda"))]
mod cpu {
    //! The CPU ring backend, two ranks as two threads.

    use super::*;
    use g4ft_ddp::store::StoreServer;
    use g4ft_ddp::{DistEnv, GroupOptions};
    use std::sync::mpsc::{channel, Receiver, Sender};

    const LAYERS: usize = 8;
    const D: usize = 256; // each layer has two D×D fp32 params: 512 KiB of gradients per layer
    const ROWS: usize = 96; // activation rows: sets compute per layer
    const BUCKET_MB: f64 = 1.0;

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
        let act = Tensor::randn(0f32, 1.0, (ROWS, D), &dev).expect("act");
        let w = Tensor::randn(0f32, 0.05, (D, D), &dev).expect("w");
        // A few matmuls, then two D×D gradients.
        let backward = Box::new(move |_l: usize| {
            let mut h = act.clone();
            for _ in 0..3 {
                h = h.matmul(&w).expect("matmul").tanh().expect("tanh"); // (ROWS, D)
            }
            let g = h.t().expect("t").matmul(&act).expect("matmul"); // (D, D)
            let g2 = (&g * 0.5).expect("scale");
            vec![g, g2]
        });
        let shapes = [("lora_A", (D, D)), ("lora_B", (D, D))];
        Rank::new(pg, &dev, LAYERS, &shapes, BUCKET_MB, backward)
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

    pub fn bench(c: &mut Criterion) {
        // One gemm thread per rank: the machine's cores go to the ranks and their comm threads.
        std::env::set_var("RAYON_NUM_THREADS", "1");
        let server = StoreServer::bind("127.0.0.1", 0).expect("store");
        let port = server.port();
        let (tx, prx) = channel();
        let (dtx, done) = channel();
        let peer = std::thread::spawn(move || peer(port, prx, dtx));
        let pg = group(0, port);
        let mut r = rank_state(&pg);
        let mut drive = |r: &mut Rank, mode: Mode, iters: u64| {
            tx.send((mode, iters)).expect("peer gone");
            let t0 = Instant::now();
            for _ in 0..iters {
                step(r, mode);
            }
            let dt = t0.elapsed();
            done.recv().expect("peer gone");
            dt
        };
        let title = format!("DDP all-reduce overlap, CPU ring, 2 ranks (threads), {LAYERS} layers x 2 x {D}x{D} fp32 grads, {BUCKET_MB} MiB buckets");
        measure(c, &mut r, &mut drive, &title);
        drop(tx);
        peer.join().expect("peer thread");
    }
}

#[cfg(feature = "cuda")]
mod nccl {
    //! The NCCL backend, one rank per GPU (processes), forced one-rank communicator alone.

    use super::*;
    use g4ft_ddp::{Backend, DistEnv, GroupOptions};

    const LAYERS: usize = 48;
    const ROWS: usize = 2048; // tokens
    const H: usize = 5120; // hidden width of the compute matmuls and of the LoRA matrices
    const R: usize = 16; // LoRA rank: 4 gradients of R×H fp32 = 1.25 MiB per layer
    const BUCKET_MB: f64 = 25.0;

    fn rank_state<'g>(pg: &'g ProcessGroup, dev: &Device, reps: usize) -> Rank<'g> {
        let x = Tensor::randn(0f32, 1.0, (ROWS, H), dev)
            .and_then(|t| t.to_dtype(DType::BF16))
            .expect("x");
        let w = Tensor::randn(0f32, 1.0 / (H as f32).sqrt(), (H, H), dev)
            .and_then(|t| t.to_dtype(DType::BF16))
            .expect("w");
        // A chain of bf16 matmuls (the layer's backward compute), then four LoRA gradients
        // (A: R×H from hᵀ·x, B: H×R from xᵀ·h, for two projections) in fp32.
        let backward = Box::new(move |_l: usize| {
            let mut h = x.clone();
            for _ in 0..reps {
                h = h.matmul(&w).expect("matmul"); // (ROWS, H)
            }
            let hs = h
                .narrow(1, 0, R)
                .and_then(|t| t.contiguous())
                .expect("narrow"); // (ROWS, R)
            let ga = hs.t().and_then(|t| t.matmul(&x)).expect("grad A"); // (R, H)
            let gb = x.t().and_then(|t| t.matmul(&hs)).expect("grad B"); // (H, R)
            let f32 = |t: &Tensor| t.to_dtype(DType::F32).expect("to f32");
            let half = |t: &Tensor| (f32(t) * 0.5).expect("scale");
            vec![f32(&ga), f32(&gb), half(&ga), half(&gb)]
        });
        let shapes = [
            ("q_proj.lora_A", (R, H)),
            ("q_proj.lora_B", (H, R)),
            ("v_proj.lora_A", (R, H)),
            ("v_proj.lora_B", (H, R)),
        ];
        Rank::new(pg, dev, LAYERS, &shapes, BUCKET_MB, backward)
    }

    /// Rank 0's command (`Some((mode index, iterations))`, or `None` = stop) to every rank. One
    /// call site for leader and followers: the process group's desync check compares where each
    /// rank issued a collective, and a leader/follower split across two lines reads as divergence.
    fn command(pg: &ProcessGroup, cmd: Option<(usize, u64)>) -> Option<(usize, u64)> {
        pg.broadcast_object(&cmd, 0).expect("command from rank 0")
    }

    /// Runs rank 0's commands until it sends `None`.
    fn follow(pg: &ProcessGroup, r: &mut Rank) {
        while let Some((code, iters)) = command(pg, None) {
            for _ in 0..iters {
                step(r, MODES[code]);
            }
        }
    }

    pub fn bench(c: &mut Criterion) {
        let reps: usize = std::env::var("G4FT_BENCH_REPS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(12);
        let env = DistEnv::from_env().expect("torchrun environment");
        let dev = Device::new_cuda(env.local_rank).expect("CUDA device cuda:LOCAL_RANK");
        let opts = GroupOptions {
            timeout: Duration::from_secs(300),
            name: Some("bench".into()),
            force_nccl: Some(true),
            ..Default::default()
        };
        let pg = ProcessGroup::new(env, &dev, opts).expect("process group");
        assert_eq!(pg.backend(), Backend::Nccl, "NCCL backend expected");
        let mut r = rank_state(&pg, &dev, reps);
        if pg.rank() != 0 {
            follow(&pg, &mut r);
            return;
        }
        let mut drive = |r: &mut Rank, mode: Mode, iters: u64| {
            let code = MODES.iter().position(|m| *m == mode).expect("mode");
            command(&pg, Some((code, iters)));
            let t0 = Instant::now();
            for _ in 0..iters {
                step(r, mode);
            }
            t0.elapsed()
        };
        let title = format!(
            "DDP all-reduce overlap, NCCL, {} rank(s) (one process per GPU{}), {LAYERS} layers x 4 x {R}x{H} fp32 grads (1.25 MiB/layer), {BUCKET_MB} MiB buckets, {reps} bf16 {ROWS}x{H}x{H} matmuls per layer",
            pg.world_size(),
            if pg.world_size() == 1 { ", forced one-rank communicator" } else { "" }
        );
        measure(c, &mut r, &mut drive, &title);
        command(&pg, None);
    }
}

#[cfg(not(feature = "cuda"))]
use cpu::bench;
#[cfg(feature = "cuda")]
use nccl::bench;

criterion_group!(benches, bench);
criterion_main!(benches);
