//! Test worker for the multi-process tests in `crates/ddp/tests/` (run under `ddprun` or with a
//! hand-made torchrun environment). `ddp_test_worker <scenario> [args]`; prints `OK <scenario>`
//! on success, exits 1 with the error otherwise. `G4FT_DDP_TIMEOUT_S` sets the collective timeout.
//!
//! `wait-for-stop` starts no process group: it waits for a stop signal and prints the notice of
//! its kind ([`signals::Catch`]).
//!
//! Every other scenario runs on the CPU backend except `nccl`: the `collectives` checks on CUDA
//! tensors (device `cuda:LOCAL_RANK`, one GPU per rank) through NCCL, plus a DDP bucket/no_sync
//! round, with the NCCL communicator forced so that world size 1 runs NCCL too (needs
//! `--features cuda`).
//! The DDP rounds cover both accumulation entry points on CUDA: single reports (bf16 gradients,
//! converted) and batched `grads_ready_from` reports (f32, read in place by the batched kernel,
//! across buckets and past the kernel's 32-entry table).

use candle_core::{DType, Device, Tensor, Var};
use g4ft_ddp::{
    signals, Backend, DdpError, DdpOptions, DistEnv, DistributedDataParallel, GroupOptions,
    ProcessGroup, ReduceOp,
};
use std::time::Duration;

type Res<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let scenario = args.first().cloned().unwrap_or_default();
    match run(&scenario, &args[1.min(args.len())..]) {
        Ok(()) => println!("OK {scenario}"),
        Err(e) => {
            eprintln!("FAILED {scenario}: {e}");
            std::process::exit(1);
        }
    }
}

fn group(
    device: &Device,
    force_nccl: Option<bool>,
    store_checks: Option<bool>,
) -> Res<ProcessGroup> {
    let secs: f64 = std::env::var("G4FT_DDP_TIMEOUT_S")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(600.0);
    let opts = GroupOptions {
        timeout: Duration::from_secs_f64(secs),
        force_nccl,
        store_checks,
        ..Default::default()
    };
    Ok(ProcessGroup::from_env(device, opts)?)
}

fn arg<T: std::str::FromStr>(a: &[String], i: usize, default: T) -> T {
    a.get(i).and_then(|s| s.parse().ok()).unwrap_or(default)
}

fn run(scenario: &str, a: &[String]) -> Res<()> {
    if scenario == "nccl" {
        return nccl();
    }
    if scenario == "wait-for-stop" {
        return wait_for_stop();
    }
    let store_checks = scenario == "async-skip";
    let pg = group(&Device::Cpu, None, store_checks.then_some(true))?;
    if scenario == "fail-first" {
        return fail_first(pg, arg(a, 0, 0));
    }
    match scenario {
        "collectives" => collectives(&pg, &Device::Cpu),
        "nosync" => nosync(&pg, arg(a, 0, 4), arg(a, 1, 3)),
        "train" => train(&pg, arg(a, 0, 2), arg(a, 1, 1), arg(a, 2, String::new())),
        "kill" => kill(&pg, arg(a, 0, 1)),
        "skip" => skip(&pg),
        "async-skip" => async_skip(&pg),
        "late" => late(&pg, arg(a, 0, 1), arg(a, 1, 30.0)),
        "unused" => unused(&pg, arg(a, 0, 0) == 1),
        "drift" => drift(&pg),
        "decide" => decide(&pg),
        other => Err(format!("unknown scenario {other:?}").into()),
    }
}

