//! GPU checks (feature `cuda`, run on the GPU machine): every op's CUDA forward and backward against
//! its CPU reference on the same inputs, then timings at Gemma 4 12B shapes (seq 2048, bf16) of the
//! fused op against its `_slow` composite on the GPU. Prints one table; fails if any check fails.
//! Run: `cargo test --release -p g4ft-ops --features cuda gpu_ -- --nocapture --test-threads=1`.

use crate::testing::{diff, randn};
use crate::*;
use candle_core::{bail, DType, Device, Result, Tensor, Var};
use std::time::Instant;

type Op<'a> = &'a dyn Fn(&[Tensor]) -> Result<Tensor>;

/// Forward output and the gradients of the trainable inputs (seeded with a fixed random gradient).
fn run(f: Op, inputs: &[Tensor], trainable: &[bool], dev: &Device) -> Result<Vec<Tensor>> {
    let vars: Vec<Var> = inputs
        .iter()
        .map(|t| Var::from_tensor(&t.to_device(dev)?))
        .collect::<Result<_>>()?;
    let ins: Vec<Tensor> = vars.iter().map(|v| v.as_tensor().clone()).collect();
    let y = f(&ins)?;
    let g = randn(y.dims(), y.dtype(), 99, &Device::Cpu)?.to_device(dev)?;
    let grads = backward_with_seed(&y, &g)?;
    let mut out = vec![y.to_device(&Device::Cpu)?];
    for (v, &tr) in vars.iter().zip(trainable) {
        if tr {
            let Some(gv) = grads.get(v) else {
                bail!("no gradient on {dev:?}")
            };
            out.push(gv.to_device(&Device::Cpu)?);
        }
    }
    Ok(out)
}

/// Max abs / rel error of CUDA vs CPU over the output and all gradients; `ok` if within `tol`.
fn check(
    name: &str,
    shape: &str,
    f: Op,
    inputs: &[Tensor],
    trainable: &[bool],
    tol: f64,
    gpu: &Device,
) -> Result<bool> {
    let cpu = run(f, inputs, trainable, &Device::Cpu)?;
    let cuda = run(f, inputs, trainable, gpu)?;
    report(name, shape, &cuda, &cpu, tol)
}

/// Prints the table row of CUDA outputs vs CPU ones (max abs and max relative-to-max-abs error
/// over all of them); `ok` if within `tol` and both have the same number of outputs.
fn report(name: &str, shape: &str, cuda: &[Tensor], cpu: &[Tensor], tol: f64) -> Result<bool> {
    let (mut abs, mut rel) = (0f64, 0f64);
    for (a, b) in cuda.iter().zip(cpu) {
        let scale = b
            .to_dtype(DType::F32)?
            .abs()?
            .max_all()?
            .to_scalar::<f32>()? as f64;
        let (x, _, _) = diff(a, b, 1e-3)?;
        abs = abs.max(x);
        rel = rel.max(x / scale.max(1e-12));
    }
    let ok = rel <= tol && cuda.len() == cpu.len();
    println!(
        "| {name} | {shape} | {abs:.2e} | {rel:.2e} (of max abs) | {} |",
        if ok { "ok" } else { "FAIL" }
    );
    Ok(ok)
}

/// Graph-free functions (the explicit-backward API): every output of `f` on CUDA vs the CPU.
fn check_outputs(
    name: &str,
    shape: &str,
    f: &dyn Fn(&[Tensor]) -> Result<Vec<Tensor>>,
    inputs: &[Tensor],
    tol: f64,
    gpu: &Device,
) -> Result<bool> {
    let on = |dev: &Device| -> Result<Vec<Tensor>> {
        let ins = inputs
            .iter()
            .map(|t| t.to_device(dev))
            .collect::<Result<Vec<_>>>()?;
        f(&ins)?.iter().map(|t| t.to_device(&Device::Cpu)).collect()
    };
    report(name, shape, &on(gpu)?, &on(&Device::Cpu)?, tol)
}

/// Mean µs of `f` over `iters` calls after one warm-up, synchronised.
fn time_us(dev: &Device, iters: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?;
    dev.synchronize()?;
    let t = Instant::now();
    for _ in 0..iters {
        f()?;
    }
    dev.synchronize()?;
    Ok(t.elapsed().as_secs_f64() * 1e6 / iters as f64)
}

/// Fused vs slow on the GPU: forward and forward+backward µs.
fn time_row(
    name: &str,
    shape: &str,
    fused: Op,
    slow: Op,
    inputs: &[Tensor],
    dev: &Device,
) -> Result<()> {
    let vars: Vec<Var> = inputs
        .iter()
        .map(|t| Var::from_tensor(&t.to_device(dev)?))
        .collect::<Result<_>>()?;
    let ins: Vec<Tensor> = vars.iter().map(|v| v.as_tensor().clone()).collect();
    let mut cols = Vec::new();
    for f in [fused, slow] {
        let fwd = time_us(dev, 5, || f(&ins).map(|_| ()))?;
        let y = f(&ins)?;
        let g = Tensor::ones_like(&y)?;
        let both = time_us(dev, 5, || {
            let y = f(&ins)?;
            backward_with_seed(&y, &g).map(|_| ())
        })?;
        cols.push((fwd, both));
    }
    println!(
        "| {name} | {shape} | {:.0} | {:.0} | {:.0} | {:.0} | {:.1}x |",
        cols[0].0,
        cols[0].1,
        cols[1].0,
        cols[1].1,
        cols[1].1 / cols[0].1
    );
    Ok(())
}

fn r(dims: &[usize], dtype: DType, seed: u64) -> Result<Tensor> {
    randn(dims, dtype, seed, &Device::Cpu)
}

fn rope_tables(b: usize, t: usize, d: usize, dtype: DType) -> Result<(Tensor, Tensor)> {
    let ang = r(&[b, t, d], DType::F32, 7)?;
    Ok((ang.cos()?.to_dtype(dtype)?, ang.sin()?.to_dtype(dtype)?))
}

