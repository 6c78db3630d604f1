//! End-to-end tests of `examples/train_ddp` on CPU with the tiny model: multi-rank equivalence,
//! exact resume, the recompute policies, crash-safe checkpoints, bad data, and parity with
//! PyTorch + PEFT
//! (`tools/reference/trainer/make_train_fixtures.py`).
//!
//! Ranks are spawned here with torchrun's environment (rank 0 hosts the store), so the tests need
//! no launcher. The fixture data is the 12 pre-tokenized sample rows the reference script wrote.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::*;

/// Largest |a − b| / max|b| per tensor, worst over the adapter; panics on differing keys.
fn max_rel_diff(a: &BTreeMap<String, Vec<f32>>, b: &BTreeMap<String, Vec<f32>>) -> (String, f64) {
    assert_eq!(
        a.keys().collect::<Vec<_>>(),
        b.keys().collect::<Vec<_>>(),
        "adapter keys differ"
    );
    let mut worst = (String::new(), 0.0);
    for (k, va) in a {
        let vb = &b[k];
        let scale = vb
            .iter()
            .fold(0f64, |m, x| m.max(x.abs() as f64))
            .max(1e-12);
        let d = va
            .iter()
            .zip(vb)
            .fold(0f64, |m, (x, y)| m.max((x - y).abs() as f64))
            / scale;
        if d > worst.1 {
            worst = (k.clone(), d);
        }
    }
    worst
}

/// Runs the fixture's initial adapter with token-weighted loss and `flags` on 2 ranks with
/// `--accum 2` and on 1 rank with `--accum 4` (micro-batch 1, `--no-shuffle`: the same 4 samples
/// per step); returns the 2-rank and the 1-rank output folders and rank 0's output of the
/// 2-rank run.
fn on_two_ranks_and_one(name: &str, flags: &[&str]) -> (PathBuf, PathBuf, String) {
    let (o2, o1) = (tmp(&format!("{name}2")), tmp(&format!("{name}1")));
    let init = fixture("init_adapter");
    let mut common = vec![
        "--init-adapter",
        &init,
        "--no-shuffle",
        "--token-weighted-loss",
        "--micro-batch",
        "1",
    ];
    common.extend(flags);
    let mut a2 = args_with(&o2, &common);
    a2.extend(["--accum", "2"].map(String::from));
    let mut a1 = args_with(&o1, &common);
    a1.extend(["--accum", "4"].map(String::from));
    let log2 = run_ok(2, &a2, &[]);
    run_ok(1, &a1, &[]);
    (o2, o1, log2)
}

#[test]
fn two_ranks_token_weighted_equal_one_rank_on_the_same_global_batches() {
    // 2 ranks × micro 1 × accum 2 and 1 rank × micro 1 × accum 4 see the same 4 samples per step
    // (no shuffle: rank r takes samples r, r+2, ...); token weighting makes the step's gradient
    // Σ token losses / global tokens in both.
    let (o2, o1, out2) = on_two_ranks_and_one("tw", &["--epochs", "1"]);
    assert!(
        out2.contains("adapter identical on all 2 ranks: checksum 0x"),
        "no cross-rank checksum line:\n{out2}"
    );
    let (l2, l1) = (losses(&o2), losses(&o1));
    assert_eq!(l2.len(), 3);
    for (step, (loss, norm)) in &l1 {
        let (loss2, norm2) = l2[step];
        assert!(
            (loss - loss2).abs() < 1e-5,
            "step {step}: loss {loss} vs {loss2}"
        );
        assert!(
            (norm - norm2).abs() < 1e-4 * norm.abs().max(1.0),
            "step {step}: norm {norm} vs {norm2}"
        );
    }
    let (key, d) = max_rel_diff(&adapter(&o2.join("epoch-0")), &adapter(&o1.join("epoch-0")));
    assert!(d < 1e-5, "{key}: max relative difference {d}");
}

#[test]
fn resumed_run_matches_an_uninterrupted_one_bit_for_bit() {
    // f32, CPU, dropout on, shuffling on, two epochs of 6 steps; resume the step-5 checkpoint of
    // the uninterrupted run into another folder and finish there.
    let common = [
        "--lora-dropout",
        "0.1",
        "--micro-batch",
        "1",
        "--accum",
        "2",
        "--epochs",
        "2",
        "--lora-r",
        "4",
    ];
    let (full, part) = (tmp("full"), tmp("part"));
    let mut first = common.to_vec();
    first.extend(["--save-every", "5"]);
    run_ok(1, &args_with(&full, &first), &[]);
    let mut resume = common.to_vec();
    let from = full.join("step-5").display().to_string();
    resume.extend(["--resume", &from]);
    let out = run_ok(1, &args_with(&part, &resume), &[]);
    assert!(out.contains("resumed from"), "{out}");

    // The resumed folder's metrics: the checkpoint's history (steps 1-5), then its own steps.
    let (lf, lp) = (losses(&full), losses(&part));
    assert_eq!(lf.len(), 12);
    assert_eq!(lf, lp, "per-step (loss, grad norm) after the resume differ");
    assert_eq!(
        adapter(&full.join("epoch-1")),
        adapter(&part.join("epoch-1")),
        "final adapters differ"
    );
}

