//! What a new user runs into in the first hour, end to end on the tiny model: resume and
//! `--init-adapter` that do what they say, output folders that other runs cannot clobber, and a
//! run that can be watched (ETA lines, the loss plot over resumed history, TensorBoard).

mod common;

use std::path::Path;

use common::*;

/// A 1-rank run of `steps` optimizer steps on the fixture data (6 steps per epoch), LoRA r 4,
/// saving every 2 steps.
fn short(out: &Path, steps: &str, extra: &[&str]) -> Vec<String> {
    let mut a = args_with(out, &SMALL_STEP);
    let more = [
        "--lora-alpha",
        "8",
        "--save-every",
        "2",
        "--max-steps",
        steps,
    ];
    a.extend(more.iter().chain(extra).map(|s| s.to_string()));
    a
}

#[test]
fn the_same_command_twice_refuses_then_resume_latest_continues() {
    let out = tmp("twice");
    let first = short(&out, "4", &[]);
    run_ok(1, &first, &[]);
    assert_eq!(checkpoints(&out), ["step-2", "step-4"]);
    let err = run_err(&first);
    assert!(
        err.contains("holds run run-")
            && err.contains("checkpoints step-2, step-4")
            && err.contains("--resume latest")
            && err.contains("--overwrite-output"),
        "{err}"
    );
    assert_eq!(
        metrics(&out, "train").len(),
        4,
        "the refused run wrote nothing"
    );

    // --resume latest alone: the settings come from the checkpoint, and it is finished.
    let log = run_ok(1, &short(&out, "4", &["--resume", "latest"]), &[]);
    assert!(
        log.contains("nothing to train: the checkpoint is at step 4 of 4"),
        "{log}"
    );
    // ... raising --max-steps trains on from step 4, reported on the resume line.
    let log = run_ok(1, &short(&out, "6", &["--resume", "latest"]), &[]);
    assert!(
        log.contains(&format!(
            "resumed from {} at step 4",
            out.join("step-4").display()
        )) && log.contains("this run changes max_steps 4 → 6 (flag)")
            && log.contains(
                "schedule cosine, warmup 1, 4 steps, lr 0.001 → cosine, warmup 1, 6 steps"
            ),
        "{log}"
    );
    let steps: Vec<u64> = metrics(&out, "train")
        .iter()
        .map(|v| v["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps, [1, 2, 3, 4, 5, 6], "one line per step");

    // --overwrite-output replaces the run: only the new run's checkpoints remain.
    let log = run_ok(1, &short(&out, "2", &["--overwrite-output"]), &[]);
    assert!(log.contains("run run-"), "{log}");
    assert_eq!(checkpoints(&out), ["step-2"]);
    assert_eq!(metrics(&out, "train").len(), 2);
}

#[test]
fn resume_takes_the_adapter_from_the_checkpoint_and_refuses_contradictions() {
    let out = tmp("shape");
    run_ok(1, &short(&out, "2", &[]), &[]);
    let from = out.join("step-2").display().to_string();
    for (flag, value, says) in [
        (
            "--lora-alpha",
            "64",
            "`lora_alpha` = 64 (set by flag) contradicts the checkpoint",
        ),
        (
            "--lora-r",
            "8",
            "`lora_r` = 8 (set by flag) contradicts the checkpoint",
        ),
        ("--lora-dropout", "0.2", "`lora_dropout` = 0.2"),
        ("--lora-targets", ".*q_proj", "`lora_targets` = .*q_proj"),
        ("--micro-batch", "2", "`micro_batch` = 2"),
    ] {
        let mut args = short(&out, "4", &["--resume", &from]);
        let i = args.iter().position(|a| a == flag);
        match i {
            Some(i) => args[i + 1] = value.into(),
            None => args.extend([flag.to_string(), value.to_string()]),
        }
        let err = run_err(&args);
        assert!(err.contains(says) && err.contains("hint:"), "{flag}: {err}");
        assert_eq!(err.lines().count(), 2, "one error and its hint: {err}");
    }
    let err = run_err(&short(
        &out,
        "4",
        &["--resume", &from, "--init-adapter", &from],
    ));
    assert!(err.contains("exclude each other"), "{err}");
    assert_eq!(metrics(&out, "train").len(), 2, "nothing trained");

    // A changed learning rate is used from the resumed step on, and said so.
    let mut args = short(&out, "4", &["--resume", &from]);
    let i = args.iter().position(|a| a == "--lr").unwrap();
    args[i + 1] = "2e-3".into();
    let log = run_ok(1, &args, &[]);
    assert!(log.contains("lr 0.001 → 0.002 (flag)"), "{log}");
    let lr3 = metrics(&out, "train")[2]["lr"].as_f64().unwrap();
    let want = 2e-3 * 0.5 * (1.0 + (std::f64::consts::PI * 1.0 / 3.0).cos());
    assert!((lr3 - want).abs() < 1e-15, "step 3 lr {lr3}, want {want}");
    // The saved adapter says what was trained.
    let cfg: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("step-4/adapter_config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        (cfg["r"].as_u64(), cfg["lora_alpha"].as_f64()),
        (Some(4), Some(8.0))
    );
    check_in_peft(&out.join("step-4"));
}

/// `score`'s loss of the fixture rows with the adapter in `dir`, then, where /opt/refenv has
/// PEFT, the same loss from PEFT loading that adapter
/// (`tools/reference/trainer/check_adapter_loss.py`).
fn check_in_peft(dir: &Path) {
    let model = Path::new(ROOT).join("assets/tiny");
    let data = fixture("data.jsonl");
    let o = std::process::Command::new(example("score"))
        .args([
            "--model".as_ref(),
            model.as_os_str(),
            "--adapter".as_ref(),
            dir.as_os_str(),
        ])
        .args(["--data", &data])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let loss = v["loss"].as_f64().unwrap();
    let python = Path::new("/opt/refenv/bin/python");
    let has_peft = python.exists()
        && std::process::Command::new(python)
            .args(["-c", "import peft, transformers, torch"])
            .status()
            .is_ok_and(|s| s.success());
    if !has_peft {
        eprintln!("note: /opt/refenv has no PEFT; the saved adapter was checked by score only");
        return;
    }
    let script = Path::new(ROOT).join("tools/reference/trainer/check_adapter_loss.py");
    let o = std::process::Command::new(python)
        .arg(&script)
        .args([model.as_os_str(), dir.as_os_str()])
        .arg(&data)
        .arg(loss.to_string())
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    eprintln!("{}", String::from_utf8_lossy(&o.stdout).trim());
}

#[test]
fn init_adapter_takes_its_shape_and_the_table_shows_it() {
    let init = fixture("init_adapter");
    let want: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(Path::new(&init).join("adapter_config.json")).unwrap(),
    )
    .unwrap();
    let r = want["r"].as_u64().unwrap();
    let out = tmp("init");
    let mut args = args_with(
        &out,
        &[
            "--init-adapter",
            &init,
            "--max-steps",
            "1",
            "--micro-batch",
            "1",
            "--accum",
            "2",
        ],
    );
    let log = run_ok(1, &args, &[]);
    let row = log.lines().find(|l| l.starts_with("| lora_r ")).unwrap();
    assert!(row.contains(&format!(" {r}   ({init})")), "{row}");
    // A different rank than the adapter's is an error, not a silent r-{r} run.
    args.extend([
        "--lora-r".to_string(),
        (r * 2).to_string(),
        "--overwrite-output".into(),
    ]);
    let err = run_err(&args);
    assert!(
        err.contains(&format!("contradicts the adapter {init}, which has {r}")),
        "{err}"
    );
}

#[test]
fn a_second_run_into_a_locked_folder_fails_at_once_naming_the_holder() {
    let out = tmp("locked");
    std::fs::create_dir_all(&out).unwrap();
    let lock = std::fs::File::create(out.join(".lock")).unwrap();
    lock.try_lock().unwrap();
    std::fs::write(
        out.join(".lock"),
        "pid 4242 on node-7 (started at unix time 1)",
    )
    .unwrap();
    let err = run_err(&short(&out, "2", &[]));
    assert!(
        err.contains("is in use by pid 4242 on node-7") && err.contains("hint:"),
        "{err}"
    );
    drop(lock);
    run_ok(1, &short(&out, "2", &[]), &[]);
}

#[test]
fn an_elastic_restart_continues_only_its_own_run() {
    let out = tmp("elastic");
    let job = |id: &'static str, restart: &'static str| {
        [
            ("TORCHELASTIC_RUN_ID", id),
            ("TORCHELASTIC_RESTART_COUNT", restart),
        ]
    };
    run_ok(1, &short(&out, "2", &[]), &job("job-a", "0"));
    // Another job's restart must not take job-a's checkpoints.
    let outs = run(1, &short(&out, "4", &[]), &job("job-b", "1"));
    let err = String::from_utf8_lossy(&outs[0].stderr);
    assert!(!outs[0].status.success());
    assert!(
        err.contains("elastic restart 1 of job \"job-b\"") && err.contains("job-a"),
        "{err}"
    );
    // job-a's own restart resumes from its newest checkpoint.
    let log = run_ok(1, &short(&out, "4", &[]), &job("job-a", "1"));
    assert!(
        log.contains("resumed from") && log.contains("at step 2"),
        "{log}"
    );
    assert_eq!(checkpoints(&out), ["step-2", "step-4"]);
}

#[test]
fn save_total_limit_keeps_the_newest_checkpoints() {
    let out = tmp("limit");
    run_ok(1, &short(&out, "6", &["--save-total-limit", "2"]), &[]);
    assert_eq!(checkpoints(&out), ["step-6", "epoch-0"]);
}

#[test]
fn a_resumed_run_keeps_one_metrics_line_per_step_and_plots_its_history() {
    let out = tmp("history");
    run_ok(1, &short(&out, "4", &[]), &[]);
    // Resume from step 2 of the same run: steps 3-4 are trained again and recorded once.
    let from = out.join("step-2").display().to_string();
    let log = run_ok(1, &short(&out, "4", &["--resume", &from]), &[]);
    assert!(
        log.contains("eta 0:00:0"),
        "the log lines carry an ETA under a pipe: {log}"
    );
    let steps: Vec<u64> = metrics(&out, "train")
        .iter()
        .map(|v| v["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps, [1, 2, 3, 4]);
    let svg = std::fs::read_to_string(out.join("loss.svg")).unwrap();
    let points = svg
        .split("<polyline")
        .nth(1)
        .and_then(|p| p.split("points=\"").nth(1))
        .and_then(|p| p.split('"').next())
        .unwrap();
    assert_eq!(
        points.split_whitespace().count(),
        4,
        "the plot spans steps 1-4: {points}"
    );
}

#[test]
fn tensorboard_event_files_hold_the_logged_scalars() {
    let out = tmp("tb");
    run_ok(1, &short(&out, "3", &["--report-to", "tensorboard"]), &[]);
    // A resumed run repeats step 3 in a second file; TensorBoard must show it once.
    let from = out.join("step-2").display().to_string();
    run_ok(
        1,
        &short(
            &out,
            "3",
            &["--report-to", "tensorboard", "--resume", &from],
        ),
        &[],
    );
    let dir = out.join("tensorboard");
    let files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 2, "{files:?}");
    // Read back with TensorBoard itself where the reference environment has it.
    let python = Path::new("/opt/refenv/bin/python");
    let has_tb = python.exists()
        && std::process::Command::new(python)
            .args(["-c", "import tensorboard"])
            .status()
            .is_ok_and(|s| s.success());
    if !has_tb {
        eprintln!("note: /opt/refenv has no tensorboard package; the format is checked byte for byte by the trainer's unit test");
        return;
    }
    let script = Path::new(ROOT).join("tools/reference/trainer/check_tensorboard.py");
    let o = std::process::Command::new(python)
        .arg(&script)
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// The stderr of the tool `name` run with `args` and `RUST_BACKTRACE=1`, which must fail with one
/// line (an ordinary error is not a crash: no backtrace).
fn one_error_line(name: &str, args: &[&std::ffi::OsStr]) -> String {
    let o = std::process::Command::new(example(name))
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!o.status.success(), "{name} should fail: {err}");
    assert_eq!(
        err.lines().count(),
        1,
        "{name}: one line, no backtrace: {err}"
    );
    err
}

#[test]
fn prepare_reads_a_folder_as_one_dataset_and_refuses_its_own_output_as_data() {
    let dir = tmp("prepare-folder");
    let shards = dir.join("shards");
    std::fs::create_dir_all(&shards).unwrap();
    let chats = std::fs::read_to_string(Path::new(ROOT).join("assets/sample/chat.jsonl")).unwrap();
    let lines: Vec<&str> = chats.lines().collect();
    let (first, rest) = lines.split_at(lines.len() / 3);
    std::fs::write(shards.join("part-1.jsonl"), first.join("\n") + "\n").unwrap();
    std::fs::write(shards.join("part-2.jsonl"), rest.join("\n") + "\n").unwrap();
    let prepare = |data: &Path, out: &Path| {
        std::process::Command::new(example("prepare"))
            .args([
                "--model",
                &format!("{ROOT}/assets/tiny"),
                "--labels",
                "assistant_only",
            ])
            .arg("--data")
            .arg(data)
            .arg("--out")
            .arg(out)
            .output()
            .unwrap()
    };
    let whole = prepare(
        &Path::new(ROOT).join("assets/sample/chat.jsonl"),
        &dir.join("whole.jsonl"),
    );
    assert!(
        whole.status.success(),
        "{}",
        String::from_utf8_lossy(&whole.stderr)
    );
    let parts = prepare(&shards, &dir.join("parts.jsonl"));
    let stdout = String::from_utf8_lossy(&parts.stdout);
    assert!(
        parts.status.success(),
        "{}",
        String::from_utf8_lossy(&parts.stderr)
    );
    assert!(stdout.contains("(split train, 2 files)"), "{stdout}");
    assert_eq!(
        std::fs::read(dir.join("parts.jsonl")).unwrap(),
        std::fs::read(dir.join("whole.jsonl")).unwrap(),
        "the two shards make the same token rows as the whole file"
    );
    // Token rows written into the folder become part of it on the next run: refused.
    std::fs::copy(dir.join("parts.jsonl"), shards.join("tokens.jsonl")).unwrap();
    let again = prepare(&shards, &shards.join("tokens.jsonl"));
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(
        !again.status.success() && err.contains("is the data file") && err.contains("tokens.jsonl"),
        "{err}"
    );
}

#[test]
fn prepare_refuses_to_overwrite_its_input_and_tools_print_one_error_line() {
    let dir = tmp("prepare");
    std::fs::create_dir_all(&dir).unwrap();
    let chats = dir.join("chat.jsonl");
    std::fs::copy(Path::new(ROOT).join("assets/sample/chat.jsonl"), &chats).unwrap();
    let before = std::fs::read(&chats).unwrap();
    let model = Path::new(ROOT).join("assets/tiny");
    let (model, chats_arg) = (model.as_os_str(), chats.as_os_str());
    // The same file by another spelling.
    let same = dir.join(".").join("chat.jsonl");
    let err = one_error_line(
        "prepare",
        &[
            "--model".as_ref(),
            model,
            "--data".as_ref(),
            chats_arg,
            "--out".as_ref(),
            same.as_os_str(),
        ],
    );
    assert!(
        err.starts_with("error: --out") && err.contains("choose another --out"),
        "{err}"
    );
    assert_eq!(
        std::fs::read(&chats).unwrap(),
        before,
        "the chats are untouched"
    );

    let missing = dir.join("missing.jsonl");
    let err = one_error_line(
        "score",
        &[
            "--model".as_ref(),
            model,
            "--data".as_ref(),
            missing.as_os_str(),
        ],
    );
    assert!(
        err.starts_with("error: ") && err.contains("missing.jsonl: no such file or folder"),
        "{err}"
    );

    // The OS error once, though its error type prints it in its own message.
    let (missing, out) = (dir.join("no-adapter"), dir.join("merged"));
    let err = one_error_line(
        "merge",
        &[
            "--model".as_ref(),
            model,
            "--adapter".as_ref(),
            missing.as_os_str(),
            "--out".as_ref(),
            out.as_os_str(),
        ],
    );
    assert!(
        err.starts_with("error: merging") && err.contains("no-adapter: No such file or directory"),
        "{err}"
    );
    assert_eq!(err.matches("(os error 2)").count(), 1, "{err}");
}