#[test]
fn gpu_kernels_table() -> Result<()> {
    let gpu = Device::new_cuda(0)?;
    let mut ok = true;
    println!("\n| op | shape | max abs err | max rel err | check |\n|---|---|---|---|---|");
    for dtype in [DType::F32, DType::BF16] {
        // Tolerances relative to the reference's largest magnitude.
        let (dn, tol) = if dtype == DType::BF16 {
            ("bf16", 2e-2)
        } else {
            ("f32", 1e-4)
        };
        for check in [
            check_pointwise,
            check_heads_transform,
            check_scalar_products,
            check_lora_linear,
            check_moe,
            check_norms_and_geglu,
            check_dropout_and_loss_head,
            check_attention,
        ] {
            ok &= check(dtype, dn, tol, &gpu)?;
        }
    }
    ok &= check_bit_exact(&gpu)?;
    print_timings(&gpu)?;
    if !ok {
        bail!("some CUDA results differ from the CPU reference (see FAIL rows)");
    }
    Ok(())
}

/// rms_norm (with and without a weight), RoPE, softmax, the GeGLU product and `swap_dims12` against
/// the CPU.
fn check_pointwise(dtype: DType, dn: &str, tol: f64, gpu: &Device) -> Result<bool> {
    let mut ok = true;
    let w = (r(&[512], dtype, 2)? + 1.0)?;
    ok &= check(
        &format!("rms_norm {dn}"),
        "(64, 512)",
        &|x| rms_norm(&x[0], Some(&x[1]), 1e-6),
        &[r(&[64, 512], dtype, 1)?, w],
        &[true, false],
        tol,
        gpu,
    )?;
    ok &= check(
        &format!("rms_norm no-w {dn}"),
        "(1,4,64,256)",
        &|x| rms_norm(&x[0], None, 1e-6),
        &[r(&[1, 4, 64, 256], dtype, 1)?],
        &[true],
        tol,
        gpu,
    )?;
    let (c, s) = rope_tables(1, 64, 256, dtype)?;
    ok &= check(
        &format!("rope {dn}"),
        "(1,4,64,256)",
        &|x| rope(&x[0], &x[1], &x[2]),
        &[r(&[1, 4, 64, 256], dtype, 1)?, c, s],
        &[true, false, false],
        tol,
        gpu,
    )?;
    ok &= check(
        &format!("softmax {dn}"),
        "(64, 1000)",
        &|x| softmax_last_dim(&x[0]),
        &[(r(&[64, 1000], dtype, 1)? * 3.0)?],
        &[true],
        tol,
        gpu,
    )?;
    // 16-byte packs only, and packs plus an odd tail (forward and backward).
    for (rows, cols) in [(64, 3000), (7, 1001)] {
        ok &= check(
            &format!("gelu_tanh_mul {dn}"),
            &format!("({rows}, {cols})"),
            &|x| gelu_tanh_mul(&x[0], &x[1]),
            &[r(&[rows, cols], dtype, 1)?, r(&[rows, cols], dtype, 2)?],
            &[true, true],
            tol,
            gpu,
        )?;
    }
    for d in [256, 5] {
        ok &= check(
            &format!("swap_dims12 {dn} d={d}"),
            "(2, 9, 4, d)",
            &|x| swap_dims12(&x[0]),
            &[r(&[2, 9, 4, d], dtype, 1)?],
            &[true],
            0.0,
            gpu,
        )?;
    }
    Ok(ok)
}

/// The fused head transform against the CPU, and against its composite on the GPU (the same bits;
/// f32 runs the composite): q / k with weight and RoPE (tables per batch or shared), v with
/// neither, the backward with an extra gradient; 16-byte packs (d 256, 512, 1024, 96) and single
/// elements (d 6).
fn check_heads_transform(dtype: DType, dn: &str, tol: f64, gpu: &Device) -> Result<bool> {
    let mut ok = true;
    for (d, cos_b) in [(256, 1), (512, 2), (1024, 1), (96, 1), (6, 2)] {
        let (b, t, n) = (2, 33, 4);
        let (c, s) = rope_tables(cos_b, t, d, dtype)?;
        let w = (r(&[d], dtype, 5)? + 1.0)?;
        let ins = [
            r(&[b, t, n, d], dtype, 1)?,
            w,
            c,
            s,
            r(&[b, n, t, d], dtype, 3)?,
            r(&[b, t, n, d], dtype, 4)?,
        ];
        let shape = format!("({b},{t},{n},{d}) cos_b={cos_b}");
        let fused = |x: &[Tensor]| -> Result<Vec<Tensor>> {
            let tables = Some((&x[2], &x[3]));
            Ok(vec![
                heads_norm_rope(&x[0], Some(&x[1]), tables, 1e-6)?,
                heads_norm_rope(&x[0], None, None, 1e-6)?,
                heads_norm_rope_backward(&x[0], Some(&x[1]), tables, &x[4], 1e-6, Some(&x[5]))?,
                heads_norm_rope_backward(&x[0], None, None, &x[4], 1e-6, None)?,
            ])
        };
        let composite = |x: &[Tensor]| -> Result<Vec<Tensor>> {
            let normed = |w: Option<&Tensor>| swap_dims12(&rms_norm(&x[0], w, 1e-6)?);
            let dn = swap_dims12(&rope_backward(&x[4], &x[2], &x[3])?)?;
            Ok(vec![
                rope(&normed(Some(&x[1]))?, &x[2], &x[3])?,
                normed(None)?,
                rms_norm_backward(&x[0], Some(&x[1]), &dn, 1e-6, Some(&x[5]))?,
                rms_norm_backward(&x[0], None, &swap_dims12(&x[4])?, 1e-6, None)?,
            ])
        };
        ok &= check_outputs(
            &format!("heads_norm_rope {dn}"),
            &shape,
            &fused,
            &ins,
            tol,
            gpu,
        )?;
        let on_gpu = ins
            .iter()
            .map(|t| t.to_device(gpu))
            .collect::<Result<Vec<_>>>()?;
        let to_cpu = |ts: Vec<Tensor>| -> Result<Vec<Tensor>> {
            ts.iter().map(|t| t.to_device(&Device::Cpu)).collect()
        };
        ok &= report(
            &format!("heads_norm_rope {dn} = composite on CUDA"),
            &shape,
            &to_cpu(fused(&on_gpu)?)?,
            &to_cpu(composite(&on_gpu)?)?,
            0.0,
        )?;
    }
    Ok(ok)
}

/// The products with PyTorch's roundings: 16-byte packs (rows of 2816), single elements (33).
/// Exact: the rows' tolerance is 0 in both passes.
fn check_scalar_products(dtype: DType, dn: &str, _tol: f64, gpu: &Device) -> Result<bool> {
    let mut ok = true;
    for d in [2816, 33] {
        let c = 2816f64.powf(-0.5);
        let ops: [(&str, Op); 3] = [
            ("mul_scalar", &|x| mul_scalar(&x[0], c)),
            ("mul_vector_scalar", &|x| mul_vector_scalar(&x[0], &x[1], c)),
            ("mul_scalar_vector", &|x| mul_scalar_vector(&x[0], c, &x[1])),
        ];
        for (name, f) in ops {
            ok &= check(
                &format!("{name} {dn}"),
                &format!("(37, {d})"),
                f,
                &[r(&[37, d], dtype, 1)?, r(&[d], dtype, 2)?],
                &[true, false],
                0.0,
                gpu,
            )?;
        }
    }
    Ok(ok)
}