#[test]
fn every_recompute_policy_trains_the_same_bits() {
    // f32, CPU, dropout on: keeping layers' activations instead of recomputing them, or parking
    // the recomputed layers' inputs (`--offload-checkpoints`), changes no loss, gradient norm or adapter
    // bit. `auto` with a budget between the predicted peaks of `all` and `none` keeps some of the
    // 4 layers. MFU both ways: with nothing recomputed the
    // hardware FLOPs are the model FLOPs; recomputing every layer runs more.
    let common = [
        "--lora-dropout",
        "0.1",
        "--micro-batch",
        "2",
        "--accum",
        "2",
        "--max-steps",
        "3",
        "--lora-r",
        "4",
        "--peak-tflops",
        "1",
    ];
    let policies: [&[&str]; 4] = [
        &["--recompute", "all"],
        &["--recompute", "none"],
        &["--recompute", "auto", "--memory-budget-gb", "0.0045"],
        &["--recompute", "all", "--offload-checkpoints"],
    ];
    let mut runs = Vec::new();
    for (k, policy) in policies.iter().enumerate() {
        let out = tmp(&format!("recompute{k}"));
        let stdout = run_ok(1, &args_with(&out, &[&common[..], policy].concat()), &[]);
        let plan = stdout
            .lines()
            .find(|l| l.starts_with("recompute "))
            .unwrap_or_else(|| panic!("no recompute plan line:\n{stdout}"))
            .to_string();
        assert!(stdout.contains("% hw"), "no MFU in the log line:\n{stdout}");
        runs.push((out, plan));
    }
    let kept = |plan: &str| -> usize {
        let (_, rest) = plan.split_once(": ").unwrap();
        rest.split(' ').next().unwrap().parse().unwrap()
    };
    assert_eq!(kept(&runs[0].1), 0, "{}", runs[0].1);
    assert_eq!(kept(&runs[1].1), 4, "{}", runs[1].1);
    assert!((1..4).contains(&kept(&runs[2].1)), "{}", runs[2].1);
    // On the CPU the parked inputs stay in the same memory: the plan is `all`'s.
    assert_eq!(runs[3].1, runs[0].1);
    let (all, _) = &runs[0];
    for (out, plan) in &runs[1..] {
        assert_eq!(losses(out), losses(all), "{plan}: losses and norms");
        assert_eq!(
            adapter(&out.join("epoch-0")),
            adapter(&all.join("epoch-0")),
            "{plan}: adapters differ"
        );
    }
    let mfu = |out: &Path, key: &str| -> Vec<f64> {
        metrics(out, "train")
            .iter()
            .map(|v| v[key].as_f64().unwrap())
            .collect()
    };
    assert_eq!(mfu(&runs[1].0, "mfu_hw"), mfu(&runs[1].0, "mfu_model"));
    for (hw, model) in mfu(all, "mfu_hw").iter().zip(mfu(all, "mfu_model")) {
        assert!(*hw > model * 1.2, "recompute all: hw {hw} vs model {model}");
    }
}

#[test]
fn resuming_an_earlier_checkpoint_makes_its_saves_the_newest() {
    // step-2, step-4 and step-5 of 6 steps per epoch; then back to step-2, saving every step
    // and keeping two: the new step-3 and step-4 are what stays, and step-4 is the latest.
    let out = tmp("rewind");
    let common = ["--micro-batch", "1", "--accum", "2", "--lora-r", "2"];
    let mut first = common.to_vec();
    first.extend(["--max-steps", "5", "--save-every", "2"]);
    run_ok(1, &args_with(&out, &first), &[]);
    assert_eq!(checkpoints(&out), ["step-2", "step-4", "step-5"]);
    let from = out.join("step-2").display().to_string();
    let mut again = common.to_vec();
    again.extend([
        "--max-steps",
        "4",
        "--save-every",
        "1",
        "--save-total-limit",
        "2",
    ]);
    again.extend(["--resume", &from]);
    let log = run_ok(1, &args_with(&out, &again), &[]);
    assert!(
        log.contains("also holds step-4, step-5, past step 2"),
        "{log}"
    );
    assert_eq!(checkpoints(&out), ["step-3", "step-4"]);
    let latest = g4ft::trainer::checkpoint::latest_complete_checkpoint(&out)
        .unwrap()
        .unwrap();
    assert_eq!(
        (latest.marker.name.as_str(), latest.marker.step),
        ("step-4", 4)
    );
}

#[test]
fn a_checkpoint_resumes_with_the_metrics_history_it_continues() {
    // Five steps, a checkpoint after each; a branch from step-2 with another learning rate
    // rewrites steps 3 and 4; resuming step-5 then brings back its own steps 3-5.
    let out = tmp("branches");
    let mut first = SMALL_STEP.to_vec();
    first.extend(["--max-steps", "5", "--save-every", "1"]);
    run_ok(1, &args_with(&out, &first), &[]);
    let original = losses(&out);
    let mut branch = SMALL_STEP.to_vec();
    let step2 = out.join("step-2").display().to_string();
    branch.extend(["--max-steps", "4", "--resume", &step2]);
    let mut branch = args_with(&out, &branch);
    let lr = branch.iter().position(|a| a == "--lr").unwrap();
    branch[lr + 1] = "0.05".into();
    run_ok(1, &branch, &[]);
    let branched = losses(&out);
    assert_eq!(branched.keys().copied().collect::<Vec<_>>(), [1, 2, 3, 4]);
    assert_ne!(branched[&4], original[&4], "the branch trains otherwise");
    let mut back = SMALL_STEP.to_vec();
    let step5 = out.join("step-5").display().to_string();
    back.extend(["--max-steps", "6", "--resume", &step5]);
    run_ok(1, &args_with(&out, &back), &[]);
    let after = losses(&out);
    assert_eq!(
        after.keys().copied().collect::<Vec<_>>(),
        (1..=6).collect::<Vec<_>>()
    );
    for step in 1..=5 {
        assert_eq!(after[&step], original[&step], "step {step}");
    }
}

