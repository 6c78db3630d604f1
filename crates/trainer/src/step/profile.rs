//! Instruments for one optimizer step, for benchmarks (`examples/bench_train.rs`): they observe
//! [`accumulate_window`](super::accumulate_window) through [`StepObserver`] and synchronise the
//! device, so an observed step is slower than a normal one.
//!
//! - [`Profiler`] synchronises at every [`StepEvent`] and charges the time since the previous one
//!   to the phase that just ended: recompute + backward per layer type (the time between the
//!   layer callbacks of `forward_backward`), gradient accumulation into DDP's buckets, DDP's
//!   finish, and (through [`StepObserver::mark`]) the grad norm and AdamW. Forward, loss head and
//!   the last layer's backward run before the first layer callback: [`Probes`] times the head (and
//!   a bare forward) separately on the same shapes, the last layer is charged its kind's mean, and
//!   the forward is the rest. [`Profiler::finish`] gives the [`Table`].
//! - [`OverlapProbe`] synchronises only at micro-batch boundaries: the time `ddp.finish()` still
//!   waits after the synchronised micro-batch's compute has finished is the communication the
//!   backward did not hide. [`CommAlone`] is the same buckets all-reduced with nothing else
//!   running (time, algorithm and bus bandwidth, the post's 100 GB/s estimate).

use std::time::Instant;

use anyhow::{Context, Result};
use candle_core::{Device, Tensor, Var};
use g4ft_data::Batch;
use g4ft_ddp::{DistributedDataParallel, ReduceOp};
use g4ft_gemma4::{Config, Gemma4Model, LayerType};
use g4ft_lora::LoraContext;

use super::{StepEvent, StepObserver};

/// Seconds from `a` to `b` (0 when either is missing), for two [`StepObserver::mark`]s.
pub fn secs_between(a: Option<Instant>, b: Option<Instant>) -> f64 {
    match (a, b) {
        (Some(a), Some(b)) => (b - a).as_secs_f64(),
        _ => 0.0,
    }
}

/// `--overlap`: synchronises the device only at micro-batch boundaries, so that the
/// synchronised micro-batch overlaps its all-reduces with its backward exactly as a normal step.
pub struct OverlapProbe<'a> {
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
    pub exposed_s: f64,
}