/// Adapters in x's dtype and in fp32 (master weights: cast copies), several ranks and widths (odd
/// ones included). With dropout, bf16 / f16 inputs whose width and rank are multiples of 8 (r <=
/// 64) take the fused adapter kernels: 512, 1032 (r 8), 96 (r 24: a ragged rank tile), 136 (r 40)
/// and 264 (r 64; ragged row and column tiles), so every rank instance of each kernel runs in bf16;
/// 1030 and 77 the dropout kernel + cuBLAS path. One f16 row (in the bf16 pass) covers the kernels'
/// f16 products. The backward's `dlow` / `dB` kernel (ranks 8 to 32, with or without dropout) takes
/// the 384 outputs in a full and a ragged 256-column chunk; the last row, 4,096 outputs of 1,100
/// rows, runs 16 chunks and splits of two 64-row stages (the last split's second ragged).
fn check_lora_linear(dtype: DType, dn: &str, tol: f64, gpu: &Device) -> Result<bool> {
    let bf = DType::BF16;
    let mut ok = true;
    let mut shapes = vec![
        ((64, 512, 384, 16), dtype, dtype),
        ((70, 264, 384, 64), dtype, DType::F32),
        ((37, 1032, 384, 8), dtype, DType::F32),
        ((19, 136, 384, 40), dtype, DType::F32),
        ((37, 1030, 384, 8), dtype, DType::F32),
        ((5, 96, 384, 24), dtype, DType::F32),
        ((21, 77, 384, 4), dtype, DType::F32),
        ((33, 520, 384, 32), dtype, DType::F32),
        ((1100, 64, 4096, 16), dtype, DType::F32),
    ];
    if dtype == bf {
        shapes.push(((64, 512, 384, 16), DType::F16, DType::F32));
    }
    for (((m, inf, out, rank), xt, adapter), dropout) in shapes
        .into_iter()
        .flat_map(|s| [(s, None), (s, Some((0.1, [1, 2, 3])))])
    {
        let w = r(&[out, inf], xt, 4)?;
        ok &= check(
            &format!(
                "lora_linear {xt:?} adapter {adapter:?} dropout={:?}",
                dropout.map(|d| d.0)
            ),
            &format!("x ({m},{inf}) w ({out},{inf}) r{rank}"),
            &move |x| {
                lora_linear(
                    &x[0],
                    &w.to_device(x[0].device())?,
                    AdapterOperands::new(&x[1], &x[2]),
                    2.0,
                    dropout,
                )
            },
            &[
                r(&[m, inf], xt, 1)?,
                r(&[rank, inf], adapter, 2)?,
                r(&[out, rank], adapter, 3)?,
            ],
            &[true, true, true],
            tol,
            gpu,
        )?;
    }
    // The explicit-backward API: saved forward + backward accumulated into a gradient, with
    // m·in above the dropout chunk (8M elements), so the chunked temporaries are exercised.
    for dropout in [None, Some((0.05, [4, 5, 6]))] {
        ok &= check_outputs(
            &format!(
                "lora_linear_saved + backward_acc/over_input {dn} dropout={:?}",
                dropout.map(|d| d.0)
            ),
            "x (600, 15360) w (64, 15360) r16",
            &move |x| {
                let ops = AdapterOperands::new(&x[2], &x[3]);
                let (y, saved) = lora_linear_saved(&x[0], &x[1], ops, 2.0, dropout, None)?;
                let (dx, da, db) = saved.backward_acc(&x[0], &x[4], x[5].copy()?)?;
                let (dx_over, da_over, _) = saved.backward_over_input(x[0].copy()?, &x[4])?;
                let state = lora_linear_saved_state(&x[0], &x[1], ops, 2.0, dropout, None)?;
                let (_, da_state, db_state) = state.backward(&x[0], &x[4])?;
                // With the forward's low kept: the same output and state, no down product.
                let kept = Some(saved.low());
                let (y_kept, _) = lora_linear_saved(&x[0], &x[1], ops, 2.0, dropout, kept)?;
                let kept_state = lora_linear_saved_state(&x[0], &x[1], ops, 2.0, dropout, kept)?;
                let (_, da_kept, _) = kept_state.backward(&x[0], &x[4])?;
                Ok(vec![
                    y, dx, da, db, dx_over, da_over, da_state, db_state, y_kept, da_kept,
                ])
            },
            &[
                r(&[600, 15360], dtype, 1)?,
                r(&[64, 15360], dtype, 2)?,
                r(&[16, 15360], DType::F32, 3)?,
                r(&[64, 16], DType::F32, 4)?,
                r(&[600, 64], dtype, 5)?,
                r(&[600, 15360], dtype, 6)?,
            ],
            tol,
            gpu,
        )?;
    }
    Ok(ok)
}

/// MoE: top-k with ties (logits on a 0.5 grid), grouping, both grouped-matmul layouts (tiled: K and
/// N multiples of 8; per element otherwise), combine and its backward. The third shape gives
/// segments of several row tiles, column tiles cut by N and K tiles cut by K.
fn check_moe(dtype: DType, dn: &str, tol: f64, gpu: &Device) -> Result<bool> {
    let mut ok = true;
    for (n, e, k, h, im) in [
        (300, 16, 4, 256, 136),
        (50, 8, 2, 20, 12),
        (1024, 8, 2, 712, 356),
    ] {
        ok &= check_outputs(
            &format!("moe topk/group/grouped_matmul nt+nn/combine(+bwd) {dn}"),
            &format!("n {n} E {e} k {k} h {h} I {im}"),
            &move |x| {
                let probs = softmax_last_dim(&x[0])?;
                let idx = moe_topk(&probs, k)?;
                let groups = moe_group(&idx, e)?;
                let rows = moe_gather(&x[1], &groups)?;
                let y1 = grouped_matmul(&rows, &x[2], &groups, true)?; // (m, 2I)
                let y2 = grouped_matmul(&y1, &x[2], &groups, false)?; // (m, h)
                let w = probs
                    .gather(&idx, 1)?
                    .flatten_all()?
                    .index_select(&groups.order, 0)?;
                let out = moe_combine(&y2, Some(&w), &groups)?;
                let (dy, dw) = moe_combine_backward(&x[3], &y2, &w, &groups)?;
                let back = moe_combine(&dy, None, &groups)?;
                let f = |t: &Tensor| t.to_dtype(DType::F32);
                Ok(vec![
                    f(&idx)?,
                    f(&groups.order)?,
                    f(&groups.slot_pos)?,
                    f(&groups.offsets)?,
                    y1,
                    y2,
                    out,
                    dy,
                    dw,
                    back,
                ])
            },
            &[
                ((r(&[n, e], DType::F32, 1)? * 2.0)?.round()? / 2.0)?,
                r(&[n, h], dtype, 2)?,
                (r(&[e, 2 * im, h], dtype, 3)? * 0.1)?,
                r(&[n, h], dtype, 4)?,
            ],
            tol,
            gpu,
        )?;
    }
    Ok(ok)
}

