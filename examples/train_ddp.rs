//! `train_ddp`: LoRA fine-tuning of Gemma 4 with DDP — the post's `train_ddp.py`, step for step.
//!
//! ```text
//! # two CPU ranks on the bundled tiny model (README's first command)
//! cargo run --release -p g4ft-ddp --bin ddprun -- --standalone --nproc-per-node 2 -- \
//!     target/release/examples/train_ddp --config configs/tiny-cpu.toml
//! # under torchrun, one GPU per rank (build with --features cuda)
//! torchrun --standalone --nproc_per_node=8 --no-python target/release/examples/train_ddp \
//!     --config configs/gemma4-12b-lora.toml
//! ```
//! Without launcher environment it runs as one process. Settings: defaults = the post's
//! constants < `--config` TOML < `MODEL_ID`/`DATA_PATH`/`OUTPUT_DIR` < flags (`--help`).
//!
//! Outputs in `OUTPUT/`: `step-N/` and `epoch-E/` checkpoints (PEFT adapter + trainer state,
//! written atomically by rank 0), `metrics.jsonl`, `loss.svg`.
//!
//! One optimizer step: ACCUM micro-batches; the first ACCUM−1 run inside `ddp.no_sync`, the last
//! one's layer-wise backward hands each finished layer's LoRA gradients to DDP so full buckets
//! all-reduce while earlier layers are still in backward; `finish` waits for the averages; the
//! norm is taken and clipped after the all-reduce (same on every rank); AdamW steps; the cosine
//! schedule advances.

use std::cell::OnceCell;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};
use candle_core::Device;
use clap::{ArgMatches, ValueEnum};
use g4ft::data::{
    detect_files_format, prepare::SKIPPED_SHOWN, skipped_row_warnings, write_skipped_rows, Batch,
    Batching, DataFiles, DataLoader, DatasetOptions, Encoder, Format, LoaderConfig, PrepareOptions,
    SplitChoice, TokenDataset,
};
use g4ft::ddp::{
    signals, DdpError, DdpOptions, DistEnv, DistributedDataParallel, GroupOptions, ProcessGroup,
};
use g4ft::gemma4::{Checkpoint, Config, Gemma4Model, Hub, ModelFiles, StepShape};
use g4ft::lora::{self, LoraConfig, ParamReport, TargetModules};
use g4ft::trainer::checkpoint::resume::{self, Launch, StartPlan};
use g4ft::trainer::checkpoint::run_dir::{self, OutputLock, RunRecord};
use g4ft::trainer::checkpoint::state::{
    config_fingerprint, math_settings, RngState, SamplerPosition, TrainerState, STATE_FORMAT,
};
use g4ft::trainer::checkpoint::{
    complete_checkpoints, damaged_checkpoints, latest_checkpoint_of_run, prune_checkpoints,
    write_checkpoint_atomic,
};
use g4ft::trainer::config::cli;
use g4ft::trainer::config::ResolvedConfig;
use g4ft::trainer::config::{Origin, ReportTo};
use g4ft::trainer::metrics::memory::{self, MemProbe};
use g4ft::trainer::metrics::tensorboard::EventWriter;
use g4ft::trainer::metrics::{
    snapshot_metrics, truncate_metrics, MetricsLogger, MfuSpec, StepStats, METRICS_FILE,
};
use g4ft::trainer::step::clip::{clip_coef, grad_norm};
use g4ft::trainer::step::nonfinite::{decide, stop_error, StepDecision};
use g4ft::trainer::step::optim::{AdamW, AdamWParams};
use g4ft::trainer::step::schedule::{warmup_steps, LrSchedule, LrSchedulerKind};
use g4ft::trainer::step::{self, Evaluation, LossWeighting};
use g4ft::trainer::TrainConfig;

fn main() -> ExitCode {
    let matches = cli::get_matches();
    let prefix = g4ft::ddp::env::message_prefix(|k| std::env::var(k).ok());
    match train(&matches, &prefix) {
        // Stopped by a signal with its checkpoint saved: the exit code of a process it ended.
        Ok(RunEnd::Stopped(sig)) => ExitCode::from((128 + sig) as u8),
        other => cli::exit_code(&prefix, other.map(drop)),
    }
}

/// How a run that did not fail ended.
enum RunEnd {
    /// Every step ran (or there was none left to run).
    Finished,
    /// A signal stopped it at a step boundary (every rank stops at the same one).
    Stopped(i32),
}

/// After the first stop signal, a second one at least this long after it ends the process at
/// once: a terminal and a launcher delivering one Ctrl-C twice do so sooner.
const STOP_AT_ONCE_AFTER: Duration = Duration::from_secs(1);

fn train(matches: &ArgMatches, prefix: &str) -> Result<RunEnd> {
    let mut resolved = cli::resolve(matches)?;
    // Where the run starts (fresh, --init-adapter, --resume, an elastic restart) and the
    // settings that fixes; every rank decides the same from the same files.
    let launch = Launch::from_env(|k| std::env::var(k).ok())?;
    let plan = resume::plan(&resolved.config, &launch)?;
    let changes = plan.apply(&mut resolved)?;
    let cfg = &resolved.config;

    // 1. Device first, then the process group bound to it (torchrun sets RANK, LOCAL_RANK,
    //    WORLD_SIZE, MASTER_ADDR, MASTER_PORT; without them: one process).
    let env = DistEnv::from_env()?;
    let device = cfg.device.open(env.local_rank)?;
    // Peak memory for the log line: the CUDA pool's high-water mark, or peak RSS on CPU.
    let mem = MemProbe::new(&device)?;
    let timeout = Duration::from_secs(cfg.collective_timeout_s);
    let group = ProcessGroup::new(
        env,
        &device,
        GroupOptions {
            timeout,
            ..Default::default()
        },
    )?;
    // A failing rank names the peer that failed first, when that is what stopped it.
    let start = Start {
        plan: &plan,
        launch: &launch,
        changes: &changes,
        claimed: OnceCell::new(),
    };
    match train_in_group(&resolved, &start, &device, &mem, &group, prefix) {
        Ok(end) => Ok(end),
        Err(e) => {
            let follows_peer = DdpError::chain_may_follow_peer_exit(e.as_ref());
            let linger = FAILURE_LINGER.min(timeout);
            let mut text = cli::error_text(&e);
            // Rank 0 says how the run goes on; rank 1 too when it follows a peer's failure,
            // which may be rank 0's death.
            let speaks = group.rank() == 0 || (group.rank() == 1 && follows_peer);
            let hint = start.claimed.get().and_then(|id| going_on(&cfg.output, id));
            if let Some(hint) = hint.filter(|_| speaks) {
                text.push_str(&format!("\n  hint: {hint}"));
            }
            Err(anyhow!(group.fail(&text, follows_peer, linger)))
        }
    }
}