#[test]
fn max_steps_sets_the_schedule_length_and_cycles_the_data() {
    // 6 steps per epoch; 8 steps run into the second epoch. Linear decay over exactly 8 steps
    // after ceil(0.25 * 8) = 2 warmup steps, as transformers' get_linear_schedule_with_warmup.
    let out = tmp("maxsteps");
    let extra = [
        "--micro-batch",
        "1",
        "--accum",
        "2",
        "--epochs",
        "1",
        "--max-steps",
        "8",
        "--lr-scheduler",
        "linear",
        "--warmup-ratio",
        "0.25",
        "--lora-r",
        "2",
    ];
    let mut args = args_with(&out, &extra);
    let i = args.iter().position(|a| a == "--warmup").unwrap();
    args.drain(i..i + 2);
    run_ok(1, &args, &[]);
    let text = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    let train: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["kind"] == "train")
        .collect();
    assert_eq!(train.len(), 8);
    for (k, v) in train.iter().enumerate() {
        let k = k as f64;
        let want = if k < 2.0 { k / 2.0 } else { (8.0 - k) / 6.0 } * 1e-3;
        let got = v["lr"].as_f64().unwrap();
        assert!(
            (got - want).abs() < 1e-15,
            "step {}: lr {got}, want {want}",
            k + 1.0
        );
        assert_eq!(v["total_steps"], 8);
    }
    assert_eq!(
        train[7]["epoch"], 1,
        "step 8 is in the second pass over the data"
    );
}

#[test]
fn interrupted_checkpoint_write_leaves_the_previous_one_as_latest() {
    use g4ft::trainer::checkpoint::latest_complete_checkpoint;
    let common = [&SMALL_STEP[..], &["--epochs", "1", "--save-every", "2"]].concat();
    let out = tmp("crash");
    let mut first = common.to_vec();
    first.extend(["--max-steps", "4"]);
    run_ok(1, &args_with(&out, &first), &[]);
    // What a crash while writing step-6 leaves: rank 0's temporary directory with part of the
    // files, and (for a non-atomic writer) a step-6 directory without completion marker.
    let partial = out.join(".tmp-step-6-999999");
    std::fs::create_dir_all(&partial).unwrap();
    std::fs::copy(
        out.join("step-4/adapter_config.json"),
        partial.join("adapter_config.json"),
    )
    .unwrap();
    std::fs::create_dir_all(out.join("step-6")).unwrap();
    std::fs::copy(
        out.join("step-4/adapter_model.safetensors"),
        out.join("step-6/adapter_model.safetensors"),
    )
    .unwrap();
    // And a checkpoint damaged after it was written: step-2's adapter truncated.
    let damaged = out.join("step-2/adapter_model.safetensors");
    let len = std::fs::metadata(&damaged).unwrap().len();
    std::fs::File::options()
        .write(true)
        .open(&damaged)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let latest = latest_complete_checkpoint(&out)
        .unwrap()
        .expect("a complete checkpoint");
    assert_eq!(latest.dir.file_name().unwrap(), "step-4");

    // An elastic restart picks it up by itself, removes the temporary and names the damaged
    // checkpoint it passed over (the flag lifts the first run's step limit, which it would
    // otherwise take from the checkpoint).
    let mut restart = common.to_vec();
    restart.extend(["--max-steps", "6"]);
    let outs = run(
        1,
        &args_with(&out, &restart),
        &[("TORCHELASTIC_RESTART_COUNT", "1")],
    );
    let log = String::from_utf8_lossy(&outs[0].stdout);
    let err = String::from_utf8_lossy(&outs[0].stderr);
    assert!(outs[0].status.success(), "{err}\n{log}");
    assert!(
        err.contains(&format!(
            "warning: passed over a damaged checkpoint: checkpoint {}: size {} bytes, expected \
             {len} from the marker",
            damaged.display(),
            len / 2
        )),
        "{err}"
    );
    assert!(
        log.contains(&format!(
            "resumed from {} at step 4",
            out.join("step-4").display()
        )),
        "{log}"
    );
    assert!(!partial.exists(), "stale temporary removed");
    assert!(out
        .join("epoch-0")
        .join("checkpoint_complete.json")
        .is_file());
    assert_eq!(
        losses(&out).keys().copied().collect::<Vec<_>>(),
        (1..=6).collect::<Vec<_>>()
    );
}

