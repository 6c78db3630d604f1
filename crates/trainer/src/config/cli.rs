//! The `train_ddp` command line and the resolution of every source of settings: defaults <
//! `--config` TOML < `MODEL_ID`/`DATA_PATH`/`OUTPUT_DIR` < flags; and [`ShapeArgs`], the shape
//! flags that the `bench_train` and `memory_plan` examples share.
//!
//! Every setting is defined once, in [`TrainConfig`]; this file only applies the sources in
//! order. The flags and the environment are clap's (which also reports where each value came
//! from), the TOML file is serde's reading of the same struct (unknown keys and wrong types name
//! the file and the line).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use candle_core::DType;
use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser};
use g4ft_gemma4::Recompute;

use crate::config::{settings, Origin, RecomputeKind, ResolvedConfig, TrainConfig};
use crate::error::{Error, Result};

/// LoRA fine-tuning of Gemma 4 with DDP: the post's `train_ddp.py`. Every flag overrides the TOML
/// key of the same name (dashes → underscores), which overrides the defaults (the post's
/// constants); MODEL_ID, DATA_PATH and OUTPUT_DIR override the file. Launch one process per device
/// with `ddprun` or `torchrun --no-python`.
#[derive(Debug, Clone, Parser)]
#[command(name = "train_ddp", version)]
pub struct Cli {
    /// TOML file with any of the settings below (keys = flag names with underscores).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The settings given as flags or environment variables (defaults elsewhere).
    #[command(flatten)]
    pub settings: TrainConfig,
}

/// The `train_ddp` command: [`Cli`]'s flags, each also accepted with underscores
/// (`--max_steps`, `--learning_rate`, as torchrun and transformers users type them), where an
/// environment override that is set but empty counts as unset (as the post's `os.environ.get`
/// with a default would treat a missing one).
pub fn command() -> clap::Command {
    Cli::command()
        .after_help(
            "Every flag may also be spelled with underscores: --max_steps, --learning_rate.",
        )
        .mut_args(|a| {
            let underscored: Vec<String> = a
                .get_long()
                .into_iter()
                .chain(a.get_all_aliases().unwrap_or_default())
                .filter(|name| name.contains('-'))
                .map(|name| name.replace('-', "_"))
                .collect();
            let a = a.aliases(underscored);
            let empty = a
                .get_env()
                .is_some_and(|var| std::env::var_os(var).is_some_and(|v| v.is_empty()));
            if empty {
                a.env(None::<&'static str>)
            } else {
                a
            }
        })
}

/// The process's arguments parsed with [`command`]; a bad flag prints clap's message and exits
/// (2), with a hint when the shell expanded an unquoted glob after `--data` or `--eval-data`
/// into several files (`--data shards/*.jsonl`).
pub fn get_matches() -> ArgMatches {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    command().try_get_matches_from(&args).unwrap_or_else(|e| {
        if let Some(hint) = expanded_glob_hint(&e, &args) {
            let _ = e.print();
            eprintln!("{hint}");
            std::process::exit(e.exit_code());
        }
        e.exit()
    })
}

/// The hint for `e` when it is an unexpected argument after `--data` / `--eval-data` and the
/// values there are existing files: what an unquoted glob expands to.
fn expanded_glob_hint(e: &clap::Error, args: &[std::ffi::OsString]) -> Option<String> {
    if e.kind() != clap::error::ErrorKind::UnknownArgument {
        return None;
    }
    let i = args
        .iter()
        .position(|a| a == "--data" || a == "--eval-data")?;
    let flag = args[i].to_string_lossy();
    let values = args[i + 1..]
        .iter()
        .take_while(|a| !a.to_string_lossy().starts_with('-'))
        .collect::<Vec<_>>();
    (values.len() > 1 && values.iter().all(|v| Path::new(v).exists())).then(|| {
        format!(
            "hint: {flag} takes one value, and the shell passed it {} files (an unquoted glob?): \
             quote the pattern ({flag} 'shards/*.jsonl') for train_ddp to match it, or pass \
             their folder",
            values.len()
        )
    })
}

/// Parses `args` (the program name first) with [`command`] and resolves them; `--help`,
/// `--version` and bad flags come back as [`Error::Flags`].
pub fn resolve_args<I, T>(args: I) -> Result<ResolvedConfig>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    resolve(&command().try_get_matches_from(args)?)
}

