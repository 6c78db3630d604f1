//! Step metrics on rank 0: one fixed-width log line per logged step, the same numbers as JSONL
//! (and as TensorBoard scalars with [`MetricsLogger::with_tensorboard`]), steady-state averages
//! (the first recorded step is warm-up and left out), an `indicatif` progress bar when stderr is a
//! terminal (otherwise, as under a launcher, each log line carries the elapsed time and an ETA),
//! and the loss curve, earlier runs' history included, rewritten to `loss.svg` at every logged
//! step and whenever the caller asks ([`MetricsLogger::write_plot`]).
//!
//! The logger does no collectives and no device syncs: the loop passes numbers that are already
//! all-reduced (loss, tokens over all ranks) and a step time measured after a sync, as the post
//! does with `.item()`.
//!
//! What the numbers come from has its own modules: FLOPs per token and MFU
//! ([`mfu`](mod@mfu)), peak memory ([`memory`]), the `loss.svg` plot ([`plot`]) and TensorBoard
//! event files ([`tensorboard`]).

pub mod memory;
pub mod mfu;
pub mod plot;
pub mod tensorboard;

use std::fs::File;
use std::io::{BufWriter, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use crate::error::{Error, Result};
use crate::metrics::mfu::{mfu, FlopsModel, FlopsPerToken};
use crate::metrics::plot::write_loss_svg;
use crate::metrics::tensorboard::EventWriter;

/// What the loop measured for one optimizer step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepStats {
    /// 0-based epoch.
    pub epoch: usize,
    /// 1-based global optimizer step.
    pub step: u64,
    /// Loss averaged over ranks (and micro-batches), as the post logs it.
    pub loss: f64,
    /// Pre-clip global gradient norm.
    pub grad_norm: f32,
    /// Learning rate this step used.
    pub lr: f64,
    /// Wall time of the step in seconds, measured after a device sync.
    pub step_s: f64,
    /// Non-padding tokens of this step summed over all ranks.
    pub tokens: u64,
    /// Padded sequence length the step ran at (for the attention term of the FLOP count).
    pub seq_len: usize,
    /// Peak device memory in bytes on this rank, if known.
    pub peak_mem_bytes: Option<u64>,
}

/// One line of `metrics.jsonl` (`"kind": "train"`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepRecord {
    /// Always `"train"`.
    pub kind: &'static str,
    /// 0-based epoch.
    pub epoch: usize,
    /// 1-based optimizer step.
    pub step: u64,
    /// Steps of the whole run.
    pub total_steps: u64,
    /// All-reduced loss.
    pub loss: f64,
    /// Pre-clip gradient norm.
    pub grad_norm: f32,
    /// Learning rate used.
    pub lr: f64,
    /// Step wall time in seconds.
    pub step_s: f64,
    /// Non-padding tokens over all ranks.
    pub tokens: u64,
    /// `tokens / step_s`.
    pub tokens_per_s: f64,
    /// Model FLOPs utilisation per device in [0, 1] (the step's work without recompute,
    /// [`crate::metrics::mfu`](mod@crate::metrics::mfu)), when a FLOP model and a peak are known.
    pub mfu_model: Option<f64>,
    /// Hardware FLOPs utilisation per device in [0, 1] (what runs, recomputed layers included).
    pub mfu_hw: Option<f64>,
    /// Peak device memory in bytes.
    pub peak_mem_bytes: Option<u64>,
}

/// One evaluation result (`"kind": "eval"` in the JSONL).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct EvalRecord {
    /// Always `"eval"`.
    pub kind: &'static str,
    /// Optimizer step after which evaluation ran.
    pub step: u64,
    /// Token-weighted mean loss over the eval set (all ranks).
    pub loss: f64,
    /// `exp(loss)`.
    pub perplexity: f64,
    /// Non-padding target tokens evaluated.
    pub tokens: u64,
}

/// Averages over the steady window (every recorded step except the first).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Summary {
    /// Steps in the window.
    pub steps: u64,
    /// Total tokens / total seconds over the window (not a mean of rates).
    pub tokens_per_s: f64,
    /// Mean seconds per optimizer step.
    pub s_per_step: f64,
    /// Model-FLOPs MFU at the window's throughput, if known.
    pub mfu_model: Option<f64>,
    /// Hardware-FLOPs MFU at the window's throughput, if known.
    pub mfu_hw: Option<f64>,
}