#[test]
fn a_signal_to_one_rank_stops_every_rank_at_one_step_with_a_checkpoint() {
    // Two ranks on a run far longer than the test; SIGINT to rank 0 alone, as a Ctrl-C under a
    // launcher reaches one process group; rank 1 learns of it from the step's all-reduce.
    let common = [&SMALL_STEP[..], &["--save-total-limit", "2"]].concat();
    let out = tmp("signal");
    let mut first = common.to_vec();
    first.extend(["--max-steps", "100000"]);
    let mut ranks = spawn_ranks(2, &args_with(&out, &first), &[]);
    let mut lines = Lines::of(&mut ranks[0]);
    lines.wait_for(|l| step_of(l).is_some_and(|n| n >= 3), &mut ranks);
    interrupt(&ranks[0]);
    let outs = wait_all(ranks);
    let log = lines.finish().join("\n");
    assert_all_exited(&outs, 130, &log);
    let err0 = String::from_utf8_lossy(&outs[0].stderr);
    assert!(
        err0.contains("SIGINT: stopping after the step in progress"),
        "{err0}"
    );
    // "stopped by SIGINT after step N of 100000: saved OUT/NAME; ..."
    let (report, step) = line_with_number(&log, "stopped by SIGINT after step ");
    assert!(step >= 3, "{report}");
    let saved = checkpoints(&out).last().cloned().expect("a checkpoint");
    assert!(
        report.contains(&format!("saved {}", out.join(&saved).display()))
            && report.contains("--resume latest"),
        "{report}"
    );
    assert_eq!(
        losses(&out).keys().copied().collect::<Vec<_>>(),
        (1..=step).collect::<Vec<_>>()
    );

    // The same command with --resume latest goes on from that step.
    let mut resume = common.to_vec();
    let end = (step + 2).to_string();
    resume.extend(["--max-steps", &end, "--resume", "latest"]);
    let log = run_ok(2, &args_with(&out, &resume), &[]);
    assert!(
        log.contains(&format!(
            "resumed from {} at step {step}",
            out.join(&saved).display()
        )),
        "{log}"
    );
    assert_eq!(
        losses(&out).keys().copied().collect::<Vec<_>>(),
        (1..=step + 2).collect::<Vec<_>>()
    );
}

#[test]
fn a_stop_is_reported_on_every_node() {
    // Two nodes of one rank each (both local rank 0); SIGINT to rank 1 alone, as a Ctrl-C on
    // node 1's terminal. Rank 0 saves and reports as ever; rank 1 says the same on its own
    // terminal, naming rank 0's node as the checkpoint's.
    let out = tmp("signal-nodes");
    let mut flags = SMALL_STEP.to_vec();
    flags.extend(["--max-steps", "100000"]);
    let nodes = [("LOCAL_RANK", "0"), ("LOCAL_WORLD_SIZE", "1")];
    let mut ranks = spawn_ranks(2, &args_with(&out, &flags), &nodes);
    let mut lines = Lines::of(&mut ranks[0]);
    lines.wait_for(|l| step_of(l).is_some_and(|n| n >= 2), &mut ranks);
    interrupt(&ranks[1]);
    let outs = wait_all(ranks);
    let log = lines.finish().join("\n");
    assert_all_exited(&outs, 130, &log);
    // "stopped by SIGINT after step N of 100000: saved OUT/NAME; to continue, ..."
    let (report, _) = line_with_number(&log, "stopped by SIGINT after step ");
    let tail = "; to continue, run the same command with --resume latest";
    assert!(
        report.contains(": saved ") && report.ends_with(tail),
        "{report}"
    );
    let (out1, err1) = (
        String::from_utf8_lossy(&outs[1].stdout),
        String::from_utf8_lossy(&outs[1].stderr),
    );
    assert!(
        err1.contains("[rank 1] SIGINT: stopping after the step in progress"),
        "{err1}"
    );
    let elsewhere = report.replace(tail, &format!(" on rank 0's node{tail}"));
    assert_eq!(
        out1.lines().last(),
        Some(elsewhere.as_str()),
        "{out1}\n{err1}"
    );
}

/// Two ranks saving every 2 steps of a long run; `victim` is killed once step 3 is logged. The
/// other rank must fail, naming the run's last complete checkpoint and `--resume latest`.
fn the_survivor_names_the_last_checkpoint(name: &str, victim: usize) {
    let mut flags = [&SMALL_STEP[..], &["--save-every", "2"]].concat();
    flags.extend(["--max-steps", "100000"]);
    let out = tmp(name);
    let mut ranks = spawn_ranks(2, &args_with(&out, &flags), &[]);
    let mut lines = Lines::of(&mut ranks[0]);
    lines.wait_for(|l| step_of(l).is_some_and(|n| n >= 3), &mut ranks);
    ranks[victim].kill().unwrap();
    let outs = wait_all(ranks);
    let _ = lines.finish();
    let survivor = &outs[1 - victim];
    let err = String::from_utf8_lossy(&survivor.stderr);
    assert!(!survivor.status.success(), "{err}");
    let last = checkpoints(&out).last().cloned().expect("a checkpoint");
    assert!(
        err.contains(&format!(
            "hint: this run's last complete checkpoint is {} (step ",
            out.join(&last).display()
        )) && err.contains("--resume latest continues from it"),
        "{err}"
    );
}

#[test]
fn a_run_that_loses_a_rank_names_its_last_checkpoint_and_how_to_go_on() {
    the_survivor_names_the_last_checkpoint("lost-rank", 1);
}

#[test]
fn a_run_that_loses_rank_0_names_its_last_checkpoint_on_rank_1() {
    the_survivor_names_the_last_checkpoint("lost-rank-0", 0);
}

