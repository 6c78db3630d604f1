//! The trainer state saved beside the adapter in each checkpoint, and the resume comparison.
//!
//! Two files (the post's `trainer_state.pt`, split so that no pickle is involved):
//! - [`STATE_FILE`] (JSON): step, epoch, sampler position, scheduler, RNG seed and counters,
//!   world size, and the resolved config as `field → value` rows plus their fingerprint;
//! - [`OPTIMIZER_FILE`] (safetensors): the AdamW moments, `exp_avg.{bucket}` and
//!   `exp_avg_sq.{bucket}`, flat fp32 in the bucket layout.
//!
//! On resume the current config is compared with the saved rows ([`TrainerState::check_resume`]):
//! a changed world size or micro-batch is an error (the sampler position would point elsewhere);
//! any other difference is a warning saying that this run's value wins, as torchtune's
//! `_update_recipe_state` does.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use candle_core::{Device, Tensor};
use g4ft_hash::Fnv1a64;
use serde::{Deserialize, Serialize};

use crate::config::TrainConfig;
use crate::error::{Error, Result};
use crate::schedule::LrSchedule;

/// JSON file with the [`TrainerState`].
pub const STATE_FILE: &str = "trainer_state.json";
/// safetensors file with the optimizer moments.
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
/// Version of the state format; bumped on incompatible changes.
pub const STATE_FORMAT: u32 = 1;

/// Config fields that may change between a run and its resumption without a warning (where to
/// write, how often to log, how long to run).
const RUN_CONTROL_FIELDS: [&str; 10] = [
    "output",
    "resume",
    "max_steps",
    "log_every",
    "save_every",
    "eval_every",
    "collective_timeout_s",
    "on_nonfinite",
    "max_nonfinite_skips",
    "peak_tflops",
];

/// Where the data order stands: the DistributedSampler of `epoch` (shuffled with `seed + epoch`)
/// after this rank consumed `micro_batches` micro-batches of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SamplerPosition {
    /// Epoch whose order is in use.
    pub epoch: usize,
    /// Micro-batches already consumed per rank in that epoch (a multiple of `accum`).
    pub micro_batches: u64,
}

/// Randomness to replay: LoRA dropout masks are a function of `(seed + rank, micro_step)`, data
/// shuffling of `(seed, epoch)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RngState {
    /// The run's seed.
    pub seed: u64,
    /// Micro-steps taken so far (the dropout counter).
    pub micro_step: u64,
}

/// Everything besides the adapter and the moments that an exact resume needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainerState {
    /// [`STATE_FORMAT`] at write time.
    pub format: u32,
    /// Optimizer steps completed (global, over all epochs).
    pub step: u64,
    /// Epoch in progress (the next one after an epoch-end checkpoint).
    pub epoch: usize,
    /// Data position.
    pub sampler: SamplerPosition,
    /// The schedule, including its step counter.
    pub scheduler: LrSchedule,
    /// AdamW's step counter (bias corrections); differs from `step` after skipped steps.
    pub optimizer_step: u64,
    /// Non-finite steps skipped directly before this checkpoint.
    pub skipped_in_a_row: usize,
    /// Seeds and counters.
    pub rng: RngState,
    /// Ranks of the run that wrote it.
    pub world_size: usize,
    /// [`config_fingerprint`] of `config`.
    pub config_fingerprint: String,
    /// The resolved config, `field → value` as in the startup table.
    pub config: BTreeMap<String, String>,
}

/// Stable hash (FNV-1a, 64 bit, hex) of the config rows that affect the math, i.e. all but the
/// run-control fields. Equal fingerprints mean a resume sees the same settings.
pub fn config_fingerprint(config: &TrainConfig) -> String {
    let mut h = Fnv1a64::default();
    for (k, v) in config.rows() {
        if RUN_CONTROL_FIELDS.contains(&k.as_str()) {
            continue;
        }
        h.update(format!("{k}={v}\n").as_bytes());
    }
    format!("{:016x}", h.finish())
}

/// Rows of the config as stored in the state.
pub fn config_rows(config: &TrainConfig) -> BTreeMap<String, String> {
    config
        .rows()
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
}