/// How a run that failed after rank 0 claimed the output folder for run `run_id` goes on: from
/// its last complete checkpoint, or, when it saved none but logged steps (which make a plain
/// rerun refuse the folder), over again.
fn going_on(output: &Path, run_id: &str) -> Option<String> {
    match latest_checkpoint_of_run(output, run_id) {
        Ok(Some(c)) => Some(format!(
            "this run's last complete checkpoint is {} (step {}); once the cause is fixed, the \
             same command with --resume latest continues from it",
            c.dir.display(),
            c.marker.step
        )),
        Ok(None) if std::fs::metadata(output.join(METRICS_FILE)).is_ok_and(|m| m.len() > 0) => {
            Some(
                "this run saved no checkpoint; once the cause is fixed, start it again with \
             --overwrite-output"
                    .into(),
            )
        }
        _ => None,
    }
}

/// How long a failing rank 0 keeps the store up for its peers to read why.
const FAILURE_LINGER: Duration = Duration::from_secs(10);

/// The decided starting point of the run.
struct Start<'a> {
    plan: &'a StartPlan,
    launch: &'a Launch,
    /// Settings a resumed run changes, `name old → new (origin)`.
    changes: &'a [String],
    /// The run's id, once rank 0 holds the output folder and has told every rank.
    claimed: OnceCell<String>,
}