/// rms_norm's kernel layouts, rms_norm_add and its backward, and the GeGLU's in-place backward,
/// adapter-term and row-halves forms against the CPU.
fn check_norms_and_geglu(dtype: DType, dn: &str, tol: f64, gpu: &Device) -> Result<bool> {
    let mut ok = true;
    // Both kernel layouts (warp per row up to d = 1024, block per row above), each with
    // 16-byte packs and per element (rows whose byte length is not a multiple of 16).
    for (rows, d) in [(37, 100), (5, 1024), (16, 3840), (9, 1030)] {
        let w = (r(&[d], dtype, 2)? + 1.0)?;
        ok &= check_outputs(
            &format!("rms_norm layouts: fwd, no-w, add, backward(residual), over_input {dn}"),
            &format!("({rows}, {d})"),
            &move |x| {
                let w = w.to_device(x[0].device())?;
                Ok(vec![
                    rms_norm(&x[0], Some(&w), 1e-6)?,
                    rms_norm(&x[0], None, 1e-6)?,
                    rms_norm_add(&x[0], Some(&w), 1e-6, &x[1])?,
                    rms_norm_backward(&x[0], Some(&w), &x[2], 1e-6, Some(&x[1]))?,
                    rms_norm_backward_over_input(x[0].copy()?, None, &x[2], 1e-6)?,
                ])
            },
            &[
                r(&[rows, d], dtype, 1)?,
                r(&[rows, d], dtype, 3)?,
                r(&[rows, d], dtype, 4)?,
            ],
            tol,
            gpu,
        )?;
    }
    let w = (r(&[512], dtype, 2)? + 1.0)?;
    ok &= check_outputs(
        &format!("rms_norm_add + rms_norm_backward(residual, over_input) {dn}"),
        "(64, 512)",
        &move |x| {
            let w = w.to_device(x[0].device())?;
            let y = rms_norm_add(&x[0], Some(&w), 1e-6, &x[1])?;
            let dx = rms_norm_backward(&x[0], Some(&w), &x[2], 1e-6, Some(&x[1]))?;
            let over = rms_norm_backward_over_input(x[0].copy()?, Some(&w), &x[2], 1e-6)?;
            Ok(vec![y, dx, over])
        },
        &[
            r(&[64, 512], dtype, 1)?,
            r(&[64, 512], dtype, 3)?,
            r(&[64, 512], dtype, 4)?,
        ],
        tol,
        gpu,
    )?;
    ok &= check_outputs(
        &format!("gelu_tanh_mul_backward_in_place {dn}"),
        "(64, 3000)",
        &|x| {
            let (dg, du) = gelu_tanh_mul_backward_in_place(x[0].copy()?, x[1].copy()?, &x[2])?;
            Ok(vec![dg, du])
        },
        &[
            r(&[64, 3000], dtype, 1)?,
            r(&[64, 3000], dtype, 2)?,
            r(&[64, 3000], dtype, 3)?,
        ],
        tol,
        gpu,
    )?;
    // The MLP's gate / up adapter terms in the GeGLU's pass: ranks of one and three k-steps,
    // a partial tile of rows and of columns (bf16: the kernel; f32: the composite).
    for (m, n, rank) in [(100, 200, 16), (64, 128, 8), (70, 264, 48)] {
        ok &= check_outputs(
            &format!("gelu_tanh_mul_lora_up {dn} r{rank}"),
            &format!("({m}, {n})"),
            &|x| {
                let term = |low: &Tensor, b: &Tensor, scale| LoraUp {
                    low: low.clone(),
                    b: b.clone(),
                    scale,
                };
                let (gt, ut) = (term(&x[2], &x[3], 2.0), term(&x[4], &x[5], 0.5));
                let (g, u, act) = gelu_tanh_mul_lora_up(x[0].copy()?, x[1].copy()?, &gt, &ut)?;
                let act_only = gelu_tanh_mul_lora_up_act(x[0].copy()?, x[1].copy()?, &gt, &ut)?;
                Ok(vec![g, u, act, act_only])
            },
            &[
                r(&[m, n], dtype, 1)?,
                r(&[m, n], dtype, 2)?,
                r(&[m, rank], dtype, 3)?,
                r(&[n, rank], dtype, 4)?,
                r(&[m, rank], dtype, 5)?,
                r(&[n, rank], dtype, 6)?,
            ],
            tol,
            gpu,
        )?;
    }
    // Row halves [gate | up]: 16-byte packs (136 columns), and single elements (33).
    for (rows, c) in [(64, 136), (9, 33)] {
        ok &= check_outputs(
            &format!("gelu_tanh_mul_halves + backward {dn}"),
            &format!("({rows}, 2·{c})"),
            &|x| {
                let y = gelu_tanh_mul_halves(&x[0])?;
                let dgu = gelu_tanh_mul_halves_backward(&x[0], &x[1])?;
                Ok(vec![y, dgu])
            },
            &[r(&[rows, 2 * c], dtype, 1)?, r(&[rows, c], dtype, 2)?],
            tol,
            gpu,
        )?;
    }
    Ok(ok)
}