/// How to compute MFU: the model's FLOP shape and one device's peak TFLOP/s.
#[derive(Debug, Clone, PartialEq)]
pub struct MfuSpec {
    /// FLOP shape of the model, with the layers the recompute policy recomputes.
    pub model: FlopsModel,
    /// Peak of one device in TFLOP/s.
    pub peak_tflops: f64,
}

/// The loss curves of steps logged before this process started (a resumed run's past).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct History {
    /// Training `(step, loss)` points.
    pub train: Vec<(u64, f64)>,
    /// Evaluation `(step, loss)` points.
    pub eval: Vec<(u64, f64)>,
}

/// The metrics file of a run's output folder, and the copy of its history each checkpoint keeps.
pub const METRICS_FILE: &str = "metrics.jsonl";

/// The train and eval lines of the metrics file `path` up to optimizer step `step`, and their
/// curves; a missing file has none. Lines cut by a crash, or not ours, are left out.
fn history_up_to(path: &Path, step: u64) -> Result<(String, History)> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Default::default()),
        Err(source) => {
            return Err(Error::MetricsIo {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    let mut kept = String::new();
    let mut history = History::default();
    for line in text.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let (Some(s), Some(loss)) = (v["step"].as_u64(), v["loss"].as_f64()) else {
            continue;
        };
        let curve = match v["kind"].as_str() {
            Some("train") => &mut history.train,
            Some("eval") => &mut history.eval,
            _ => continue,
        };
        if s <= step {
            curve.push((s, loss));
            kept.push_str(line);
            kept.push('\n');
        }
    }
    Ok((kept, history))
}

/// Writes into checkpoint folder `dir` the history it continues: the train and eval lines of the
/// run's metrics file `metrics` up to `step`. A resume from the checkpoint restores them
/// ([`truncate_metrics`]), whatever other branches of the run wrote since.
pub fn snapshot_metrics(metrics: &Path, dir: &Path, step: u64) -> Result<()> {
    let (kept, _) = history_up_to(metrics, step)?;
    let path = dir.join(METRICS_FILE);
    std::fs::write(&path, kept).map_err(|source| Error::MetricsIo { path, source })
}

/// Makes the metrics file `path` the history of the run up to optimizer step `step` (the step a
/// run resumes from; 0 for a fresh start), rewriting it atomically, and returns its curves. The
/// history is that of `checkpoint` when it keeps one ([`snapshot_metrics`]): a run resumed from
/// an earlier checkpoint may have replaced the later steps' lines since. Otherwise it is the
/// lines of `path` up to `step` (later steps a resumed run repeats and summaries are dropped). A
/// missing file is an empty history.
pub fn truncate_metrics(path: &Path, step: u64, checkpoint: Option<&Path>) -> Result<History> {
    let kept_by_checkpoint = checkpoint
        .map(|dir| dir.join(METRICS_FILE))
        .filter(|p| p.is_file());
    let (kept, history) = history_up_to(kept_by_checkpoint.as_deref().unwrap_or(path), step)?;
    let tmp = path.with_extension("jsonl.tmp");
    std::fs::write(&tmp, kept)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|source| Error::MetricsIo {
            path: path.to_path_buf(),
            source,
        })?;
    Ok(history)
}

/// Rank 0's step logger. Construct it on rank 0 only.
#[derive(Debug)]
pub struct MetricsLogger {
    jsonl: Option<(PathBuf, BufWriter<File>)>,
    plot: Option<(PathBuf, String)>,
    events: Option<EventWriter>,
    started: Instant,
    first_step: Option<u64>,
    mfu: Option<MfuSpec>,
    world_size: usize,
    total_steps: u64,
    bar: Option<ProgressBar>,
    train_curve: Vec<(u64, f64)>,
    eval_curve: Vec<(u64, f64)>,
    window: Window,
}

#[derive(Debug, Default, Clone, Copy)]
struct Window {
    recorded: u64,
    steps: u64,
    tokens: u64,
    secs: f64,
    /// Model and hardware FLOPs of the window.
    flops: (f64, f64),
}