/// Steps 2-12 of the post's script, once the process group exists.
fn train_in_group(
    resolved: &ResolvedConfig,
    start: &Start<'_>,
    device: &Device,
    mem: &MemProbe,
    group: &ProcessGroup,
    prefix: &str,
) -> Result<RunEnd> {
    let cfg = &resolved.config;
    let (rank, world_size) = (group.rank(), group.world_size());
    let is_main = rank == 0;
    start.plan.check_world_size(world_size)?;
    // Every rank must run the same training from the same start: a node launched with other
    // flags, or one that saw other files, is an error before anything is loaded.
    let mine = (math_settings(cfg), start.plan.describe());
    let (settings, starts): (Vec<_>, Vec<_>) = group.all_gather_object(&mine)?.into_iter().unzip();
    resume::check_same_settings(&settings)?;
    resume::check_same_start(&starts, &cfg.output)?;
    // What the device could allocate before the model is loaded: --recompute auto's default budget.
    let free_at_start = memory::free_memory(device, group.env().local_world_size);

    // The output folder: rank 0 locks it for the run's lifetime and claims it. Only rank 0
    // writes there; the lock is released when `run` drops, at the end of the run.
    let run = if is_main {
        Some(claim_output(cfg, start)?)
    } else {
        None
    };
    let run_id = run.as_ref().map_or("", |(_, r)| r.run_id.as_str());
    let _ = start
        .claimed
        .set(group.broadcast_object(&run_id.to_string(), 0)?);
    if is_main {
        println!("{}", resolved.table());
        println!("run {run_id} in {}", cfg.output.display());
    }

    // 2. Model: its files and config (a Hub id is downloaded once into the cache) ...
    let files = ModelFiles::resolve_with(&cfg.model, &Hub::from_env(cfg.revision.as_deref()))?;
    let config = Config::from_file(&files.config)?;
    let model_dir = files.config.parent().unwrap_or(Path::new("."));

    // 5. Data: DistributedSampler(seed, drop_last) + loader with drop_last on every rank. Opened
    //    before the weights load, so that a mistake in the data costs no model load, and before
    //    the first collective, so that bad data is every rank's own error.
    let data = |files: DataFiles, train: bool| {
        open_loader(cfg, model_dir, &config, &files, rank, world_size, train)
    };
    let data_hub = Hub::from_env(cfg.data_revision.as_deref());
    let train_split =
        SplitChoice::train(cfg.data_split.as_deref()).with_config(cfg.data_config.as_deref());
    let train_files = DataFiles::resolve(&cfg.data.to_string_lossy(), train_split, &data_hub)?;
    check_outside_output(&train_files, &cfg.output)?;
    let loader = data(train_files, true)?;
    let eval_loader = match &cfg.eval_data {
        Some(spec) => {
            let eval_split = SplitChoice::eval(cfg.eval_split.as_deref())
                .with_config(cfg.eval_config.as_deref());
            let files = DataFiles::resolve(&spec.to_string_lossy(), eval_split, &data_hub)?;
            check_outside_output(&files, &cfg.output)?;
            Some(data(files, false)?)
        }
        None => None,
    };
    // len(loader) // ACCUM optimizer steps per epoch, the partial window dropped.
    let steps_per_epoch = loader.len() / cfg.accum;
    if steps_per_epoch == 0 {
        let unit = if cfg.packing { "packs" } else { "rows" };
        bail!(
            "{}: {} {unit} make {} batch(es) of --micro-batch {} on each of {world_size} rank(s), \
             fewer than --accum {}: one optimizer step takes {} {unit}; lower --micro-batch or \
             --accum, or add data",
            loader.dataset().files().describe(),
            loader.sampler().dataset_len(),
            loader.len(),
            cfg.micro_batch,
            cfg.accum,
            cfg.micro_batch * cfg.accum * world_size
        );
    }

    // 2. ... and its weights: every rank loads its own copy of the frozen base.
    let mut model = Gemma4Model::from_checkpoint(
        config,
        &Checkpoint::open(&files.weights)?,
        cfg.dtype.dtype(),
        device,
    )?;
    // 3. LoRA adapters on the targeted projections.
    let lora_cfg = attach_lora(cfg, start.plan, &mut model)?;
    // 4. Recompute policy: which layers keep their activations for the backward.
    plan_recompute(resolved, &mut model, free_at_start, group, device)?;
    if is_main {
        println!("{}", param_report(&model, &lora_cfg)?);
    }

    // 6. DDP wrap: checks names/shapes on every rank, broadcasts rank 0's values, builds the
    //    reverse-order buckets that hold the gradients (gradient_as_bucket_view).
    let params = lora::lora_parameters(model.projections())
        .into_iter()
        .map(|p| (p.name, p.var))
        .collect();
    let ddp_opts = DdpOptions {
        bucket_cap_mb: cfg.bucket_cap_mb,
        ..Default::default()
    };
    let mut ddp = DistributedDataParallel::new(group, params, ddp_opts)?;
    // Dropout is seeded with SEED + rank after the wrap (see step::train_context).

    // 7. Optimizer and schedule over the run's steps, identical on every rank (steps per epoch
    //    from step 5). --max-steps replaces epochs × steps as the schedule's length
    //    (transformers' max_steps), cycling the data.
    let run_steps = cfg
        .max_steps
        .map_or((steps_per_epoch * cfg.epochs) as u64, |m| m as u64);
    let epochs = run_steps.div_ceil(steps_per_epoch as u64) as usize;
    let mut opt = AdamW::new(
        AdamWParams::with_weight_decay(cfg.weight_decay),
        &step::bucket_lens(&ddp)?,
        device,
    )?;
    let warmup = warmup_steps(cfg.warmup, cfg.warmup_ratio, run_steps);
    let mut sched = LrSchedule::new(cfg.lr_scheduler, cfg.lr, warmup, run_steps);
    if is_main {
        println!(
            "world={world_size} global_batch={} steps={steps_per_epoch}",
            cfg.global_batch(world_size)
        );
        for warning in settings_without_effect(resolved, warmup, run_steps, device) {
            eprintln!("warning: {warning}");
        }
    }

    // 8. Continue where the checkpoint stopped: moments, schedule, data position, dropout counter.
    let mut pos = Position::default();
    if let resume::Start::Checkpoint { dir, state, .. } = &start.plan.start {
        let (resumed, changes) =
            resume_from(dir, state, start.changes, &mut opt, &mut sched, cfg, device)?;
        pos = resumed;
        if pos.step_in_epoch >= steps_per_epoch {
            (pos.epoch, pos.step_in_epoch) = (pos.epoch + 1, 0);
        }
        if is_main {
            let changed = if changes.is_empty() {
                String::new()
            } else {
                format!("; this run changes {}", changes.join(", "))
            };
            println!(
                "resumed from {} at step {} (epoch {}){changed}",
                dir.display(),
                pos.step,
                pos.epoch
            );
            for damaged in damaged_checkpoints(&cfg.output)? {
                eprintln!("warning: passed over a damaged checkpoint: {damaged}");
            }
            let later: Vec<String> = complete_checkpoints(&cfg.output)?
                .into_iter()
                .filter(|c| c.marker.step > pos.step)
                .map(|c| c.marker.name)
                .collect();
            if !later.is_empty() {
                println!(
                    "note: {} also holds {}, past step {}; this run's checkpoints are newer than \
                     them (--resume latest takes the one written last, --save-total-limit removes \
                     the first written, a save of the same name replaces one)",
                    cfg.output.display(),
                    later.join(", "),
                    pos.step
                );
            }
        }
        if pos.step >= run_steps {
            if is_main {
                let raise = if cfg.max_steps.is_some() {
                    "--max-steps"
                } else {
                    "--epochs"
                };
                println!(
                    "nothing to train: the checkpoint is at step {} of {run_steps} (raise {raise} to train further)",
                    pos.step
                );
            }
            return Ok(RunEnd::Finished);
        }
    }
    let mut logger = if is_main {
        let splits = [("train", Some(&loader)), ("eval", eval_loader.as_ref())];
        Some(open_logger(
            cfg,
            device,
            &model,
            &splits,
            run_steps,
            world_size,
            &start.plan.start,
        )?)
    } else {
        None
    };

    // 9. Train. Checkpoints bind what stays fixed for the run once; each save passes the rest.
    let ckpt = Checkpointer {
        group,
        cfg,
        model: &model,
        lora_cfg: &lora_cfg,
        world_size,
        run_id,
    };
    // SIGINT, SIGTERM or SIGHUP (Ctrl-C, a launcher, a scheduler's preemption) stops the run at
    // the next step boundary, where every rank learns of it from the step's first all-reduce
    // and rank 0 saves a checkpoint; a second signal ends the process at once. The first rank
    // of each node (local rank 0) prints the notices and the report, so that every node's
    // terminal says why its workers exit.
    let speaks = group.env().local_rank == 0;
    signals::install(signals::Catch {
        notice: speaks.then(|| {
            format!(
                "{prefix}{{signal}}: stopping after the step in progress and saving a \
                 checkpoint; send it again to stop at once"
            )
        }),
        exit_on_repeat_after: Some(STOP_AT_ONCE_AFTER),
        exit_notice: speaks.then(|| {
            format!(
                "{prefix}a second signal: stopping at once; a checkpoint being written is left \
                 incomplete, and --resume latest continues from the last complete one"
            )
        }),
        launcher_notice: speaks
            .then(|| format!("{prefix}the launcher is stopping the workers because {{reason}}")),
    });
    let first_step = pos.step;
    let (mut last_saved, mut last_eval): (Option<(u64, String)>, _) = (None, None);
    // A stop signal that abandoned an evaluation.
    let mut stop = None;
    // The stop report of a signal after `step`, on the ranks that speak.
    let report_stop = |sig: i32, step: u64, saved: Option<&str>| {
        speaks.then(|| stop_report(sig, step, run_steps, cfg, saved, start, is_main))
    };
    'epochs: for epoch in pos.epoch..epochs {
        pos.epoch = epoch;
        // sampler.set_epoch(epoch): a new shuffle of seed + epoch, the same on all ranks.
        let mut batches = loader.epoch(epoch as u64, pos.step_in_epoch * cfg.accum);
        for step_in_epoch in pos.step_in_epoch..steps_per_epoch {
            if pos.step >= run_steps {
                break 'epochs;
            }
            let t0 = Instant::now();
            let window: Vec<Batch> = (0..cfg.accum)
                .map(|_| {
                    batches
                        .next()
                        .context("the loader ended before len(loader) batches")?
                        .map_err(anyhow::Error::from)
                })
                .collect::<Result<_>>()?;

            // Token counts of this optimizer step over all ranks (the loss weights need them),
            // and which stop signals the ranks have caught.
            let local_targets: usize = window.iter().map(|b| b.n_label_tokens).sum();
            let local_tokens: usize = window.iter().map(|b| b.n_tokens).sum();
            let mut local = vec![local_targets as f64, local_tokens as f64];
            local.extend(signals::caught_flags());
            let counts = step::all_reduce_sum(group, &local, device)?;
            if let Some(sig) = signals::flagged(&counts[2..]) {
                let saved = match &last_saved {
                    Some((step, name)) if *step == pos.step => Some(name.clone()),
                    _ if pos.step == first_step => None,
                    _ => {
                        let name = format!("step-{}", pos.step);
                        ckpt.save(&name, epoch, &opt, &sched, &pos, logger.as_ref())?;
                        Some(name)
                    }
                };
                let report = report_stop(sig, pos.step, saved.as_deref());
                return stopped(sig, report, logger.as_mut());
            }
            let weighting = if cfg.token_weighted_loss {
                LossWeighting::TokenWeighted {
                    world_size,
                    global_tokens: counts[0] as u64,
                }
            } else {
                LossWeighting::MeanPerMicroBatch { accum: cfg.accum }
            };

            // ACCUM−1 micro-batches under ddp.no_sync, the last one synchronised (buckets
            // all-reduce during its backward), then ddp.finish(): the buffers hold the
            // rank-averaged gradients.
            let loss_share = step::accumulate_window(
                &model,
                &mut ddp,
                &window,
                weighting,
                cfg.seed,
                &mut pos.micro_step,
                &mut step::NoObserver,
            )?;

            // Clip after the all-reduce: the same norm and coefficient on every rank.
            let loss = step::all_reduce_sum(group, &[loss_share], device)?[0];
            let norm = grad_norm(&step::bucket_grads(&ddp)?)?;
            // A NaN must not split the ranks: rank 0 decides, everyone acts on its decision.
            let code = group.decide_on_rank0(|| {
                decide(
                    loss,
                    norm,
                    cfg.on_nonfinite,
                    cfg.max_nonfinite_skips,
                    pos.skipped_in_a_row,
                )
                .code()
            })?;
            let lr = sched.lr();
            match StepDecision::from_code(code) {
                StepDecision::Apply => {
                    step::adamw_step(&mut opt, &ddp, lr, clip_coef(norm, cfg.max_grad_norm))?;
                    sched.advance();
                    pos.skipped_in_a_row = 0;
                }
                StepDecision::Skip => {
                    pos.skipped_in_a_row += 1;
                    if is_main {
                        eprintln!("warning: step {}: non-finite loss {loss} or grad norm {norm}; step skipped", pos.step + 1);
                    }
                }
                StepDecision::Stop => {
                    return Err(stop_error(
                        pos.step + 1,
                        loss,
                        norm,
                        cfg.on_nonfinite,
                        pos.skipped_in_a_row,
                    )
                    .into());
                }
            }
            pos.step += 1;
            pos.step_in_epoch = step_in_epoch + 1;
            let step_s = t0.elapsed().as_secs_f64(); // the reduces above waited for the device

            if let Some(logger) = logger.as_mut() {
                let stats = StepStats {
                    epoch,
                    step: pos.step,
                    loss,
                    grad_norm: norm,
                    lr,
                    step_s,
                    tokens: counts[1] as u64,
                    seq_len: window.iter().map(|b| b.seq_len).max().unwrap_or(0),
                    peak_mem_bytes: mem.peak().ok(),
                };
                if (pos.step - 1).is_multiple_of(cfg.log_every as u64) {
                    logger.log_step(&stats)?;
                } else {
                    logger.record_step(&stats)?;
                    logger.progress_to(pos.step);
                }
            }
            if every(cfg.save_every, pos.step) {
                let name = format!("step-{}", pos.step);
                ckpt.save(&name, epoch, &opt, &sched, &pos, logger.as_ref())?;
                last_saved = Some((pos.step, name));
            }
            if every(cfg.eval_every, pos.step) {
                // A signal that abandons it stops the run at the next step boundary (or below,
                // when this was the last step).
                stop = run_eval(
                    &model,
                    eval_loader.as_ref(),
                    group,
                    logger.as_mut(),
                    pos.step,
                )?;
                if stop.is_none() {
                    last_eval = Some(pos.step);
                }
            }
        }
        // Epoch end: rank 0 writes, the others wait at the barrier.
        pos.step_in_epoch = 0;
        let name = format!("epoch-{epoch}");
        ckpt.save(&name, epoch + 1, &opt, &sched, &pos, logger.as_ref())?;
        last_saved = Some((pos.step, name));
    }
    if last_saved.as_ref().map(|(step, _)| *step) != Some(pos.step) {
        // Stopped by --max-steps mid-epoch: keep the final adapter too.
        let name = format!("step-{}", pos.step);
        ckpt.save(&name, pos.epoch, &opt, &sched, &pos, logger.as_ref())?;
        last_saved = Some((pos.step, name));
    }
    if stop.is_none() && last_eval != Some(pos.step) {
        stop = run_eval(
            &model,
            eval_loader.as_ref(),
            group,
            logger.as_mut(),
            pos.step,
        )?;
    }
    if stop.is_none() {
        // A signal caught during the last step, its save or the final evaluation's last batch:
        // the run is complete, and says so to the signal's sender.
        let caught = step::all_reduce_sum(group, &signals::caught_flags(), device)?;
        stop = signals::flagged(&caught);
    }
    if let Some(sig) = stop {
        let saved = last_saved.map(|(_, name)| name);
        let report = report_stop(sig, pos.step, saved.as_deref());
        return stopped(sig, report, logger.as_mut());
    }
    if let Some((step, loss)) = logger.as_ref().and_then(MetricsLogger::best_eval) {
        println!("{}", best_eval_report(&cfg.output, step, loss)?);
    }

    // 10. Every rank must end with the same adapter (DDP's invariant): compare checksums.
    let checksum = ddp.check_parameters()?;
    if is_main {
        if world_size > 1 {
            println!("adapter identical on all {world_size} ranks: checksum {checksum:#018x}");
        } else {
            println!("adapter checksum {checksum:#018x} (one rank)");
        }
    }

    // 11. Metrics summary and the loss curve.
    if let Some(logger) = logger.as_mut() {
        if let Some(s) = logger.finish()? {
            println!(
                "steady state: {:.0} tok/s, {:.3} s/step over {} steps",
                s.tokens_per_s, s.s_per_step, s.steps
            );
        }
        logger.write_plot()?;
        if let Some(svg) = logger.plot_path() {
            println!("wrote {}", svg.display());
        }
    }

    // 12. Teardown (the post's destroy_process_group): the DDP reducer here, the group by the
    //     caller.
    drop(ddp);
    Ok(RunEnd::Finished)
}

