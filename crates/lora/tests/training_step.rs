//! Training behaviour on the toy model: fresh PEFT-style adapters (B = 0) get gradients where
//! they should, every LoRA parameter has a non-zero gradient after one optimiser step (catches
//! silently cut graphs), dropout masks replay under an identical context, and the adapter branch
//! equals `base + (x·mask)·Aᵀ·Bᵀ·scale`.

mod common;

use candle_core::{DType, Device, Tensor};
use common::{fixtures, load, Toy};
use g4ft_lora::{
    attach, dropout_key, lora_parameters, LoraConfig, LoraContext, LoraLinear, TargetModules,
};

fn all_projections() -> LoraConfig {
    let names = [
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    ];
    let mut cfg = LoraConfig::new(
        4,
        8.0,
        TargetModules::List(names.map(String::from).to_vec()),
    );
    cfg.lora_dropout = 0.1;
    cfg
}

fn ctx(micro_step: u64) -> LoraContext {
    LoraContext {
        training: true,
        track_grad: true,
        seed: 1234,
        micro_step,
    }
}

fn max_abs(t: &Tensor) -> f32 {
    t.abs().unwrap().max_all().unwrap().to_scalar().unwrap()
}

#[test]
fn every_lora_parameter_has_a_gradient_after_one_step() {
    let x = load(&fixtures().join("list/golden.safetensors"))["x"].clone();
    let mut toy = Toy::load_base();
    attach(&all_projections(), toy.projections.iter_mut(), 7).unwrap();
    let params = lora_parameters(toy.projections.iter());
    assert_eq!(
        params.len(),
        2 * 13,
        "13 adapted projections (layer 1 has no v_proj)"
    );

    // Step 0: B = 0, so dL/dA = 0 exactly and dL/dB != 0 (PEFT's init).
    let loss = Toy::loss(&toy.forward(&x, &ctx(0)).unwrap()).unwrap();
    let grads = loss.backward().unwrap();
    for p in &params {
        let g = grads
            .get(p.var.as_tensor())
            .unwrap_or_else(|| panic!("{}: no gradient at all", p.name));
        if p.name.contains("lora_A") {
            assert_eq!(max_abs(g), 0.0, "{}", p.name);
        } else {
            assert!(max_abs(g) > 0.0, "{}: zero gradient", p.name);
        }
    }
    // One SGD step, then every A and B must receive a non-zero gradient.
    for p in &params {
        let g = grads.get(p.var.as_tensor()).unwrap();
        p.var
            .set(&(p.var.as_tensor() - (g * 0.1).unwrap()).unwrap())
            .unwrap();
    }
    let loss = Toy::loss(&toy.forward(&x, &ctx(1)).unwrap()).unwrap();
    let grads = loss.backward().unwrap();
    for p in &params {
        let g = grads
            .get(p.var.as_tensor())
            .unwrap_or_else(|| panic!("{}: no gradient", p.name));
        assert!(max_abs(g) > 0.0, "{}: zero gradient after one step", p.name);
    }
}

#[test]
fn recompute_with_same_context_replays_dropout() {
    let x = load(&fixtures().join("list/golden.safetensors"))["x"].clone();
    let mut cfg = all_projections();
    cfg.init_lora_weights = g4ft_lora::InitLoraWeights::Random;
    cfg.lora_dropout = 0.5;
    let mut toy = Toy::load_base();
    attach(&cfg, toy.projections.iter_mut(), 7).unwrap();
    let run = |c: LoraContext| -> (Vec<f32>, Vec<Vec<f32>>) {
        let y = toy.forward(&x, &c).unwrap();
        let grads = Toy::loss(&y).unwrap().backward().unwrap();
        let g = lora_parameters(toy.projections.iter())
            .iter()
            .map(|p| {
                grads
                    .get(p.var.as_tensor())
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1()
                    .unwrap()
            })
            .collect();
        (y.flatten_all().unwrap().to_vec1().unwrap(), g)
    };
    let first = run(ctx(5));
    assert_eq!(
        first,
        run(ctx(5)),
        "identical context must replay outputs and gradients"
    );
    assert_ne!(
        first.0,
        run(ctx(6)).0,
        "another micro_step draws another mask"
    );
    let eval = toy
        .forward(&x, &LoraContext::EVAL)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    assert_ne!(first.0, eval, "training applies dropout, eval does not");
}

