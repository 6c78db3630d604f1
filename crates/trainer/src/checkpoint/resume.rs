//! Where a run starts (fresh, from a PEFT adapter, from a checkpoint) and which settings the
//! starting point fixes.
//!
//! [`plan`] decides the start from `--resume DIR|latest`, `--init-adapter DIR` and the elastic
//! restart environment; every rank computes the same plan from the same files. [`StartPlan::apply`]
//! then puts the starting point's settings under this run's, by each setting's
//! [`ResumeRule`]:
//! - the adapter's shape (r, alpha, dropout, targets, rsLoRA) comes from the adapter's
//!   `adapter_config.json` (with `--resume` and with `--init-adapter`);
//! - with `--resume`, every other setting this run does not set itself comes from the
//!   checkpoint, so `--resume latest` alone continues the run as it was configured;
//! - a value this run sets that contradicts the adapter's shape or the checkpoint's batch/bucket
//!   layout is an error before anything is loaded; a changed optimization or data setting is
//!   used and reported in one line; run control changes freely.

use std::path::{Path, PathBuf};

use g4ft_lora::{LoraConfig, TargetModules};
use g4ft_wait::host_name;
use serde_json::{Map, Value};

use crate::checkpoint::run_dir::{read_run, Claim, RunRecord};
use crate::checkpoint::state::TrainerState;
use crate::checkpoint::{latest_checkpoint_of_run, latest_complete_checkpoint, read_checkpoint};
use crate::config::{settings, show_value, Origin, ResolvedConfig, ResumeRule, TrainConfig};
use crate::error::{Error, Result};

/// `--resume` values that mean "the newest complete checkpoint of `--output`".
pub const RESUME_LATEST: [&str; 2] = ["latest", "auto"];

/// The `TORCHELASTIC_RUN_ID` torchrun (and `ddprun`) give a job launched without `--rdzv-id`: the
/// same for every such job, so it tells none apart.
pub const NO_JOB_ID: &str = "none";

/// What the launcher says about this start (torchrun's `TORCHELASTIC_*` variables).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Launch {
    /// `TORCHELASTIC_RESTART_COUNT`: 0 on the first attempt.
    pub restart_count: u64,
    /// `TORCHELASTIC_RUN_ID`: the job id shared by all attempts; `None` when unset or
    /// [`NO_JOB_ID`].
    pub launcher_run_id: Option<String>,
    /// The launcher's process id (this process's parent): the same for every attempt of a job,
    /// which is what tells jobs without an id apart on one host.
    pub launcher_pid: u32,
}

impl Launch {
    /// Whether `record`'s run was started by this launcher job: the same job id, or, where
    /// neither has one, the same launcher process on this host.
    pub fn started(&self, record: &RunRecord) -> bool {
        let theirs = record
            .launcher_run_id
            .as_deref()
            .filter(|id| *id != NO_JOB_ID);
        match (self.launcher_run_id.as_deref(), theirs) {
            (Some(ours), Some(theirs)) => ours == theirs,
            (None, None) => {
                record.launcher_pid == Some(self.launcher_pid) && record.host == host_name()
            }
            _ => false,
        }
    }

    /// "\"job-a\"", or "launcher pid P on H" for a job without an id.
    fn job(id: Option<&str>, pid: Option<u32>, host: &str) -> String {
        match (id.filter(|id| *id != NO_JOB_ID), pid) {
            (Some(id), _) => format!("job {id:?}"),
            (None, Some(pid)) => format!("the job of launcher pid {pid} on {host}"),
            (None, None) => "a job without an id".into(),
        }
    }

    /// Reads the variables through `lookup` (`|k| std::env::var(k).ok()`); the launcher's pid is
    /// this process's parent.
    pub fn from_env(lookup: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let restart_count = match lookup("TORCHELASTIC_RESTART_COUNT") {
            Some(v) if !v.is_empty() => v.parse().map_err(|_| Error::Start {
                reason: format!("TORCHELASTIC_RESTART_COUNT={v:?} is not a number"),
                hint: "the launcher sets it; unset it when running by hand".into(),
            })?,
            _ => 0,
        };
        Ok(Self {
            restart_count,
            launcher_run_id: lookup("TORCHELASTIC_RUN_ID")
                .filter(|v| !v.is_empty() && v != NO_JOB_ID),
            launcher_pid: std::os::unix::process::parent_id(),
        })
    }
}

