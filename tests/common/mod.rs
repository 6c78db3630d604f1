//! Helpers shared by the tests that run `examples/train_ddp` as processes: the binary, the
//! fixture data, temporary folders, spawning ranks with torchrun's environment, reading the
//! outputs back.
#![allow(dead_code)] // each test binary uses its own subset

pub mod hub;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use safetensors::SafeTensors;

pub const ROOT: &str = env!("CARGO_MANIFEST_DIR");
pub const FIXTURES: &str = "tools/reference/trainer/fixtures/train";

/// `target/<profile>/examples/<name>`, built by `cargo test` beside this test binary.
pub fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>");
    let bin = dir.join("examples").join(name);
    assert!(
        bin.exists(),
        "{} missing: run through `cargo test` (it builds examples)",
        bin.display()
    );
    bin
}

/// The `train_ddp` example.
pub fn train_ddp() -> PathBuf {
    example("train_ddp")
}

pub fn fixture(p: &str) -> String {
    Path::new(ROOT).join(FIXTURES).join(p).display().to_string()
}

pub fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("g4ft-train-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// The small optimizer step of the multi-step tests: one sample per micro-batch, two
/// micro-batches per step, LoRA rank 4.
pub const SMALL_STEP: [&str; 6] = ["--micro-batch", "1", "--accum", "2", "--lora-r", "4"];

/// Flags shared by every run: tiny model, fixture data, fp32 CPU, log every step.
pub fn base_args(output: &Path) -> Vec<String> {
    let model = Path::new(ROOT).join("assets/tiny").display().to_string();
    [
        "--model",
        &model,
        "--data",
        &fixture("data.jsonl"),
        "--output",
        &output.display().to_string(),
        "--device",
        "cpu",
        "--dtype",
        "f32",
        "--max-len",
        "128",
        "--log-every",
        "1",
        "--lr",
        "1e-3",
        "--warmup",
        "1",
        "--collective-timeout-s",
        "60",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Runs `world` ranks of train_ddp with `args` (and extra environment), waits at most 120 s.
pub fn run(world: usize, args: &[String], env: &[(&str, &str)]) -> Vec<Output> {
    wait_all(spawn_ranks(world, args, env))
}

/// Starts `world` ranks of train_ddp with `args` (and extra environment), their output piped.
pub fn spawn_ranks(world: usize, args: &[String], env: &[(&str, &str)]) -> Vec<Child> {
    spawn_ranks_with(world, |_| args.to_vec(), env)
}

/// [`spawn_ranks`] with each rank's own arguments, `args_of(rank)`.
pub fn spawn_ranks_with(
    world: usize,
    args_of: impl Fn(usize) -> Vec<String>,
    env: &[(&str, &str)],
) -> Vec<Child> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    (0..world)
        .map(|rank| {
            let mut c = Command::new(train_ddp());
            c.args(args_of(rank))
                .current_dir(ROOT)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            if world > 1 {
                c.env("RANK", rank.to_string())
                    .env("LOCAL_RANK", rank.to_string())
                    .env("WORLD_SIZE", world.to_string())
                    .env("LOCAL_WORLD_SIZE", world.to_string())
                    .env("MASTER_ADDR", "127.0.0.1")
                    .env("MASTER_PORT", port.to_string());
            }
            for (k, v) in env {
                c.env(k, v);
            }
            c.spawn().expect("spawn train_ddp")
        })
        .collect()
}

/// Waits at most 120 s for every rank to exit (then kills them all and panics) and collects
/// their output.
pub fn wait_all(children: Vec<Child>) -> Vec<Output> {
    let world = children.len();
    let start = Instant::now();
    let mut children: Vec<_> = children.into_iter().map(Some).collect();
    let mut outs: Vec<Option<Output>> = (0..world).map(|_| None).collect();
    while outs.iter().any(Option::is_none) {
        for (i, c) in children.iter_mut().enumerate() {
            if let Some(ch) = c.as_mut() {
                if ch.try_wait().unwrap().is_some() {
                    outs[i] = Some(c.take().unwrap().wait_with_output().unwrap());
                }
            }
        }
        if start.elapsed() > Duration::from_secs(120) {
            for c in children.iter_mut().flatten() {
                let _ = c.kill();
            }
            panic!("train_ddp did not finish within 120 s (a hang)");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    outs.into_iter().map(Option::unwrap).collect()
}

pub fn run_ok(world: usize, args: &[String], env: &[(&str, &str)]) -> String {
    let outs = run(world, args, env);
    for (r, o) in outs.iter().enumerate() {
        assert!(
            o.status.success(),
            "rank {r} failed: {}\n{}",
            String::from_utf8_lossy(&o.stderr),
            String::from_utf8_lossy(&o.stdout)
        );
    }
    String::from_utf8_lossy(&outs[0].stdout).into_owned()
}

/// `step → (loss, grad_norm)` of the train lines of `metrics.jsonl`.
pub fn losses(output: &Path) -> BTreeMap<u64, (f64, f64)> {
    let text = std::fs::read_to_string(output.join("metrics.jsonl")).unwrap();
    text.lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["kind"] == "train")
        .map(|v| {
            (
                v["step"].as_u64().unwrap(),
                (
                    v["loss"].as_f64().unwrap(),
                    v["grad_norm"].as_f64().unwrap(),
                ),
            )
        })
        .collect()
}

/// Every tensor of an adapter file as f32 values, by key.
pub fn adapter(path: &Path) -> BTreeMap<String, Vec<f32>> {
    let bytes = std::fs::read(path.join("adapter_model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(k, t)| {
            let v = t
                .data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            (k, v)
        })
        .collect()
}

pub fn args_with(out: &Path, extra: &[&str]) -> Vec<String> {
    let mut a = base_args(out);
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

/// Stderr of one train_ddp process that must fail.
pub fn run_err(args: &[String]) -> String {
    let outs = run(1, args, &[]);
    assert!(!outs[0].status.success(), "should fail: {args:?}");
    String::from_utf8_lossy(&outs[0].stderr).into_owned()
}

/// Every line of `OUTPUT/metrics.jsonl` of `kind` (`train`, `eval`, `summary`).
pub fn metrics(output: &Path, kind: &str) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(output.join("metrics.jsonl")).unwrap();
    text.lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["kind"] == kind)
        .collect()
}

/// Names of the complete checkpoints in `output`, in the order they were written.
pub fn checkpoints(output: &Path) -> Vec<String> {
    g4ft::trainer::checkpoint::complete_checkpoints(output)
        .unwrap()
        .into_iter()
        .map(|c| c.marker.name)
        .collect()
}

/// A process's stdout read line by line on a thread, so that a test can wait for a line while
/// the process runs (to signal it at a known point) and still read every line afterwards.
pub struct Lines {
    rx: std::sync::mpsc::Receiver<String>,
    reader: std::thread::JoinHandle<()>,
    /// The lines received so far.
    pub seen: Vec<String>,
}

impl Lines {
    /// Takes over `child`'s piped stdout.
    pub fn of(child: &mut Child) -> Lines {
        use std::io::{BufRead, BufReader};
        let stdout = child.stdout.take().expect("stdout piped");
        let (tx, rx) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Lines {
            rx,
            reader,
            seen: Vec::new(),
        }
    }

    /// Waits until a line satisfies `wanted`; after 60 s without one, kills `ranks` and panics
    /// with the lines seen.
    pub fn wait_for(&mut self, wanted: impl Fn(&str) -> bool, ranks: &mut [Child]) {
        while !self.seen.iter().any(|l| wanted(l)) {
            match self.rx.recv_timeout(Duration::from_secs(60)) {
                Ok(line) => self.seen.push(line),
                Err(_) => {
                    for r in ranks.iter_mut() {
                        let _ = r.kill();
                    }
                    panic!("the awaited line did not come within 60 s: {:?}", self.seen);
                }
            }
        }
    }

    /// Every line, once the process has exited.
    pub fn finish(mut self) -> Vec<String> {
        self.reader.join().unwrap();
        self.seen.extend(self.rx.try_iter());
        self.seen
    }
}

/// The step number of a step log line (`epoch E | step    N/M | loss ...`).
pub fn step_of(line: &str) -> Option<u64> {
    let rest = line.split("| step").nth(1)?;
    rest.trim_start().split('/').next()?.parse().ok()
}

/// Sends SIGINT to `child`, as a Ctrl-C would.
pub fn interrupt(child: &Child) {
    let kill = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
}

/// Asserts that every rank exited with `code` (each failing rank's stderr and `log` shown).
pub fn assert_all_exited(outs: &[Output], code: i32, log: &str) {
    for (r, o) in outs.iter().enumerate() {
        assert_eq!(
            o.status.code(),
            Some(code),
            "rank {r}: {}\n{log}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

/// The first line of `log` holding `marker`, and the number that follows the marker there.
pub fn line_with_number(log: &str, marker: &str) -> (String, u64) {
    let line = log
        .lines()
        .find(|l| l.contains(marker))
        .unwrap_or_else(|| panic!("no line with {marker:?}: {log}"));
    let n = line
        .split(marker)
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no number after {marker:?}: {line}"));
    (line.to_string(), n)
}