/// Where the run's best evaluation (`loss` at `step`, earlier runs' included) is kept: the
/// checkpoint of its step, which `--save-total-limit` spares, if one was saved.
fn best_eval_report(output: &Path, step: u64, loss: f64) -> Result<String> {
    let head = format!("best evaluation: loss {loss:.4} at step {step}");
    let kept = complete_checkpoints(output)?
        .into_iter()
        .rfind(|c| c.marker.step == step);
    Ok(match kept {
        Some(c) => format!("{head}, in {}", c.dir.display()),
        None => format!(
            "{head}; no checkpoint holds that step (--save-every a multiple of --eval-every \
             keeps one)"
        ),
    })
}

/// The end of a run that `sig` stopped: `report` is printed (by the first rank of each node),
/// the loss plot is written (by rank 0).
fn stopped(sig: i32, report: Option<String>, logger: Option<&mut MetricsLogger>) -> Result<RunEnd> {
    if let Some(report) = report {
        println!("{report}");
    }
    if let Some(logger) = logger {
        logger.write_plot()?;
    }
    Ok(RunEnd::Stopped(sig))
}

/// What a run stopped by `sig` after `step` of `run_steps` says: the checkpoint that holds it
/// (`saved`, in the output folder) and how to continue. Said by another node's first rank than
/// rank 0 (`!by_rank0`), it names rank 0's node as the one whose output folder holds them.
fn stop_report(
    sig: i32,
    step: u64,
    run_steps: u64,
    cfg: &TrainConfig,
    saved: Option<&str>,
    start: &Start<'_>,
    by_rank0: bool,
) -> String {
    let head = format!(
        "stopped by {} after step {step} of {run_steps}",
        signals::name(sig)
    );
    let there = if by_rank0 { "" } else { " on rank 0's node" };
    match (saved, &start.plan.start) {
        // The last step's save or the final evaluation (whose abandonment is reported by
        // itself) was under way.
        (Some(name), _) if step == run_steps => format!(
            "{head}: training is complete, its adapter is saved in {}{there}",
            cfg.output.join(name).display()
        ),
        (Some(name), _) => format!(
            "{head}: saved {}{there}; to continue, run the same command with --resume latest",
            cfg.output.join(name).display()
        ),
        (None, resume::Start::Checkpoint { dir, .. }) => format!(
            "{head}, before this run finished a step: nothing new to save; the same command \
             continues from {}{there} again",
            dir.display()
        ),
        (None, _) => format!("{head}: no step had finished, nothing was saved"),
    }
}

