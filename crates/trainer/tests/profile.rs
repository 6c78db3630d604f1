//! The step's observers on the tiny model (CPU, one rank, two micro-batches): the profiler
//! charges every layer's backward and hand-over once per micro-batch and the step's host-side
//! phases through `mark`; the overlap probe times the `no_sync` micro-batches and the exposed
//! communication; the all-reduce timing alone runs on the step's buckets.

use std::path::Path;

use candle_core::{DType, Device, Var};
use g4ft_data::Batch;
use g4ft_ddp::{DdpOptions, DistEnv, DistributedDataParallel, GroupOptions, ProcessGroup};
use g4ft_gemma4::{Gemma4Model, LayerType};
use g4ft_lora::{attach, lora_parameters, LoraConfig, TargetModules};
use g4ft_trainer::step::profile::{secs_between, CommAlone, OverlapProbe, Probes, Profiler};
use g4ft_trainer::step::{self, LossWeighting, StepObserver};

const ACCUM: usize = 2;

fn batch(micro: u32, vocab: u32) -> Batch {
    let (b, t) = (2, 12);
    let input_ids: Vec<u32> = (0..(b * t) as u32)
        .map(|i| (i * 7 + micro * 13) % vocab)
        .collect();
    Batch::full_rows(input_ids, b, t)
}

/// One step's window of `ACCUM` micro-batches through DDP, observed by `obs`.
fn window_step(
    model: &Gemma4Model,
    ddp: &mut DistributedDataParallel<'_>,
    micro_step: &mut u64,
    obs: &mut impl StepObserver,
) -> anyhow::Result<f64> {
    let vocab = model.config().vocab_size as u32;
    let window: Vec<Batch> = (0..ACCUM as u32).map(|k| batch(k, vocab)).collect();
    let weighting = LossWeighting::MeanPerMicroBatch { accum: ACCUM };
    step::accumulate_window(model, ddp, &window, weighting, 1, micro_step, obs)
}

#[test]
fn profiler_and_overlap_probe_observe_one_step() -> anyhow::Result<()> {
    let dev = Device::Cpu;
    let tiny = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/tiny");
    let mut model = Gemma4Model::load(tiny.to_str().expect("utf-8 path"), DType::F32, &dev)?;
    let targets = TargetModules::Regex(".*(q_proj|v_proj|down_proj)".into());
    attach(
        &LoraConfig::new(4, 8.0, targets),
        model.projections_mut(),
        1,
    )?;
    let params: Vec<(String, Var)> = lora_parameters(model.projections())
        .into_iter()
        .map(|p| (p.name, p.var))
        .collect();
    let group = ProcessGroup::new(DistEnv::single(), &dev, GroupOptions::default())?;
    let mut ddp = DistributedDataParallel::new(&group, params, DdpOptions::default())?;
    let cfg = model.config().clone();
    let mut micro_step = 0;

    let mut prof = Profiler::new(&dev, &cfg);
    prof.restart()?;
    let t0 = std::time::Instant::now();
    window_step(&model, &mut ddp, &mut micro_step, &mut prof)?;
    let (a, b) = (prof.mark()?, prof.mark()?);
    assert!(a.is_some() && b.is_some(), "the profiler measures");
    let probes = Probes::measure(&model, &batch(0, cfg.vocab_size as u32), 1)?;
    assert!(probes.loss_s > 0.0 && probes.head_s > 0.0 && probes.loss_host_s > 0.0);
    let table = prof.finish(&probes, secs_between(a, b), 0.0, t0.elapsed().as_secs_f64());
    let layers = cfg.layers.len();
    let calls = |prefix: &str| {
        let row = table.rows.iter().find(|r| r.name.starts_with(prefix));
        row.unwrap_or_else(|| panic!("a row {prefix:?}")).calls
    };
    let full = cfg
        .layers
        .iter()
        .filter(|l| l.layer_type == LayerType::Full)
        .count();
    assert_eq!(calls("backward sliding"), (layers - full) * ACCUM);
    assert_eq!(calls("backward full"), full * ACCUM);
    assert_eq!(calls("grad accumulation"), layers * ACCUM);
    assert_eq!(calls("forward"), ACCUM);
    assert_eq!(table.micro, ACCUM);
    assert!(table.render().contains("step wall (synchronised)"));
    assert!(table.note.contains("the forward probe"), "{}", table.note);
    let sum: f64 = table.rows.iter().map(|r| r.total_s).sum();
    assert!(
        sum > 0.0 && sum <= table.wall_s * 1.5,
        "the rows split the measured step"
    );
    assert_eq!(table.json()["rows"].as_array().map(Vec::len), Some(9));

    let mut probe = OverlapProbe::new(&dev, ACCUM);
    window_step(&model, &mut ddp, &mut micro_step, &mut probe)?;
    assert_eq!(
        probe.mark()?,
        None,
        "the overlap probe leaves the host phases alone"
    );
    assert!(probe.exposed_s >= 0.0);
    let alone = CommAlone::measure(&ddp, &dev)?;
    let report = probe.report(&alone, &[probe.exposed_s]);
    assert!(report.starts_with("OVERLAP world 1:"), "{report}");
    assert!(report.contains("OVERLAP_JSON"), "{report}");
    Ok(())
}