/// LoRA dropout (the same bits) and the fused linear cross-entropy against the CPU.
fn check_dropout_and_loss_head(dtype: DType, dn: &str, tol: f64, gpu: &Device) -> Result<bool> {
    let mut ok = true;
    // 16-byte packs only, and packs plus an odd tail.
    for (rows, cols) in [(64, 3000), (7, 1001)] {
        ok &= check(
            &format!("lora_dropout {dn}"),
            &format!("({rows}, {cols})"),
            &|x| lora_dropout(&x[0], 0.1, [1, 2, 3]),
            &[r(&[rows, cols], dtype, 1)?],
            &[true],
            0.0,
            gpu,
        )?;
    }
    let tg: Vec<u32> = (0..256u32)
        .map(|i| {
            if i % 7 == 3 {
                u32::MAX
            } else {
                (i * 2654435761u32) % 8192
            }
        })
        .collect();
    let tg = Tensor::new(tg.as_slice(), &Device::Cpu)?;
    let tgg = tg.clone();
    ok &= check(
        &format!("linear_cross_entropy {dn}"),
        "n256 h512 v8192 chunk96",
        &move |x| {
            linear_cross_entropy(&x[0], &x[1], &tgg.to_device(x[0].device())?, Some(30.0), 96)
        },
        &[r(&[256, 512], dtype, 1)?, r(&[8192, 512], dtype, 2)?],
        &[true, false],
        tol,
        gpu,
    )?;
    Ok(ok)
}

/// Attention, forward and backward, against the CPU on every kernel path: fused, blocked and
/// wgmma, with padding and with packed rows (the cases are listed below).
fn check_attention(dtype: DType, dn: &str, tol: f64, gpu: &Device) -> Result<bool> {
    let mut ok = true;
    let mask = Tensor::new(&[[1u8; 320], [1u8; 320]], &Device::Cpu)?.narrow(1, 0, 300)?;
    let mask = Tensor::cat(&[mask, Tensor::zeros((2, 20), DType::U8, &Device::Cpu)?], 1)?;
    // The fused kernels where they apply (forward: 16-bit, d 16 / 32 / 64 / 128 / 256 / 512;
    // backward: d 256 / 512; ragged last key and query tiles at t 320; the dK / dV kernel
    // splits the GQA groups of 2 and 8 over blocks, not the group of 1), then the blocked
    // kernels with 48-row (nh 8) / 96-row (nh 4) blocks and a ragged last block: 983,040 B =
    // 48 rows of b·nh·t fp32 scores at nh 8 (Q regrouped for the groups of 2 and 8). The
    // default plan picks between the two per call. Then packed rows ("segmented": a sequence
    // start at a fused block boundary, a sequence of length 1, starts inside the sliding
    // window, the padded last 20 keys inside each row's last sequence) at head dims 256, 512
    // and 32. At head dims 256 and 512 the fused kernels run on mma.sync and, in builds for
    // compute capability 90, on wgmma (elsewhere those rows repeat the mma.sync ones).
    let fused = AttentionPlan {
        backward: AttentionBackward::Fused,
        wgmma: false,
        ..AttentionPlan::default()
    };
    let wgmma = AttentionPlan {
        wgmma: true,
        ..fused
    };
    let blocked = AttentionPlan {
        forward: AttentionForward::Blocked,
        backward: AttentionBackward::Blocked,
        score_bytes: 983_040,
        wgmma: false,
    };
    let lens: [&[usize]; 2] = [&[64, 1, 150, 105], &[37, 200, 83]];
    let starts: Vec<u32> = lens
        .iter()
        .flat_map(|row| {
            let mut first = 0;
            row.iter().flat_map(move |&len| {
                first += len;
                std::iter::repeat_n((first - len) as u32, len)
            })
        })
        .collect();
    let starts = Tensor::from_vec(starts, (2, 320), &Device::Cpu)?;
    for ((nh, nkv, d, win, packed), plan) in [
        (8, 4, 256, Some(128), false),
        (4, 4, 256, Some(70), false),
        (8, 1, 512, None, false),
        (4, 2, 512, Some(100), false),
        (4, 2, 80, Some(33), false),
        (4, 4, 64, Some(50), false),
        (6, 2, 128, None, false),
        (4, 2, 32, Some(40), false),
        (2, 1, 16, None, false),
        (8, 4, 256, Some(128), true),
        (8, 4, 256, None, true),
        (4, 4, 256, Some(70), true),
        (4, 2, 512, Some(100), true),
        (4, 1, 512, None, true),
        (4, 2, 32, Some(40), true),
    ]
    .into_iter()
    .flat_map(|c| {
        // The wgmma kernels (Hopper builds) where they apply: head dims 256 and 512.
        let wgmma = [256, 512].contains(&c.2).then_some((c, wgmma));
        [(c, fused), (c, blocked)].into_iter().chain(wgmma)
    }) {
        let (m, st) = (mask.clone(), packed.then(|| starts.clone()));
        let what = if packed { " segmented" } else { "" };
        ok &= check(
            &format!("attention{what} {dn} win={win:?} {plan:?}"),
            &format!("b2 nh{nh} nkv{nkv} t320 d{d}"),
            &move |x| {
                let dev = x[0].device();
                let padding = m.to_device(dev)?;
                let seq_start = st.as_ref().map(|s| s.to_device(dev)).transpose()?;
                let keys = KeyMask {
                    padding: Some(&padding),
                    seq_start: seq_start.as_ref(),
                };
                attention(
                    &x[0],
                    &x[1],
                    &x[2],
                    keys,
                    win,
                    1.0 / (d as f64).sqrt(),
                    &plan,
                )
            },
            &[
                r(&[2, nh, 320, d], dtype, 1)?,
                r(&[2, nkv, 320, d], dtype, 2)?,
                r(&[2, nkv, 320, d], dtype, 3)?,
            ],
            &[true, true, true],
            tol,
            gpu,
        )?;
    }
    Ok(ok)
}

