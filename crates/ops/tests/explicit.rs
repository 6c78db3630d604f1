//! The explicit-backward API (graph-free forwards that keep what the backward reads, and each op's
//! backward as a function) against Candle's autograd through the same ops, on the CPU: the values
//! must be identical, since both run the same kernels; fused residual adds must equal a separate
//! add (same roundings).

use candle_core::{DType, Device, Result, Tensor, Var};
use g4ft_hash::stream_unit_f64;
use g4ft_ops::*;

fn randn(dims: &[usize], dtype: DType, seed: u64) -> Result<Tensor> {
    let n: usize = dims.iter().product();
    let v: Vec<f32> = (0..n as u64)
        .map(|i| (stream_unit_f64(seed, i) * 2.0 - 1.0) as f32)
        .collect();
    Tensor::from_vec(v, dims, &Device::Cpu)?.to_dtype(dtype)
}

fn assert_same(what: &str, got: &Tensor, want: &Tensor) -> Result<()> {
    let d = (got.to_dtype(DType::F32)? - want.to_dtype(DType::F32)?)?
        .abs()?
        .max_all()?
        .to_scalar::<f32>()?;
    assert_eq!(got.dims(), want.dims(), "{what}");
    assert!(d == 0.0, "{what}: max |diff| {d}");
    Ok(())
}

/// Gradients of `f`'s output seeded with `g`, for each of `inputs`, through autograd.
fn autograd(
    f: impl Fn(&[Tensor]) -> Result<Tensor>,
    inputs: &[Tensor],
    g: &Tensor,
) -> Result<Vec<Tensor>> {
    let vars = inputs
        .iter()
        .map(Var::from_tensor)
        .collect::<Result<Vec<_>>>()?;
    let ts: Vec<Tensor> = vars.iter().map(|v| v.as_tensor().clone()).collect();
    let grads = backward_with_seed(&f(&ts)?, g)?;
    Ok(vars
        .iter()
        .map(|v| grads.get(v).expect("a gradient").clone())
        .collect())
}

#[test]
fn rms_norm_explicit_matches_autograd_and_fuses_the_residual() -> Result<()> {
    for dtype in [DType::F32, DType::BF16] {
        let (x, w) = (
            (randn(&[3, 5, 64], dtype, 1)? * 3.0)?,
            (randn(&[64], dtype, 2)? + 1.0)?,
        );
        let (g, res) = (randn(&[3, 5, 64], dtype, 3)?, randn(&[3, 5, 64], dtype, 4)?);
        let want = autograd(
            |t| rms_norm(&t[0], Some(&w), 1e-6),
            std::slice::from_ref(&x),
            &g,
        )?;
        let dx = rms_norm_backward(&x, Some(&w), &g, 1e-6, None)?;
        assert_same("rms_norm_backward", &dx, &want[0])?;
        let over = rms_norm_backward_over_input(x.copy()?, Some(&w), &g, 1e-6)?;
        assert_same("rms_norm_backward_over_input", &over, &want[0])?;
        let fused = rms_norm_backward(&x, Some(&w), &g, 1e-6, Some(&res))?;
        assert_same("rms_norm_backward + residual", &fused, &(&res + &dx)?)?;
        let y = rms_norm_add(&x, Some(&w), 1e-6, &res)?;
        assert_same("rms_norm_add", &y, &(&res + rms_norm(&x, Some(&w), 1e-6)?)?)?;
    }
    Ok(())
}

#[test]
fn rope_and_geglu_backward_match_autograd() -> Result<()> {
    for dtype in [DType::F32, DType::BF16] {
        let x = randn(&[1, 2, 6, 8], dtype, 1)?;
        let (c, s) = (randn(&[1, 6, 8], dtype, 2)?, randn(&[1, 6, 8], dtype, 3)?);
        let g = randn(&[1, 2, 6, 8], dtype, 4)?;
        let want = autograd(|t| rope(&t[0], &c, &s), &[x], &g)?;
        assert_same("rope_backward", &rope_backward(&g, &c, &s)?, &want[0])?;

        let (gate, up, g) = (
            randn(&[4, 30], dtype, 5)?,
            randn(&[4, 30], dtype, 6)?,
            randn(&[4, 30], dtype, 7)?,
        );
        let want = autograd(
            |t| gelu_tanh_mul(&t[0], &t[1]),
            &[gate.clone(), up.clone()],
            &g,
        )?;
        let (dg, du) = gelu_tanh_mul_backward(&gate, &up, &g)?;
        assert_same("gelu_tanh_mul_backward gate", &dg, &want[0])?;
        assert_same("gelu_tanh_mul_backward up", &du, &want[1])?;
        let (dg, du) = gelu_tanh_mul_backward_in_place(gate.copy()?, up.copy()?, &g)?;
        assert_same("in place gate", &dg, &want[0])?;
        assert_same("in place up", &du, &want[1])?;
    }
    Ok(())
}