#[test]
fn evaluation_runs_at_its_interval_and_the_end_with_one_loss_on_one_and_two_ranks() {
    // The setting of the two-ranks test above, with the fixture rows as the eval set too: every
    // rank evaluates its half of them, the all-reduced mean is the one rank's over all of them.
    let eval = fixture("data.jsonl");
    let flags = [
        "--max-steps",
        "3",
        "--eval-data",
        &eval,
        "--eval-every",
        "2",
    ];
    let (o2, o1, log2) = on_two_ranks_and_one("eval", &flags);
    let evals = |out: &Path| -> Vec<(u64, f64, u64)> {
        metrics(out, "eval")
            .iter()
            .map(|v| {
                let f = |k: &str| v[k].as_f64().unwrap();
                (v["step"].as_u64().unwrap(), f("loss"), f("tokens") as u64)
            })
            .collect()
    };
    let (e2, e1) = (evals(&o2), evals(&o1));
    // At step 2 (the interval) and step 3 (the end), over every target token of the 12 rows.
    assert_eq!(e2.iter().map(|e| e.0).collect::<Vec<_>>(), [2, 3], "{log2}");
    let targets = metrics(&o2, "dataset")
        .iter()
        .find(|d| d["split"] == "eval")
        .and_then(|d| d["trainable_tokens"].as_u64())
        .expect("the eval set's dataset record");
    for ((s2, l2, t2), (s1, l1, t1)) in e2.iter().zip(&e1) {
        assert_eq!((s2, t2), (s1, t1));
        assert_eq!(*t2, targets, "step {s2}");
        assert!((l2 - l1).abs() < 1e-5, "step {s2}: {l2} vs {l1}");
    }
    assert!(
        log2.contains(&format!("eval @ step 2 | loss {:.4}", e2[0].1)),
        "{log2}"
    );
}

#[test]
fn the_checkpoint_of_the_best_evaluation_outlives_the_save_limit() {
    // A checkpoint and an evaluation after every step, one checkpoint kept: at the end, the
    // newest and the one of the lowest eval loss remain, and the run names the latter.
    let out = tmp("best-eval");
    let eval = Path::new(ROOT).join("assets/sample/tokens.jsonl");
    let eval = eval.display().to_string();
    let flags = [
        "--max-steps",
        "6",
        "--accum",
        "2",
        "--eval-data",
        &eval,
        "--eval-every",
        "1",
        "--save-every",
        "1",
        "--save-total-limit",
        "1",
    ];
    // A learning rate at which the eval loss does not fall at every step.
    let mut args = args_with(&out, &flags);
    let lr = args.iter().position(|a| a == "--lr").unwrap();
    args[lr + 1] = "5e-2".into();
    let log = run_ok(1, &args, &[]);
    let evals: Vec<(u64, f64)> = metrics(&out, "eval")
        .iter()
        .map(|v| (v["step"].as_u64().unwrap(), v["loss"].as_f64().unwrap()))
        .collect();
    assert_eq!(evals.len(), 6, "{log}");
    let best = evals
        .iter()
        .copied()
        .reduce(|b, e| if e.1 < b.1 { e } else { b })
        .unwrap();
    let kept = checkpoints(&out);
    let newest = kept.last().cloned().unwrap();
    let at_best = g4ft::trainer::checkpoint::complete_checkpoints(&out)
        .unwrap()
        .into_iter()
        .rfind(|c| c.marker.step == best.0)
        .map(|c| c.marker.name)
        .unwrap_or_else(|| panic!("no checkpoint of step {} in {kept:?}\n{log}", best.0));
    let mut want = vec![at_best.clone(), newest];
    want.dedup();
    assert_eq!(kept, want, "{log}");
    assert!(
        log.contains(&format!(
            "best evaluation: loss {:.4} at step {}, in {}",
            best.1,
            best.0,
            out.join(&at_best).display()
        )),
        "{log}"
    );
}

#[test]
fn a_larger_evaluation_batch_gives_the_same_loss() {
    // transformers' per_device_eval_batch_size: 4 rows a batch (padded) against 1 a batch.
    let eval = fixture("data.jsonl");
    let run = |name: &str, extra: &[&str]| {
        let out = tmp(name);
        let mut flags = vec!["--max-steps", "1", "--accum", "2", "--eval-data", &eval];
        flags.extend(extra);
        let log = run_ok(1, &args_with(&out, &flags), &[]);
        let e = metrics(&out, "eval");
        assert_eq!(e.len(), 1, "{log}");
        (
            e[0]["loss"].as_f64().unwrap(),
            e[0]["tokens"].as_u64().unwrap(),
        )
    };
    let (one, four) = (
        run("eval-mb1", &[]),
        run("eval-mb4", &["--per-device-eval-batch-size", "4"]),
    );
    assert_eq!(one.1, four.1);
    assert!((one.0 - four.0).abs() < 1e-5, "{one:?} vs {four:?}");
}

