//! AdamW, clipping and the cosine schedule against PyTorch + transformers.
//!
//! Fixture: `tools/reference/trainer/optim_fixtures.json`, written by `make_fixtures.py` next to it
//! (torch.optim.AdamW single-tensor path, clip_grad_norm_, get_cosine_schedule_with_warmup; the
//! three parameters are flattened in order into one bucket). Regenerate with
//! `/opt/refenv/bin/python tools/reference/trainer/make_fixtures.py`.
//! Tolerance: 1e-6 relative per element (f32 elementwise math in the same order as torch). The
//! moments get an absolute floor of 1e-6 × the buffer's largest magnitude: an `exp_avg` element
//! that is a near-cancelling sum of gradients of both signs inherits the 1-ulp differences of the
//! clip coefficient (our norm accumulates in f64, torch's per tensor in f32) and of the FMA in
//! torch's vectorised lerp at ~1e-5 of its own size, which says nothing about the optimizer.

use std::path::Path;

use candle_core::{Device, Tensor, Var};
use g4ft_trainer::step::clip::{clip_coef, grad_norm};
use g4ft_trainer::step::optim::{AdamW, AdamWParams, FlatBucket};
use g4ft_trainer::step::schedule::{warmup_steps, LrSchedule, LrSchedulerKind};
use serde_json::Value;

const SHAPES: [&[usize]; 3] = [&[4, 3], &[2, 5], &[7]];
const RTOL: f64 = 1e-6;

fn fixtures() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tools/reference/trainer/optim_fixtures.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("fixture is valid JSON")
}

fn f32s(v: &Value) -> Vec<f32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_f64().expect("number") as f32)
        .collect()
}

/// Fails with the name, max abs/rel diff and the worst element, after checking everything.
fn assert_close(name: &str, got: &[f32], want: &[f32], atol: f64) {
    assert_eq!(got.len(), want.len(), "{name}: length");
    let mut worst = (0usize, 0f64);
    let mut bad = 0;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (g as f64 - w as f64).abs();
        let tol = atol + RTOL * (w as f64).abs();
        if err > tol {
            bad += 1;
        }
        let rel = err / (w as f64).abs().max(1e-12);
        if rel > worst.1 {
            worst = (i, rel);
        }
    }
    assert!(
        bad == 0,
        "{name}: {bad}/{} elements off; worst rel {:.3e} at [{}]: got {} want {}; first got {:?} want {:?}",
        got.len(),
        worst.1,
        worst.0,
        got[worst.0],
        want[worst.0],
        &got[..got.len().min(4)],
        &want[..want.len().min(4)]
    );
}

fn moment_atol(want: &[f32]) -> f64 {
    1e-6 * want.iter().fold(0f64, |a, &x| a.max((x as f64).abs()))
}

fn vars(dev: &Device, values: &[f32]) -> Vec<Var> {
    let mut off = 0;
    SHAPES
        .iter()
        .map(|s| {
            let n: usize = s.iter().product();
            let v = Var::from_slice(&values[off..off + n], *s, dev).expect("var");
            off += n;
            v
        })
        .collect()
}

fn flat(vs: &[Var]) -> Vec<f32> {
    vs.iter()
        .flat_map(|v| v.flatten_all().unwrap().to_vec1::<f32>().unwrap())
        .collect()
}

#[test]
fn adamw_clip_schedule_match_torch() {
    let fx = fixtures();
    let dev = Device::Cpu;
    for case in fx["optim"].as_array().expect("optim cases") {
        let name = case["name"].as_str().unwrap();
        let hp = AdamWParams::with_weight_decay(case["weight_decay"].as_f64().unwrap());
        let max_norm = case["max_grad_norm"].as_f64().unwrap();
        let init = f32s(&case["init_params"]);
        let n = init.len();
        let mut sched = LrSchedule::cosine(
            case["lr"].as_f64().unwrap(),
            case["warmup"].as_u64().unwrap(),
            case["total"].as_u64().unwrap(),
        );

        // grad_norm + clip_coef folded into AdamW::step.
        let params = vars(&dev, &init);
        let mut opt = AdamW::new(hp, &[n], &dev).unwrap();

        for (k, st) in case["steps"].as_array().unwrap().iter().enumerate() {
            let tag = format!("{name} step {}", k + 1);
            let lr = sched.lr();
            let want_lr = st["lr"].as_f64().unwrap();
            assert!(
                (lr - want_lr).abs() <= 1e-12 * want_lr.abs().max(1e-30),
                "{tag}: lr {lr} vs {want_lr}"
            );

            let grads = f32s(&st["grads"]);
            let g = Tensor::from_slice(&grads, n, &dev).unwrap();
            let norm = grad_norm(std::slice::from_ref(&g)).unwrap();
            assert_close(
                &format!("{tag} norm"),
                &[norm],
                &[st["norm"].as_f64().unwrap() as f32],
                1e-9,
            );
            // The coefficient times each gradient is what clip_grad_norm_ leaves in p.grad.
            let coef = clip_coef(norm, max_norm);
            let clipped: Vec<f32> = grads.iter().map(|&x| x * coef).collect();
            assert_close(
                &format!("{tag} clipped grads"),
                &clipped,
                &f32s(&st["clipped_grads"]),
                1e-9,
            );
            opt.step(
                lr,
                coef,
                &[FlatBucket {
                    params: &params,
                    grads: &g,
                }],
            )
            .unwrap();
            assert_close(
                &format!("{tag} params"),
                &flat(&params),
                &f32s(&st["params"]),
                1e-9,
            );

            sched.advance();
        }
        assert_eq!(opt.step_count(), case["final_step"].as_u64().unwrap());
        let state = opt.state_tensors();
        assert_close(
            &format!("{name} exp_avg"),
            &state[0].1.to_vec1::<f32>().unwrap(),
            &f32s(&case["exp_avg"]),
            moment_atol(&f32s(&case["exp_avg"])),
        );
        assert_close(
            &format!("{name} exp_avg_sq"),
            &state[1].1.to_vec1::<f32>().unwrap(),
            &f32s(&case["exp_avg_sq"]),
            moment_atol(&f32s(&case["exp_avg_sq"])),
        );
    }
}

#[test]
fn schedules_match_transformers() {
    let fx = fixtures();
    for case in fx["schedule"].as_array().expect("schedule cases") {
        let kind: LrSchedulerKind = serde_json::from_value(case["kind"].clone()).unwrap();
        let mut s = LrSchedule::new(
            kind,
            case["base_lr"].as_f64().unwrap(),
            case["warmup"].as_u64().unwrap(),
            case["total"].as_u64().unwrap(),
        );
        for (k, want) in case["lrs"].as_array().unwrap().iter().enumerate() {
            let want = want.as_f64().unwrap();
            let got = s.lr();
            assert!(
                (got - want).abs() <= 1e-12 * want.abs().max(1e-30) || (got == 0.0 && want == 0.0),
                "{kind:?} warmup {} total {} step {k}: got {got} want {want}",
                s.warmup,
                s.total
            );
            s.advance();
        }
    }
    for case in fx["warmup_ratio"].as_array().expect("warmup ratio cases") {
        let ratio = case["ratio"].as_f64().unwrap();
        let total = case["total"].as_u64().unwrap();
        assert_eq!(
            warmup_steps(20, Some(ratio), total),
            case["warmup"].as_u64().unwrap(),
            "warmup ratio {ratio} of {total} steps"
        );
    }
}