/// Catches the stop signals with a notice for each kind of stop, says `ready`, and once a stop
/// signal comes exits with 128 + it.
fn wait_for_stop() -> Res<()> {
    signals::install(signals::Catch {
        notice: Some("{signal}: stopping".into()),
        launcher_notice: Some("stopped by the launcher: {reason}".into()),
        ..Default::default()
    });
    println!("ready");
    loop {
        if let Some(sig) = signals::received() {
            std::process::exit(128 + sig);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Value of element `i` on rank `r` (small integers: exact in every float dtype).
fn val(r: usize, i: usize) -> f64 {
    ((i * 7 + r * 13) % 17) as f64
}

/// `collectives` and a DDP round on CUDA tensors through NCCL (forced at world size 1 too).
fn nccl() -> Res<()> {
    let env = DistEnv::from_env()?;
    let dev = Device::new_cuda(env.local_rank)
        .map_err(|e| format!("cuda:{} (build with --features cuda): {e}", env.local_rank))?;
    let pg = group(&dev, Some(true), None)?;
    if pg.backend() != Backend::Nccl {
        return Err(format!("backend {:?}, expected Nccl", pg.backend()).into());
    }
    collectives(&pg, &dev)?;
    ddp_round(&pg, &dev)?;
    ddp_many(&pg, &dev)?;
    Ok(())
}

/// DDP on `dev`: construction broadcasts rank 0's values; several buckets; a no_sync
/// micro-batch then a synced one leave the rank average of both sums in the buckets.
fn ddp_round(pg: &ProcessGroup, dev: &Device) -> Res<()> {
    let (r, w) = (pg.rank(), pg.world_size());
    let shapes: [&[usize]; 4] = [&[5, 7], &[300], &[4, 4], &[1000]];
    let init = |p: usize, n: usize, rank: usize| -> Vec<f32> {
        (0..n)
            .map(|i| (p * 31 + i * 7 + rank * 13) as f32)
            .collect()
    };
    let mut ps = Vec::new();
    for (p, s) in shapes.iter().enumerate() {
        let n: usize = s.iter().product();
        let v = Var::from_tensor(&Tensor::from_vec(init(p, n, r), *s, dev)?)?;
        ps.push((format!("p{p}"), v));
    }
    let opts = DdpOptions {
        bucket_cap_mb: 200.0 * 4.0 / (1024.0 * 1024.0), // 200 floats: [1000], [4x4], [300], [5x7]
        ..Default::default()
    };
    let mut ddp = DistributedDataParallel::new(pg, ps.clone(), opts)?;
    if ddp.plan().buckets.len() < 3 {
        return Err(format!("{} buckets, expected >= 3", ddp.plan().buckets.len()).into());
    }
    for (p, (name, v)) in ps.iter().enumerate() {
        let want: Vec<f64> = init(p, v.elem_count(), 0)
            .iter()
            .map(|x| *x as f64)
            .collect();
        check(
            &v.as_tensor().flatten_all()?,
            &want,
            &format!("{name} after DDP::new"),
        )?;
    }
    // Gradient of parameter p, micro-batch m, on rank q: small integers (exact sums).
    let grad = |p: usize, n: usize, m: usize, q: usize| -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 3 + p + m * 5 + q * 11) % 19) as f32)
            .collect()
    };
    for step in 0..3 {
        if step == 0 {
            // One parameter per report; the no_sync ones in bf16 (converted to f32).
            ddp.no_sync(|ns| -> Res<()> {
                for (p, (name, v)) in ps.iter().enumerate() {
                    let g = Tensor::from_vec(grad(p, v.elem_count(), 0, r), v.shape(), dev)?;
                    ns.grad_ready(name, &g.to_dtype(DType::BF16)?)?;
                }
                Ok(())
            })?;
            for (p, (name, v)) in ps.iter().enumerate().rev() {
                let g = Tensor::from_vec(grad(p, v.elem_count(), 1, r), v.shape(), dev)?;
                ddp.grad_ready(name, &g)?;
            }
        } else {
            // Every parameter in one batched report per micro-batch (spans all buckets).
            let all: Vec<usize> = (0..ps.len()).collect();
            let n = ddp.no_sync(|ns| -> Res<usize> {
                Ok(ns.grads_ready_from(&grads_of(&ps, &all, dev, |p, n| grad(p, n, 0, r))?)?)
            })?;
            let m = ddp.grads_ready_from(&grads_of(&ps, &all, dev, |p, n| grad(p, n, 1, r))?)?;
            if (n, m) != (ps.len(), ps.len()) {
                return Err(format!("batched reports took {n} and {m} gradients").into());
            }
        }
        ddp.finish()?;
        for (p, (name, v)) in ps.iter().enumerate() {
            let n = v.elem_count();
            let want: Vec<f64> = (0..n)
                .map(|i| {
                    let s: f32 = (0..w)
                        .map(|q| grad(p, n, 0, q)[i] + grad(p, n, 1, q)[i])
                        .sum();
                    s as f64 / w as f64
                })
                .collect();
            check(
                &ddp.grad(name)?.flatten_all()?,
                &want,
                &format!("step {step}: averaged gradient of {name}"),
            )?;
        }
    }
    ddp.check_parameters()?;
    println!(
        "ddp buckets {} reductions {}",
        ddp.plan().buckets.len(),
        ddp.reductions()
    );
    Ok(())
}