impl<'a> OverlapProbe<'a> {
    pub fn new(device: &'a Device, accum: usize) -> Self {
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
    pub fn report(&self, alone: &CommAlone, exposed: &[f64]) -> String {
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

/// All-reduce (average) times with nothing else running, median of 5 after one warm-up:
/// one bucket, every bucket back to back as DDP launches them, and one flat buffer of the same
/// total size.
pub struct CommAlone {
    backend: String,
    buckets: usize,
    first_bucket_bytes: usize,
    bytes: usize,
    one_bucket_s: f64,
    all_buckets_s: f64,
    flat_s: f64,
}

impl CommAlone {
    pub fn measure(ddp: &DistributedDataParallel<'_>, device: &Device) -> Result<Self> {
        let lens = super::bucket_lens(ddp)?;
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
    pub fn render(&self, world: usize) -> String {
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

/// `--profile`: synchronises the device at every [`StepEvent`] and charges the time since the
/// previous event to the phase that just ended.
pub struct Profiler<'a> {
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
    pub fn new(device: &'a Device, cfg: &Config) -> Self {
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
    pub fn restart(&mut self) -> Result<()> {
        self.device.synchronize()?;
        self.last = Instant::now();
        self.prev = None;
        Ok(())
    }

    /// The table. Each micro-batch's first interval (its forward, the loss head and layer
    /// `L−1`'s recompute + backward) is split with the head probe and, for layer `L−1`, the mean
    /// of the measured intervals of its kind (the probes' remainder when no other layer has its
    /// kind); the forward is the rest, so it includes what the step's forward saves or parks for
    /// the backward, which the forward probe (`loss()`) does not (a note gives both).
    pub fn finish(&self, probes: &Probes, norm_s: f64, optim_s: f64, wall_s: f64) -> Table {
        let micro = self.first.len();
        let last_kind = self.kind.last().copied().unwrap_or(0);
        let (total, n) = self.backward[last_kind];
        let measured = n > 0;
        let last_s = if measured {
            total / n as f64
        } else {
            let mean_first = self.first.iter().sum::<f64>() / micro.max(1) as f64;
            mean_first - probes.forward_s - probes.head_s
        };
        let mut backward = self.backward;
        backward[last_kind].0 += last_s * micro as f64;
        backward[last_kind].1 += micro;
        let forward_s: f64 = self.first.iter().map(|f| f - probes.head_s - last_s).sum();
        let n_kind = |k: usize| self.kind.iter().filter(|&&x| x == k).count();
        let rows = vec![
            Row::new(
                format!(
                    "forward: embedding + {} layers (see the note)",
                    self.kind.len()
                ),
                forward_s,
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
        let kind = ["sliding", "full"][last_kind];
        let last_from = if measured {
            format!("the mean {kind} layer's backward")
        } else {
            format!("the remainder after the forward probe (no other {kind} layer)")
        };
        let note = format!(
            "note: the forward row is each micro-batch's first interval (forward, head, layer {}'s \
             backward) less the head probe and, for that layer, {last_from} ({:.3} ms); the \
             forward probe, loss() saving and parking nothing, took {:.3} ms per micro-batch",
            self.kind.len().saturating_sub(1),
            last_s * 1e3,
            probes.forward_s * 1e3
        );
        Table {
            rows,
            wall_s,
            micro,
            note,
        }
    }
}

impl StepObserver for Profiler<'_> {
    fn event(&mut self, event: StepEvent) -> Result<()> {
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

    fn mark(&mut self) -> Result<Option<Instant>> {
        self.device.synchronize()?;
        Ok(Some(Instant::now()))
    }
}

/// Separate timings of what runs before the first layer callback, on the profiled step's
/// first micro-batch shape (best of two, synchronised).
pub struct Probes {
    /// Embedding + every layer's forward without graph (`loss()` minus the forward-only head).
    pub forward_s: f64,
    /// Host time until `loss()` returns, before the device finishes: when close to the synchronised
    /// time of `loss()`, the GPU waits for the host (launch-bound), otherwise the host runs ahead.
    pub loss_host_s: f64,
    /// Synchronised time of `loss()` (forward + forward-only head).
    pub loss_s: f64,
    /// The fused linear cross-entropy with d(hidden) (tracked hidden) + its backward, on a random
    /// hidden and a random `(vocab, hidden)` weight in the model dtype.
    pub head_s: f64,
}

impl Probes {
    pub fn measure(model: &Gemma4Model, batch: &Batch, seed: u64) -> Result<Self> {
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
            let out = model.loss(&super::token_batch(batch), &batch.labels, &ctx)?;
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
pub struct Row {
    /// The phase.
    pub name: String,
    /// Seconds over the step.
    pub total_s: f64,
    /// How many times the phase ran.
    pub calls: usize,
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
pub struct Table {
    /// The phases, in step order.
    pub rows: Vec<Row>,
    /// The synchronised step's wall time.
    pub wall_s: f64,
    /// Micro-batches in the step.
    pub micro: usize,
    /// How the rows before the first layer callback were split.
    pub note: String,
}

impl Table {
    /// The table as text, one line per phase, the sum and the wall time.
    pub fn render(&self) -> String {
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
        out += &self.note;
        out.push('\n');
        out
    }

    /// The table as JSON (`micro_batches`, `wall_s`, `rows`).
    pub fn json(&self) -> serde_json::Value {
        let rows: Vec<serde_json::Value> = self
            .rows
            .iter()
            .map(|r| serde_json::json!({"phase": r.name, "total_s": r.total_s, "calls": r.calls}))
            .collect();
        serde_json::json!({"micro_batches": self.micro, "wall_s": self.wall_s, "rows": rows, "note": self.note})
    }
}
