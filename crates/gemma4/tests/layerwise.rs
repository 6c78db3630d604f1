//! Layer-wise backward (per-layer recompute) == full-graph backward for LoRA adapters on every
//! projection, including KV sharing (producers receive their consumers' gradients) and MoE, with
//! both layer backwards: the explicit one (dense layers with own K/V) and Candle's autograd.

mod common;

use std::collections::HashMap;

use candle_core::{DType, Tensor, Var};
use common::{golden, golden_dir, test_device, Checks, GoldenBatch};
use g4ft_gemma4::{BackwardMode, Gemma4Model, TokenBatch};
use g4ft_lora::{Adapter, LoraContext};

const TRAIN: LoraContext = LoraContext {
    training: true,
    track_grad: true,
    seed: 3,
    micro_step: 0,
};

/// `n` fixed pseudo-random values in `[-0.3, 0.3)` for stream `seed` (SplitMix64), so every run
/// uses the same adapters.
fn fixed_values(n: usize, seed: u64) -> Vec<f32> {
    (0..n as u64)
        .map(|i| {
            let mut z = (seed << 32 ^ i).wrapping_add(0x9E37_79B9_7F4A_7C15);
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            ((z >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.6
        })
        .collect()
}

/// Fixed nonzero A and B (r = 2) on every projection with LoRA dropout `dropout`; returns
/// (path, A, B) in model order.
fn attach_all(model: &mut Gemma4Model, dropout: f64) -> Vec<(String, Var, Var)> {
    let mut out = Vec::new();
    for (k, p) in model.projections_mut().enumerate() {
        let (o, i) = (p.out_features(), p.in_features());
        let var = |dims: (usize, usize), seed: u64| {
            let t = Tensor::from_vec(fixed_values(dims.0 * dims.1, seed), dims, &test_device());
            Var::from_tensor(&t.unwrap()).unwrap()
        };
        let (a, b) = (var((2, i), 2 * k as u64), var((o, 2), 2 * k as u64 + 1));
        p.set_adapter(Some(Adapter {
            a: a.clone(),
            b: b.clone(),
            scale: 2.0,
            dropout,
        }));
        out.push((p.path().to_string(), a, b));
    }
    out
}

/// The adapters' gradients from [`Gemma4Model::forward_backward`] (path → (dA, dB)) and its stats.
fn layerwise_grads(
    model: &Gemma4Model,
    batch: &TokenBatch,
    labels: &[i64],
    adapters: &[(String, Var, Var)],
    scale: f64,
) -> (HashMap<String, (Tensor, Tensor)>, g4ft_gemma4::LossStats) {
    let mut layerwise = HashMap::new();
    let stats = model
        .forward_backward(
            batch,
            labels,
            &TRAIN,
            scale,
            |layer, gs| -> Result<(), g4ft_gemma4::Error> {
                for (path, a, bv) in adapters {
                    if path.contains(&format!(".layers.{layer}.")) {
                        let ga = gs
                            .get(a)
                            .unwrap_or_else(|| panic!("{path}: no lora_A grad"));
                        let gb = gs
                            .get(bv)
                            .unwrap_or_else(|| panic!("{path}: no lora_B grad"));
                        layerwise.insert(path.clone(), (ga.clone(), gb.clone()));
                    }
                }
                Ok(())
            },
        )
        .unwrap();
    (layerwise, stats)
}

fn load(case: &str, dtype: DType) -> Gemma4Model {
    Gemma4Model::load(golden_dir(case).to_str().unwrap(), dtype, &test_device()).unwrap()
}

/// Layer-wise gradients with `mode` == full-graph ones; `explicit_layers` is how many layers the
/// explicit backward must cover in this model.
fn check_case(
    case: &str,
    dtype: DType,
    rtol: f64,
    (mode, dropout): (BackwardMode, f64),
    explicit_layers: usize,
) {
    println!("== {case} {dtype:?} {mode:?} dropout {dropout}");
    let golden_batch = GoldenBatch::new(&golden(case));
    let (labels, batch) = (&golden_batch.labels, golden_batch.tokens());
    let mut model = load(case, dtype);
    let adapters = attach_all(&mut model, dropout);
    model.set_backward_mode(mode);
    assert_eq!(model.explicit_backward_layers(), explicit_layers, "{case}");
    let scale = 0.25;
    let (layerwise, stats) = layerwise_grads(&model, &batch, labels, &adapters, scale);
    let full = model.loss(&batch, labels, &TRAIN).unwrap();
    assert_eq!(full.n_tokens, stats.n_tokens);
    let full_loss = full.sum.to_scalar::<f32>().unwrap() as f64;
    let fg = (full.sum * (scale / full.n_tokens as f64))
        .unwrap()
        .backward()
        .unwrap();
    let mut checks = Checks::default();
    checks.scalar("loss sum", stats.loss_sum, full_loss, 0.0, 1e-6);
    for (path, a, bv) in &adapters {
        let (ga, gb) = &layerwise[path];
        let na = ga
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!(na > 0.0, "{path}: lora_A gradient is zero");
        checks.close(&format!("{path}.lora_A"), ga, fg.get(a).unwrap(), 0.0, rtol);
        checks.close(
            &format!("{path}.lora_B"),
            gb,
            fg.get(bv).unwrap(),
            0.0,
            rtol,
        );
    }
    checks.finish();
}

const AUTOGRAD: (BackwardMode, f64) = (BackwardMode::Autograd, 0.0);

#[test]
fn layerwise_equals_full_graph_kv_sharing_f32() {
    check_case("gemma4-b-ple-kvshare", DType::F32, 1e-5, AUTOGRAD, 0);
}

#[test]
fn layerwise_equals_full_graph_moe_f32() {
    check_case("gemma4-c-moe", DType::F32, 1e-5, AUTOGRAD, 0);
}

#[test]
fn layerwise_equals_full_graph_kv_sharing_bf16() {
    // bf16: both graphs run the same ops in the same order (measured: identical); the margin only
    // covers a future kernel whose accumulation order depends on what is tracked.
    check_case("gemma4-b-ple-kvshare", DType::BF16, 1e-3, AUTOGRAD, 0);
}

/// The explicit layer backward (every layer of the dense k_eq_v model, with LoRA dropout) equals
/// the full-graph autograd gradients; so does the autograd layer backward on the same model.
#[test]
fn explicit_layer_backward_equals_full_graph_f32() {
    let case = "gemma4-a-unified-keqv";
    check_case(case, DType::F32, 1e-5, (BackwardMode::Explicit, 0.25), 6);
    check_case(case, DType::F32, 1e-5, (BackwardMode::Autograd, 0.25), 6);
}

/// bf16: the explicit backward runs the same kernels as autograd but sums the residual-stream
/// gradients in another order (e.g. d(normed input) = dq + dk + dv), so the two differ by bf16
/// rounding (measured with these fixed adapters: at most 2.9% of max|grad| over all adapters of
/// this 6-layer model; other random adapters gave up to 10%: the tiny random model amplifies
/// rounding differences through its layers). The
/// precise equality check is the f32 test above; bf16 training is checked by the loss curve on
/// the GPU (`tools/gpu/loss_curve.sh`).
#[test]
fn explicit_layer_backward_equals_full_graph_bf16() {
    let case = "gemma4-a-unified-keqv";
    check_case(case, DType::BF16, 5e-2, (BackwardMode::Explicit, 0.25), 6);
}

#[test]
fn batch_without_targets_gives_zero_gradients_for_every_layer() {
    let case = "gemma4-a-unified-keqv";
    let golden_batch = GoldenBatch::new(&golden(case));
    let (b, t) = golden_batch.dims;
    let labels = vec![-100i64; b * t];
    let batch = TokenBatch {
        attention_mask: None,
        ..golden_batch.tokens()
    };
    let mut model = Gemma4Model::load(
        golden_dir(case).to_str().unwrap(),
        DType::F32,
        &test_device(),
    )
    .unwrap();
    let adapters = attach_all(&mut model, 0.0);
    assert_eq!(model.backward_mode(), BackwardMode::Explicit);
    let mut layers = Vec::new();
    let stats = model
        .forward_backward(
            &batch,
            &labels,
            &TRAIN,
            1.0,
            |layer, gs| -> Result<(), g4ft_gemma4::Error> {
                layers.push(layer);
                for (path, _, bv) in adapters
                    .iter()
                    .filter(|(p, _, _)| p.contains(&format!(".layers.{layer}.")))
                {
                    let gb = gs.get(bv).unwrap_or_else(|| panic!("{path}: no grad"));
                    let m = gb
                        .abs()
                        .unwrap()
                        .max_all()
                        .unwrap()
                        .to_scalar::<f32>()
                        .unwrap();
                    assert_eq!(m, 0.0, "{path}");
                }
                Ok(())
            },
        )
        .unwrap();
    assert_eq!(stats.n_tokens, 0);
    assert!(stats.mean().is_nan());
    assert_eq!(layers, (0..6).rev().collect::<Vec<_>>());
}