impl MetricsLogger {
    /// A logger for a run of `total_steps` optimizer steps on `world_size` ranks. `jsonl`:
    /// where to append the metrics (created with its parent directory). `progress`: show a bar
    /// if stderr is a terminal.
    pub fn new(
        total_steps: u64,
        world_size: usize,
        jsonl: Option<&Path>,
        mfu: Option<MfuSpec>,
        progress: bool,
    ) -> Result<Self> {
        let jsonl = match jsonl {
            Some(path) => {
                let io = |source| Error::MetricsIo {
                    path: path.to_path_buf(),
                    source,
                };
                if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir).map_err(io)?;
                }
                let file = File::options()
                    .create(true)
                    .append(true)
                    .open(path)
                    .map_err(io)?;
                Some((path.to_path_buf(), BufWriter::new(file)))
            }
            None => None,
        };
        let bar = (progress && std::io::stderr().is_terminal()).then(|| {
            let bar = ProgressBar::new(total_steps);
            let style = ProgressStyle::with_template(
                "{bar:40} {pos}/{len} steps [{elapsed_precise} < {eta_precise}]",
            )
            .expect("the progress template is a valid constant");
            bar.set_style(style);
            bar
        });
        Ok(Self {
            jsonl,
            plot: None,
            events: None,
            started: Instant::now(),
            first_step: None,
            mfu,
            world_size: world_size.max(1),
            total_steps,
            bar,
            train_curve: Vec::new(),
            eval_curve: Vec::new(),
            window: Window::default(),
        })
    }

    /// Starts the curves with the points of an earlier process of this run.
    pub fn with_history(mut self, history: History) -> Self {
        self.train_curve = history.train;
        self.eval_curve = history.eval;
        self
    }

    /// Rewrites the loss plot at `path` (titled `title`) at every logged step and on
    /// [`Self::write_plot`].
    pub fn with_plot(mut self, path: &Path, title: &str) -> Self {
        self.plot = Some((path.to_path_buf(), title.to_string()));
        self
    }

    /// Also writes each record's numbers as TensorBoard scalars (`train/loss`, `train/grad_norm`,
    /// `train/lr`, `train/tokens_per_s`, `eval/loss`, `eval/perplexity`).
    pub fn with_tensorboard(mut self, events: EventWriter) -> Self {
        self.events = Some(events);
        self
    }

    /// Writes the loss plot (all points so far), if one was asked for.
    pub fn write_plot(&self) -> Result<()> {
        match &self.plot {
            Some((path, title)) => write_loss_svg(path, &self.train_curve, &self.eval_curve, title),
            None => Ok(()),
        }
    }

    /// The loss plot's path, if any.
    pub fn plot_path(&self) -> Option<&Path> {
        self.plot.as_ref().map(|(p, _)| p.as_path())
    }

    /// Turns measurements into a record: rates, MFU, JSONL line, curve point and steady-window
    /// totals (the first step recorded by this process is warm-up: CUDA context, allocator,
    /// communicator setup, so it is not averaged).
    pub fn record_step(&mut self, s: &StepStats) -> Result<StepRecord> {
        let tokens_per_s = if s.step_s > 0.0 {
            s.tokens as f64 / s.step_s
        } else {
            0.0
        };
        let flops = self
            .mfu
            .as_ref()
            .map(|m| (m.model.flops_per_token(s.seq_len), m.peak_tflops));
        let per_device = tokens_per_s / self.world_size as f64;
        let mfu_of = |pick: fn(&FlopsPerToken) -> f64| {
            flops.map(|(f, peak)| mfu(per_device, pick(&f), peak))
        };
        let record = StepRecord {
            kind: "train",
            epoch: s.epoch,
            step: s.step,
            total_steps: self.total_steps,
            loss: s.loss,
            grad_norm: s.grad_norm,
            lr: s.lr,
            step_s: s.step_s,
            tokens: s.tokens,
            tokens_per_s,
            mfu_model: mfu_of(|f| f.model),
            mfu_hw: mfu_of(|f| f.hardware),
            peak_mem_bytes: s.peak_mem_bytes,
        };
        self.window.recorded += 1;
        if self.window.recorded > 1 {
            self.window.steps += 1;
            self.window.tokens += s.tokens;
            self.window.secs += s.step_s;
            if let Some((f, _)) = flops {
                self.window.flops.0 += s.tokens as f64 * f.model;
                self.window.flops.1 += s.tokens as f64 * f.hardware;
            }
        }
        self.train_curve.push((s.step, s.loss));
        self.first_step.get_or_insert(s.step);
        self.write_json(&record)?;
        if let Some(ev) = &mut self.events {
            ev.scalar("train/loss", s.step, s.loss)?;
            ev.scalar("train/grad_norm", s.step, s.grad_norm as f64)?;
            ev.scalar("train/lr", s.step, s.lr)?;
            ev.scalar("train/tokens_per_s", s.step, tokens_per_s)?;
        }
        self.progress_to(s.step);
        Ok(record)
    }

    /// Records, formats and prints one step (the usual call on logged steps), and rewrites the
    /// plot. Without a progress bar the line ends with the elapsed time and the ETA of the run.
    pub fn log_step(&mut self, s: &StepStats) -> Result<StepRecord> {
        let record = self.record_step(s)?;
        let mut line = format_step_line(&record);
        if self.bar.is_none() {
            line.push_str(&self.timing(s.step));
        }
        self.println(&line);
        self.write_plot()?;
        Ok(record)
    }

    /// ` | 0:01:05 elapsed | eta 0:04:20`: this process's time so far and the remaining steps at
    /// its mean step time.
    fn timing(&self, step: u64) -> String {
        let elapsed = self.started.elapsed().as_secs_f64();
        let done = step + 1 - self.first_step.unwrap_or(step);
        let left = self.total_steps.saturating_sub(step);
        let eta = elapsed / done as f64 * left as f64;
        format!(
            " | {} elapsed | eta {}",
            format_clock(elapsed),
            format_clock(eta)
        )
    }

    /// Records and prints an evaluation result.
    pub fn log_eval(&mut self, step: u64, loss: f64, tokens: u64) -> Result<EvalRecord> {
        let record = EvalRecord {
            kind: "eval",
            step,
            loss,
            perplexity: loss.exp(),
            tokens,
        };
        self.eval_curve.push((step, loss));
        self.write_json(&record)?;
        if let Some(ev) = &mut self.events {
            ev.scalar("eval/loss", step, loss)?;
            ev.scalar("eval/perplexity", step, record.perplexity)?;
        }
        self.println(&format!(
            "eval @ step {step} | loss {loss:.4} | ppl {:.2} | {tokens} tokens",
            record.perplexity
        ));
        Ok(record)
    }

    /// Records the dataset report of the training or evaluation data (`"kind": "dataset"`, `split`
    /// is `train` or `eval`; `path` what `--data` gave, `files` its files, `data_config` and
    /// `data_split` the config and split taken from a folder or Hub dataset; `report` is `g4ft_data::PrepareReport::to_json`).
    pub fn log_dataset(
        &mut self,
        split: &str,
        files: &g4ft_data::DataFiles,
        report: serde_json::Value,
    ) -> Result<()> {
        let mut record = serde_json::json!({
            "kind": "dataset",
            "split": split,
            "path": files.spec,
            "files": files.files,
            "data_config": files.config,
            "data_split": files.split,
        });
        if let (Some(r), serde_json::Value::Object(fields)) = (record.as_object_mut(), report) {
            r.extend(fields);
        }
        self.write_json(&record)
    }

    /// Moves the progress bar (for steps that are not logged).
    pub fn progress_to(&self, step: u64) {
        if let Some(bar) = &self.bar {
            bar.set_position(step);
        }
    }

    /// Prints a line to stdout, above the progress bar if one is shown.
    pub fn println(&self, line: &str) {
        match &self.bar {
            Some(bar) => bar.println(line),
            None => println!("{line}"),
        }
    }

    /// Averages over the steady window; `None` until two steps were recorded.
    pub fn summary(&self) -> Option<Summary> {
        let w = &self.window;
        if w.steps == 0 || w.secs <= 0.0 {
            return None;
        }
        let tokens_per_s = w.tokens as f64 / w.secs;
        let mfu_of = |flops: f64| {
            self.mfu
                .as_ref()
                .map(|m| flops / w.secs / self.world_size as f64 / (m.peak_tflops * 1e12))
        };
        Some(Summary {
            steps: w.steps,
            tokens_per_s,
            s_per_step: w.secs / w.steps as f64,
            mfu_model: mfu_of(w.flops.0),
            mfu_hw: mfu_of(w.flops.1),
        })
    }

    /// The recorded training `(step, loss)` points, for [`crate::metrics::plot::write_loss_svg`].
    pub fn train_curve(&self) -> &[(u64, f64)] {
        &self.train_curve
    }

    /// The recorded evaluation `(step, loss)` points.
    pub fn eval_curve(&self) -> &[(u64, f64)] {
        &self.eval_curve
    }

    /// The evaluation with the lowest finite loss so far, `(step, loss)` (the earliest of equal
    /// ones), earlier runs' history included.
    pub fn best_eval(&self) -> Option<(u64, f64)> {
        self.eval_curve
            .iter()
            .copied()
            .filter(|(_, loss)| loss.is_finite())
            .fold(None, |best, e| match best {
                Some((_, b)) if b <= e.1 => best,
                _ => Some(e),
            })
    }

    /// Flushes the JSONL, writes the summary line to it, clears the progress bar, and returns
    /// the summary.
    pub fn finish(&mut self) -> Result<Option<Summary>> {
        let summary = self.summary();
        if let Some(s) = summary {
            #[derive(Serialize)]
            struct Line {
                kind: &'static str,
                #[serde(flatten)]
                summary: Summary,
            }
            self.write_json(&Line {
                kind: "summary",
                summary: s,
            })?;
        }
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
        Ok(summary)
    }

    fn write_json<T: Serialize>(&mut self, value: &T) -> Result<()> {
        if let Some((path, w)) = &mut self.jsonl {
            let line = serde_json::to_string(value).expect("metrics records serialize");
            let io = |source| Error::MetricsIo {
                path: path.clone(),
                source,
            };
            // flushed per line so a crash keeps every step written so far
            writeln!(w, "{line}").map_err(io)?;
            w.flush().map_err(io)?;
        }
        Ok(())
    }
}

