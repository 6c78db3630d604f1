//! Memory-efficient causal attention with sliding window, key padding mask and GQA: the (t, t)
//! score matrix is never stored. Forward keeps the per-row log-sum-exp (fp32) for the backward,
//! which recomputes the probabilities (FlashAttention-2's recurrences: `D_i = do_i·o_i`,
//! `ds = p·(do·v − D)`). The CPU path below is the plain-loop reference, one row at a time. On
//! CUDA (`attention_cuda.rs`) the queries go in blocks through cuBLAS tensor-core GEMMs with fp32
//! scores and two row kernels (`kernels/attention.cu`); memory per call is O(t·block), and the
//! block-wise causal / window bounds skip the masked key ranges. The forward of 16-bit inputs with
//! head dim 16–512 is one fused kernel instead (`kernels/attention_flash.cu`, FlashAttention-2's
//! one-pass online softmax on tensor cores).
//!
//! Mask semantics (transformers Gemma 4, `docs/gemma4.md` §4.3): query i attends key j iff
//! `j <= i`, `i − j < window` (exactly W keys including itself) and `key_mask[b, j] != 0`. Query head
//! h uses kv head `h / (nh / nkv)`. Scores, softmax and accumulation in fp32, output rounded to the
//! input dtype. A query row with no allowed key (only possible with left padding) outputs zeros;
//! the finite-min additive mask of the reference gives a uniform average there instead.

use crate::util::{cpu_slice, with_cpu_storage, with_float_type, Elem, Stash, Storable};
use candle_core::{bail, CpuStorage, CustomOp1, CustomOp3, DType, Layout, Result, Shape, Tensor};

/// Sizes and mask parameters shared by the forward and backward.
#[derive(Clone, Copy)]
struct Dims {
    b: usize,
    nh: usize,
    nkv: usize,
    t: usize,
    d: usize,
    window: usize, // 0 = none
    scale: f32,
}

impl Dims {
    /// Keys `lo..=i` query `i` may see before the padding mask.
    fn keys(&self, i: usize) -> std::ops::RangeInclusive<usize> {
        let lo = if self.window > 0 {
            (i + 1).saturating_sub(self.window)
        } else {
            0
        };
        lo..=i
    }

    fn q_elems(&self) -> usize {
        self.b * self.nh * self.t * self.d
    }

    fn kv_elems(&self) -> usize {
        self.b * self.nkv * self.t * self.d
    }
}

/// Forward op on `(q, k, v)`; stashes the log-sum-exp for the backward.
struct Attention {
    n: Dims,
    mask: Tensor, // (b, t) u8
    lse: Stash,
}

/// Backward op on `q` → packed `[dq (b, nh, t, d), dk (b, nkv, t, d), dv (b, nkv, t, d)]`.
struct AttentionBwd {
    n: Dims,
    k: Tensor,
    v: Tensor,
    o: Tensor,
    dout: Tensor,
    lse: Tensor,
    mask: Tensor,
}

fn dot<T: Elem>(a: &[T], b: &[T]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x.to_f32() * y.to_f32()).sum()
}

/// Returns `(o, lse)`; `lse = +inf` marks a row with no allowed key.
fn fwd_cpu<T: Elem>(q: &[T], k: &[T], v: &[T], mask: &[u8], n: &Dims) -> (Vec<T>, Vec<f32>) {
    let (t, d) = (n.t, n.d);
    let mut o = vec![T::from_f32(0.0); n.q_elems()];
    let mut lse = vec![f32::INFINITY; n.b * n.nh * t];
    let mut scores = Vec::with_capacity(t);
    let mut acc = vec![0f32; d];
    for b in 0..n.b {
        for h in 0..n.nh {
            let kv0 = (b * n.nkv + h / (n.nh / n.nkv)) * t;
            for i in 0..t {
                let row = (b * n.nh + h) * t + i;
                let qr = &q[row * d..(row + 1) * d];
                scores.clear();
                for j in n.keys(i).filter(|&j| mask[b * t + j] != 0) {
                    scores.push((j, dot(qr, &k[(kv0 + j) * d..(kv0 + j + 1) * d]) * n.scale));
                }
                if scores.is_empty() {
                    continue;
                }
                let m = scores.iter().map(|s| s.1).fold(f32::NEG_INFINITY, f32::max);
                let l: f32 = scores.iter().map(|s| (s.1 - m).exp()).sum();
                acc.iter_mut().for_each(|a| *a = 0.0);
                for &(j, s) in &scores {
                    let p = (s - m).exp() / l;
                    for (a, x) in acc.iter_mut().zip(&v[(kv0 + j) * d..(kv0 + j + 1) * d]) {
                        *a += p * x.to_f32();
                    }
                }
                for (dst, a) in o[row * d..(row + 1) * d].iter_mut().zip(&acc) {
                    *dst = T::from_f32(*a);
                }
                lse[row] = m + l.ln();
            }
        }
    }
    (o, lse)
}