/// Applies every source (defaults < `--config` file < environment < flags) to the parsed command
/// line and validates the result.
pub fn resolve(matches: &ArgMatches) -> Result<ResolvedConfig> {
    let cli = Cli::from_arg_matches(matches)?;
    let (file_config, file_keys) = match &cli.config {
        Some(path) => read_toml_file(path)?,
        None => (TrainConfig::default(), Vec::new()),
    };
    let mut merged = to_object(&file_config);
    let given = to_object(&cli.settings);
    let mut origins = BTreeMap::new();
    for s in settings() {
        let origin = match matches.value_source(&s.name) {
            Some(ValueSource::CommandLine) => Origin::Flag,
            Some(ValueSource::EnvVariable) => {
                Origin::Env(s.env.clone().expect("an env value has a variable"))
            }
            _ => {
                if let (Some(path), true) = (&cli.config, file_keys.contains(&s.name)) {
                    origins.insert(s.name, Origin::File(path.clone()));
                }
                continue;
            }
        };
        merged.insert(s.name.clone(), given[&s.name].clone());
        origins.insert(s.name, origin);
    }
    let config = serde_json::from_value(serde_json::Value::Object(merged))
        .expect("values of one TrainConfig and another deserialize");
    let resolved = ResolvedConfig { config, origins };
    resolved.validate()?;
    Ok(resolved)
}

fn to_object(c: &TrainConfig) -> serde_json::Map<String, serde_json::Value> {
    match serde_json::to_value(c).expect("the config serializes") {
        serde_json::Value::Object(m) => m,
        _ => unreachable!("a struct serializes to an object"),
    }
}

/// Reads a TOML config file: the settings it gives on top of the defaults, and which keys it set.
/// Errors name the file and the line/column of the offending key (unknown keys list the valid
/// ones) or value (wrong type).
pub fn read_toml_file(path: &Path) -> Result<(TrainConfig, Vec<String>)> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::ConfigRead {
        path: path.to_path_buf(),
        source,
    })?;
    parse_toml(&text, path)
}

/// Parses TOML text as [`read_toml_file`] does; `path` is used in error messages only.
pub fn parse_toml(text: &str, path: &Path) -> Result<(TrainConfig, Vec<String>)> {
    let parse_error = |e: toml::de::Error| {
        let offset = e.span().map_or(0, |s| s.start);
        let (line, column) = line_col(text, offset);
        let message = e.message().trim();
        Error::ConfigParse {
            path: path.to_path_buf(),
            line,
            column,
            message: unknown_key(message).unwrap_or_else(|| message.to_string()),
        }
    };
    let config: TrainConfig = toml::from_str(text).map_err(parse_error)?;
    let keys = toml::from_str::<toml::Table>(text)
        .map_err(parse_error)?
        .keys()
        .cloned()
        .collect();
    Ok((config, keys))
}

/// For serde's "unknown field `k`, expected one of …" (which lists every setting), the message
/// that says what `k` should be: the setting written with `_`, the setting a transformers
/// spelling stands for, or the nearest setting's name.
fn unknown_key(message: &str) -> Option<String> {
    let key = message.strip_prefix("unknown field `")?.split('`').next()?;
    let flag = key.replace('_', "-");
    let known = settings();
    let meant = known
        .iter()
        .find(|s| s.name.replace('_', "-") == flag || s.aliases.contains(&flag))
        .or_else(|| {
            known
                .iter()
                .map(|s| (strsim::levenshtein(&s.name, key), s))
                .filter(|(d, _)| *d <= 2.max(key.len() / 4))
                .min_by_key(|(d, _)| *d)
                .map(|(_, s)| s)
        });
    Some(match meant {
        Some(s) => format!("unknown setting `{key}`: the key is `{}`", s.name),
        None => format!("unknown setting `{key}` (`--help` lists the settings; the keys are their names with `_`)"),
    })
}