/// The dropout mask bits, the gradient norm and three AdamW steps with clipping: CPU and CUDA
/// must agree exactly (the norm and AdamW to fp32 rounding).
fn check_bit_exact(gpu: &Device) -> Result<bool> {
    let mut ok = true;
    let mc = dropout_mask((1000, 999), 0.1, [5, 6, 7], &Device::Cpu)?;
    let mg = dropout_mask((1000, 999), 0.1, [5, 6, 7], gpu)?.to_device(&Device::Cpu)?;
    let bad = mc
        .ne(&mg)?
        .to_dtype(DType::F32)?
        .sum_all()?
        .to_scalar::<f32>()?;
    println!(
        "| dropout_mask bits | (1000, 999) | {bad} differing | - | {} |",
        if bad == 0.0 { "ok" } else { "FAIL" }
    );
    ok &= bad == 0.0;
    let gbig = (r(&[3_000_001], DType::F32, 4)? * 0.01)?;
    let nc = l2_norm(&gbig)?.to_scalar::<f32>()? as f64;
    let ng = l2_norm(&gbig.to_device(gpu)?)?
        .to_device(&Device::Cpu)?
        .to_scalar::<f32>()? as f64;
    let rel_n = (ng - nc).abs() / nc;
    println!(
        "| l2_norm | n=3,000,001 | {rel_n:.2e} | - | {} |",
        if rel_n < 1e-5 { "ok" } else { "FAIL" }
    );
    ok &= rel_n < 1e-5;
    let n = 1 << 20;
    let hp = AdamWParams::with_weight_decay(0.01);
    let mut states = Vec::new();
    for dev in [Device::Cpu, gpu.clone()] {
        let p = r(&[n], DType::F32, 1)?.to_device(&dev)?;
        let (m, v) = (
            Tensor::zeros(n, DType::F32, &dev)?,
            Tensor::zeros(n, DType::F32, &dev)?,
        );
        for step in 1..=3 {
            let g = r(&[n], DType::F32, 10 + step)?.to_device(&dev)?;
            let norm = l2_norm(&g)?.to_device(&Device::Cpu)?.to_scalar::<f32>()?;
            let coef = Tensor::new(&[(1.0 / (norm + 1e-6)).min(1.0)], &dev)?;
            let s = AdamWScalars::new(&hp, 1e-3, step);
            adamw_step(&p, &g, &m, &v, &s, &coef)?;
        }
        states.push(
            [p, m, v]
                .iter()
                .map(|t| t.to_device(&Device::Cpu))
                .collect::<Result<Vec<_>>>()?,
        );
    }
    let mut worst = 0f64;
    for (a, b) in states[0].iter().zip(&states[1]) {
        worst = worst.max(diff(b, a, 1e-12)?.0);
    }
    println!(
        "| adamw_step (3 steps, clip) | n=2^20 | {worst:.2e} | - | {} |",
        if worst < 1e-6 { "ok" } else { "FAIL" }
    );
    ok &= worst < 1e-6;

    Ok(ok)
}

/// Fused against slow on the GPU at the 12B's shapes (seq 2048, bf16): forward and
/// forward + backward µs of each op, and the optimizer's norm + AdamW over the 12B's LoRA
/// parameters.
fn print_timings(gpu: &Device) -> Result<()> {
    let bf = DType::BF16;
    let hp = AdamWParams::with_weight_decay(0.01);
    println!("\nTimings on the GPU, 12B shapes, bf16, µs (mean of 5 after a warm-up; fwd+bwd = forward + backward_with_seed):\n");
    println!("| op | shape | fused fwd | fused fwd+bwd | slow fwd | slow fwd+bwd | speed-up fwd+bwd |\n|---|---|---|---|---|---|---|");
    let (t, h, inter) = (2048, 3840, 15360);
    time_row(
        "rms_norm",
        "(2048, 3840)",
        &|x| rms_norm(&x[0], Some(&x[1]), 1e-6),
        &|x| rms_norm_slow(&x[0], Some(&x[1]), 1e-6),
        &[r(&[t, h], bf, 1)?, r(&[h], bf, 2)?],
        gpu,
    )?;
    // The 26B-A4B router's input scale (its hidden size), against Candle's broadcast multiply and
    // fp32 round trip.
    let c = 2816f64.powf(-0.5);
    time_row(
        "mul_vector_scalar (router scale)",
        "(2048, 2816)",
        &|x| mul_vector_scalar(&x[0], &x[1], c),
        &|x| (x[0].broadcast_mul(&x[1])?.to_dtype(DType::F32)? * c)?.to_dtype(bf),
        &[r(&[t, 2816], bf, 1)?, r(&[2816], bf, 2)?],
        gpu,
    )?;
    time_row(
        "q_norm (no w)",
        "(1,16,2048,256)",
        &|x| rms_norm(&x[0], None, 1e-6),
        &|x| rms_norm_slow(&x[0], None, 1e-6),
        &[r(&[1, 16, t, 256], bf, 1)?],
        gpu,
    )?;
    let (c, s) = rope_tables(1, t, 256, bf)?;
    let (cg, sg) = (c.to_device(gpu)?, s.to_device(gpu)?);
    time_row(
        "rope",
        "(1,16,2048,256)",
        &|x| rope(&x[0], &cg, &sg),
        &|x| rope_slow(&x[0], &cg, &sg),
        &[r(&[1, 16, t, 256], bf, 1)?],
        gpu,
    )?;
    time_row(
        "gelu_tanh_mul",
        "(2048, 15360)",
        &|x| gelu_tanh_mul(&x[0], &x[1]),
        &|x| gelu_tanh_mul_slow(&x[0], &x[1]),
        &[r(&[t, inter], bf, 1)?, r(&[t, inter], bf, 2)?],
        gpu,
    )?;
    time_row(
        "softmax",
        "(16*2048, 2048)",
        &|x| softmax_last_dim(&x[0]),
        &|x| softmax_last_dim_slow(&x[0]),
        &[r(&[16 * t, t], bf, 1)?],
        gpu,
    )?;
    for (out, inf) in [(4096, h), (inter, h), (h, inter)] {
        let drop = Some((0.05, [1, 2, 3]));
        time_row(
            "lora_linear r16 (fp32 adapter) p=0.05",
            &format!("x ({t}, {inf}) -> {out}"),
            &move |x| lora_linear(&x[0], &x[1], AdapterOperands::new(&x[2], &x[3]), 2.0, drop),
            &move |x| lora_linear_slow(&x[0], &x[1], &x[2], &x[3], 2.0, drop),
            &[
                r(&[t, inf], bf, 1)?,
                (r(&[out, inf], bf, 2)? * 0.02)?,
                (r(&[16, inf], DType::F32, 3)? * 0.02)?,
                (r(&[out, 16], DType::F32, 4)? * 0.02)?,
            ],
            gpu,
        )?;
    }
    time_row(
        "lora_dropout p=0.1",
        "(2048, 3840)",
        &|x| lora_dropout(&x[0], 0.1, [1, 2, 3]),
        &|x| lora_dropout_slow(&x[0], 0.1, [1, 2, 3]),
        &[r(&[t, h], bf, 1)?],
        gpu,
    )?;
    // Sliding layer: the fused forward with 4- and 8-warp blocks, then the blocked forward, each
    // with the fused and the blocked backward; full layer (head dim 512): the fused forward (8
    // warps with either plan) and the blocked one, with either backward. Between them, the wgmma
    // kernels (forward, dQ, and dK / dV at head dim 256; builds for other GPUs run the mma.sync
    // FusedW8 rows there).
    let plan = |forward, backward| AttentionPlan {
        forward,
        backward,
        wgmma: false,
        ..AttentionPlan::default()
    };
    let (fb, bb) = (AttentionBackward::Fused, AttentionBackward::Blocked);
    let wgmma = |backward| AttentionPlan {
        wgmma: true,
        ..plan(AttentionForward::FusedW8, backward)
    };
    for (nh, nkv, d, win, plan) in [
        (16, 8, 256, Some(1024), plan(AttentionForward::FusedW4, fb)),
        (16, 8, 256, Some(1024), plan(AttentionForward::FusedW8, fb)),
        (16, 8, 256, Some(1024), plan(AttentionForward::FusedW8, bb)),
        (16, 8, 256, Some(1024), plan(AttentionForward::Blocked, bb)),
        (16, 8, 256, Some(1024), wgmma(fb)),
        (16, 1, 512, None, wgmma(fb)),
        (16, 1, 512, None, wgmma(bb)),
        (16, 1, 512, None, plan(AttentionForward::FusedW8, fb)),
        (16, 1, 512, None, plan(AttentionForward::FusedW8, bb)),
        (16, 1, 512, None, plan(AttentionForward::Blocked, bb)),
    ] {
        let sc = 1.0;
        time_row(
            &format!(
                "attention win={win:?} fwd {:?} bwd {:?} wgmma {}",
                plan.forward, plan.backward, plan.wgmma
            ),
            &format!("(1,{nh},2048,{d}) kv{nkv}"),
            &move |x| attention(&x[0], &x[1], &x[2], KeyMask::default(), win, sc, &plan),
            &move |x| attention_slow(&x[0], &x[1], &x[2], KeyMask::default(), win, sc),
            &[
                r(&[1, nh, t, d], bf, 1)?,
                r(&[1, nkv, t, d], bf, 2)?,
                r(&[1, nkv, t, d], bf, 3)?,
            ],
            gpu,
        )?;
    }
    let tg: Vec<u32> = (0..t as u32)
        .map(|i| (i * 2654435761u32) % 262144)
        .collect();
    let tg = Tensor::new(tg.as_slice(), gpu)?;
    let w = r(&[262144, h], bf, 2)?.to_device(gpu)?;
    let (tg2, w2) = (tg.clone(), w.clone());
    time_row(
        "linear_cross_entropy chunk 1024",
        "n2048 h3840 v262144",
        &move |x| linear_cross_entropy(&x[0], &w, &tg, Some(30.0), 1024),
        &move |x| linear_cross_entropy_slow(&x[0], &w2, &tg2, Some(30.0)),
        &[r(&[t, h], bf, 1)?],
        gpu,
    )?;
    let n = 65_568_768;
    let p = Tensor::zeros(n, DType::F32, gpu)?;
    let (g, m, v) = (
        Tensor::ones(n, DType::F32, gpu)?,
        Tensor::zeros(n, DType::F32, gpu)?,
        Tensor::zeros(n, DType::F32, gpu)?,
    );
    let mut step = 0;
    let one = Tensor::new(&[1f32], gpu)?;
    let us = time_us(gpu, 5, || {
        step += 1;
        l2_norm(&g)?;
        adamw_step(&p, &g, &m, &v, &AdamWScalars::new(&hp, 1e-3, step), &one)
    })?;
    let us_step = time_us(gpu, 5, || {
        step += 1;
        adamw_step(&p, &g, &m, &v, &AdamWScalars::new(&hp, 1e-3, step), &one)
    })?;
    println!("| l2_norm + adamw_step | n=65,568,768 (12B LoRA r16) | {us:.0} (adamw_step alone {us_step:.0}; {:.0} GB/s) | - | - | - | - |", 28.0 * n as f64 / us_step / 1e3);
    Ok(())
}