/// The starting point.
#[derive(Debug, Clone, PartialEq)]
pub enum Start {
    /// A fresh adapter from the seed.
    Fresh,
    /// The weights of a PEFT adapter directory (`--init-adapter`).
    Adapter {
        /// The adapter directory.
        dir: PathBuf,
        /// Its `adapter_config.json`.
        adapter: LoraConfig,
    },
    /// A checkpoint of this trainer (`--resume`, or an elastic restart).
    Checkpoint {
        /// The checkpoint directory.
        dir: PathBuf,
        /// Its `adapter_config.json`.
        adapter: LoraConfig,
        /// Its trainer state.
        state: Box<TrainerState>,
    },
}

/// The decided start and how the run relates to its output folder.
#[derive(Debug, Clone, PartialEq)]
pub struct StartPlan {
    /// Where the weights and state come from.
    pub start: Start,
    /// A new run, or the continuation of the run with this id (for [`crate::checkpoint::run_dir::claim`]).
    pub claim: Claim,
}

/// Checks that every rank decided the same start (`starts[r]`: rank r's
/// [`StartPlan::describe`]). Each rank plans from the files it sees; a folder that changes while
/// the job starts (a previous job's rank still saving, a shared file system showing nodes
/// different listings) could otherwise send the ranks to different checkpoints.
pub fn check_same_start(starts: &[String], output: &Path) -> Result<()> {
    let Some(first) = starts.first() else {
        return Ok(());
    };
    if starts.iter().all(|s| s == first) {
        return Ok(());
    }
    let each: Vec<String> = starts
        .iter()
        .enumerate()
        .map(|(r, s)| format!("rank {r}: {s}"))
        .collect();
    Err(start_error(
        format!(
            "the ranks chose different starting points ({})",
            each.join("; ")
        ),
        &format!(
            "{} changed while the job started, or the ranks see different files in it: make sure \
             no other job writes there (and that every node sees the same folder), then start \
             again",
            output.display()
        ),
    ))
}

/// Settings whose values are paths: a node may reach the same model or data through another
/// mount, so they are not compared across ranks.
const PATH_SETTINGS: [&str; 3] = ["model", "data", "eval_data"];

/// Checks that every rank runs the same training (`settings[r]`: rank r's
/// [`crate::checkpoint::state::math_settings`]; paths left out). A launcher or node started with
/// other flags would otherwise train with another batch layout, seed or schedule than its peers,
/// and only the end-of-run parameter check, if anything, would notice.
pub fn check_same_settings(settings: &[Vec<(String, String)>]) -> Result<()> {
    let Some(first) = settings.first() else {
        return Ok(());
    };
    let mut differences = Vec::new();
    for (i, (name, value)) in first.iter().enumerate() {
        if PATH_SETTINGS.contains(&name.as_str()) {
            continue;
        }
        let others: Vec<String> = settings
            .iter()
            .enumerate()
            .skip(1)
            .filter_map(|(r, rows)| {
                let theirs = rows.get(i).map_or("<missing>", |(_, v)| v.as_str());
                (theirs != value).then(|| format!("{theirs} on rank {r}"))
            })
            .collect();
        if !others.is_empty() {
            differences.push(format!("{name}: {value} on rank 0, {}", others.join(", ")));
        }
    }
    if differences.is_empty() {
        return Ok(());
    }
    Err(start_error(
        format!(
            "the ranks were started with different settings ({})",
            differences.join("; ")
        ),
        "start every launcher (every node) with the same command: the same flags, config file \
         and environment",
    ))
}

fn start_error(reason: String, hint: &str) -> Error {
    Error::Start {
        reason,
        hint: hint.to_string(),
    }
}