/// Packed `[dq, dk, dv]` (see [`AttentionBwd`]).
struct BwdIn<'a, T> {
    q: &'a [T],
    k: &'a [T],
    v: &'a [T],
    o: &'a [T],
    dout: &'a [T],
    lse: &'a [f32],
    mask: &'a [u8],
}

fn bwd_cpu<T: Elem>(x: &BwdIn<'_, T>, n: &Dims) -> Vec<T> {
    let (t, d) = (n.t, n.d);
    let mut dq = vec![0f32; n.q_elems()];
    let mut dk = vec![0f32; n.kv_elems()];
    let mut dv = vec![0f32; n.kv_elems()];
    for b in 0..n.b {
        for h in 0..n.nh {
            let kv0 = (b * n.nkv + h / (n.nh / n.nkv)) * t;
            for i in 0..t {
                let row = (b * n.nh + h) * t + i;
                let r = row * d..(row + 1) * d;
                let (qr, dor) = (&x.q[r.clone()], &x.dout[r.clone()]);
                if x.lse[row] == f32::INFINITY {
                    continue;
                }
                let dd = dot(dor, &x.o[r.clone()]);
                for j in n.keys(i).filter(|&j| x.mask[b * t + j] != 0) {
                    let kr = (kv0 + j) * d..(kv0 + j + 1) * d;
                    let p = (dot(qr, &x.k[kr.clone()]) * n.scale - x.lse[row]).exp();
                    let ds = p * (dot(dor, &x.v[kr.clone()]) - dd);
                    for c in 0..d {
                        dq[row * d + c] += ds * x.k[kr.start + c].to_f32() * n.scale;
                        dk[kr.start + c] += ds * qr[c].to_f32() * n.scale;
                        dv[kr.start + c] += p * dor[c].to_f32();
                    }
                }
            }
        }
    }
    dq.iter()
        .chain(&dk)
        .chain(&dv)
        .map(|v| T::from_f32(*v))
        .collect()
}

impl CustomOp3 for Attention {
    fn name(&self) -> &'static str {
        "attention"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let op = self.name();
        let n = self.n;
        with_float_type!(s1, op, T => {
            let q = cpu_slice::<T>(s1, l1, op, "q")?;
            let k = cpu_slice::<T>(s2, l2, op, "k")?;
            let v = cpu_slice::<T>(s3, l3, op, "v")?;
            let (o, lse) = with_cpu_storage(&self.mask, op, "key_mask", |ms, ml| {
                Ok(fwd_cpu(q, k, v, cpu_slice::<u8>(ms, ml, op, "key_mask")?, &n))
            })?;
            self.lse.put(Tensor::from_vec(lse, (n.b, n.nh, n.t), &candle_core::Device::Cpu)?);
            Ok((T::storage(o), l1.shape().clone()))
        })
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (o, lse) = cuda_impl::forward(
            self.name(),
            &self.n,
            (s1, l1),
            (s2, l2),
            (s3, l3),
            &self.mask,
        )?;
        let n = &self.n;
        self.lse.put(crate::util::tensor_from_storage(
            candle_core::Storage::Cuda(lse),
            &[n.b, n.nh, n.t],
        ));
        Ok((o, l1.shape().clone()))
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        o: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let saved = AttentionSaved {
            n: self.n,
            mask: self.mask.clone(),
            lse: self.lse.get(self.name())?,
        };
        let (dq, dk, dv) = saved.backward(q, k, v, o, g)?;
        Ok((Some(dq), Some(dk), Some(dv)))
    }
}