#[test]
fn adapter_branch_is_base_plus_masked_low_rank_update() {
    let dev = Device::Cpu;
    let (b, t, inf, outf, r, p) = (2, 3, 6, 5, 2, 0.25);
    let w = Tensor::randn(0f32, 1.0, (outf, inf), &dev).unwrap();
    let x = Tensor::randn(0f32, 1.0, (b, t, inf), &dev).unwrap();
    let mut lin = LoraLinear::new("m.layers.0.self_attn.q_proj", w.clone());
    let mut cfg = LoraConfig::new(r, 3.0, TargetModules::List(vec!["q_proj".into()]));
    cfg.lora_dropout = p;
    cfg.init_lora_weights = g4ft_lora::InitLoraWeights::Random;
    attach(&cfg, std::iter::once(&mut lin), 1).unwrap();
    let ad = lin.adapter().unwrap().clone();
    let c = ctx(3);
    let y = lin.forward(&x, &c).unwrap();
    let mask = g4ft_ops::dropout_mask(x.dims(), p, dropout_key(&c, lin.path()), &dev).unwrap();
    let xd = (&x * (mask.to_dtype(DType::F32).unwrap() / (1.0 - p)).unwrap()).unwrap();
    let want = (x.broadcast_matmul(&w.t().unwrap()).unwrap()
        + (xd.broadcast_matmul(&ad.a.as_tensor().t().unwrap()).unwrap())
            .broadcast_matmul(&ad.b.as_tensor().t().unwrap())
            .unwrap()
            * (3.0 / r as f64))
        .unwrap();
    let diff = max_abs(&(y - &want).unwrap());
    assert!(diff < 1e-5, "{diff}");
    // bf16 base and activations with the fp32 adapter: output bf16, close to the f32 result.
    let mut lin16 = LoraLinear::new(lin.path(), w.to_dtype(DType::BF16).unwrap());
    lin16.set_adapter(Some(ad));
    let y16 = lin16
        .forward(&x.to_dtype(DType::BF16).unwrap(), &c)
        .unwrap();
    assert_eq!(y16.dtype(), DType::BF16);
    let diff16 = max_abs(&(y16.to_dtype(DType::F32).unwrap() - &want).unwrap());
    assert!(diff16 < 0.05 * max_abs(&want), "{diff16}");
}

/// While copies are held, a projection reads them and not the parameters (so they must not change
/// meanwhile); a nested guard leaves the outer one's copies; dropping the guard reads the
/// parameters again.
#[test]
fn held_copies_are_what_the_forward_reads_until_released() {
    let dev = Device::Cpu;
    let w = Tensor::ones((3, 4), DType::BF16, &dev).unwrap();
    let mut proj = LoraLinear::new("layers.0.self_attn.q_proj", w);
    let a =
        candle_core::Var::from_tensor(&Tensor::ones((2, 4), DType::F32, &dev).unwrap()).unwrap();
    let b =
        candle_core::Var::from_tensor(&Tensor::ones((3, 2), DType::F32, &dev).unwrap()).unwrap();
    proj.set_adapter(Some(g4ft_lora::Adapter {
        a: a.clone(),
        b,
        scale: 1.0,
        dropout: 0.0,
    }));
    let x = Tensor::ones((1, 4), DType::BF16, &dev).unwrap();
    let y = |proj: &LoraLinear| -> f32 {
        let (y, _) = proj.forward_saved(&x, None, &LoraContext::EVAL).unwrap();
        y.to_dtype(DType::F32)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()[0]
    };
    assert_eq!(y(&proj), 4.0 + 8.0, "base 4 + adapter 2·4");
    let held = g4ft_lora::hold_adapter_copies([&proj], DType::BF16).unwrap();
    a.set(&Tensor::zeros((2, 4), DType::F32, &dev).unwrap())
        .unwrap();
    assert_eq!(y(&proj), 12.0, "the held copies, not the changed parameter");
    {
        let nested = g4ft_lora::hold_adapter_copies([&proj], DType::BF16).unwrap();
        drop(nested);
        assert_eq!(
            y(&proj),
            12.0,
            "an inner guard leaves the outer one's copies"
        );
    }
    drop(held);
    assert_eq!(y(&proj), 4.0, "released: the parameter again");
}