/// Decides the start:
/// 1. an elastic restart (`restart_count > 0`) continues the run of the output folder's record,
///    which must name this job, from its newest checkpoint (or as it started, if it has none);
/// 2. `--resume latest` takes the newest complete checkpoint of the folder's run;
/// 3. `--resume DIR` takes that checkpoint;
/// 4. `--init-adapter DIR` that adapter, else a fresh adapter.
///
/// `--resume` with `--init-adapter`, or with `--overwrite-output`, is an error.
pub fn plan(cfg: &TrainConfig, launch: &Launch) -> Result<StartPlan> {
    if let (Some(r), Some(i)) = (&cfg.resume, &cfg.init_adapter) {
        return Err(start_error(
            format!(
                "--resume {} and --init-adapter {} exclude each other",
                r.display(),
                i.display()
            ),
            "--resume continues a run (adapter, optimizer, schedule, data position); \
             --init-adapter starts a new run from an adapter's weights: give one",
        ));
    }
    if cfg.resume.is_some() && cfg.overwrite_output {
        return Err(start_error(
            "--resume and --overwrite-output exclude each other".into(),
            "--overwrite-output deletes the previous run's checkpoints; drop it to resume",
        ));
    }
    let output = &cfg.output;
    let new_run = Claim::New {
        overwrite: cfg.overwrite_output,
    };
    if launch.restart_count > 0 {
        if let Some(record) = read_run(output)? {
            if !launch.started(&record) {
                let ours = Launch::job(
                    launch.launcher_run_id.as_deref(),
                    Some(launch.launcher_pid),
                    &host_name(),
                );
                let theirs = Launch::job(
                    record.launcher_run_id.as_deref(),
                    record.launcher_pid,
                    &record.host,
                );
                return Err(start_error(
                    format!(
                        "elastic restart {} of {ours}, but {} holds run {} of {theirs}",
                        launch.restart_count,
                        output.display(),
                        record.run_id,
                    ),
                    "another job took the output folder since this job started; give each job \
                     its own --output",
                ));
            }
            let claim = Claim::Continue {
                run_id: record.run_id.clone(),
            };
            if let Some(c) = latest_checkpoint_of_run(output, &record.run_id)? {
                return Ok(StartPlan {
                    start: checkpoint_start(&c.dir)?,
                    claim,
                });
            }
            // The first attempt saved nothing: start again as it did.
            return Ok(StartPlan {
                start: initial_start(cfg)?,
                claim,
            });
        }
    }
    let Some(resume) = &cfg.resume else {
        return Ok(StartPlan {
            start: initial_start(cfg)?,
            claim: new_run,
        });
    };
    let dir = if RESUME_LATEST.iter().any(|k| resume.as_os_str() == *k) {
        let latest = match read_run(output)? {
            Some(record) => latest_checkpoint_of_run(output, &record.run_id)?,
            None => latest_complete_checkpoint(output)?,
        };
        match latest {
            Some(c) => c.dir,
            None => {
                return Err(start_error(
                    format!(
                        "--resume {}: {} has no complete checkpoint",
                        resume.display(),
                        output.display()
                    ),
                    "check --output, or start without --resume",
                ))
            }
        }
    } else {
        read_checkpoint(resume)?.dir
    };
    let start = checkpoint_start(&dir)?;
    let Start::Checkpoint { state, .. } = &start else {
        unreachable!("checkpoint_start returns a checkpoint")
    };
    let claim = Claim::Continue {
        run_id: state.run_id.clone(),
    };
    Ok(StartPlan { start, claim })
}