/// The gate / up adapter terms added in the GeGLU's pass against the projections' own outputs, at
/// the 12B's MLP shape, with a term much smaller than the output (B just after its zero init) and
/// one of its size: the same bits for gate, up and their GeGLU (also from the `act`-only pass,
/// written over gate); and the sums against the exactly
/// rounded ones (f64 on the CPU, first 256 rows): the share of elements that differ (fp32
/// accumulation can flip a near-tie), at most 0.1%.
#[test]
fn gpu_lora_up_geglu_against_the_projection() -> Result<()> {
    let gpu = Device::new_cuda(0)?;
    let (bf, f32_) = (DType::BF16, DType::F32);
    let (m, inf, n, rank) = (2048, 3840, 15360, 16);
    let x = r(&[m, inf], bf, 1)?.to_device(&gpu)?;
    let w = (r(&[n, inf], f32_, 2)? * 0.02)?
        .to_dtype(bf)?
        .to_device(&gpu)?;
    let a = (r(&[rank, inf], f32_, 3)? * 0.02)?.to_device(&gpu)?;
    let drop = Some((0.05, crate::dropout_key(1, 2, "mlp.gate_proj")));
    let host = |t: &Tensor| -> Result<Vec<f32>> { t.to_dtype(f32_)?.flatten_all()?.to_vec1() };
    let mut ok = true;
    for b_scale in [1e-5, 0.05] {
        let b = (r(&[n, rank], f32_, 4)? * b_scale)?.to_device(&gpu)?;
        let ops = AdapterOperands::new(&a, &b);
        let (want, _) = lora_linear_saved(&x, &w, ops, 2.0, drop, None)?;
        let (base, _, term) = lora_linear_saved_deferred(&x, &w, ops, 2.0, drop, None)?;
        let exact_rows = base.narrow(0, 0, 256)?;
        let base_h = host(&exact_rows)?;
        let (low_h, b_h) = (host(&term.low)?, host(&term.b.to_dtype(f32_)?)?);
        let act_only = gelu_tanh_mul_lora_up_act(base.copy()?, base.copy()?, &term, &term)?;
        let (g, u, act) = gelu_tanh_mul_lora_up(base.copy()?, base, &term, &term)?;
        let want_act = gelu_tanh_mul(&want, &want)?;
        let same = |p: &Tensor, q: &Tensor| -> Result<bool> { Ok(host(p)? == host(q)?) };
        let bits_ok = same(&g, &want)?
            && same(&u, &want)?
            && same(&act, &want_act)?
            && same(&act_only, &want_act)?;
        let g_h = host(&g)?;
        let mut off = 0usize;
        for i in 0..256 * n {
            let (row, col) = (i / n, i % n);
            let dot: f64 = (0..rank)
                .map(|k| low_h[row * rank + k] as f64 * b_h[col * rank + k] as f64)
                .sum();
            let exact = half::bf16::from_f64(base_h[i] as f64 + 2.0 * dot).to_f32();
            off += (exact != g_h[i]) as usize;
        }
        let share = off as f64 / (256 * n) as f64;
        println!(
            "B scale {b_scale:e}: fused == projection + GeGLU bits: {bits_ok}; {off} of {} sums ({:.4}%) differ from the exactly rounded ones",
            256 * n,
            100.0 * share
        );
        ok &= bits_ok && share <= 1e-3;
    }
    if !ok {
        bail!("the fused terms differ from the projection's or from the exact sums (see above)");
    }
    Ok(())
}