/// Gradients `g(p, numel)` of the parameters `which` as a GradStore (backward of
/// `sum_p (v_p * g_p).sum()`, so each gradient is exactly `g_p`), f32 on `dev`.
fn grads_of(
    ps: &[(String, Var)],
    which: &[usize],
    dev: &Device,
    g: impl Fn(usize, usize) -> Vec<f32>,
) -> Res<candle_core::backprop::GradStore> {
    let mut loss = Tensor::zeros((), DType::F32, dev)?;
    for &p in which {
        let v = &ps[p].1;
        let c = Tensor::from_vec(g(p, v.elem_count()), v.shape(), dev)?;
        loss = (loss + (v.as_tensor() * c)?.sum_all()?)?;
    }
    Ok(loss.backward()?)
}

/// DDP with 40 parameters of different sizes in one bucket, reported in batches (more than the
/// kernel's 32 table entries, so one report takes several launches), three micro-batches per
/// step of which the middle one reports only the even parameters: buckets hold the rank average
/// of every micro-batch's sum.
fn ddp_many(pg: &ProcessGroup, dev: &Device) -> Res<()> {
    let (r, w) = (pg.rank(), pg.world_size());
    let mut ps = Vec::new();
    for p in 0..40 {
        let n = 1 + p * 37 % 301;
        ps.push((
            format!("q{p}"),
            Var::from_tensor(&Tensor::zeros(n, DType::F32, dev)?)?,
        ));
    }
    let mut ddp = DistributedDataParallel::new(pg, ps.clone(), DdpOptions::default())?;
    let grad = |p: usize, n: usize, m: usize, q: usize| -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 5 + p * 3 + m * 7 + q * 11) % 23) as f32)
            .collect()
    };
    let all: Vec<usize> = (0..ps.len()).collect();
    let even: Vec<usize> = (0..ps.len()).step_by(2).collect();
    for step in 0..2 {
        ddp.no_sync(|ns| -> Res<()> {
            ns.grads_ready_from(&grads_of(&ps, &all, dev, |p, n| grad(p, n, 0, r))?)?;
            ns.grads_ready_from(&grads_of(&ps, &even, dev, |p, n| grad(p, n, 1, r))?)?;
            Ok(())
        })?;
        ddp.grads_ready_from(&grads_of(&ps, &all, dev, |p, n| grad(p, n, 2, r))?)?;
        ddp.finish()?;
        for (p, (name, v)) in ps.iter().enumerate() {
            let n = v.elem_count();
            let micro: &[usize] = if p % 2 == 0 { &[0, 1, 2] } else { &[0, 2] };
            let want: Vec<f64> = (0..n)
                .map(|i| {
                    let s: f32 = (0..w)
                        .flat_map(|q| micro.iter().map(move |m| (q, *m)))
                        .map(|(q, m)| grad(p, n, m, q)[i])
                        .sum();
                    s as f64 / w as f64
                })
                .collect();
            check(
                &ddp.grad(name)?,
                &want,
                &format!("many step {step}: averaged gradient of {name}"),
            )?;
        }
    }
    println!("ddp many: {} parameters ok", ps.len());
    Ok(())
}

fn collectives(pg: &ProcessGroup, dev: &Device) -> Res<()> {
    let (r, w) = (pg.rank(), pg.world_size());
    for &n in &[0usize, 1, 2, 3, 5, 17, 100, 1023, 4096, 100_003] {
        for dt in [
            DType::F32,
            DType::F64,
            DType::BF16,
            DType::F16,
            DType::U32,
            DType::I64,
            DType::U8,
        ] {
            let mine: Vec<f64> = (0..n).map(|i| val(r, i)).collect();
            let sum: Vec<f64> = (0..n).map(|i| (0..w).map(|q| val(q, i)).sum()).collect();
            let t = make(&mine, dt, dev)?;
            pg.all_reduce(&t, ReduceOp::Sum)?;
            check(&t, &sum, &format!("all_reduce(sum) {dt:?} n={n}"))?;
            if dt.is_float() {
                // Averages of small integers are exact only in f32/f64; half types get a tolerance.
                let avg: Vec<f64> = sum.iter().map(|s| s / w as f64).collect();
                let t = make(&mine, dt, dev)?;
                pg.all_reduce(&t, ReduceOp::Avg)?;
                check(&t, &avg, &format!("all_reduce(avg) {dt:?} n={n}"))?;
            }
            for root in 0..w {
                let t = make(&mine, dt, dev)?;
                pg.broadcast(&t, root)?;
                let want: Vec<f64> = (0..n).map(|i| val(root, i)).collect();
                check(&t, &want, &format!("broadcast(root={root}) {dt:?} n={n}"))?;
            }
        }
    }
    // A view in the middle of a larger buffer: only the view changes.
    let base = Tensor::ones(10, DType::F32, dev)?;
    pg.all_reduce(&base.narrow(0, 3, 4)?, ReduceOp::Sum)?;
    let want: Vec<f64> = (0..10)
        .map(|i| if (3..7).contains(&i) { w as f64 } else { 1.0 })
        .collect();
    check(&base, &want, "all_reduce of a narrow view")?;
    let names = pg.all_gather_object(&format!("rank-{r}-{}", "x".repeat(r * 1000)))?;
    for (q, s) in names.iter().enumerate() {
        if *s != format!("rank-{q}-{}", "x".repeat(q * 1000)) {
            return Err(format!("all_gather_object: entry {q} is {s:?}").into());
        }
    }
    pg.barrier()?;
    println!("counts {:?}", pg.counts());
    Ok(())
}