/// Two ranks evaluating a set that takes seconds on the tiny model (the 12 fixture rows 600
/// times: 3,600 batches a rank) after step 1, with `flags`; SIGINT to rank 0 once step 1 is
/// logged, when its evaluation starts. Checks that every rank exits 130 after abandoning the
/// evaluation, that nothing was logged for it and that step-1 was saved; returns rank 0's
/// output and the output folder.
fn interrupt_the_evaluation_after_step_1(name: &str, flags: &[&str]) -> (String, PathBuf) {
    let dir = tmp(name);
    std::fs::create_dir_all(&dir).unwrap();
    let rows = std::fs::read_to_string(fixture("data.jsonl")).unwrap();
    let eval = dir.join("eval.jsonl");
    std::fs::write(&eval, rows.repeat(600)).unwrap();
    let out = dir.join("out");
    let eval_path = eval.display().to_string();
    let mut extra = SMALL_STEP.to_vec();
    extra.extend(["--eval-data", &eval_path]);
    extra.extend(flags);
    let mut ranks = spawn_ranks(2, &args_with(&out, &extra), &[]);
    let mut lines = Lines::of(&mut ranks[0]);
    lines.wait_for(|l| step_of(l) == Some(1), &mut ranks);
    interrupt(&ranks[0]);
    let outs = wait_all(ranks);
    let log = lines.finish().join("\n");
    assert_all_exited(&outs, 130, &log);
    // "evaluation at step 1 stopped by SIGINT after B of 3600 batches; not logged"
    let (abandoned, batches) =
        line_with_number(&log, "evaluation at step 1 stopped by SIGINT after ");
    assert!(
        batches < 3600 && abandoned.contains("of 3600 batches"),
        "{abandoned}"
    );
    assert!(metrics(&out, "eval").is_empty(), "{log}");
    assert_eq!(checkpoints(&out), ["step-1"]);
    assert_eq!(losses(&out).keys().copied().collect::<Vec<_>>(), [1]);
    (log, out)
}

#[test]
fn a_signal_during_an_evaluation_abandons_it_on_every_rank_and_saves_the_step() {
    let (log, out) = interrupt_the_evaluation_after_step_1(
        "eval-signal",
        &["--max-steps", "100", "--eval-every", "1"],
    );
    assert!(
        log.contains(&format!(
            "stopped by SIGINT after step 1 of 100: saved {}; to continue, run the same command \
             with --resume latest",
            out.join("step-1").display()
        )),
        "{log}"
    );
}

#[test]
fn a_signal_during_the_final_evaluation_ends_a_complete_run() {
    let (log, out) =
        interrupt_the_evaluation_after_step_1("final-eval-signal", &["--max-steps", "1"]);
    assert!(
        log.contains(&format!(
            "stopped by SIGINT after step 1 of 1: training is complete, its adapter is saved \
             in {}",
            out.join("step-1").display()
        )),
        "{log}"
    );
}

#[test]
fn ranks_started_with_other_settings_stop_before_training() {
    // Rank 1 as a second node's launcher started with another --micro-batch would run it.
    let out = tmp("other-settings");
    let args = args_with(&out, &SMALL_STEP);
    let ranks = spawn_ranks_with(
        2,
        |rank| {
            let mut mine = args.clone();
            if rank == 1 {
                let i = mine.iter().position(|a| a == "--micro-batch").unwrap();
                mine[i + 1] = "2".into();
            }
            mine
        },
        &[],
    );
    for (r, o) in wait_all(ranks).iter().enumerate() {
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "rank {r}: {err}");
        assert!(
            err.contains("started with different settings (micro_batch: 1 on rank 0, 2 on rank 1)"),
            "rank {r}: {err}"
        );
    }
    assert!(!out.exists(), "nothing was written");
}

#[test]
fn invalid_json_line_is_a_clean_error_on_every_rank() {
    let dir = tmp("bad");
    std::fs::create_dir_all(&dir).unwrap();
    let good = std::fs::read_to_string(Path::new(ROOT).join("assets/sample/chat.jsonl")).unwrap();
    let mut lines: Vec<&str> = good.lines().take(8).collect();
    lines[2] = "{\"messages\": [{\"role\": \"user\", \"content\": \"unterminated}";
    let data = dir.join("bad.jsonl");
    std::fs::write(&data, lines.join("\n")).unwrap();
    let mut args = base_args(&dir.join("out"));
    let i = args.iter().position(|a| a == "--data").unwrap();
    args[i + 1] = data.display().to_string();
    let outs = run(2, &args, &[]);
    for (r, o) in outs.iter().enumerate() {
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "rank {r} should fail");
        assert!(
            err.contains(&format!("{}:3:", data.display())),
            "rank {r}: {err}"
        );
        assert!(!err.contains("Broken pipe"), "rank {r}: {err}");
    }
}

#[test]
fn matches_pytorch_peft_on_three_steps() {
    // tools/reference/trainer/make_train_fixtures.py: same init adapter, one rank, no shuffle,
    // dropout 0 (from the adapter config), micro-batch 2, accum 2, K = 3 steps.
    let out = tmp("parity");
    let extra = [
        "--init-adapter",
        &fixture("init_adapter"),
        "--no-shuffle",
        "--micro-batch",
        "2",
        "--accum",
        "2",
        "--epochs",
        "1",
    ];
    run_ok(1, &args_with(&out, &extra), &[]);
    let want: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("steps.json")).unwrap()).unwrap();
    let got = losses(&out);
    let steps = want["steps"].as_array().unwrap();
    assert_eq!(got.len(), steps.len());
    for s in steps {
        let step = s["step"].as_u64().unwrap();
        let (loss, norm) = got[&step];
        let (wl, wn) = (
            s["loss"].as_f64().unwrap(),
            s["grad_norm"].as_f64().unwrap(),
        );
        assert!(
            (loss - wl).abs() < 1e-4 * wl.abs(),
            "step {step}: loss {loss} vs torch {wl}"
        );
        assert!(
            (norm - wn).abs() < 1e-3 * wn.abs(),
            "step {step}: grad norm {norm} vs torch {wn}"
        );
    }
    let (key, d) = max_rel_diff(
        &adapter(&out.join("epoch-0")),
        &adapter(Path::new(&fixture("final_adapter"))),
    );
    assert!(
        d < 1e-4,
        "{key}: max relative difference {d} to PEFT's final adapter"
    );
}