/// The folder holding checkpoint `dir`: `.` for a bare name (`--resume step-10` given in the
/// output folder).
fn folder_of(dir: &Path) -> &Path {
    match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

fn initial_start(cfg: &TrainConfig) -> Result<Start> {
    Ok(match &cfg.init_adapter {
        Some(dir) => Start::Adapter {
            adapter: LoraConfig::from_dir(dir)?,
            dir: dir.clone(),
        },
        None => Start::Fresh,
    })
}

fn checkpoint_start(dir: &Path) -> Result<Start> {
    Ok(Start::Checkpoint {
        dir: dir.to_path_buf(),
        adapter: LoraConfig::from_dir(dir)?,
        state: Box::new(TrainerState::read(dir)?),
    })
}

/// The adapter settings an `adapter_config.json` implies, by setting name (the settings of
/// [`crate::config::section::ADAPTER`]). A list of target names becomes the regex PEFT's suffix
/// match is equivalent to.
pub fn adapter_settings(adapter: &LoraConfig) -> Map<String, Value> {
    let targets = match &adapter.target_modules {
        TargetModules::Regex(r) => r.clone(),
        TargetModules::List(names) => {
            let names: Vec<String> = names.iter().map(|n| regex::escape(n)).collect();
            format!(r"(?:.*\.)?(?:{})", names.join("|"))
        }
    };
    let mut m = Map::new();
    m.insert("lora_r".into(), adapter.r.into());
    m.insert("lora_alpha".into(), adapter.lora_alpha.into());
    m.insert("lora_dropout".into(), adapter.lora_dropout.into());
    m.insert("lora_targets".into(), targets.into());
    m.insert("use_rslora".into(), adapter.use_rslora.into());
    m
}

fn to_object(c: &TrainConfig) -> Map<String, Value> {
    match serde_json::to_value(c).expect("the config serializes") {
        Value::Object(m) => m,
        _ => unreachable!("a struct serializes to an object"),
    }
}

impl StartPlan {
    /// The starting point's directory, if any.
    pub fn dir(&self) -> Option<&Path> {
        match &self.start {
            Start::Fresh => None,
            Start::Adapter { dir, .. } | Start::Checkpoint { dir, .. } => Some(dir),
        }
    }

    /// The starting point in words, the same on every rank that decided the same start:
    /// `a fresh adapter`, `the adapter in DIR`, `checkpoint DIR (step N of run R)`.
    pub fn describe(&self) -> String {
        match &self.start {
            Start::Fresh => "a fresh adapter".into(),
            Start::Adapter { dir, .. } => format!("the adapter in {}", dir.display()),
            Start::Checkpoint { dir, state, .. } => format!(
                "checkpoint {} (step {} of run {})",
                dir.display(),
                state.step,
                state.run_id
            ),
        }
    }

    /// A resumed run needs the checkpoint's number of processes (the saved data position
    /// counts micro-batches per rank).
    pub fn check_world_size(&self, world_size: usize) -> Result<()> {
        if let Start::Checkpoint { dir, state, .. } = &self.start {
            if state.world_size != world_size {
                return Err(Error::ResumeMismatch {
                    path: dir.clone(),
                    field: "world_size".into(),
                    saved: state.world_size.to_string(),
                    current: world_size.to_string(),
                    hint: "the saved data position counts micro-batches per rank; resume with the \
                           same number of processes, or start a new run from the adapter with \
                           --init-adapter",
                });
            }
        }
        Ok(())
    }

    /// Puts the starting point's settings under `resolved` (see the module docs) and validates
    /// the result. Returns the changes this run makes to a resumed run's optimization and data
    /// settings, as `name old → new (origin)`.
    pub fn apply(&self, resolved: &mut ResolvedConfig) -> Result<Vec<String>> {
        let (dir, adapter, state) = match &self.start {
            Start::Fresh => return Ok(Vec::new()),
            Start::Adapter { dir, adapter } => (dir, adapter, None),
            Start::Checkpoint {
                dir,
                adapter,
                state,
            } => (dir, adapter, Some(state)),
        };
        let from_adapter = adapter_settings(adapter);
        let saved = state.map(|s| to_object(&s.config));
        let mut values = to_object(&resolved.config);
        let mut changes = Vec::new();
        for s in settings() {
            let rule = s.resume_rule();
            let theirs = match (rule, &saved) {
                (ResumeRule::NotInherited, _) => continue,
                (ResumeRule::FromCheckpoint, _) => &from_adapter[&s.name],
                (_, Some(saved)) => &saved[&s.name],
                (_, None) => continue,
            };
            let origin = resolved.origin(&s.name);
            let ours = &values[&s.name];
            if origin == Origin::Default {
                // Not set by this run: the starting point's value. A resumed run keeps writing
                // into the folder of its checkpoint unless told otherwise.
                let value = if s.name == "output" {
                    Value::String(folder_of(dir).display().to_string())
                } else {
                    theirs.clone()
                };
                if &value != ours {
                    values.insert(s.name.clone(), value);
                    resolved.origins.insert(s.name, Origin::Saved(dir.clone()));
                }
                continue;
            }
            if theirs == ours {
                continue;
            }
            let conflict = |what: &str, hint: &str| Error::SettingConflict {
                field: s.name.clone(),
                detail: format!(
                    "= {} (set by {origin}) contradicts {what} {}, which has {}\n  hint: {hint}",
                    show_value(ours),
                    dir.display(),
                    show_value(theirs)
                ),
            };
            match (rule, state) {
                (ResumeRule::FromCheckpoint, Some(_)) => {
                    return Err(conflict(
                        "the checkpoint",
                        "the adapter's shape is the checkpoint's: drop this setting to resume; to \
                         train another shape start a new run",
                    ))
                }
                (ResumeRule::FromCheckpoint, None) => {
                    return Err(conflict(
                        "the adapter",
                        "the adapter's shape is its adapter_config.json's: drop this setting",
                    ))
                }
                (ResumeRule::MustMatch, _) => {
                    return Err(conflict(
                        "the checkpoint",
                        "the saved data position and optimizer moments are counted in this \
                         setting: resume with the checkpoint's value, or start a new run from its \
                         adapter with --init-adapter",
                    ))
                }
                (ResumeRule::Reported, _) => changes.push(format!(
                    "{} {} → {} ({origin})",
                    s.name,
                    show_value(theirs),
                    show_value(ours)
                )),
                _ => {}
            }
        }
        resolved.config =
            serde_json::from_value(Value::Object(values)).expect("merged settings deserialize");
        resolved.validate()?;
        Ok(changes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::state::{config_fingerprint, RngState, SamplerPosition, STATE_FORMAT};
    use crate::config::cli::resolve_args;
    use crate::config::section;
    use crate::step::schedule::LrSchedule;

    #[test]
    fn ranks_started_with_other_settings_are_named() {
        let rows = |micro: &str, data: &str| {
            vec![
                ("data".to_string(), data.to_string()),
                ("micro_batch".to_string(), micro.to_string()),
                ("seed".to_string(), "42".to_string()),
            ]
        };
        // Paths may differ between nodes.
        check_same_settings(&[rows("2", "/a/d.jsonl"), rows("2", "/b/d.jsonl")]).unwrap();
        let msg = check_same_settings(&[rows("2", "d"), rows("2", "d"), rows("1", "d")])
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("different settings (micro_batch: 2 on rank 0, 1 on rank 2)")
                && msg.contains("the same command"),
            "{msg}"
        );
    }

    #[test]
    fn ranks_that_chose_different_starts_are_named() {
        let config = TrainConfig::default();
        let resumed = checkpoint(&config).describe();
        assert_eq!(resumed, "checkpoint out/step-20 (step 20 of run run-1)");
        let fresh = StartPlan {
            start: Start::Fresh,
            claim: Claim::New { overwrite: false },
        }
        .describe();
        let out = Path::new("out");
        check_same_start(&[resumed.clone(), resumed.clone()], out).unwrap();
        let msg = check_same_start(&[resumed.clone(), fresh], out)
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains(&format!("rank 0: {resumed}; rank 1: a fresh adapter"))
                && msg.contains("out changed while the job started"),
            "{msg}"
        );
    }

    fn checkpoint(config: &TrainConfig) -> StartPlan {
        let mut adapter = LoraConfig::new(
            config.lora_r,
            config.lora_alpha,
            TargetModules::Regex(config.lora_targets.clone()),
        );
        adapter.lora_dropout = config.lora_dropout;
        let state = TrainerState {
            format: STATE_FORMAT,
            run_id: "run-1".into(),
            step: 20,
            epoch: 0,
            sampler: SamplerPosition {
                epoch: 0,
                micro_batches: 40,
            },
            scheduler: LrSchedule::cosine(config.lr, 2, 40),
            optimizer_step: 20,
            skipped_in_a_row: 0,
            rng: RngState {
                seed: 42,
                micro_step: 40,
            },
            world_size: 2,
            config_fingerprint: config_fingerprint(config),
            config: config.clone(),
        };
        StartPlan {
            start: Start::Checkpoint {
                dir: "out/step-20".into(),
                adapter,
                state: Box::new(state),
            },
            claim: Claim::Continue {
                run_id: "run-1".into(),
            },
        }
    }

    fn saved_run() -> TrainConfig {
        resolve_args([
            "t",
            "--output",
            "out",
            "--lora-r",
            "8",
            "--lora-alpha",
            "16",
            "--lr",
            "1e-3",
            "--micro-batch",
            "2",
            "--save-every",
            "20",
        ])
        .unwrap()
        .config
    }

    #[test]
    fn adapter_settings_cover_the_adapter_section() {
        let names: Vec<String> = settings()
            .into_iter()
            .filter(|s| s.section == section::ADAPTER)
            .map(|s| s.name)
            .collect();
        let adapter = LoraConfig::new(4, 8.0, TargetModules::List(vec!["q_proj".into()]));
        let m = adapter_settings(&adapter);
        assert_eq!(m.keys().cloned().collect::<Vec<_>>().len(), names.len());
        assert!(
            names.iter().all(|n| m.contains_key(n)),
            "{names:?} vs {m:?}"
        );
        assert_eq!(m["lora_targets"], r"(?:.*\.)?(?:q_proj)");
    }

    #[test]
    fn resume_alone_continues_the_run_as_configured() {
        let plan = checkpoint(&saved_run());
        let mut r = resolve_args(["t", "--resume", "latest", "--output", "out"]).unwrap();
        let changes = plan.apply(&mut r).unwrap();
        assert!(changes.is_empty(), "{changes:?}");
        let c = &r.config;
        assert_eq!(
            (c.lora_r, c.lora_alpha, c.lr, c.micro_batch),
            (8, 16.0, 1e-3, 2)
        );
        assert_eq!(c.save_every, Some(20));
        assert_eq!(r.origin("lora_r"), Origin::Saved("out/step-20".into()));
        assert!(r.table().contains("(out/step-20)"), "{}", r.table());
        assert_eq!(
            c.resume,
            Some("latest".into()),
            "the start itself is this run's"
        );
    }

    #[test]
    fn a_resumed_run_writes_into_its_checkpoints_folder() {
        for (given, folder) in [
            ("out/step-20", "out"),
            ("step-20", "."),
            ("/r/o/step-2", "/r/o"),
        ] {
            assert_eq!(folder_of(Path::new(given)), Path::new(folder), "{given}");
        }
    }

    #[test]
    fn a_contradicting_adapter_or_layout_setting_is_an_error() {
        let plan = checkpoint(&saved_run());
        for (flag, value, says) in [
            ("--lora-alpha", "64", "`lora_alpha` = 64 (set by flag) contradicts the checkpoint out/step-20, which has 16"),
            ("--lora-r", "16", "`lora_r` = 16"),
            ("--lora-targets", ".*q_proj", "`lora_targets`"),
            ("--lora-dropout", "0.1", "`lora_dropout`"),
            ("--micro-batch", "1", "`micro_batch` = 1"),
            ("--bucket-cap-mb", "50", "`bucket_cap_mb`"),
        ] {
            let mut r = resolve_args(["t", "--resume", "out/step-20", flag, value]).unwrap();
            let msg = plan.apply(&mut r).unwrap_err().to_string();
            assert!(msg.contains(says) && msg.contains("hint:"), "{flag}: {msg}");
        }
        let msg = plan.check_world_size(4).unwrap_err().to_string();
        assert!(
            msg.contains("`world_size` was 2") && msg.contains("now 4"),
            "{msg}"
        );
    }

    #[test]
    fn changed_optimization_settings_are_used_and_reported() {
        let plan = checkpoint(&saved_run());
        let mut r = resolve_args([
            "t",
            "--resume",
            "out/step-20",
            "--lr",
            "2e-3",
            "--warmup",
            "5",
            "--log-every",
            "3",
            "--lora-alpha",
            "16",
        ])
        .unwrap();
        let changes = plan.apply(&mut r).unwrap();
        assert_eq!(changes, ["lr 0.001 → 0.002 (flag)", "warmup 20 → 5 (flag)"]);
        assert_eq!(
            (r.config.lr, r.config.warmup, r.config.log_every),
            (2e-3, 5, 3)
        );
        assert_eq!(
            r.config.output,
            PathBuf::from("out"),
            "the checkpoint's folder"
        );
    }

    #[test]
    fn init_adapter_takes_its_shape_and_refuses_a_contradiction() {
        let mut adapter = LoraConfig::new(
            8,
            4.0,
            TargetModules::List(vec!["q_proj".into(), "v_proj".into()]),
        );
        adapter.lora_dropout = 0.0;
        let plan = StartPlan {
            start: Start::Adapter {
                dir: "init".into(),
                adapter,
            },
            claim: Claim::New { overwrite: false },
        };
        let mut r = resolve_args(["t", "--init-adapter", "init", "--lr", "5e-4"]).unwrap();
        plan.apply(&mut r).unwrap();
        let c = &r.config;
        assert_eq!(
            (c.lora_r, c.lora_alpha, c.lora_dropout, c.lr),
            (8, 4.0, 0.0, 5e-4)
        );
        assert_eq!(c.lora_targets, r"(?:.*\.)?(?:q_proj|v_proj)");
        assert!(r.table().contains("| lora_r ") && r.table().contains("8   (init)"));
        let mut r = resolve_args(["t", "--init-adapter", "init", "--lora-r", "16"]).unwrap();
        let msg = plan.apply(&mut r).unwrap_err().to_string();
        assert!(
            msg.contains("contradicts the adapter init, which has 8"),
            "{msg}"
        );
    }

    #[test]
    fn resume_with_init_adapter_or_overwrite_is_an_error() {
        let r = resolve_args(["t", "--resume", "a", "--init-adapter", "b"]).unwrap();
        let msg = plan(&r.config, &Launch::default()).unwrap_err().to_string();
        assert!(
            msg.contains("exclude each other") && msg.contains("hint:"),
            "{msg}"
        );
        let r = resolve_args(["t", "--resume", "latest", "--overwrite-output"]).unwrap();
        let msg = plan(&r.config, &Launch::default()).unwrap_err().to_string();
        assert!(msg.contains("--overwrite-output"), "{msg}");
        let out = std::env::temp_dir().join(format!("g4ft-resume-none-{}", std::process::id()));
        let r =
            resolve_args(["t", "--resume", "latest", "--output", out.to_str().unwrap()]).unwrap();
        let msg = plan(&r.config, &Launch::default()).unwrap_err().to_string();
        assert!(msg.contains("has no complete checkpoint"), "{msg}");
    }

    #[test]
    fn launch_reads_torchelastic_variables() {
        let l = Launch::from_env(|k| match k {
            "TORCHELASTIC_RESTART_COUNT" => Some("2".into()),
            "TORCHELASTIC_RUN_ID" => Some("job42".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!(
            (l.restart_count, l.launcher_run_id.as_deref()),
            (2, Some("job42"))
        );
        assert!(Launch::from_env(|_| Some("x".into())).is_err());
        let bare = Launch::from_env(|_| None).unwrap();
        assert_eq!((bare.restart_count, bare.launcher_run_id), (0, None));
        assert_eq!(bare.launcher_pid, std::os::unix::process::parent_id());
    }

    #[test]
    fn a_restart_knows_its_job_by_id_or_without_one_by_its_launcher() {
        let launch = |id: Option<&str>, pid| Launch {
            restart_count: 1,
            launcher_run_id: id.map(String::from),
            launcher_pid: pid,
        };
        let record = |id: Option<&str>, pid| RunRecord {
            launcher_run_id: id.map(String::from),
            launcher_pid: Some(pid),
            ..RunRecord::new(None, 0, "f".into())
        };
        assert!(launch(Some("a"), 1).started(&record(Some("a"), 2)));
        assert!(!launch(Some("b"), 1).started(&record(Some("a"), 1)));
        assert!(!launch(None, 1).started(&record(Some("a"), 1)));
        // torchrun's placeholder id is no id: the launcher process decides.
        assert!(launch(None, 7).started(&record(Some(NO_JOB_ID), 7)));
        assert!(!launch(None, 8).started(&record(Some(NO_JOB_ID), 7)));
        let other_host = RunRecord {
            host: "elsewhere".into(),
            ..record(None, 7)
        };
        assert!(!launch(None, 7).started(&other_host));
        let parsed = Launch::from_env(|k| (k == "TORCHELASTIC_RUN_ID").then(|| "none".into()));
        assert_eq!(parsed.unwrap().launcher_run_id, None);
    }
}
