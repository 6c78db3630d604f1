//! Test helpers: deterministic inputs (a fixed-seed generator, so failures reproduce) and
//! `assert_close`, which prints the name, shape, max abs/rel error and the worst element.

use candle_core::{bail, DType, Device, Result, Tensor};

/// Deterministic pseudo-normal values (sum of 4 uniforms, centred, unit variance) of `dims`.
pub(crate) fn randn(dims: &[usize], dtype: DType, seed: u64, dev: &Device) -> Result<Tensor> {
    let n: usize = dims.iter().product();
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut uniform = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 40) as f32 / (1u64 << 24) as f32
    };
    let v: Vec<f32> = (0..n)
        .map(|_| (uniform() + uniform() + uniform() + uniform() - 2.0) * 3f32.sqrt())
        .collect();
    Tensor::from_vec(v, dims, dev)?.to_dtype(dtype)
}

/// Max abs and max rel (|got-want| / max(|want|, atol)) difference and the worst flat index.
pub(crate) fn diff(got: &Tensor, want: &Tensor, atol: f64) -> Result<(f64, f64, usize)> {
    if got.dims() != want.dims() {
        bail!(
            "shape mismatch: got {:?}, want {:?}",
            got.dims(),
            want.dims()
        );
    }
    let g = got.flatten_all()?.to_dtype(DType::F64)?.to_vec1::<f64>()?;
    let w = want.flatten_all()?.to_dtype(DType::F64)?.to_vec1::<f64>()?;
    let (mut abs, mut rel, mut worst) = (0f64, 0f64, 0usize);
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        let d = (a - b).abs();
        let r = d / b.abs().max(atol);
        if d.is_nan() || d > abs {
            abs = if d.is_nan() { f64::INFINITY } else { d };
            worst = i;
        }
        rel = rel.max(r);
    }
    Ok((abs, rel, worst))
}

/// Fails unless every element satisfies `|got - want| <= atol + rtol·|want|`; the message names
/// the tensor, its shape, the max abs/rel error and the worst element with both values.
pub(crate) fn assert_close(
    name: &str,
    got: &Tensor,
    want: &Tensor,
    atol: f64,
    rtol: f64,
) -> Result<()> {
    let g = got.flatten_all()?.to_dtype(DType::F64)?.to_vec1::<f64>()?;
    let w = want.flatten_all()?.to_dtype(DType::F64)?.to_vec1::<f64>()?;
    let (abs, rel, worst) = diff(got, want, atol)?;
    let bad = g
        .iter()
        .zip(&w)
        .filter(|(a, b)| {
            let d = (*a - *b).abs();
            d.is_nan() || d > atol + rtol * b.abs()
        })
        .count();
    if bad > 0 {
        bail!(
            "{name} {:?}: {bad} elements off (atol {atol:e}, rtol {rtol:e}); max abs {abs:e}, \
             max rel {rel:e}; worst [{worst}] got {} want {}; first got {:?} want {:?}",
            got.dims(),
            g[worst],
            w[worst],
            &g[..g.len().min(4)],
            &w[..w.len().min(4)]
        );
    }
    Ok(())
}

/// Fused vs composite: forward outputs, then the gradients (seeded with a random upstream gradient)
/// of each input flagged in `trainable`, on the same inputs. Tolerances per dtype are the caller's.
pub(crate) fn check_fused_vs_slow(
    name: &str,
    inputs: &[Tensor],
    trainable: &[bool],
    fused: impl Fn(&[Tensor]) -> Result<Tensor>,
    slow: impl Fn(&[Tensor]) -> Result<Tensor>,
    (atol, rtol): (f64, f64),
) -> Result<()> {
    let vars: Vec<candle_core::Var> = inputs
        .iter()
        .map(candle_core::Var::from_tensor)
        .collect::<Result<_>>()?;
    let as_inputs = |vars: &[candle_core::Var]| -> Vec<Tensor> {
        vars.iter()
            .zip(inputs.iter().zip(trainable))
            .map(|(v, (t, &tr))| if tr { v.as_tensor().clone() } else { t.clone() })
            .collect()
    };
    let ins = as_inputs(&vars);
    let y_fast = fused(&ins)?;
    let y_slow = slow(&ins)?;
    assert_close(&format!("{name} forward"), &y_fast, &y_slow, atol, rtol)?;
    let g = randn(y_fast.dims(), y_fast.dtype(), 99, y_fast.device())?;
    let gf = crate::backward_with_seed(&y_fast, &g)?;
    let gs = crate::backward_with_seed(&y_slow, &g)?;
    for (i, (v, &tr)) in vars.iter().zip(trainable).enumerate() {
        if !tr {
            continue;
        }
        let (Some(a), Some(b)) = (gf.get(v), gs.get(v)) else {
            bail!(
                "{name}: input {i} has no gradient (fused {}, slow {})",
                gf.get(v).is_some(),
                gs.get(v).is_some()
            );
        };
        assert_close(&format!("{name} d(input {i})"), a, b, atol, rtol)?;
    }
    Ok(())
}