/// The rank-0 line, e.g. `epoch 0 | step  12/400 | loss 1.2345 | norm 0.810 | lr 2.0e-04 | 412 ms
/// | 61.2k tok/s | MFU 38.1% model, 52.3% hw | 52.3 GiB peak`; MFU and memory are left out when
/// unknown.
pub fn format_step_line(r: &StepRecord) -> String {
    let width = r.total_steps.to_string().len();
    let mut line = format!(
        "epoch {} | step {:>width$}/{} | loss {:.4} | norm {:.3} | lr {} | {} | {} tok/s",
        r.epoch,
        r.step,
        r.total_steps,
        r.loss,
        r.grad_norm,
        format_sci(r.lr),
        format_duration(r.step_s),
        format_count(r.tokens_per_s),
    );
    if let (Some(model), Some(hw)) = (r.mfu_model, r.mfu_hw) {
        line.push_str(&format!(
            " | MFU {:.1}% model, {:.1}% hw",
            model * 100.0,
            hw * 100.0
        ));
    }
    if let Some(b) = r.peak_mem_bytes {
        line.push_str(&format!(
            " | {:.1} GiB peak",
            b as f64 / (1u64 << 30) as f64
        ));
    }
    line
}

/// `2.0e-04`: one decimal, two-digit exponent (Python's `:.1e`).
fn format_sci(x: f64) -> String {
    let s = format!("{x:.1e}");
    match s.split_once('e') {
        Some((mantissa, exp)) => {
            let exp: i32 = exp.parse().expect("Rust's {:e} writes an integer exponent");
            let sign = if exp < 0 { '-' } else { '+' };
            format!("{mantissa}e{sign}{:02}", exp.abs())
        }
        None => s, // NaN, inf
    }
}