impl TrainerState {
    /// Writes [`STATE_FILE`] and [`OPTIMIZER_FILE`] into `dir` (normally the temporary directory
    /// of [`crate::checkpoint::write_checkpoint_atomic`]). `moments` is
    /// [`crate::optim::AdamW::state_tensors`].
    pub fn save(&self, dir: &Path, moments: &[(String, Tensor)]) -> Result<()> {
        let path = dir.join(STATE_FILE);
        let json = serde_json::to_vec_pretty(self).expect("the trainer state serializes");
        std::fs::write(&path, json).map_err(|source| Error::CheckpointIo {
            path: path.clone(),
            op: "write".into(),
            source,
        })?;
        let path = dir.join(OPTIMIZER_FILE);
        let map: HashMap<String, Tensor> = moments.iter().cloned().collect();
        candle_core::safetensors::save(&map, &path).map_err(|e| Error::CheckpointInvalid {
            path,
            reason: format!("cannot write the optimizer moments: {e}"),
            hint: "check free disk space and permissions of the output directory",
        })
    }

    /// Reads the state and the optimizer moments (onto `device`) from checkpoint `dir`.
    pub fn load(dir: &Path, device: &Device) -> Result<(Self, HashMap<String, Tensor>)> {
        let path = dir.join(STATE_FILE);
        let text = std::fs::read_to_string(&path).map_err(|e| Error::CheckpointInvalid {
            path: path.clone(),
            reason: format!("cannot read the trainer state: {e}"),
            hint: "--resume needs a checkpoint written by train_ddp (adapter + trainer state); \
                   to start from a bare PEFT adapter use --init-adapter",
        })?;
        let state: TrainerState =
            serde_json::from_str(&text).map_err(|e| Error::CheckpointInvalid {
                path: path.clone(),
                reason: format!("unreadable trainer state: {e}"),
                hint: "the file was edited, truncated, or written by an incompatible version",
            })?;
        if state.format != STATE_FORMAT {
            return Err(Error::CheckpointInvalid {
                path,
                reason: format!(
                    "state format {}, this build reads {STATE_FORMAT}",
                    state.format
                ),
                hint: "resume with the version of train_ddp that wrote the checkpoint",
            });
        }
        let path = dir.join(OPTIMIZER_FILE);
        let moments = candle_core::safetensors::load(&path, device).map_err(|e| Error::CheckpointInvalid {
            path,
            reason: format!("cannot read the optimizer moments: {e}"),
            hint: "the checkpoint is incomplete; use latest_complete_checkpoint or an older checkpoint",
        })?;
        Ok((state, moments))
    }

    /// Compares the saved config with this run's. Returns one warning per changed field
    /// ("this run's value wins"); errors if the world size or the micro-batch changed, because
    /// the saved sampler position counts per-rank micro-batches. `dir` is used in messages.
    pub fn check_resume(
        &self,
        dir: &Path,
        current: &TrainConfig,
        world_size: usize,
    ) -> Result<Vec<String>> {
        let mismatch = |field: &'static str, saved: String, current: String| {
            Error::ResumeMismatch {
            path: dir.to_path_buf(),
            field,
            saved,
            current,
            hint: "the saved data position counts micro-batches per rank; resume with the same number of \
                   processes and --micro-batch, or start a new run from the adapter with --init-adapter",
        }
        };
        if world_size != self.world_size {
            return Err(mismatch(
                "world_size",
                self.world_size.to_string(),
                world_size.to_string(),
            ));
        }
        let now = config_rows(current);
        if let (Some(saved), Some(cur)) = (self.config.get("micro_batch"), now.get("micro_batch")) {
            if saved != cur {
                return Err(mismatch("micro_batch", saved.clone(), cur.clone()));
            }
        }
        if config_fingerprint(current) == self.config_fingerprint {
            return Ok(Vec::new());
        }
        let mut warnings = Vec::new();
        for (field, cur) in &now {
            if RUN_CONTROL_FIELDS.contains(&field.as_str()) {
                continue;
            }
            match self.config.get(field) {
                Some(saved) if saved != cur => warnings.push(format!(
                    "resume: `{field}` was {saved} in {}, now {cur}; using {cur} (this run)",
                    dir.display()
                )),
                None => warnings.push(format!(
                    "resume: `{field}` is not in the checkpoint's config; using {cur} (this run)"
                )),
                _ => {}
            }
        }
        Ok(warnings)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::DType;