/// What the backward of [`attention_saved`] reads besides `q`, `k`, `v`, the output and its
/// gradient: the validated sizes, the key mask and the per-row log-sum-exp (fp32).
pub struct AttentionSaved {
    n: Dims,
    mask: Tensor,
    lse: Tensor,
}

impl AttentionSaved {
    /// `(dq, dk, dv)` from the forward's inputs `q`, `k`, `v`, its output `o` and the output
    /// gradient `g` (the kernels autograd runs). Records no graph.
    pub fn backward(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        o: &Tensor,
        g: &Tensor,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let n = self.n;
        if q.dims() != [n.b, n.nh, n.t, n.d] || o.dims() != q.dims() || g.dims() != q.dims() {
            bail!(
                "attention backward: q {:?}, o {:?} and grad {:?} must be the forward's ({}, {}, {}, {})",
                q.dims(),
                o.dims(),
                g.dims(),
                n.b,
                n.nh,
                n.t,
                n.d
            );
        }
        let op = AttentionBwd {
            n,
            k: k.contiguous()?,
            v: v.contiguous()?,
            o: o.contiguous()?,
            dout: g.contiguous()?,
            lse: self.lse.clone(),
            mask: self.mask.clone(),
        };
        let packed = q.contiguous()?.apply_op1_no_bwd(&op)?;
        let (nq, nkv) = (n.q_elems(), n.kv_elems());
        let dq = packed.narrow(0, 0, nq)?.reshape(q.dims())?;
        let dk = packed.narrow(0, nq, nkv)?.reshape(k.dims())?;
        let dv = packed.narrow(0, nq + nkv, nkv)?.reshape(v.dims())?;
        Ok((dq, dk, dv))
    }
}

impl CustomOp1 for AttentionBwd {
    fn name(&self) -> &'static str {
        "attention-bwd"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let op = self.name();
        let n = self.n;
        with_float_type!(s, op, T => {
            let q = cpu_slice::<T>(s, l, op, "q")?;
            let get = |t: &Tensor, what: &str| -> Result<Vec<T>> {
                with_cpu_storage(t, op, what, |s, l| Ok(cpu_slice::<T>(s, l, op, what)?.to_vec()))
            };
            let (k, v, o, dout) = (get(&self.k, "k")?, get(&self.v, "v")?, get(&self.o, "o")?, get(&self.dout, "grad")?);
            let lse = with_cpu_storage(&self.lse, op, "lse", |s, l| Ok(cpu_slice::<f32>(s, l, op, "lse")?.to_vec()))?;
            let mask = with_cpu_storage(&self.mask, op, "key_mask", |s, l| Ok(cpu_slice::<u8>(s, l, op, "key_mask")?.to_vec()))?;
            let x = BwdIn { q, k: &k, v: &v, o: &o, dout: &dout, lse: &lse, mask: &mask };
            let out = bwd_cpu(&x, &n);
            let len = out.len();
            Ok((T::storage(out), Shape::from(len)))
        })
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let out = cuda_impl::backward(self, (s, l))?;
        Ok((out, Shape::from(self.n.q_elems() + 2 * self.n.kv_elems())))
    }
}

#[cfg(feature = "cuda")]
#[path = "attention_cuda.rs"]
mod cuda_impl;
#[cfg(all(test, feature = "cuda"))]
pub(crate) use cuda_impl::{
    set_flash_forward, set_flash_warps, set_score_bytes, DEFAULT_SCORE_BYTES,
};

/// Validated sizes, or an error naming the mismatching tensor.
fn dims(q: &Tensor, k: &Tensor, v: &Tensor, window: Option<usize>, scale: f64) -> Result<Dims> {
    let (b, nh, t, d) = q.dims4()?;
    let (kb, nkv, kt, kd) = k.dims4()?;
    if (kb, kt, kd) != (b, t, d) || v.dims() != k.dims() || nkv == 0 || nh % nkv != 0 {
        bail!(
            "attention: q {:?} (b, nh, t, d), k {:?} and v {:?} must be (b, nkv, t, d) with nh % nkv == 0",
            q.dims(),
            k.dims(),
            v.dims()
        );
    }
    if k.dtype() != q.dtype() || v.dtype() != q.dtype() {
        bail!(
            "attention: q, k, v dtypes differ: {:?} {:?} {:?}",
            q.dtype(),
            k.dtype(),
            v.dtype()
        );
    }
    if window == Some(0) {
        bail!("attention: window must be at least 1 (it counts the query itself)");
    }
    Ok(Dims {
        b,
        nh,
        nkv,
        t,
        d,
        window: window.unwrap_or(0),
        scale: scale as f32,
    })
}