/// `vals` as a `dt` tensor on `dev`: a prefix view of one more element, so that even `n = 0`
/// allocates nothing empty (zero-byte CUDA allocations are not allowed).
fn make(vals: &[f64], dt: DType, dev: &Device) -> Res<Tensor> {
    let padded: Vec<f64> = vals.iter().copied().chain([0.0]).collect();
    Ok(Tensor::new(padded.as_slice(), dev)?
        .to_dtype(dt)?
        .narrow(0, 0, vals.len())?)
}

fn check(t: &Tensor, want: &[f64], what: &str) -> Res<()> {
    let got: Vec<f64> = if t.elem_count() == 0 {
        Vec::new()
    } else {
        t.to_dtype(DType::F64)?.to_vec1()?
    };
    for (i, (g, e)) in got.iter().zip(want).enumerate() {
        let rel = match t.dtype() {
            DType::BF16 | DType::F16 => 0.02,
            DType::F32 => 1e-6,
            _ => 1e-12,
        };
        let tol = rel * e.abs().max(1.0);
        if (g - e).abs() > tol {
            return Err(format!("{what}: element {i}: got {g}, expected {e}").into());
        }
    }
    if got.len() != want.len() {
        return Err(format!("{what}: {} elements, expected {}", got.len(), want.len()).into());
    }
    Ok(())
}

/// Small two-parameter model; returns (name, var) in model order.
fn params(rank: usize) -> Res<Vec<(String, Var)>> {
    let d = 8;
    let w: Vec<f32> = (0..d)
        .map(|j| 0.05 * (j as f32 + 1.0) * (rank as f32 + 1.0))
        .collect();
    Ok(vec![
        (
            "linear.weight".into(),
            Var::from_slice(&w, d, &Device::Cpu)?,
        ),
        (
            "linear.bias".into(),
            Var::from_slice(&[0.1f32 * (rank as f32 + 1.0)], 1, &Device::Cpu)?,
        ),
    ])
}

/// Sample `i`: features (8,) and target, deterministic.
fn sample(i: usize) -> (Vec<f32>, f32) {
    let x: Vec<f32> = (0..8)
        .map(|j| ((i * 7 + j * 3) as f32 * 0.37).sin())
        .collect();
    let y = x
        .iter()
        .enumerate()
        .map(|(j, v)| v * (j as f32 - 3.5) * 0.3)
        .sum::<f32>()
        + 0.5
        + (i as f32).cos() * 0.01;
    (x, y)
}

/// Mean-squared-error backward on samples `idx`, loss scaled by `1/scale`; returns the grads.
fn backward(
    ps: &[(String, Var)],
    idx: &[usize],
    scale: f32,
) -> Res<candle_core::backprop::GradStore> {
    let (xs, ys): (Vec<Vec<f32>>, Vec<f32>) = idx.iter().map(|i| sample(*i)).unzip();
    let x = Tensor::from_vec(xs.concat(), (idx.len(), 8), &Device::Cpu)?; // (b, 8)
    let y = Tensor::from_vec(ys, idx.len(), &Device::Cpu)?; // (b,)
    let pred = x
        .matmul(&ps[0].1.as_tensor().unsqueeze(1)?)?
        .squeeze(1)?
        .broadcast_add(ps[1].1.as_tensor())?;
    let loss = ((pred - y)?.sqr()?.sum_all()? / scale as f64)?;
    Ok(loss.backward()?)
}