    fn state(config: &TrainConfig, world_size: usize) -> TrainerState {
        let mut scheduler = LrSchedule::cosine(config.lr, config.warmup as u64, 100);
        (0..7).for_each(|_| scheduler.advance());
        TrainerState {
            format: STATE_FORMAT,
            step: 7,
            epoch: 0,
            sampler: SamplerPosition {
                epoch: 0,
                micro_batches: 56,
            },
            scheduler,
            optimizer_step: 7,
            skipped_in_a_row: 0,
            rng: RngState {
                seed: config.seed,
                micro_step: 56,
            },
            world_size,
            config_fingerprint: config_fingerprint(config),
            config: config_rows(config),
        }
    }

    #[test]
    fn save_load_roundtrip() {
        let dir = std::env::temp_dir().join(format!("g4ft-state-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let cfg = TrainConfig::default();
        let s = state(&cfg, 2);
        let m = Tensor::new(&[0.5f32, -1.0, 2.0], &Device::Cpu).unwrap();
        let v = Tensor::new(&[0.25f32, 1.0, 4.0], &Device::Cpu).unwrap();
        s.save(&dir, &[("exp_avg.0".into(), m), ("exp_avg_sq.0".into(), v)])
            .unwrap();
        let (back, moments) = TrainerState::load(&dir, &Device::Cpu).unwrap();
        assert_eq!(back, s);
        assert_eq!(
            moments["exp_avg.0"].to_vec1::<f32>().unwrap(),
            vec![0.5, -1.0, 2.0]
        );
        assert_eq!(moments["exp_avg_sq.0"].dtype(), DType::F32);

        std::fs::remove_file(dir.join(OPTIMIZER_FILE)).unwrap();
        let msg = TrainerState::load(&dir, &Device::Cpu)
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains(OPTIMIZER_FILE) && msg.contains("hint:"),
            "{msg}"
        );
        std::fs::remove_dir_all(&dir).unwrap();

        let msg = TrainerState::load(&dir, &Device::Cpu)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("--init-adapter"), "{msg}");
    }

    #[test]
    fn resume_warns_which_value_wins() {
        let cfg = TrainConfig::default();
        let s = state(&cfg, 8);
        assert!(s.check_resume(Path::new("ck"), &cfg, 8).unwrap().is_empty());

        let changed = TrainConfig {
            lr: 2e-4,
            max_steps: Some(99),
            output: "elsewhere".into(),
            ..cfg.clone()
        };
        let w = s.check_resume(Path::new("ck"), &changed, 8).unwrap();
        assert_eq!(
            w,
            vec!["resume: `lr` was 0.0001 in ck, now 0.0002; using 0.0002 (this run)".to_string()]
        );
    }

    #[test]
    fn resume_rejects_a_different_data_layout() {
        let cfg = TrainConfig::default();
        let s = state(&cfg, 8);
        let msg = s
            .check_resume(Path::new("ck"), &cfg, 4)
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("`world_size` was 8") && msg.contains("now 4"),
            "{msg}"
        );
        let mb = TrainConfig {
            micro_batch: 2,
            ..cfg
        };
        let msg = s
            .check_resume(Path::new("ck"), &mb, 8)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("`micro_batch` was 1"), "{msg}");
    }

    #[test]
    fn fingerprint_ignores_run_control_only() {
        let a = TrainConfig::default();
        let b = TrainConfig {
            log_every: 1,
            output: "x".into(),
            ..a.clone()
        };
        let c = TrainConfig {
            seed: 1,
            ..a.clone()
        };
        assert_eq!(config_fingerprint(&a), config_fingerprint(&b));
        assert_ne!(config_fingerprint(&a), config_fingerprint(&c));
    }
}
