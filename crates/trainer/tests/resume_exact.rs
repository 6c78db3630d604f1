//! Stop after k optimizer steps, checkpoint atomically, resume, finish: the parameters, moments
//! and learning rates must be bit-identical to an uninterrupted run (the optimizer/schedule half
//! of the resume acceptance; the model half lives in the example's test).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor, Var};
use g4ft_trainer::checkpoint::state::{
    config_fingerprint, RngState, SamplerPosition, TrainerState, STATE_FORMAT,
};
use g4ft_trainer::checkpoint::{latest_complete_checkpoint, write_checkpoint_atomic};
use g4ft_trainer::step::clip::{clip_coef, grad_norm};
use g4ft_trainer::step::optim::{AdamW, AdamWParams, FlatBucket};
use g4ft_trainer::step::schedule::LrSchedule;
use g4ft_trainer::TrainConfig;

const STEPS: u64 = 8;
const STOP_AT: u64 = 3;
const BUCKETS: [&[usize]; 2] = [&[6, 4], &[5]]; // parameter sizes per bucket

/// Deterministic "gradients" for step `t` (stand-in for an all-reduced backward pass).
fn grads(t: u64, dev: &Device) -> Vec<Tensor> {
    BUCKETS
        .iter()
        .enumerate()
        .map(|(b, sizes)| {
            let n: usize = sizes.iter().sum();
            let v: Vec<f32> = (0..n)
                .map(|i| ((t * 31 + b as u64 * 7 + i as u64) as f32 * 0.7).sin() * 3.0)
                .collect();
            Tensor::from_vec(v, n, dev).unwrap()
        })
        .collect()
}

fn fresh_params(dev: &Device) -> Vec<Vec<Var>> {
    BUCKETS
        .iter()
        .map(|sizes| {
            sizes
                .iter()
                .enumerate()
                .map(|(k, &n)| {
                    let v: Vec<f32> = (0..n).map(|i| ((k * 13 + i) as f32 * 0.3).cos()).collect();
                    Var::from_vec(v, n, dev).unwrap()
                })
                .collect()
        })
        .collect()
}

struct Run {
    params: Vec<Vec<Var>>,
    opt: AdamW,
    sched: LrSchedule,
    step: u64,
    lrs: Vec<f64>,
}

impl Run {
    fn new(dev: &Device) -> Self {
        let lens: Vec<usize> = BUCKETS.iter().map(|s| s.iter().sum()).collect();
        Self {
            params: fresh_params(dev),
            opt: AdamW::new(AdamWParams::with_weight_decay(0.01), &lens, dev).unwrap(),
            sched: LrSchedule::cosine(1e-2, 2, STEPS),
            step: 0,
            lrs: Vec::new(),
        }
    }

    fn train_until(&mut self, last: u64, dev: &Device) {
        while self.step < last {
            self.step += 1;
            let g = grads(self.step, dev);
            let coef = clip_coef(grad_norm(&g).unwrap(), 1.0);
            let lr = self.sched.lr();
            let buckets: Vec<FlatBucket> = self
                .params
                .iter()
                .zip(&g)
                .map(|(p, g)| FlatBucket {
                    params: p,
                    grads: g,
                })
                .collect();
            self.opt.step(lr, coef, &buckets).unwrap();
            self.sched.advance();
            self.lrs.push(lr);
        }
    }

    fn values(&self) -> Vec<Vec<u32>> {
        self.params
            .iter()
            .flatten()
            .map(|v| {
                v.as_tensor()
                    .to_vec1::<f32>()
                    .unwrap()
                    .iter()
                    .map(|x| x.to_bits())
                    .collect()
            })
            .collect()
    }

    fn save(&self, out: &Path, cfg: &TrainConfig) {
        let state = TrainerState {
            format: STATE_FORMAT,
            run_id: "run-test".into(),
            step: self.step,
            epoch: 0,
            sampler: SamplerPosition {
                epoch: 0,
                micro_batches: self.step * 2,
            },
            scheduler: self.sched,
            optimizer_step: self.opt.step_count(),
            skipped_in_a_row: 0,
            rng: RngState {
                seed: 42,
                micro_step: self.step * 2,
            },
            world_size: 1,
            config_fingerprint: config_fingerprint(cfg),
            config: cfg.clone(),
        };
        let adapter: HashMap<String, Tensor> = self
            .params
            .iter()
            .flatten()
            .enumerate()
            .map(|(i, v)| (format!("p{i}"), v.as_tensor().clone()))
            .collect();
        write_checkpoint_atomic(
            out,
            &format!("step-{}", self.step),
            self.step,
            "run-test",
            |dir| {
                candle_core::safetensors::save(&adapter, dir.join("adapter_model.safetensors"))?;
                state.save(dir, &self.opt.state_tensors())?;
                Ok(())
            },
        )
        .unwrap();
    }

    fn resume(out: &Path, cfg: &TrainConfig, dev: &Device) -> Self {
        let info = latest_complete_checkpoint(out)
            .unwrap()
            .expect("a checkpoint was written");
        let state = TrainerState::read(&info.dir).unwrap();
        let moments = TrainerState::read_moments(&info.dir, dev).unwrap();
        assert_eq!(&state.config, cfg, "the settings come back as saved");
        let adapter =
            candle_core::safetensors::load(info.dir.join("adapter_model.safetensors"), dev)
                .unwrap();
        let mut run = Run::new(dev);
        for (i, v) in run.params.iter().flatten().enumerate() {
            v.set(&adapter[&format!("p{i}")]).unwrap();
        }
        run.opt.load_state(state.optimizer_step, &moments).unwrap();
        run.sched = state.scheduler;
        run.step = state.step;
        run
    }
}

#[test]
fn stop_save_resume_is_bit_identical() {
    let dev = Device::Cpu;
    let cfg = TrainConfig::default();
    let out: PathBuf = std::env::temp_dir().join(format!("g4ft-resume-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);

    let mut full = Run::new(&dev);
    full.train_until(STEPS, &dev);

    let mut first = Run::new(&dev);
    first.train_until(STOP_AT, &dev);
    first.save(&out, &cfg);
    drop(first);
    let mut resumed = Run::resume(&out, &cfg, &dev);
    resumed.train_until(STEPS, &dev);

    assert_eq!(
        resumed.values(),
        full.values(),
        "parameters differ after resume"
    );
    assert_eq!(
        resumed.lrs,
        full.lrs[STOP_AT as usize..],
        "learning rates differ after resume"
    );
    for ((name, a), (_, b)) in resumed
        .opt
        .state_tensors()
        .iter()
        .zip(full.opt.state_tensors())
    {
        assert_eq!(
            a.to_vec1::<f32>().unwrap(),
            b.to_vec1::<f32>().unwrap(),
            "{name}"
        );
    }
    std::fs::remove_dir_all(&out).unwrap();
}