#[test]
fn attention_saved_matches_autograd() -> Result<()> {
    let (q, k, v) = (
        randn(&[2, 4, 7, 8], DType::F32, 1)?,
        randn(&[2, 2, 7, 8], DType::F32, 2)?,
        randn(&[2, 2, 7, 8], DType::F32, 3)?,
    );
    let mask = Tensor::new(
        &[[1u32, 1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1, 1]],
        &Device::Cpu,
    )?;
    // Two packed sequences per row (the segment starts reach the backward too).
    let starts = Tensor::new(
        &[[0u32, 0, 0, 3, 3, 3, 3], [0, 0, 0, 0, 4, 4, 4]],
        &Device::Cpu,
    )?;
    let keys = KeyMask {
        padding: Some(&mask),
        seq_start: Some(&starts),
    };
    let g = randn(&[2, 4, 7, 8], DType::F32, 4)?;
    let plan = AttentionPlan::default();
    let want = autograd(
        |t| attention(&t[0], &t[1], &t[2], keys, Some(3), 1.0, &plan),
        &[q.clone(), k.clone(), v.clone()],
        &g,
    )?;
    let (o, saved) = attention_saved(&q, &k, &v, keys, Some(3), 1.0, &plan)?;
    assert_same(
        "attention_saved output",
        &o,
        &attention(&q, &k, &v, keys, Some(3), 1.0, &plan)?,
    )?;
    let (dq, dk, dv) = saved.backward(&q, &k, &v, &o, &g)?;
    for (what, got, want) in [
        ("dq", &dq, &want[0]),
        ("dk", &dk, &want[1]),
        ("dv", &dv, &want[2]),
    ] {
        assert_same(what, got, want)?;
    }
    assert!(
        saved.backward(&q, &k, &v, &o, &g.narrow(2, 0, 6)?).is_err(),
        "wrong grad shape"
    );
    Ok(())
}

#[test]
fn lora_linear_saved_matches_autograd_and_accumulates() -> Result<()> {
    let key = dropout_key(1, 2, "layers.0.mlp.down_proj");
    for (dtype, dropout) in [
        (DType::F32, None),
        (DType::F32, Some((0.25, key))),
        (DType::BF16, Some((0.25, key))),
    ] {
        let (x, w) = (randn(&[2, 5, 12], dtype, 1)?, randn(&[7, 12], dtype, 2)?);
        let (a, b) = (
            randn(&[4, 12], DType::F32, 3)?,
            randn(&[7, 4], DType::F32, 4)?,
        );
        let (g, acc) = (randn(&[2, 5, 7], dtype, 5)?, randn(&[2, 5, 12], dtype, 6)?);
        let f =
            |t: &[Tensor]| lora_linear(&t[0], &w, AdapterOperands::new(&t[1], &t[2]), 2.0, dropout);
        let want = autograd(f, &[x.clone(), a.clone(), b.clone()], &g)?;
        let ops = AdapterOperands::new(&a, &b);
        let (y, saved) = lora_linear_saved(&x, &w, ops, 2.0, dropout, None)?;
        assert_same(
            "forward",
            &y,
            &lora_linear(&x, &w, AdapterOperands::new(&a, &b), 2.0, dropout)?,
        )?;
        let (dx, da, db) = saved.backward(&x, &g)?;
        assert_same("dx", &dx, &want[0])?;
        assert_same("dA", &da, &want[1])?;
        assert_same("dB", &db, &want[2])?;
        let (dx_acc, _, _) = saved.backward_acc(&x, &g, acc.copy()?)?;
        assert_same("dx + acc", &dx_acc, &(&acc + &want[0])?)?;
        let (dx_over, da_over, _) = saved.backward_over_input(x.copy()?, &g)?;
        assert_same("dx over input", &dx_over, &want[0])?;
        assert_same("dA over input", &da_over, &want[1])?;
        // The saved state alone (no output computed) gives the same backward.
        let state = lora_linear_saved_state(&x, &w, ops, 2.0, dropout, None)?;
        let (dx_state, da_state, db_state) = state.backward(&x, &g)?;
        assert_same("dx from the saved state", &dx_state, &want[0])?;
        assert_same("dA from the saved state", &da_state, &want[1])?;
        assert_same("dB from the saved state", &db_state, &want[2])?;
        // A kept low stands for the down product: the same output, deferred term and backward.
        let kept = Some(saved.low());
        let (y_kept, kept_saved) = lora_linear_saved(&x, &w, ops, 2.0, dropout, kept)?;
        assert_same("forward with the kept low", &y_kept, &y)?;
        let (base, _, up) = lora_linear_saved_deferred(&x, &w, ops, 2.0, dropout, kept)?;
        assert_same("deferred output + term", &up.add_to(base)?, &y)?;
        let kept_state = lora_linear_saved_state(&x, &w, ops, 2.0, dropout, kept)?;
        for s in [&kept_saved, &kept_state] {
            let (dx_kept, da_kept, db_kept) = s.backward(&x, &g)?;
            assert_same("dx from the kept low", &dx_kept, &want[0])?;
            assert_same("dA from the kept low", &da_kept, &want[1])?;
            assert_same("dB from the kept low", &db_kept, &want[2])?;
        }
        let wrong = saved.low().narrow(0, 0, 9)?;
        let err = lora_linear_saved_state(&x, &w, ops, 2.0, dropout, Some(&wrong));
        assert!(err.is_err(), "a kept low of the wrong shape");
        assert!(
            saved.backward(&x, &g.narrow(1, 0, 4)?).is_err(),
            "wrong grad shape"
        );
        assert!(
            saved.backward(&x.narrow(1, 0, 4)?, &g).is_err(),
            "wrong input shape"
        );
    }
    Ok(())
}