/// The key mask as (b, t) u8 with 1 = keep (all ones when `None`).
fn key_mask_u8(key_mask: Option<&Tensor>, q: &Tensor, n: &Dims) -> Result<Tensor> {
    match key_mask {
        None => Tensor::ones((n.b, n.t), DType::U8, q.device()),
        Some(m) => {
            if m.dims() != [n.b, n.t] {
                bail!(
                    "attention: key_mask must be ({}, {}), got {:?}",
                    n.b,
                    n.t,
                    m.dims()
                );
            }
            m.ne(0u32)?.contiguous()
        }
    }
}

/// Causal attention `softmax(q·kᵀ·scale + mask)·v`, memory-efficient (no (t, t) tensor).
///
/// `q`: (b, nh, t, d); `k`, `v`: (b, nkv, t, d), nh a multiple of nkv (GQA: query head h reads
/// kv head `h / (nh / nkv)`); all the same float dtype. `key_mask`: (b, t) u8 or u32, nonzero = keep
/// (padding mask), or `None`. `window`: `Some(W)` lets query i see keys `i−W < j <= i` (W keys
/// including itself), `None` = full causal. `scale` multiplies the scores (Gemma 4: 1.0).
/// Fp32 scores and softmax, output in the input dtype. Gradients for q, k and v.
pub fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    key_mask: Option<&Tensor>,
    window: Option<usize>,
    scale: f64,
) -> Result<Tensor> {
    let n = dims(q, k, v, window, scale)?;
    let mask = key_mask_u8(key_mask, q, &n)?;
    let op = Attention {
        n,
        mask,
        lse: Stash::default(),
    };
    q.contiguous()?
        .apply_op3(&k.contiguous()?, &v.contiguous()?, op)
}

/// [`attention`] without a graph, for explicit backward passes: the output and what
/// [`AttentionSaved::backward`] needs (same arguments and numerics as [`attention`]).
pub fn attention_saved(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    key_mask: Option<&Tensor>,
    window: Option<usize>,
    scale: f64,
) -> Result<(Tensor, AttentionSaved)> {
    let n = dims(q, k, v, window, scale)?;
    let mask = key_mask_u8(key_mask, q, &n)?;
    let op = Attention {
        n,
        mask,
        lse: Stash::default(),
    };
    let o = q
        .contiguous()?
        .apply_op3_no_bwd(&k.contiguous()?, &v.contiguous()?, &op)?;
    let lse = op.lse.get("attention")?;
    let saved = AttentionSaved {
        n,
        mask: op.mask,
        lse,
    };
    Ok((o, saved))
}