#[test]
fn pre_tokenized_data_needs_no_tokenizer_and_trains_packed() {
    // A model directory with only config.json and the weights: enough for token rows.
    let dir = tmp("tokens-only");
    let model = dir.join("model");
    std::fs::create_dir_all(&model).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(Path::new(ROOT).join("assets/tiny").join(f), model.join(f)).unwrap();
    }
    let mut args = args_with(
        &dir.join("out"),
        &["--packing", "--max-steps", "2", "--accum", "1"],
    );
    let i = args.iter().position(|a| a == "--model").unwrap();
    args[i + 1] = model.display().to_string();
    let stdout = run_ok(1, &args, &[]);
    assert!(stdout.contains("rows kept          12"), "{stdout}");
    let text = std::fs::read_to_string(dir.join("out/metrics.jsonl")).unwrap();
    let dataset: serde_json::Value = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|v| v["kind"] == "dataset")
        .expect("a dataset record");
    assert_eq!(
        (dataset["split"].as_str(), dataset["rows"].as_u64()),
        (Some("train"), Some(12))
    );
    assert_eq!(dataset["format"], "tokens");
    assert_eq!(losses(&dir.join("out")).len(), 2);
    // these rows carry no labels: assistant_only cannot know what to train (a fresh output folder,
    // since the first run owns `out`)
    let i = args.iter().position(|a| a == "--output").unwrap();
    args[i + 1] = dir.join("out-assistant-only").display().to_string();
    args.extend(["--labels".to_string(), "assistant_only".to_string()]);
    let out = &run(1, &args, &[])[0];
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("data.jsonl:1: labels: missing; --labels assistant_only needs"),
        "{err}"
    );
}

#[test]
fn a_folder_of_shards_trains_its_train_split_as_the_one_file_would() {
    // The fixture's 12 rows cut into two train shards, the whole file as the validation split:
    // the folder trains and evaluates exactly as the files themselves.
    let dir = tmp("shards");
    let data = dir.join("ds/data");
    std::fs::create_dir_all(&data).unwrap();
    let rows = std::fs::read_to_string(fixture("data.jsonl")).unwrap();
    let lines: Vec<&str> = rows.lines().collect();
    for (i, part) in lines.chunks(6).enumerate() {
        let name = format!("train-{i:05}-of-00002.jsonl");
        std::fs::write(data.join(name), part.join("\n") + "\n").unwrap();
    }
    std::fs::write(data.join("validation-00000-of-00001.jsonl"), &rows).unwrap();
    let folder = dir.join("ds").display().to_string();
    // The base flags with --data replaced.
    let args_for = |out: &Path, data: &str| {
        let mut args = args_with(out, &["--max-steps", "2", "--eval-every", "2"]);
        let i = args.iter().position(|a| a == "--data").unwrap();
        args[i + 1] = data.to_string();
        args.extend(["--eval-data".to_string(), data.to_string()]);
        args
    };
    let run_with = |out: &str, data: &str| {
        let out = dir.join(out);
        (run_ok(1, &args_for(&out, data), &[]), out)
    };
    let (log, from_folder) = run_with("folder", &folder);
    let (_, from_file) = run_with("file", &fixture("data.jsonl"));
    assert_eq!(losses(&from_folder), losses(&from_file));
    let eval_loss = |out: &Path| metrics(out, "eval")[0]["loss"].as_f64();
    assert_eq!(eval_loss(&from_folder), eval_loss(&from_file));
    assert!(
        log.contains(&format!("dataset {folder} (split train, 2 files)")),
        "{log}"
    );
    let records = metrics(&from_folder, "dataset");
    let (train, eval) = (&records[0], &records[1]);
    assert_eq!(
        (&train["data_split"], &eval["data_split"]),
        (&"train".into(), &"validation".into())
    );
    assert_eq!(train["files"].as_array().map(Vec::len), Some(2));
    assert_eq!(train["rows"].as_u64(), Some(12));
    // A split the folder does not have names the ones it has.
    let mut args = args_for(&dir.join("no-split"), &folder);
    args.extend(["--data-split".to_string(), "test".to_string()]);
    let err = run_err(&args);
    assert!(
        err.contains("no split `test` here: the files make the splits train, validation"),
        "{err}"
    );
    // An output folder inside a data folder all of whose files are data would feed the run's
    // own files back as data.
    let plain = dir.join("plain");
    std::fs::create_dir_all(&plain).unwrap();
    std::fs::write(plain.join("rows.jsonl"), &rows).unwrap();
    let err = run_err(&args_for(&plain.join("out"), &plain.display().to_string()));
    assert!(err.contains("is in the output folder"), "{err}");
}