/// Settings that the run does not use as asked, each as a sentence: a warmup the schedule has
/// none of (given explicitly), a warmup as long as the run, checkpoint offload on the CPU.
fn settings_without_effect(
    resolved: &ResolvedConfig,
    warmup: u64,
    run_steps: u64,
    device: &Device,
) -> Vec<String> {
    let cfg = &resolved.config;
    let set = |name: &str| resolved.origin(name) != Origin::Default;
    let mut said = Vec::new();
    if cfg.lr_scheduler == LrSchedulerKind::Constant && (set("warmup") || set("warmup_ratio")) {
        said.push(
            "--lr-scheduler constant has no warmup (transformers' get_constant_schedule): the \
             warmup setting is unused; constant-with-warmup has one"
                .to_string(),
        );
    } else if cfg.lr_scheduler != LrSchedulerKind::Constant && warmup >= run_steps {
        said.push(format!(
            "a warmup of {warmup} steps in a run of {run_steps}: the learning rate never reaches \
             --lr {}",
            cfg.lr
        ));
    }
    if cfg.offload_checkpoints && device.is_cpu() {
        said.push(
            "--offload-checkpoints parks a GPU's activations in host memory; on the CPU it \
             only copies them"
                .to_string(),
        );
    }
    said
}

/// Whether a `--save-every` / `--eval-every` interval falls on `step`.
fn every(interval: Option<usize>, step: u64) -> bool {
    interval.is_some_and(|n| step.is_multiple_of(n as u64))
}