/// SGD with DDP: `micro` samples per rank per micro-batch, `accum` micro-batches per step.
fn train(pg: &ProcessGroup, micro: usize, accum: usize, out: String) -> Res<()> {
    let (r, w) = (pg.rank(), pg.world_size());
    let ps = params(r)?;
    let opts = DdpOptions {
        bucket_cap_mb: 4.0 / (1024.0 * 1024.0),
        ..Default::default()
    }; // 1 float/bucket cap
    let mut ddp = DistributedDataParallel::new(pg, ps.clone(), opts)?;
    let global = micro * w * accum;
    for step in 0..6 {
        // Step's samples [step*global, (step+1)*global); micro-batch m of rank r gets a slice.
        let idx = |m: usize| -> Vec<usize> {
            let start = step * global + m * micro * w + r * micro;
            (start..start + micro).collect()
        };
        let scale = (micro * accum) as f32;
        for m in 0..accum - 1 {
            ddp.no_sync(|ns| -> Res<()> {
                ns.grads_ready_from(&backward(&ps, &idx(m), scale)?)?;
                Ok(())
            })?;
        }
        let g = backward(&ps, &idx(accum - 1), scale)?;
        // Layer-wise order: the bias (last parameter) becomes ready first.
        for (name, v) in ps.iter().rev() {
            ddp.grad_ready(name, g.get(v.as_tensor()).ok_or("missing grad")?)?;
        }
        ddp.finish()?;
        for (name, v) in &ps {
            v.set(&(v.as_tensor() - (ddp.grad(name)? * 0.1)?)?)?;
        }
    }
    ddp.check_parameters()?;
    if r == 0 && !out.is_empty() {
        let vals: Vec<Vec<f32>> = ps
            .iter()
            .map(|(_, v)| v.as_tensor().to_vec1::<f32>())
            .collect::<candle_core::Result<_>>()?;
        std::fs::write(&out, serde_json::to_string(&vals)?)?;
    }
    println!(
        "reductions {} buckets {}",
        ddp.reductions(),
        ddp.plan().buckets.len()
    );
    Ok(())
}

fn nosync(pg: &ProcessGroup, accum: usize, steps: usize) -> Res<()> {
    let ps = params(pg.rank())?;
    let opts = DdpOptions {
        bucket_cap_mb: 4.0 / (1024.0 * 1024.0),
        ..Default::default()
    };
    let mut ddp = DistributedDataParallel::new(pg, ps.clone(), opts)?;
    let buckets = ddp.plan().buckets.len() as u64;
    let before = pg.counts().get("all_reduce(avg)").copied().unwrap_or(0);
    for step in 0..steps {
        for m in 0..accum - 1 {
            ddp.no_sync(|ns| -> Res<()> {
                ns.grads_ready_from(&backward(&ps, &[step * 100 + m], 1.0)?)?;
                Ok(())
            })?;
            let now = pg.counts().get("all_reduce(avg)").copied().unwrap_or(0);
            if now != before + step as u64 * buckets {
                return Err(format!(
                    "step {step} micro {m}: {} all-reduces inside no_sync",
                    now - before
                )
                .into());
            }
        }
        ddp.grads_ready_from(&backward(&ps, &[step * 100 + accum], 1.0)?)?;
        ddp.finish()?;
    }
    let after = pg.counts().get("all_reduce(avg)").copied().unwrap_or(0);
    println!(
        "all_reduce per step {} buckets {buckets}",
        (after - before) as f64 / steps as f64
    );
    if after - before != steps as u64 * buckets || ddp.reductions() != steps as u64 * buckets {
        return Err(format!(
            "{} all-reduces for {steps} steps of {buckets} buckets",
            after - before
        )
        .into());
    }
    Ok(())
}