#[test]
fn too_little_data_for_one_step_is_an_error_before_the_weights_load() {
    let out = tmp("little");
    let outs = run(
        1,
        &args_with(&out, &["--micro-batch", "5", "--accum", "3"]),
        &[],
    );
    let (stdout, stderr) = (
        String::from_utf8_lossy(&outs[0].stdout),
        String::from_utf8_lossy(&outs[0].stderr),
    );
    assert!(!outs[0].status.success());
    assert!(
        stderr.contains(
            "data.jsonl: 12 rows make 2 batch(es) of --micro-batch 5 on each of 1 rank(s), \
             fewer than --accum 3: one optimizer step takes 15 rows"
        ),
        "{stderr}"
    );
    assert!(
        stdout.contains("dataset ") && !stdout.contains("trainable params"),
        "{stdout}"
    );
}

#[test]
fn settings_the_run_cannot_use_as_asked_are_warnings() {
    for (extra, says) in [
        (
            ["--lr-scheduler", "constant", "--warmup", "3"],
            "warning: --lr-scheduler constant has no warmup",
        ),
        (
            ["--lr-scheduler", "linear", "--warmup", "1"],
            "warning: a warmup of 1 steps in a run of 1: the learning rate never reaches --lr",
        ),
    ] {
        let out = tmp("unused");
        let mut args = args_with(
            &out,
            &["--max-steps", "1", "--accum", "1", "--offload-checkpoints"],
        );
        let i = args.iter().position(|a| a == "--warmup").unwrap();
        args.drain(i..i + 2);
        args.extend(extra.map(String::from));
        let outs = run(1, &args, &[]);
        let stderr = String::from_utf8_lossy(&outs[0].stderr);
        assert!(outs[0].status.success(), "{stderr}");
        assert!(stderr.contains(says), "{stderr}");
        assert!(
            stderr.contains("--offload-checkpoints parks a GPU's activations"),
            "{stderr}"
        );
    }
}

#[test]
fn skipped_rows_get_a_warning_each_and_truncation_is_reported() {
    let dir = tmp("skip");
    std::fs::create_dir_all(&dir).unwrap();
    let good = std::fs::read_to_string(Path::new(ROOT).join("assets/sample/chat.jsonl")).unwrap();
    let mut lines: Vec<&str> = good.lines().take(12).collect();
    lines[2] = "{\"messages\": [";
    lines[5] = r#"{"messages": [{"role": "robot", "content": "x"}]}"#;
    let data = dir.join("skip.jsonl");
    std::fs::write(&data, lines.join("\n")).unwrap();
    let mut args = args_with(
        &dir.join("out"),
        &["--skip-bad-lines", "--max-steps", "1", "--accum", "1"],
    );
    let i = args.iter().position(|a| a == "--data").unwrap();
    args[i + 1] = data.display().to_string();
    let i = args.iter().position(|a| a == "--max-len").unwrap();
    args[i + 1] = "20".into();
    let outs = run(1, &args, &[]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&outs[0].stdout),
        String::from_utf8_lossy(&outs[0].stderr),
    );
    assert!(outs[0].status.success(), "{stderr}");
    let path = data.display().to_string();
    assert!(
        stderr.contains(&format!(
            "warning: {path}:3: skipped (invalid_json): invalid JSON"
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "warning: {path}:6: skipped (bad_field): messages[0].role"
        )),
        "{stderr}"
    );
    assert!(
        stdout.contains("rows skipped       2 (invalid_json 1, bad_field 1)"),
        "{stdout}"
    );
    assert!(
        stderr.contains("were truncated"),
        "most rows exceed 20 tokens: {stderr}"
    );
}

#[test]
fn adapter_settings_that_cannot_train_are_errors() {
    let out = tmp("badlora");
    let err = run_err(&args_with(&out, &["--lora-r", "40"]));
    assert!(
        err.contains("lora_r = 40 is larger than")
            && err.contains("k_proj")
            && err.contains("at most 32"),
        "{err}"
    );
    let err = run_err(&args_with(&out, &["--lora-alpha", "0"]));
    assert!(
        err.contains("`lora_alpha` = 0") && err.contains("nothing would train"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "one error line: {err}");
}

#[test]
fn a_malformed_launcher_variable_is_one_error_line_naming_it() {
    let out = tmp("badenv");
    let env = [("WORLD_SIZE", "1"), ("RANK", "0"), ("LOCAL_RANK", "first")];
    let outs = run(1, &base_args(&out), &env);
    assert!(!outs[0].status.success(), "LOCAL_RANK=first must fail");
    let err = String::from_utf8_lossy(&outs[0].stderr);
    assert!(err.contains("LOCAL_RANK") && err.contains("first"), "{err}");
    assert_eq!(err.lines().count(), 1, "one error line: {err}");
}

/// A checkpoint's weights get the permissions of the JSON files beside them (those of a file the
/// process creates), so the other users of a machine can read what they can read of the rest.
#[cfg(unix)]
#[test]
fn checkpoint_weights_are_as_readable_as_their_json() {
    use std::os::unix::fs::PermissionsExt;
    let out = tmp("modes");
    run_ok(1, &args_with(&out, &["--max-steps", "2"]), &[]);
    let last = checkpoints(&out).pop().expect("a checkpoint");
    let mode = |f: &str| {
        let meta = std::fs::metadata(out.join(&last).join(f)).unwrap();
        meta.permissions().mode() & 0o777
    };
    assert_eq!(
        mode("adapter_model.safetensors"),
        mode("adapter_config.json")
    );
    assert_eq!(mode("optimizer.safetensors"), mode("trainer_state.json"));
}
