//! The trainer state saved beside the adapter in each checkpoint.
//!
//! Two files (the post's `trainer_state.pt`, split so that no pickle is involved):
//! - [`STATE_FILE`] (JSON): run id, step, epoch, sampler position, scheduler, RNG seed and
//!   counters, world size, and the resolved settings plus their fingerprint;
//! - [`OPTIMIZER_FILE`] (safetensors): the AdamW moments, `exp_avg.{bucket}` and
//!   `exp_avg_sq.{bucket}`, flat fp32 in the bucket layout.
//!
//! What a resumed run does with the saved settings is [`crate::checkpoint::resume`]'s business.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};
use g4ft_hash::Fnv1a64;
use serde::{Deserialize, Serialize};

use crate::config::{settings, ResumeRule, TrainConfig};
use crate::error::{Error, Result};
use crate::step::schedule::LrSchedule;

/// JSON file with the [`TrainerState`].
pub const STATE_FILE: &str = "trainer_state.json";
/// safetensors file with the optimizer moments.
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
/// Version of the state format; bumped on incompatible changes.
pub const STATE_FORMAT: u32 = 2;

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
    /// The run that wrote it (see [`crate::checkpoint::run_dir`]).
    pub run_id: String,
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
    /// The resolved settings of the run.
    pub config: TrainConfig,
}

/// The settings that affect the math, as `(name, value)` rows: every setting whose
/// [`ResumeRule`] is not free run control.
pub fn math_settings(config: &TrainConfig) -> Vec<(String, String)> {
    let math: Vec<String> = settings()
        .into_iter()
        .filter(|s| !matches!(s.resume_rule(), ResumeRule::Free | ResumeRule::NotInherited))
        .map(|s| s.name)
        .collect();
    config
        .rows()
        .into_iter()
        .filter(|(k, _)| math.contains(k))
        .collect()
}

/// Stable hash (FNV-1a, 64 bit, hex) of [`math_settings`]. Equal fingerprints mean the same
/// training.
pub fn config_fingerprint(config: &TrainConfig) -> String {
    let mut h = Fnv1a64::default();
    for (k, v) in math_settings(config) {
        h.update(format!("{k}={v}\n").as_bytes());
    }
    format!("{:016x}", h.finish())
}

impl TrainerState {
    /// Writes [`STATE_FILE`] and [`OPTIMIZER_FILE`] into `dir` (normally the temporary directory
    /// of [`crate::checkpoint::write_checkpoint_atomic`]). `moments` is
    /// [`crate::step::optim::AdamW::state_tensors`].
    pub fn save(&self, dir: &Path, moments: &[(String, Tensor)]) -> Result<()> {
        let path = dir.join(STATE_FILE);
        let json = serde_json::to_vec_pretty(self).expect("the trainer state serializes");
        std::fs::write(&path, json).map_err(|source| Error::CheckpointIo {
            path: path.clone(),
            op: "write".into(),
            source,
        })?;
        let path = dir.join(OPTIMIZER_FILE);
        g4ft_lora::write_safetensors(&path, moments.to_vec()).map_err(|e| {
            Error::CheckpointInvalid {
                path,
                reason: format!("cannot write the optimizer moments: {e}"),
                hint: "check free disk space and permissions of the output directory",
            }
        })
    }

    /// Reads [`STATE_FILE`] of checkpoint `dir`.
    pub fn read(dir: &Path) -> Result<Self> {
        let path = dir.join(STATE_FILE);
        let text = std::fs::read_to_string(&path).map_err(|e| Error::CheckpointInvalid {
            path: path.clone(),
            reason: format!("cannot read the trainer state: {e}"),
            hint: "--resume needs a checkpoint written by train_ddp (adapter + trainer state); \
                   to start from a bare PEFT adapter use --init-adapter",
        })?;
        let format = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| v["format"].as_u64());
        if format != Some(STATE_FORMAT as u64) {
            return Err(Error::CheckpointInvalid {
                path,
                reason: format!(
                    "state format {}, this build reads {STATE_FORMAT}",
                    format.map_or_else(|| "unknown".into(), |f| f.to_string())
                ),
                hint: "resume with the version of train_ddp that wrote the checkpoint, or start \
                       a new run from its adapter with --init-adapter",
            });
        }
        serde_json::from_str(&text).map_err(|e| Error::CheckpointInvalid {
            path: path.clone(),
            reason: format!("unreadable trainer state: {e}"),
            hint: "the file was edited, truncated, or written by an incompatible version",
        })
    }

    /// Reads the optimizer moments of checkpoint `dir` onto `device`.
    pub fn read_moments(dir: &Path, device: &Device) -> Result<HashMap<String, Tensor>> {
        let path = dir.join(OPTIMIZER_FILE);
        candle_core::safetensors::load(&path, device).map_err(|e| Error::CheckpointInvalid {
            path,
            reason: format!("cannot read the optimizer moments: {e}"),
            hint: "the checkpoint is incomplete; resume from an older checkpoint",
        })
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
            run_id: "run-1".into(),
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
            config: config.clone(),
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
        let back = TrainerState::read(&dir).unwrap();
        let moments = TrainerState::read_moments(&dir, &Device::Cpu).unwrap();
        assert_eq!(back, s);
        assert_eq!(
            moments["exp_avg.0"].to_vec1::<f32>().unwrap(),
            vec![0.5, -1.0, 2.0]
        );
        assert_eq!(moments["exp_avg_sq.0"].dtype(), DType::F32);

        std::fs::remove_file(dir.join(OPTIMIZER_FILE)).unwrap();
        let msg = TrainerState::read_moments(&dir, &Device::Cpu)
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains(OPTIMIZER_FILE) && msg.contains("hint:"),
            "{msg}"
        );
        std::fs::remove_dir_all(&dir).unwrap();

        let msg = TrainerState::read(&dir).unwrap_err().to_string();
        assert!(msg.contains("--init-adapter"), "{msg}");
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
        let d = TrainConfig {
            max_steps: Some(9),
            ..a.clone()
        };
        assert_eq!(config_fingerprint(&a), config_fingerprint(&b));
        assert_ne!(config_fingerprint(&a), config_fingerprint(&c));
        assert_ne!(
            config_fingerprint(&a),
            config_fingerprint(&d),
            "max_steps shapes the schedule"
        );
    }
}