fn kill(pg: &ProcessGroup, victim: usize) -> Res<()> {
    let t = Tensor::ones(1000, DType::F32, &Device::Cpu)?;
    for step in 0..1000 {
        if step == 3 && pg.rank() == victim {
            // SAFETY: kill(2) on our own pid; simulates a rank crashing mid-step.
            unsafe {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
        }
        pg.all_reduce(&t, ReduceOp::Avg)?;
    }
    Err("survived 1000 steps although a rank was killed".into())
}

/// Rank `victim` fails with an error of its own after one all-reduce while the others wait in
/// a barrier; every rank ends through [`ProcessGroup::fail`], as `train_ddp` does.
fn fail_first(pg: ProcessGroup, victim: usize) -> Res<()> {
    let t = Tensor::ones(16, DType::F32, &Device::Cpu)?;
    pg.all_reduce(&t, ReduceOp::Sum)?;
    let result: Res<()> = if pg.rank() == victim {
        Err(format!("bad record at data.jsonl:3 (rank {victim}'s own error)").into())
    } else {
        pg.barrier().map_err(Into::into)
    };
    result.map_err(|e| {
        let follows_peer = DdpError::chain_may_follow_peer_exit(e.as_ref());
        pg.fail(&e.to_string(), follows_peer, Duration::from_secs(10))
            .into()
    })
}

fn skip(pg: &ProcessGroup) -> Res<()> {
    let t = Tensor::ones(16, DType::F32, &Device::Cpu)?;
    pg.all_reduce(&t, ReduceOp::Sum)?;
    if pg.rank() != 1 {
        pg.all_reduce(&t, ReduceOp::Sum)?; // rank 1 skips this one
    }
    pg.barrier()?;
    Ok(())
}

/// `skip` with queued all-reduces and the store agreement on (as NCCL runs it): the agreement
/// deferred to `wait` reports the desync.
fn async_skip(pg: &ProcessGroup) -> Res<()> {
    let t = Tensor::ones(16, DType::F32, &Device::Cpu)?;
    pg.all_reduce_async(&t, ReduceOp::Sum)?.wait()?;
    if pg.rank() != 1 {
        pg.all_reduce_async(&t, ReduceOp::Sum)?.wait()?; // rank 1 skips this one
    }
    pg.barrier()?;
    Ok(())
}

/// Rank `sleeper` reaches the barrier `secs` seconds after the others.
fn late(pg: &ProcessGroup, sleeper: usize, secs: f64) -> Res<()> {
    if pg.rank() == sleeper {
        std::thread::sleep(Duration::from_secs_f64(secs));
    }
    pg.barrier()?;
    Ok(())
}

fn unused(pg: &ProcessGroup, find_unused: bool) -> Res<()> {
    let ps = params(pg.rank())?;
    let opts = DdpOptions {
        find_unused_parameters: find_unused,
        ..Default::default()
    };
    let mut ddp = DistributedDataParallel::new(pg, ps.clone(), opts)?;
    let g = backward(&ps, &[0, 1], 1.0)?;
    ddp.grad_ready(
        "linear.weight",
        g.get(ps[0].1.as_tensor()).ok_or("missing grad")?,
    )?;
    ddp.finish()?; // linear.bias never reported
    let b = ddp.grad("linear.bias")?.to_vec1::<f32>()?;
    if b != [0.0] {
        return Err(format!("unused bias grad {b:?}, expected zero-filled").into());
    }
    Ok(())
}

fn drift(pg: &ProcessGroup) -> Res<()> {
    let ps = params(pg.rank())?;
    let ddp = DistributedDataParallel::new(pg, ps.clone(), DdpOptions::default())?;
    ddp.check_parameters()?;
    if pg.rank() == 1 {
        ps[1].1.set(&Tensor::new(&[42f32], &Device::Cpu)?)?;
    }
    ddp.check_parameters()?;
    Ok(())
}

fn decide(pg: &ProcessGroup) -> Res<()> {
    let stop = pg.decide_on_rank0(|| format!("decided by rank {}", pg.rank()))?;
    if stop != "decided by rank 0" {
        return Err(format!("decision {stop:?}").into());
    }
    let dir = std::env::temp_dir().join(format!(
        "g4ft-ddp-decide-{}",
        std::env::var("TORCHELASTIC_RUN_ID")?
    ));
    let out = pg.rank0_then_barrier(|| std::fs::write(&dir, b"ckpt"))?;
    if (pg.rank() == 0) != out.is_some() || std::fs::read(&dir)? != b"ckpt" {
        return Err("rank0_then_barrier: file not visible after the barrier".into());
    }
    pg.barrier()?;
    let _ = std::fs::remove_file(&dir);
    let failed = pg.rank0_then_barrier(|| Err::<(), _>("disk full"));
    match failed {
        Err(e) if e.to_string().contains("disk full") => Ok(()),
        other => Err(format!("expected every rank to see rank 0's failure, got {other:?}").into()),
    }
}