/// 1-based (line, column) of a byte offset.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

/// `e` and its causes joined by `: `, as anyhow's `{:#}` prints them, less each cause whose text
/// ends the message before it: error types that print their source in their own message (some
/// of ours, many of our dependencies') would otherwise show it twice.
pub fn error_text(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let message = cause.to_string();
        if text.ends_with(&message) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&message);
    }
    text
}

/// How a binary ends: success, or one `error: …` line on stderr (the error and its causes,
/// [`error_text`], `prefix` first, e.g. `[rank 1] `) and a failure exit code. The backtrace is
/// added only when asked for twice: `RUST_BACKTRACE` set and `G4FT_DEBUG=1` (an ordinary error is
/// not a crash). A stderr that is gone (the launcher that read it was killed) still gives the
/// failure exit code, not a panic.
pub fn exit_code(prefix: &str, result: anyhow::Result<()>) -> std::process::ExitCode {
    use std::io::Write;
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            let debug = std::env::var_os("RUST_BACKTRACE").is_some_and(|v| v != "0")
                && std::env::var("G4FT_DEBUG").is_ok_and(|v| v == "1");
            let text = if debug {
                format!("{e:?}")
            } else {
                error_text(&e)
            };
            let _ = writeln!(std::io::stderr(), "{prefix}error: {text}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// The flags `bench_train` and `memory_plan` share (`#[command(flatten)]` in both): the model
/// config, the shape of one training micro-batch and the recompute policy (`train_ddp`'s
/// settings of the same names). Names and defaults are the ones `tools/gpu/*.sh` pass.
#[derive(Debug, Clone, clap::Args)]
pub struct ShapeArgs {
    /// Gemma 4 config.json (text or multimodal).
    #[arg(long)]
    pub config: PathBuf,
    /// Tokens per sample.
    #[arg(long, default_value_t = 2048)]
    pub seq: usize,
    /// Samples per micro-batch.
    #[arg(long, default_value_t = 1)]
    pub micro_batch: usize,
    /// LoRA rank.
    #[arg(long, default_value_t = 16)]
    pub lora_r: usize,
    /// Frozen weight / activation dtype: bf16 or f32.
    #[arg(long, default_value = "bf16")]
    pub dtype: String,
    /// Which layers the backward recomputes: all, none, or auto (as many kept as fit
    /// --memory-budget-gb).
    #[arg(long, value_enum, default_value_t = RecomputeKind::All)]
    pub recompute: RecomputeKind,
    /// With --recompute auto: the predicted peak memory may reach this many GB (10^9 bytes)
    /// (unset: as train_ddp, from the device's free memory).
    #[arg(long, value_name = "GB")]
    pub memory_budget_gb: Option<f64>,
    /// Keep the recomputed layers' inputs, block outputs and attention state in host memory
    /// between the forward and their backward, as much as the host's RAM holds (as train_ddp).
    #[arg(long)]
    pub offload_checkpoints: bool,
}

impl ShapeArgs {
    /// `--dtype` as a Candle dtype; anything but `bf16` or `f32` is an error naming the value.
    pub fn dtype(&self) -> anyhow::Result<DType> {
        match self.dtype.as_str() {
            "bf16" => Ok(DType::BF16),
            "f32" => Ok(DType::F32),
            other => anyhow::bail!("--dtype: expected bf16 or f32, got {other:?}"),
        }
    }

    /// `--recompute` and `--memory-budget-gb` as the model's policy
    /// ([`crate::metrics::memory::recompute_policy`]; `free_at_start` is asked only for `auto` without a
    /// budget). A budget must be a positive number and comes only with `auto`.
    pub fn recompute_policy(
        &self,
        free_at_start: impl FnOnce() -> anyhow::Result<u64>,
    ) -> anyhow::Result<Recompute> {
        if let Some(gb) = self.memory_budget_gb {
            if !(gb.is_finite() && gb > 0.0) {
                anyhow::bail!("--memory-budget-gb: expected a positive number of GB, got {gb}");
            }
            if self.recompute != RecomputeKind::Auto {
                anyhow::bail!("--memory-budget-gb is the budget of --recompute auto; add it");
            }
        }
        crate::metrics::memory::recompute_policy(
            self.recompute,
            self.memory_budget_gb,
            free_at_start,
        )
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn an_expanded_glob_after_data_gets_a_hint() {
        let sample = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/sample");
        let (a, b) = (sample.join("chat.jsonl"), sample.join("tokens.jsonl"));
        let args: Vec<std::ffi::OsString> = ["train_ddp", "--data"]
            .iter()
            .map(Into::into)
            .chain([a.into_os_string(), b.into_os_string()])
            .chain(["--max-steps".into(), "1".into()])
            .collect();
        let e = command().try_get_matches_from(&args).unwrap_err();
        let hint = expanded_glob_hint(&e, &args).expect("a hint");
        assert!(
            hint.starts_with("hint: --data takes one value, and the shell passed it 2 files"),
            "{hint}"
        );
        // A stray word that is no file is clap's error alone.
        let args: Vec<std::ffi::OsString> = ["train_ddp", "--data", "a.jsonl", "oops"]
            .iter()
            .map(Into::into)
            .collect();
        let e = command().try_get_matches_from(&args).unwrap_err();
        assert_eq!(expanded_glob_hint(&e, &args), None);
    }
    use super::*;
    use crate::config::{DTypeKind, DeviceKind, LabelsKind};
    use crate::step::schedule::LrSchedulerKind;

    #[test]
    fn error_text_shows_each_cause_once() {
        let read = || crate::Error::ConfigRead {
            path: "run.toml".into(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"),
        };
        // The variant prints its source itself: the chain's copy is left out.
        let e = anyhow::Error::new(read()).context("loading the settings");
        assert_eq!(
            error_text(&e),
            "loading the settings: config run.toml: cannot read: no such file"
        );
        assert!(format!("{e:#}").ends_with("no such file: no such file"));
        // Causes that their parents do not print stay.
        let e = anyhow::anyhow!("no such file")
            .context("step 3")
            .context("resume");
        assert_eq!(error_text(&e), "resume: step 3: no such file");
    }

    fn repo_config(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../configs")
            .join(name)
    }

    fn parse(text: &str) -> Result<(TrainConfig, Vec<String>)> {
        parse_toml(text, Path::new("run.toml"))
    }

    #[test]
    fn flags_parse_like_the_issue_lists_them() {
        let r = resolve_args([
            "train_ddp",
            "--model",
            "assets/tiny",
            "--labels",
            "assistant_only",
            "--no-shuffle",
            "--token-weighted-loss",
            "--dtype",
            "f32",
            "--device",
            "cpu",
            "--max-steps",
            "3",
            "--lr",
            "2e-4",
            "--lora-targets",
            ".*q_proj",
        ])
        .unwrap();
        let c = &r.config;
        assert_eq!(c.model, "assets/tiny");
        assert_eq!(c.labels, LabelsKind::AssistantOnly);
        assert!(!c.shuffle && c.token_weighted_loss);
        assert_eq!(
            (c.dtype, c.device, c.max_steps, c.lr),
            (DTypeKind::F32, DeviceKind::Cpu, Some(3), 2e-4)
        );
        assert_eq!(c.lora_targets, ".*q_proj");
        assert_eq!(
            (c.enable_thinking, c.packing, c.data_format),
            (None, false, None)
        );
        assert_eq!(r.origin("lr"), Origin::Flag);
        assert_eq!(r.origin("shuffle"), Origin::Flag);
        assert_eq!(r.origin("accum"), Origin::Default);
        let d = resolve_args([
            "t",
            "--enable-thinking",
            "--packing",
            "--data-format",
            "tokens",
        ])
        .unwrap();
        assert_eq!(d.config.enable_thinking, Some(true));
        assert_eq!(d.config.data_format, Some(g4ft_data::Format::Tokens));
        assert!(d.config.packing);
        let d = resolve_args(["t", "--enable-thinking", "false"]).unwrap();
        assert_eq!(d.config.enable_thinking, Some(false));
    }

    #[test]
    fn file_beats_default_and_flag_beats_file() {
        let path = repo_config("tiny-cpu.toml");
        let p = path.to_str().unwrap();
        let r = resolve_args(["t", "--config", p, "--output", "flag-out"]).unwrap();
        assert_eq!(
            r.config.output,
            PathBuf::from("flag-out"),
            "flag beats file"
        );
        assert_eq!(r.origin("output"), Origin::Flag);
        assert_eq!(r.config.max_len, 128, "file beats default");
        assert_eq!(r.origin("max_len"), Origin::File(path.clone()));
        assert_eq!(r.config.seed, 42, "default where nobody sets it");
        assert_eq!(r.origin("seed"), Origin::Default);
        // A switch given in the file stays on when the flag is absent.
        let dir = std::env::temp_dir().join(format!("g4ft-cli-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("switch.toml");
        std::fs::write(&file, "skip_bad_lines = true\nshuffle = false\n").unwrap();
        let r = resolve_args(["t", "--config", file.to_str().unwrap()]).unwrap();
        assert!(r.config.skip_bad_lines && !r.config.shuffle);
        assert_eq!(r.origin("shuffle"), Origin::File(file.clone()));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn shipped_configs_resolve() {
        let big = repo_config("gemma4-12b-lora.toml");
        let big = resolve_args(["t", "--config", big.to_str().unwrap()])
            .unwrap()
            .config;
        assert_eq!(
            big,
            TrainConfig::default(),
            "the 12B config restates the post's values"
        );
        let tiny = repo_config("tiny-cpu.toml");
        let tiny = resolve_args(["t", "--config", tiny.to_str().unwrap()])
            .unwrap()
            .config;
        assert_eq!((tiny.device, tiny.dtype), (DeviceKind::Cpu, DTypeKind::F32));
        assert_eq!(
            (tiny.micro_batch, tiny.accum, tiny.log_every, tiny.warmup),
            (2, 2, 1, 2)
        );
        assert_eq!(tiny.lr, 1e-3);
    }

    #[test]
    fn every_setting_is_a_flag_with_help_and_a_toml_key() {
        let cmd = command();
        let table = TrainConfig::default().rows();
        assert_eq!(table.len(), settings().len());
        for s in settings() {
            let arg = cmd
                .get_arguments()
                .find(|a| a.get_id() == s.name.as_str())
                .unwrap();
            assert!(arg.get_help().is_some(), "--{} has no help", s.name);
            assert!(arg.get_long().is_some(), "{} is not a long flag", s.name);
            // The TOML key is the field name: a file setting the key to its default parses.
            let (_, v) = table.iter().find(|(k, _)| *k == s.name).unwrap();
            let value = toml::Value::try_from(
                serde_json::to_value(TrainConfig::default()).unwrap()[&s.name].clone(),
            );
            if let Ok(value) = value {
                let text = format!("{} = {value}\n", s.name);
                let (c, keys) = parse(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
                assert_eq!(keys, vec![s.name.clone()]);
                assert_eq!(c, TrainConfig::default(), "{text} (table shows {v})");
            }
        }
    }

    #[test]
    fn transformers_spellings_with_dashes_or_underscores() {
        let r = resolve_args([
            "t",
            "--learning_rate",
            "3e-4",
            "--gradient-accumulation-steps",
            "4",
            "--per_device_train_batch_size",
            "2",
            "--num-train-epochs",
            "3",
            "--output_dir",
            "o",
            "--logging_steps",
            "5",
            "--save-steps",
            "50",
            "--max_steps",
            "100",
            "--lr_scheduler_type",
            "constant_with_warmup",
            "--warmup_ratio",
            "0.1",
            "--max_grad_norm",
            "0.5",
        ])
        .unwrap();
        let c = &r.config;
        assert_eq!((c.lr, c.accum, c.micro_batch, c.epochs), (3e-4, 4, 2, 3));
        assert_eq!(c.output, PathBuf::from("o"));
        assert_eq!(
            (c.log_every, c.save_every, c.max_steps),
            (5, Some(50), Some(100))
        );
        assert_eq!(c.lr_scheduler, LrSchedulerKind::ConstantWithWarmup);
        assert_eq!((c.warmup_ratio, c.max_grad_norm), (Some(0.1), 0.5));
        assert_eq!(r.origin("accum"), Origin::Flag);
        let r = resolve_args([
            "t",
            "--resume-from-checkpoint",
            "ck",
            "--lr-scheduler",
            "linear",
        ])
        .unwrap();
        assert_eq!(r.config.resume, Some(PathBuf::from("ck")));
        assert_eq!(r.config.lr_scheduler, LrSchedulerKind::Linear);
    }

    #[test]
    fn numeric_flags_are_range_checked() {
        for (flag, value, says) in [
            (
                "--collective-timeout-s",
                "18446744073709551615",
                "between 1 and 604800",
            ),
            ("--collective-timeout-s", "0", "between 1 and"),
            ("--lora-r", "100000", "at most 65536"),
            ("--lora-alpha", "0", "nothing would train"),
            ("--lr", "-1", "> 0"),
            ("--lora-dropout", "1", "[0, 1)"),
            ("--warmup-ratio", "1.5", "[0, 1]"),
            ("--max-len", "0", "at least 1"),
            ("--micro-batch", "100000000", "at most"),
            ("--max-steps", "0", "leave unset"),
            ("--bucket-cap-mb", "0", "> 0"),
        ] {
            let arg = format!("{flag}={value}");
            let msg = resolve_args(["t", &arg]).unwrap_err().to_string();
            assert!(
                msg.contains(says) && msg.contains("(set by flag)"),
                "{arg}: {msg}"
            );
        }
        for (flag, value) in [("--seed", "-1"), ("--lora-alpha", "nan"), ("--lr", "inf")] {
            let arg = format!("{flag}={value}");
            let msg = resolve_args(["t", &arg]).unwrap_err().to_string();
            assert!(msg.contains(flag), "{arg}: {msg}");
        }
        let msg = parse("lr = nan\n").unwrap_err().to_string();
        assert!(
            msg.contains("run.toml:1:") && msg.contains("finite"),
            "{msg}"
        );
        let msg = resolve_args(["t", "--warmup", "5", "--warmup-ratio", "0.1"])
            .unwrap_err()
            .to_string();
        assert!(msg.contains("not both"), "{msg}");
        resolve_args(["t", "--warmup-ratio", "0.1"]).unwrap();
    }

    #[test]
    fn toml_parses_known_keys_and_enums() {
        let (c, keys) = parse(
            "lr = 2e-4\nlabels = \"assistant_only\"\ndtype = \"f32\"\nmax_steps = 5\nlora_alpha = 16\n",
        )
        .unwrap();
        assert_eq!(c.lr, 2e-4);
        assert_eq!(c.labels, LabelsKind::AssistantOnly);
        assert_eq!(c.dtype, DTypeKind::F32);
        assert_eq!(c.max_steps, Some(5));
        assert_eq!(c.lora_alpha, 16.0, "integers are accepted for floats");
        assert_eq!(c.accum, 8, "unset keys keep the default");
        assert_eq!(keys.len(), 5);
    }

    #[test]
    fn toml_unknown_key_names_key_file_and_line() {
        let msg = parse("lr = 1e-4\n\nlearning_rat = 3e-4\n")
            .unwrap_err()
            .to_string();
        assert!(msg.starts_with("config run.toml:3:"), "{msg}");
        assert!(msg.contains("learning_rat"), "{msg}");
        for (key, says) in [
            (
                "learning_rate",
                "unknown setting `learning_rate`: the key is `lr`",
            ),
            (
                "max-steps",
                "unknown setting `max-steps`: the key is `max_steps`",
            ),
            ("per_device_train_batch_size", "the key is `micro_batch`"),
            ("lora_rr", "the key is `lora_r`"),
            (
                "flash",
                "unknown setting `flash` (`--help` lists the settings",
            ),
        ] {
            let msg = parse(&format!("{key} = 1\n")).unwrap_err().to_string();
            assert!(msg.ends_with(says) || msg.contains(says), "{key}: {msg}");
            assert!(!msg.contains("expected one of"), "{msg}");
        }
    }

    #[test]
    fn toml_wrong_type_names_line() {
        let msg = parse("seed = 1\naccum = \"eight\"\n")
            .unwrap_err()
            .to_string();
        assert!(msg.starts_with("config run.toml:2:"), "{msg}");
        let msg = parse("device = \"tpu\"\n").unwrap_err().to_string();
        assert!(msg.contains("tpu") && msg.contains("run.toml:1:"), "{msg}");
    }

    #[test]
    fn invalid_flag_value_is_reported_with_its_origin() {
        let msg = resolve_args(["t", "--accum", "0"]).unwrap_err().to_string();
        assert!(msg.contains("`accum` = 0 (set by flag)"), "{msg}");
        let msg = resolve_args(["t", "--accum", "x"]).unwrap_err().to_string();
        assert!(msg.contains("--accum"), "{msg}");
    }

    #[test]
    fn missing_config_file_names_the_path() {
        let msg = resolve_args(["t", "--config", "/nonexistent/x.toml"])
            .unwrap_err()
            .to_string();
        assert!(msg.contains("/nonexistent/x.toml"), "{msg}");
    }

    /// A command line with only the shared shape flags, as the examples flatten them.
    #[derive(Debug, Parser)]
    struct ShapeOnly {
        #[command(flatten)]
        shape: ShapeArgs,
    }

    #[test]
    fn shape_flags_keep_the_scripts_names_and_defaults() {
        let d = ShapeOnly::try_parse_from(["t", "--config", "c.json"])
            .unwrap()
            .shape;
        assert_eq!(d.config, PathBuf::from("c.json"));
        assert_eq!((d.seq, d.micro_batch, d.lora_r), (2048, 1, 16));
        assert_eq!(d.dtype().unwrap(), DType::BF16);
        let s = ShapeOnly::try_parse_from([
            "t",
            "--config",
            "c.json",
            "--seq",
            "64",
            "--micro-batch",
            "2",
            "--lora-r",
            "8",
            "--dtype",
            "f32",
        ])
        .unwrap()
        .shape;
        assert_eq!((s.seq, s.micro_batch, s.lora_r), (64, 2, 8));
        assert_eq!(s.dtype().unwrap(), DType::F32);
        assert!(
            ShapeOnly::try_parse_from(["t"]).is_err(),
            "--config is required"
        );
    }

    #[test]
    fn shape_dtype_names_the_rejected_value() {
        let s = ShapeOnly::try_parse_from(["t", "--config", "c.json", "--dtype", "f16"])
            .unwrap()
            .shape;
        let msg = s.dtype().unwrap_err().to_string();
        assert_eq!(msg, "--dtype: expected bf16 or f32, got \"f16\"");
    }
}
