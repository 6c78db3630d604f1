//! `Gemma4Model::random_init`: a model built from a config alone has the checkpoint's module
//! paths and shapes, runs forward / loss / layer-wise backward, and repeats for a seed.

use candle_core::{DType, Device, Tensor, Var};
use g4ft_gemma4::{Config, Gemma4Model, TokenBatch};
use g4ft_lora::{Adapter, LoraContext};

fn tiny_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/tiny")
}

fn tiny_config() -> Config {
    Config::from_file(tiny_dir().join("config.json")).unwrap()
}

#[test]
fn paths_and_shapes_match_the_checkpoint_model() {
    let cfg = tiny_config();
    let random = Gemma4Model::random_init(&cfg, DType::F32, &Device::Cpu, 1).unwrap();
    let loaded = Gemma4Model::load(tiny_dir().to_str().unwrap(), DType::F32, &Device::Cpu).unwrap();
    assert_eq!(random.prefix(), "model.language_model");
    let shapes = |m: &Gemma4Model| {
        m.projections()
            .map(|p| (p.path().to_string(), p.weight().dims().to_vec()))
            .collect::<Vec<_>>()
    };
    assert_eq!(shapes(&random), shapes(&loaded));
    assert_eq!(
        random.projections().next().unwrap().path(),
        "model.language_model.layers.0.self_attn.q_proj"
    );
}

#[test]
fn forward_loss_and_backward_run_and_repeat_for_a_seed() {
    let cfg = tiny_config();
    let (b, t, v) = (2, 12, cfg.vocab_size);
    let ids: Vec<u32> = (0..b * t).map(|i| (3 + 37 * i % (v - 3)) as u32).collect();
    let labels: Vec<i64> = ids.iter().map(|&x| x as i64).collect();
    let batch = TokenBatch {
        input_ids: &ids,
        attention_mask: None,
        position_ids: None,
        batch: b,
        seq_len: t,
    };
    let mut model = Gemma4Model::random_init(&cfg, DType::F32, &Device::Cpu, 5).unwrap();
    let logits = model.forward(&batch, &LoraContext::EVAL).unwrap();
    assert_eq!(logits.dims(), &[b, t, v]);
    let again = Gemma4Model::random_init(&cfg, DType::F32, &Device::Cpu, 5).unwrap();
    let logits2 = again.forward(&batch, &LoraContext::EVAL).unwrap();
    let diff = (&logits - &logits2)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap();
    assert_eq!(diff.to_scalar::<f32>().unwrap(), 0.0);

    // Small random weights: the loss is near ln(V) and finite.
    let loss = model.loss(&batch, &labels, &LoraContext::EVAL).unwrap();
    let mean = loss.sum.to_scalar::<f32>().unwrap() as f64 / loss.n_tokens as f64;
    assert!((mean - (v as f64).ln()).abs() < 0.5, "loss {mean} vs ln V");

    // Adapters with nonzero B on every projection get finite, nonzero gradients.
    let mut vars = Vec::new();
    for p in model.projections_mut() {
        let (o, i) = (p.out_features(), p.in_features());
        let a = Var::from_tensor(&Tensor::randn(0f32, 0.1, (2, i), &Device::Cpu).unwrap()).unwrap();
        let bv =
            Var::from_tensor(&Tensor::randn(0f32, 0.1, (o, 2), &Device::Cpu).unwrap()).unwrap();
        p.set_adapter(Some(Adapter {
            a: a.clone(),
            b: bv.clone(),
            scale: 2.0,
            dropout: 0.0,
        }));
        vars.push(a);
        vars.push(bv);
    }
    let ctx = LoraContext {
        training: true,
        track_grad: true,
        seed: 0,
        micro_step: 0,
    };
    let mut seen = Vec::new();
    let mut n_grads = 0;
    let stats = model
        .forward_backward(&batch, &labels, &ctx, 1.0, |i, g| {
            seen.push(i);
            for var in &vars {
                if let Some(gr) = g.get(var) {
                    let s = gr.abs()?.sum_all()?.to_scalar::<f32>()?;
                    assert!(s.is_finite() && s > 0.0, "layer {i}: grad sum {s}");
                    n_grads += 1;
                }
            }
            Ok::<(), g4ft_gemma4::Error>(())
        })
        .unwrap();
    assert_eq!(seen, (0..cfg.num_hidden_layers).rev().collect::<Vec<_>>());
    assert_eq!(n_grads, vars.len());
    let with_adapters = model.loss(&batch, &labels, &LoraContext::EVAL).unwrap();
    let want = with_adapters.sum.to_scalar::<f32>().unwrap() as f64 / with_adapters.n_tokens as f64;
    let mean = stats.mean().unwrap();
    assert!((mean - want).abs() < 1e-4, "{mean} vs {want}");
}

#[test]
fn bf16_builds_in_bf16() {
    let cfg = tiny_config();
    let m = Gemma4Model::random_init(&cfg, DType::BF16, &Device::Cpu, 2).unwrap();
    assert!(m.projections().all(|p| p.weight().dtype() == DType::BF16));
    assert!(Gemma4Model::random_init(&cfg, DType::F16, &Device::Cpu, 2).is_err());
}