/// `cast_together` on the GPU: the bits and shapes of each tensor's own `to_dtype` (GPU and CPU),
/// for 18 tensors (two launches of the 16-segment kernel) of odd sizes, in bf16 and f16.
#[test]
fn gpu_cast_together_gives_to_dtype_bits() -> Result<()> {
    let gpu = Device::new_cuda(0)?;
    let srcs: Vec<Tensor> = (0..18)
        .map(|k| (r(&[k + 1, 3 * k + 7], DType::F32, k as u64)? * 100.0)?.to_device(&gpu))
        .collect::<Result<_>>()?;
    let refs: Vec<&Tensor> = srcs.iter().collect();
    for dtype in [DType::BF16, DType::F16] {
        let out = cast_together(&refs, dtype)?;
        for (k, (got, src)) in out.iter().zip(&srcs).enumerate() {
            let host = |t: &Tensor| -> Result<Vec<f32>> {
                t.to_dtype(DType::F32)?.flatten_all()?.to_vec1()
            };
            let (want_gpu, want_cpu) = (
                src.to_dtype(dtype)?,
                src.to_device(&Device::Cpu)?.to_dtype(dtype)?,
            );
            if got.dims() != src.dims()
                || got.dtype() != dtype
                || host(got)? != host(&want_gpu)?
                || host(got)? != host(&want_cpu)?
            {
                bail!(
                    "cast_together {dtype:?}: tensor {k} {:?} differs from to_dtype",
                    src.dims()
                );
            }
        }
    }
    Ok(())
}

/// The bits of a float tensor's elements, widened to f32 (exact for every float dtype here).
fn bits_of(t: &Tensor) -> Result<Vec<u32>> {
    let v: Vec<f32> = t.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
    Ok(v.into_iter().map(f32::to_bits).collect())
}

/// The fused attention backward gives the same bits on every run, also where its dK / dV kernel
/// splits a GQA group's query heads over blocks (here every group: few kv heads and short rows,
/// the E2B's one kv head among them), on mma.sync and on wgmma.
#[test]
fn gpu_attention_backward_is_deterministic() -> Result<()> {
    let gpu = Device::new_cuda(0)?;
    let fused = AttentionPlan {
        backward: AttentionBackward::Fused,
        wgmma: false,
        ..AttentionPlan::default()
    };
    let bits = |ts: &[Tensor]| -> Result<Vec<Vec<u32>>> { ts.iter().map(bits_of).collect() };
    for plan in [
        fused,
        AttentionPlan {
            wgmma: true,
            ..fused
        },
    ] {
        for (nkv, d) in [(1, 256), (1, 512), (2, 256)] {
            let inputs = [
                r(&[2, 8, 320, d], DType::BF16, 1)?,
                r(&[2, nkv, 320, d], DType::BF16, 2)?,
                r(&[2, nkv, 320, d], DType::BF16, 3)?,
            ];
            let scale = 1.0 / (d as f64).sqrt();
            let f = |x: &[Tensor]| {
                attention(&x[0], &x[1], &x[2], KeyMask::default(), None, scale, &plan)
            };
            let first = bits(&run(&f, &inputs, &[true; 3], &gpu)?)?;
            for _ in 0..3 {
                if bits(&run(&f, &inputs, &[true; 3], &gpu)?)? != first {
                    bail!("attention nkv {nkv} d {d} {plan:?}: a second run gave other bits");
                }
            }
        }
    }
    Ok(())
}

/// `HostOffload` on the GPU: tensors of each float dtype parked, their device copies dropped at
/// once, then fetched back (one prefetched ahead, one not) with the same bits and shape; a slot
/// parked again with a larger tensor (its host buffer grown) and with a smaller one (reused);
/// kernels queued right after a park and after a fetch read the parked values.
#[test]
fn gpu_host_offload_round_trips() -> Result<()> {
    let gpu = Device::new_cuda(0)?;
    let mut park = HostOffload::new(&gpu, 3)?;
    let rounds: [&[(usize, &[usize], DType)]; 3] = [
        &[
            (0, &[5, 7], DType::F32),
            (1, &[256, 3840], DType::BF16),
            (2, &[1], DType::F16),
        ],
        &[(0, &[512, 3840], DType::BF16), (1, &[3, 3], DType::F32)],
        &[(0, &[7, 5], DType::F16), (2, &[1024, 3840], DType::BF16)],
    ];
    for (k, round) in rounds.iter().enumerate() {
        let mut want = Vec::new();
        for &(slot, dims, dtype) in round.iter() {
            let src = r(dims, DType::F32, (10 * k + slot) as u64)?.to_device(&gpu)?;
            let bits = bits_of(&(&src * 3.0)?.to_dtype(dtype)?)?;
            // Made by kernels just before the park and dropped right after it: the next round's
            // kernels may get its memory once the copy is done.
            let t = (src * 3.0)?.to_dtype(dtype)?;
            park.park(slot, &t)?;
            drop(t);
            want.push((slot, dims.to_vec(), dtype, bits));
        }
        let (first, rest) = want.split_first().expect("each round parks");
        park.prefetch(first.0)?;
        for (slot, dims, dtype, bits) in std::iter::once(first).chain(rest) {
            let got = (park.fetch(*slot)? * 1.0)?;
            if got.dims() != dims.as_slice() || got.dtype() != *dtype || bits_of(&got)? != *bits {
                bail!("host offload round {k}: slot {slot} {dims:?} {dtype:?} came back different");
            }
        }
    }
    if park.fetch(1).is_ok() {
        bail!("host offload: a fetched slot gave a tensor again");
    }
    Ok(())
}