/// `h:mm:ss`.
fn format_clock(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

/// `412 ms` below ten seconds, `12.3 s` above.
fn format_duration(secs: f64) -> String {
    if secs < 10.0 {
        format!("{:.0} ms", secs * 1e3)
    } else {
        format!("{secs:.1} s")
    }
}

/// `950`, `61.2k`, `1.25M`.
fn format_count(x: f64) -> String {
    if x >= 1e6 {
        format!("{:.2}M", x / 1e6)
    } else if x >= 1e3 {
        format!("{:.1}k", x / 1e3)
    } else {
        format!("{x:.0}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::mfu::{AttnLayer, LayerFlops};

    fn stats(step: u64, step_s: f64) -> StepStats {
        StepStats {
            epoch: 0,
            step,
            loss: 1.2345,
            grad_norm: 0.81,
            lr: 2e-4,
            step_s,
            tokens: 1000,
            seq_len: 2048,
            peak_mem_bytes: None,
        }
    }

    #[test]
    fn line_matches_the_style_guide() {
        let r = StepRecord {
            kind: "train",
            epoch: 0,
            step: 12,
            total_steps: 400,
            loss: 1.2345,
            grad_norm: 0.81,
            lr: 2e-4,
            step_s: 0.412,
            tokens: 25214,
            tokens_per_s: 61_200.0,
            mfu_model: Some(0.381),
            mfu_hw: Some(0.523),
            peak_mem_bytes: Some((52.3 * (1u64 << 30) as f64) as u64),
        };
        assert_eq!(
            format_step_line(&r),
            "epoch 0 | step  12/400 | loss 1.2345 | norm 0.810 | lr 2.0e-04 | 412 ms | 61.2k tok/s | MFU 38.1% model, 52.3% hw | 52.3 GiB peak"
        );
        let r = StepRecord {
            mfu_model: None,
            mfu_hw: None,
            peak_mem_bytes: None,
            step_s: 12.34,
            tokens_per_s: 950.0,
            ..r
        };
        assert!(format_step_line(&r).ends_with("| 12.3 s | 950 tok/s"));
    }

    #[test]
    fn scientific_lr_has_two_digit_exponent() {
        assert_eq!(format_sci(2e-4), "2.0e-04");
        assert_eq!(format_sci(1.0), "1.0e+00");
        assert_eq!(format_sci(0.0), "0.0e+00");
        assert_eq!(format_sci(f64::NAN), "NaN");
    }

    #[test]
    fn first_step_is_left_out_of_averages() {
        let model = FlopsModel {
            layers: vec![LayerFlops {
                n_linear: 1_000_000,
                n_routed: 0,
                attention: AttnLayer {
                    n_heads: 1,
                    head_dim: 1,
                    window: Some(1),
                },
                recomputed: true,
                n_reused: 0,
                attention_reused: false,
            }],
            n_head: 0,
            n_once: 0,
        };
        let spec = MfuSpec {
            model,
            peak_tflops: 1e-3,
        };
        let mut log = MetricsLogger::new(10, 2, None, Some(spec), false).unwrap();
        log.record_step(&stats(1, 5.0)).unwrap();
        assert_eq!(log.summary(), None);
        log.record_step(&stats(2, 1.0)).unwrap();
        log.record_step(&stats(3, 1.0)).unwrap();
        let s = log.summary().unwrap();
        assert_eq!((s.steps, s.tokens_per_s, s.s_per_step), (2, 1000.0, 1.0));
        // 500 tok/s per device × FLOP/token / 1e9 FLOP/s; the window-1 attention is 4 FLOP/token
        // per forward: model 4e6 + 3·4, hardware 6e6 + 4·4 (the layer is recomputed).
        let (model, hw) = (500.0 * (4e6 + 12.0) / 1e9, 500.0 * (6e6 + 16.0) / 1e9);
        assert!((s.mfu_model.unwrap() - model).abs() < 1e-12, "{s:?}");
        assert!((s.mfu_hw.unwrap() - hw).abs() < 1e-12, "{s:?}");
    }

    #[test]
    fn jsonl_has_one_object_per_line() {
        let dir = std::env::temp_dir().join(format!("g4ft-metrics-{}", std::process::id()));
        let path = dir.join("sub/metrics.jsonl");
        let _ = std::fs::remove_dir_all(&dir);
        let mut log = MetricsLogger::new(3, 1, Some(&path), None, false).unwrap();
        log.record_step(&stats(1, 1.0)).unwrap();
        log.record_step(&stats(2, 0.5)).unwrap();
        log.log_eval(2, 1.0, 77).unwrap();
        log.finish().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 4);
        assert_eq!(lines[1]["kind"], "train");
        assert_eq!(lines[1]["tokens_per_s"], 2000.0);
        assert_eq!(lines[2]["kind"], "eval");
        assert_eq!(lines[2]["perplexity"], std::f64::consts::E);
        assert_eq!(lines[3]["kind"], "summary");
        assert_eq!(log.train_curve(), &[(1, 1.2345), (2, 1.2345)]);
        assert_eq!(log.eval_curve(), &[(2, 1.0)]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_best_evaluation_is_the_earliest_lowest_finite_loss() {
        let mut log = MetricsLogger::new(3, 1, None, None, false).unwrap();
        assert_eq!(log.best_eval(), None);
        for (step, loss) in [(1, 2.0), (2, f64::NAN), (3, 1.5), (4, 1.5), (5, 1.7)] {
            log.log_eval(step, loss, 10).unwrap();
        }
        assert_eq!(log.best_eval(), Some((3, 1.5)));
    }
}