/// Rank 0's hold on the output folder: locked for the run's lifetime (a second run into the
/// same folder is refused while this one lives) and claimed (a folder holding another run is
/// refused unless --overwrite-output).
fn claim_output(cfg: &TrainConfig, start: &Start<'_>) -> Result<(OutputLock, RunRecord)> {
    let holder = format!(
        "{} (started at unix time {})",
        g4ft::wait::this_process(),
        SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs()
    );
    let lock = run_dir::lock(&cfg.output, &holder)?;
    let fresh = RunRecord::new(
        start.launch.launcher_run_id.clone(),
        start.launch.launcher_pid,
        config_fingerprint(cfg),
    );
    let record = run_dir::claim(&cfg.output, &start.plan.claim, fresh)?;
    Ok((lock, record))
}

/// Attaches the run's adapters and returns their config: the same seed on every rank gives the
/// same init (DDP's broadcast enforces it), or the weights of the PEFT adapter or checkpoint the
/// run starts from, with their adapter_config.json (the settings table shows its values).
fn attach_lora(cfg: &TrainConfig, plan: &StartPlan, model: &mut Gemma4Model) -> Result<LoraConfig> {
    let mut lora_cfg = match plan.dir() {
        Some(dir) => lora::load_adapter(dir, model.projections_mut())?,
        None => {
            let mut c = LoraConfig::new(
                cfg.lora_r,
                cfg.lora_alpha,
                TargetModules::Regex(cfg.lora_targets.clone()),
            );
            c.lora_dropout = cfg.lora_dropout;
            c.use_rslora = cfg.use_rslora;
            lora::attach(&c, model.projections_mut(), cfg.seed)?;
            c
        }
    };
    lora_cfg.base_model_name_or_path = Some(cfg.model.clone());
    check_rank_fits(model)?;
    Ok(lora_cfg)
}

/// Which layers keep their activations for the backward and which are recomputed, from the
/// memory model's predicted peak for micro-batches of max_len tokens, and where the recomputed
/// layers' inputs wait (the gradients are the same bits either way). Each rank plans for its
/// own device; rank 0 prints the plan.
fn plan_recompute(
    resolved: &ResolvedConfig,
    model: &mut Gemma4Model,
    free_at_start: Result<u64>,
    group: &ProcessGroup,
    device: &Device,
) -> Result<()> {
    let cfg = &resolved.config;
    let local_world_size = group.env().local_world_size;
    let free = free_at_start.map_err(|e| format!("{e:#}"));
    let policy = memory::recompute_policy(cfg.recompute, cfg.memory_budget_gb, || {
        free.clone().map_err(anyhow::Error::msg)
    })?;
    let (recompute, parked_note) = memory::apply_recompute(
        model,
        policy,
        cfg.offload_checkpoints,
        cfg.micro_batch,
        cfg.max_len,
        || memory::host_room(local_world_size),
    )?;
    if group.rank() == 0 {
        println!("{recompute}");
        if let Some(note) = &parked_note {
            println!("{note}");
        }
        if !recompute.fits() {
            eprintln!("warning: the predicted peak is over --memory-budget-gb even with every layer recomputed; lower --micro-batch or --max-len if the run runs out of memory");
        }
        // A GPU with room to spare: say what the faster policy would keep.
        if let (true, Origin::Default, Ok(free)) = (
            device.is_cuda(),
            resolved.origin("recompute"),
            free.as_ref(),
        ) {
            let shape = StepShape::of_model(model, cfg.micro_batch, cfg.max_len);
            if let Some(note) = memory::auto_instead_of_all(model.config(), shape, *free) {
                println!("{note}");
            }
        }
    }
    Ok(())
}

/// The table of trainable parameters per adapted projection.
fn param_report(model: &Gemma4Model, lora_cfg: &LoraConfig) -> Result<ParamReport> {
    let shapes: Vec<lora::ProjectionShape> = model
        .projections()
        .map(|p| lora::ProjectionShape {
            path: p.path().into(),
            in_features: p.in_features(),
            out_features: p.out_features(),
        })
        .collect();
    Ok(ParamReport::new(
        lora_cfg,
        &shapes,
        model.config().num_text_parameters(),
    )?)
}

/// The position in training saved in a checkpoint's trainer state, with the optimizer's
/// moments and the schedule restored, and the settings this run changes (those of the start
/// plan, and the schedule if it is rebuilt).
fn resume_from(
    dir: &Path,
    state: &TrainerState,
    changes: &[String],
    opt: &mut AdamW,
    sched: &mut LrSchedule,
    cfg: &TrainConfig,
    device: &Device,
) -> Result<(Position, Vec<String>)> {
    opt.load_state(
        state.optimizer_step,
        &TrainerState::read_moments(dir, device)?,
    )?;
    // This run's schedule settings at the saved step: the same curve unless they changed.
    let rebuilt = state
        .scheduler
        .rebuilt(sched.kind, sched.base_lr, sched.warmup, sched.total);
    let mut changes = changes.to_vec();
    if rebuilt != state.scheduler {
        changes.push(format!(
            "schedule {} → {} (rebuilt at step {})",
            describe_schedule(&state.scheduler),
            describe_schedule(&rebuilt),
            state.step
        ));
    }
    *sched = rebuilt;
    let pos = Position {
        step: state.step,
        epoch: state.sampler.epoch,
        step_in_epoch: state.sampler.micro_batches as usize / cfg.accum,
        micro_step: state.rng.micro_step,
        skipped_in_a_row: state.skipped_in_a_row,
    };
    Ok((pos, changes))
}