/// Composite reference for [`attention`]: fp32 scores with an additive finite-min mask (as
/// transformers' eager path, without its bf16 rounding of the scores), fp32 softmax, fp32 P·V,
/// one rounding. Materialises (b, nh, t, t).
pub fn attention_slow(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    key_mask: Option<&Tensor>,
    window: Option<usize>,
    scale: f64,
) -> Result<Tensor> {
    let n = dims(q, k, v, window, scale)?;
    let dtype = q.dtype();
    let rep = n.nh / n.nkv;
    let repeat = |x: &Tensor| -> Result<Tensor> {
        x.to_dtype(DType::F32)?
            .unsqueeze(2)?
            .broadcast_as((n.b, n.nkv, rep, n.t, n.d))?
            .reshape((n.b, n.nh, n.t, n.d))
    };
    let (kf, vf) = (repeat(k)?, repeat(v)?);
    let qf = q.to_dtype(DType::F32)?;
    let scores = (qf.matmul(&kf.t()?)? * scale)?; // (b, nh, t, t)
    let keep = key_mask_u8(key_mask, q, &n)?.to_vec2::<u8>()?;
    let mut add = vec![0f32; n.b * n.t * n.t];
    for b in 0..n.b {
        for i in 0..n.t {
            for j in 0..n.t {
                if !(n.keys(i).contains(&j) && keep[b][j] != 0) {
                    add[(b * n.t + i) * n.t + j] = f32::MIN;
                }
            }
        }
    }
    let add = Tensor::from_vec(add, (n.b, 1, n.t, n.t), q.device())?;
    let p = crate::softmax_last_dim_slow(&scores.broadcast_add(&add)?)?;
    p.matmul(&vf)?.to_dtype(dtype)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{check_fused_vs_slow, randn};
    use candle_core::Device;

    fn check(
        dtype: DType,
        nh: usize,
        nkv: usize,
        window: Option<usize>,
        masked: bool,
        tol: (f64, f64),
    ) -> Result<()> {
        let dev = Device::Cpu;
        let (b, t, d) = (2, 7, 8);
        let q = randn(&[b, nh, t, d], dtype, 1, &dev)?;
        let k = randn(&[b, nkv, t, d], dtype, 2, &dev)?;
        let v = randn(&[b, nkv, t, d], dtype, 3, &dev)?;
        // right padding: batch 1 has its last position masked (with window >= 2 no query row is
        // fully masked; those rows are where fused (zeros) and reference (uniform) differ)
        let m = Tensor::new(&[[1u32, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 0]], &dev)?;
        let mask = masked.then_some(m);
        let scale = 0.35;
        check_fused_vs_slow(
            &format!("attention {dtype:?} nh={nh} nkv={nkv} window={window:?} masked={masked}"),
            &[q, k, v],
            &[true, true, true],
            |x| attention(&x[0], &x[1], &x[2], mask.as_ref(), window, scale),
            |x| attention_slow(&x[0], &x[1], &x[2], mask.as_ref(), window, scale),
            tol,
        )
    }

    #[test]
    fn fused_matches_slow_f32() -> Result<()> {
        let tol = (1e-5, 1e-4);
        check(DType::F32, 2, 2, None, false, tol)?;
        check(DType::F32, 4, 2, Some(3), true, tol)?;
        check(DType::F32, 3, 1, Some(1), false, tol)?;
        check(DType::F32, 3, 1, Some(2), true, tol)?;
        check(DType::F32, 4, 1, None, true, tol)
    }

    #[test]
    fn fused_matches_slow_bf16() -> Result<()> {
        check(DType::BF16, 4, 2, Some(3), true, (2e-2, 3e-2))
    }

    #[test]
    fn window_counts_the_query_itself() -> Result<()> {
        // v = one-hot of the key position: the output row shows which keys were attended
        let dev = Device::Cpu;
        let t = 8;
        let q = Tensor::zeros((1, 1, t, t), DType::F32, &dev)?;
        let v = Tensor::eye(t, DType::F32, &dev)?.reshape((1, 1, t, t))?;
        let o = attention(&q, &q, &v, None, Some(4), 1.0)?;
        let row7 = o.get(0)?.get(0)?.get(7)?.to_vec1::<f32>()?;
        assert_eq!(row7, vec![0.0, 0.0, 0.0, 0.0, 0.25, 0.25, 0.25, 0.25]); // keys 4..=7
        Ok(())
    }

    #[test]
    fn fully_masked_row_is_zero_with_finite_grads() -> Result<()> {
        let dev = Device::Cpu;
        let q = candle_core::Var::from_tensor(&randn(&[1, 2, 4, 8], DType::F32, 1, &dev)?)?;
        let k = randn(&[1, 1, 4, 8], DType::F32, 2, &dev)?;
        let mask = Tensor::new(&[[0u8, 1, 1, 1]], &dev)?; // left padding: query 0 sees nothing
        let o = attention(&q, &k, &k, Some(&mask), None, 1.0)?;
        assert_eq!(
            o.get(0)?
                .get(0)?
                .get(0)?
                .abs()?
                .sum_all()?
                .to_scalar::<f32>()?,
            0.0
        );
        let g = crate::backward_with_seed(&o, &randn(&[1, 2, 4, 8], DType::F32, 3, &dev)?)?;
        let s = g.get(&q).expect("dq").sum_all()?.to_scalar::<f32>()?;
        assert!(s.is_finite());
        Ok(())
    }
}