/// Rank 0's metrics: the step log (with MFU against --peak-tflops, else the data-sheet peak of
/// a known GPU; none on the CPU), metrics.jsonl made the history of the checkpoint the run
/// starts `from`, the loss plot, TensorBoard events if asked, and each data split's report.
fn open_logger(
    cfg: &TrainConfig,
    device: &Device,
    model: &Gemma4Model,
    splits: &[(&str, Option<&DataLoader>)],
    run_steps: u64,
    world_size: usize,
    from: &resume::Start,
) -> Result<MetricsLogger> {
    let (resumed_step, resumed) = match from {
        resume::Start::Checkpoint { dir, state, .. } => (state.step, Some(dir.as_path())),
        _ => (0, None),
    };
    let peak = cfg
        .peak_tflops
        .or_else(|| g4ft_trainer::metrics::mfu::device_peak_tflops(device));
    let mfu = peak.map(|peak_tflops| MfuSpec {
        model: step::flops_model(model),
        peak_tflops,
    });
    let jsonl = cfg.output.join(METRICS_FILE);
    let history = truncate_metrics(&jsonl, resumed_step, resumed)?;
    let title = format!("{} LoRA, world {world_size}", cfg.model);
    let mut logger = MetricsLogger::new(run_steps, world_size, Some(&jsonl), mfu, true)?
        .with_history(history)
        .with_plot(&cfg.output.join("loss.svg"), &title);
    if cfg.report_to == ReportTo::Tensorboard {
        let events = EventWriter::create(&cfg.output.join("tensorboard"), resumed_step)?;
        println!("tensorboard: {}", events.path().display());
        logger = logger.with_tensorboard(events);
    }
    for (split, loader) in splits {
        if let Some(l) = loader {
            let ds = l.dataset();
            logger.log_dataset(split, ds.files(), ds.report().to_json())?;
        }
    }
    Ok(logger)
}

/// A LoRA rank above a layer's smaller dimension adds parameters without adding rank: an error
/// naming the first such layer.
fn check_rank_fits(model: &Gemma4Model) -> Result<()> {
    for p in model.projections() {
        let Some(a) = p.adapter() else { continue };
        let r = a.a.dims()[0];
        let limit = p.in_features().min(p.out_features());
        if r > limit {
            bail!(
                "lora_r = {r} is larger than {} ({} x {}): at most {limit} for this model",
                p.path(),
                p.out_features(),
                p.in_features()
            );
        }
    }
    Ok(())
}

/// `cosine, warmup 2, 40 steps, lr 0.001` for the resume line.
fn describe_schedule(s: &LrSchedule) -> String {
    let kind = s
        .kind
        .to_possible_value()
        .map_or_else(String::new, |v| v.get_name().to_string());
    format!(
        "{kind}, warmup {}, {} steps, lr {}",
        s.warmup, s.total, s.base_lr
    )
}

/// Where training stands (saved in the trainer state).
#[derive(Default)]
struct Position {
    step: u64,
    epoch: usize,
    step_in_epoch: usize,
    micro_step: u64,
    skipped_in_a_row: usize,
}

/// Data files inside the output folder (a data folder that holds it, such as `--data .`) would
/// make the run's own files (`metrics.jsonl`, `skipped_rows.*.jsonl`) training data: an error.
fn check_outside_output(files: &DataFiles, output: &Path) -> Result<()> {
    let Ok(output_dir) = output.canonicalize() else {
        return Ok(()); // not made yet: no file is in it
    };
    let inside = files
        .files
        .iter()
        .find(|f| f.canonicalize().is_ok_and(|f| f.starts_with(&output_dir)));
    match inside {
        Some(f) => bail!(
            "{}: {} is in the output folder {}, whose files would become training data; keep \
             --output outside the data folder, or name the data files with a glob",
            files.spec,
            f.display(),
            output.display()
        ),
        None => Ok(()),
    }
}

/// The post's `ChatJsonl` + `DistributedSampler` + `DataLoader(collate_fn=PadCollate)`.
/// Every rank opens (and tokenizes, or reuses the caches of) the files before any collective.
/// Pre-tokenized data needs no tokenizer: the pad id and vocabulary come from the model config.
/// Rank 0 prints the dataset report and a warning per skipped row. `model_dir` holds the
/// tokenizer and chat template.
fn open_loader(
    cfg: &TrainConfig,
    model_dir: &Path,
    model: &g4ft::gemma4::Config,
    files: &DataFiles,
    rank: usize,
    world_size: usize,
    train: bool,
) -> Result<DataLoader> {
    let prepare = PrepareOptions {
        max_len: cfg.max_len,
        label_mode: cfg.labels.into(),
        skip_bad_lines: cfg.skip_bad_lines,
        vocab_size: Some(model.vocab_size),
        format: cfg.data_format,
        max_line_bytes: cfg.max_line_bytes,
    };
    let encoder = match detect_files_format(files, &prepare)? {
        Format::Tokens => None,
        _ => {
            let encoder = Encoder::from_model_dir(model_dir)?;
            Some(match cfg.enable_thinking {
                Some(on) => encoder.with_enable_thinking(on),
                None => encoder,
            })
        }
    };
    let opts = DatasetOptions {
        prepare,
        cache_dir: Some(cfg.output.join(".token-cache")),
        pad_id: Some(model.pad_token_id),
        ..Default::default()
    };
    let dataset = Arc::new(TokenDataset::open_files(files, encoder.as_ref(), &opts)?);
    if rank == 0 {
        let split = if train { "train" } else { "eval" };
        let skipped_list = cfg.output.join(format!("skipped_rows.{split}.jsonl"));
        print_dataset_report(&dataset, &skipped_list)?;
    }

    let batching = if cfg.packing {
        Batching::Packed {
            pack_len: cfg.max_len,
        }
    } else if cfg.group_by_length {
        Batching::GroupByLength {
            mega_batch_mult: 50,
        }
    } else {
        Batching::Plain
    };
    let loader = DataLoader::new(
        dataset,
        LoaderConfig {
            batch_size: match train {
                true => cfg.micro_batch,
                false => cfg.eval_micro_batch.unwrap_or(cfg.micro_batch),
            },
            rank,
            world_size,
            shuffle: train && cfg.shuffle,
            seed: cfg.seed,
            drop_last: train,
            drop_last_batch: train,
            batching,
            ..Default::default()
        },
    )?;
    Ok(loader)
}

/// The dataset report, the warnings about skipped rows (every one written to `skipped_list` when
/// there are too many to print), and one when most rows were truncated.
fn print_dataset_report(ds: &TokenDataset, skipped_list: &Path) -> Result<()> {
    let report = ds.report();
    let source = ds.files().describe();
    println!(
        "dataset {source}{}",
        if ds.from_cache() {
            " (token cache)"
        } else {
            ""
        }
    );
    for line in report.lines() {
        println!("  {line}");
    }
    let files: Vec<_> = ds.file_reports().collect();
    let listed_in = (report.bad_lines.len() > SKIPPED_SHOWN).then_some(skipped_list);
    if let Some(path) = listed_in {
        write_skipped_rows(&files, path)?;
    }
    for line in skipped_row_warnings(&files, listed_in) {
        eprintln!("{line}");
    }
    if report.mostly_truncated() {
        eprintln!(
            "warning: {source}: {} of {} rows are longer than max_len {} and were truncated \
             (p50 {} tokens after truncation); raise --max-len or shorten the data",
            report.truncated_rows,
            report.rows,
            ds.max_len(),
            report.lengths.p50
        );
    }
    Ok(())
}

/// What every checkpoint of the run shares: the group, the settings, the model whose adapters
/// are saved and their LoRA config, the world size.
struct Checkpointer<'a> {
    group: &'a ProcessGroup,
    cfg: &'a TrainConfig,
    model: &'a Gemma4Model,
    lora_cfg: &'a LoraConfig,
    world_size: usize,
    /// The run's id (rank 0, which writes; empty on the other ranks).
    run_id: &'a str,
}

impl Checkpointer<'_> {
    /// Rank 0 writes `OUTPUT/name/` atomically (PEFT adapter + trainer state with the optimizer,
    /// the schedule and `pos`, the sampler at `epoch`), removes checkpoints beyond
    /// `--save-total-limit` and refreshes the plot, then every rank passes a barrier so nobody
    /// races ahead or exits while it writes.
    fn save(
        &self,
        name: &str,
        epoch: usize,
        opt: &AdamW,
        sched: &LrSchedule,
        pos: &Position,
        logger: Option<&MetricsLogger>,
    ) -> Result<()> {
        let Checkpointer {
            group,
            cfg,
            model,
            lora_cfg,
            world_size,
            run_id,
        } = *self;
        let state = TrainerState {
            format: STATE_FORMAT,
            run_id: run_id.to_string(),
            step: pos.step,
            epoch,
            sampler: SamplerPosition {
                epoch,
                micro_batches: (pos.step_in_epoch * cfg.accum) as u64,
            },
            scheduler: *sched,
            optimizer_step: opt.step_count(),
            skipped_in_a_row: pos.skipped_in_a_row,
            rng: RngState {
                seed: cfg.seed,
                micro_step: pos.micro_step,
            },
            world_size,
            config_fingerprint: config_fingerprint(cfg),
            config: cfg.clone(),
        };
        group.rank0_then_barrier(|| -> Result<()> {
            write_checkpoint_atomic(&cfg.output, name, pos.step, run_id, |dir| {
                lora::save_adapter(dir, lora_cfg, model.projections())?;
                state.save(dir, &opt.state_tensors())?;
                snapshot_metrics(&cfg.output.join(METRICS_FILE), dir, pos.step)?;
                Ok(())
            })?;
            if let Some(keep) = cfg.save_total_limit {
                let best = logger
                    .and_then(MetricsLogger::best_eval)
                    .map(|(step, _)| step);
                prune_checkpoints(&cfg.output, keep, best)?;
            }
            if let Some(logger) = logger {
                logger.write_plot()?;
            }
            Ok(())
        })?;
        Ok(())
    }
}

/// Evaluation on every rank over its DistributedSampler shard; rank 0 logs the all-reduced
/// loss and perplexity. A stop signal caught on any rank abandons it on all of them (nothing is
/// logged; rank 0 says so) and is returned, for the step boundary to act on.
fn run_eval(
    model: &Gemma4Model,
    loader: Option<&DataLoader>,
    group: &ProcessGroup,
    logger: Option<&mut MetricsLogger>,
    step: u64,
) -> Result<Option<i32>> {
    let Some(loader) = loader else {
        return Ok(None);
    };
    match step::evaluate(model, loader, group, step)? {
        Evaluation::Done { loss, tokens } => {
            if let Some(logger) = logger {
                logger.log_eval(step, loss, tokens)?;
            }
            Ok(None)
        }
        Evaluation::Stopped {
            signal,
            batches,
            of,
        } => {
            if group.rank() == 0 {
                println!(
                    "evaluation at step {step} stopped by {} after {batches} of {of} batches; \
                     not logged",
                    signals::name(signal)
                );
            }
            Ok(Some(signal))
        }
    }
}
