//! Memory-efficient causal attention with sliding window, key padding mask and GQA: the (t, t)
//! score matrix is never stored. Forward keeps the per-row log-sum-exp (fp32) for the backward,
//! which recomputes the probabilities (FlashAttention-2's recurrences: `D_i = do_i·o_i`,
//! `ds = p·(do·v − D)`). The CPU path below is the plain-loop reference, one row at a time. On
//! CUDA (`attention_cuda.rs`) the queries go in blocks through cuBLAS tensor-core GEMMs with fp32
//! scores and two row kernels (`kernels/attention.cu`); memory per call is O(t·block), and the
//! block-wise causal / window bounds skip the masked key ranges. For 16-bit inputs the forward at
//! head dim 16–512 is one fused kernel instead (`kernels/attention_flash.cu`, FlashAttention-2's
//! one-pass online softmax on tensor cores), and so is the backward at head dims 256 and 512
//! (`kernels/attention_flash_bwd.cu`: one kernel for dK / dV per key tile, one for dQ per query
//! tile, each recomputing P; [`AttentionBackward`] says when it runs).
//!
//! Mask semantics (transformers Gemma 4, `docs/gemma4.md` §4.3): query i attends key j iff
//! `seq_start[b, i] <= j <= i`, `i − j < window` (exactly W keys including itself) and
//! `padding[b, j] != 0` ([`KeyMask`]; `seq_start` confines packed sequences to themselves, 0 without
//! it). Query head h uses kv head `h / (nh / nkv)`. Scores, softmax and accumulation in fp32, output
//! rounded to the input dtype. A query row with no allowed key (only possible with left padding)
//! outputs zeros; the finite-min additive mask of the reference gives a uniform average there
//! instead.

use crate::util::{cpu_slice, with_cpu_storage, with_float_type, Elem, Stash, Storable};
use candle_core::{bail, CpuStorage, CustomOp1, CustomOp3, DType, Layout, Result, Shape, Tensor};

/// Which kernels the CUDA path of [`attention`] runs (the CPU path ignores it). The default is
/// the fastest measured on the 12B step (`docs/benchmarks.md`); tests and benchmarks pass others
/// to compare the kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionPlan {
    /// The forward kernel.
    pub forward: AttentionForward,
    /// The backward kernels.
    pub backward: AttentionBackward,
    /// Upper bound in bytes of one fp32 score buffer (`b·nh·rows·t` floats) of the blocked path,
    /// forward and backward: it sets the query block size (at least 16 rows). Default 32 MiB:
    /// 256-row blocks for the 12B shape (16 heads, t = 2048), faster in the 12B step than 16 or
    /// 8 MiB (`CHANGELOG.md`).
    pub score_bytes: usize,
    /// In builds for compute capability 90 (H100 / H200), run the fused kernels that have a
    /// version on Hopper's warpgroup MMA (`kernels/attention_wgmma.cu`: the forward and the
    /// backward's dQ kernel at head dims 256 and 512, its dK / dV kernel at 256) on it; other
    /// builds ignore it. Default on: the 12B step on one H200 is faster with it at 2k and 32k
    /// tokens (`docs/benchmarks.md` §1d).
    pub wgmma: bool,
}

impl Default for AttentionPlan {
    fn default() -> Self {
        AttentionPlan {
            forward: AttentionForward::FusedW8,
            backward: AttentionBackward::Auto,
            score_bytes: 32 << 20,
            wgmma: true,
        }
    }
}

impl AttentionPlan {
    /// Query rows per block of the blocked path for `b` samples of `nh` heads and `t` tokens: as
    /// many as one [`AttentionPlan::score_bytes`] fp32 score buffer holds, a multiple of 16 and at
    /// least 16 (all `t` when they fit).
    pub fn blocked_rows(&self, b: usize, nh: usize, t: usize) -> usize {
        let bq = (self.score_bytes / (b * nh * t * 4).max(1)).max(16);
        if bq < t {
            bq / 16 * 16
        } else {
            t
        }
    }

    /// The backward the CUDA path runs for `dtype` inputs of `b` samples, `nh` query heads, `t`
    /// tokens and head dim `d`: [`AttentionBackward::Fused`] or [`AttentionBackward::Blocked`]
    /// ([`AttentionBackward::Auto`] resolved; the fused kernels also need 16-byte aligned inputs).
    pub fn backward_for(
        &self,
        dtype: DType,
        (b, nh, t, d): (usize, usize, usize, usize),
    ) -> AttentionBackward {
        let covered = fused_covers(&FUSED_BACKWARD_DIMS, dtype, d);
        let fused = match self.backward {
            AttentionBackward::Blocked => false,
            AttentionBackward::Fused => covered,
            AttentionBackward::Auto => covered && (d == 256 || self.blocked_rows(b, nh, t) < 64),
        };
        if fused {
            AttentionBackward::Fused
        } else {
            AttentionBackward::Blocked
        }
    }
}

/// Head dims the fused backward kernels are instantiated for (`kernels/attention_flash_bwd.cu`;
/// the forward's are in the CUDA module, its only user).
const FUSED_BACKWARD_DIMS: [usize; 2] = [256, 512];

/// Whether fused kernels instantiated for head dims `dims` take `dtype` inputs of head dim `d`:
/// bf16 / f16 only (the launch also needs 16-byte aligned inputs). The one rule of the fused
/// forward and backward.
fn fused_covers(dims: &[usize], dtype: DType, d: usize) -> bool {
    matches!(dtype, DType::BF16 | DType::F16) && dims.contains(&d)
}

/// The forward kernel of [`AttentionPlan`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionForward {
    /// The blocked cuBLAS path (the backward's structure) for every call.
    Blocked,
    /// The fused kernel where it applies (bf16 / f16, head dim 16, 32, 64, 128, 256 or 512,
    /// 16-byte aligned inputs; otherwise blocked), 4 warps per block except at head dim 512
    /// (always 8: two warps per 16 query rows).
    FusedW4,
    /// As [`AttentionForward::FusedW4`] but head dim 256 runs 8 warps per block with
    /// double-buffered K/V, the faster of the two in the 12B step (`CHANGELOG.md`).
    FusedW8,
}

/// The backward kernels of [`AttentionPlan`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionBackward {
    /// The blocked cuBLAS path for every call.
    Blocked,
    /// The fused kernels where they apply (bf16 / f16, head dim 256 or 512, 16-byte aligned
    /// inputs; otherwise blocked).
    Fused,
    /// Fused at head dim 256; at head dim 512 fused only when the blocked path's query blocks
    /// would be shorter than 64 rows (long sequences: [`AttentionPlan::score_bytes`] bounds the
    /// blocks): on one H200 the blocked backward is the faster at head dim 512 at 2k tokens, the
    /// fused one at 32k (`docs/benchmarks.md` §1c, §1d).
    Auto,
}

/// Which keys each query may see besides causality and the sliding window.
#[derive(Clone, Copy, Debug, Default)]
pub struct KeyMask<'a> {
    /// (b, t) u8 or u32, nonzero = the key may be attended (padding), `None` = all.
    pub padding: Option<&'a Tensor>,
    /// (b, t) u32: for each token the index of the first token of its packed sequence
    /// (non-decreasing along t); query i sees only keys j >= seq_start[b, i]. `None` = one sequence per row.
    pub seq_start: Option<&'a Tensor>,
}

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
    /// Keys `lo..=i` query `i` of a sequence starting at key `start` may see before the padding
    /// mask (empty if `start > i`).
    fn keys(&self, i: usize, start: usize) -> std::ops::RangeInclusive<usize> {
        let lo = if self.window > 0 {
            (i + 1).saturating_sub(self.window)
        } else {
            0
        };
        lo.max(start)..=i
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
    plan: AttentionPlan,
    mask: Tensor,              // (b, t) u8
    seq_start: Option<Tensor>, // (b, t) u32
    lse: Stash,
}

impl Attention {
    /// The op of [`attention`]'s arguments (validated).
    fn new(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        key_mask: KeyMask,
        window: Option<usize>,
        scale: f64,
        plan: &AttentionPlan,
    ) -> Result<Self> {
        let n = dims(q, k, v, window, scale)?;
        Ok(Attention {
            n,
            plan: *plan,
            mask: key_mask_u8(key_mask.padding, q, &n)?,
            seq_start: seq_start_u32(key_mask.seq_start, q, &n)?,
            lse: Stash::default(),
        })
    }

    /// What the backward reads of this forward, with its log-sum-exp `lse`.
    fn saved(self, lse: Tensor) -> AttentionSaved {
        AttentionSaved {
            n: self.n,
            plan: self.plan,
            mask: self.mask,
            seq_start: self.seq_start,
            lse,
        }
    }
}

/// Backward op on `q` → packed `[dq (b, nh, t, d), dk (b, nkv, t, d), dv (b, nkv, t, d)]`.
struct AttentionBwd {
    n: Dims,
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))] // the CPU loops have one kernel
    plan: AttentionPlan,
    k: Tensor,
    v: Tensor,
    o: Tensor,
    dout: Tensor,
    lse: Tensor,
    mask: Tensor,
    seq_start: Option<Tensor>,
}

/// A call's key mask on the host: the (b, t) padding flags and, for packed rows, segment starts.
struct HostKeys<'a> {
    padding: &'a [u8],
    seq_start: Option<&'a [u32]>,
}

impl HostKeys<'_> {
    /// The keys query `i` of batch row `b` attends ([`Dims::keys`] within its sequence, minus
    /// padding).
    fn visible<'s>(&'s self, n: &Dims, b: usize, i: usize) -> impl Iterator<Item = usize> + 's {
        let start = self.seq_start.map_or(0, |s| s[b * n.t + i] as usize);
        let padding = &self.padding[b * n.t..(b + 1) * n.t];
        n.keys(i, start).filter(move |&j| padding[j] != 0)
    }
}

/// The (b·t) segment starts of `seq_start` on the host (a copy: b·t values per call).
fn host_seq_start(seq_start: Option<&Tensor>) -> Result<Option<Vec<u32>>> {
    seq_start
        .map(|s| s.flatten_all()?.to_vec1::<u32>())
        .transpose()
}

fn dot<T: Elem>(a: &[T], b: &[T]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x.to_f32() * y.to_f32()).sum()
}

/// Returns `(o, lse)`; `lse = +inf` marks a row with no allowed key.
fn fwd_cpu<T: Elem>(q: &[T], k: &[T], v: &[T], keys: &HostKeys, n: &Dims) -> (Vec<T>, Vec<f32>) {
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
                for j in keys.visible(n, b, i) {
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
    keys: HostKeys<'a>,
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
                for j in x.keys.visible(n, b, i) {
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
            let seq_start = host_seq_start(self.seq_start.as_ref())?;
            let (o, lse) = with_cpu_storage(&self.mask, op, "key_mask", |ms, ml| {
                let keys = HostKeys { padding: cpu_slice::<u8>(ms, ml, op, "key_mask")?, seq_start: seq_start.as_deref() };
                Ok(fwd_cpu(q, k, v, &keys, &n))
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
            &self.plan,
            (s1, l1),
            (s2, l2),
            (s3, l3),
            &self.mask,
            self.seq_start.as_ref(),
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
            plan: self.plan,
            mask: self.mask.clone(),
            seq_start: self.seq_start.clone(),
            lse: self.lse.get(self.name())?,
        };
        let (dq, dk, dv) = saved.backward(q, k, v, o, g)?;
        Ok((Some(dq), Some(dk), Some(dv)))
    }
}

/// What the backward of [`attention_saved`] reads besides `q`, `k`, `v`, the output and its
/// gradient: the validated sizes, the forward's plan, the key mask (padding and segment starts)
/// and the per-row log-sum-exp (fp32).
pub struct AttentionSaved {
    n: Dims,
    plan: AttentionPlan,
    mask: Tensor,
    seq_start: Option<Tensor>,
    lse: Tensor,
}

impl AttentionSaved {
    /// What [`attention_saved`] on `q`, `k`, `v` kept, rebuilt from its output `o` (which has
    /// `q`'s shape) and its log-sum-exp `lse` ([`AttentionSaved::lse`]) without running the
    /// forward: for a recompute that kept both from the first forward. The arguments are
    /// [`attention_saved`]'s.
    #[allow(clippy::too_many_arguments)]
    pub fn from_lse(
        o: &Tensor,
        k: &Tensor,
        v: &Tensor,
        key_mask: KeyMask,
        window: Option<usize>,
        scale: f64,
        plan: &AttentionPlan,
        lse: Tensor,
    ) -> Result<Self> {
        let op = Attention::new(o, k, v, key_mask, window, scale, plan)?;
        let n = op.n;
        if lse.dims() != [n.b, n.nh, n.t] || lse.dtype() != DType::F32 {
            bail!(
                "attention: the log-sum-exp must be ({}, {}, {}) f32, got {:?} {:?}",
                n.b,
                n.nh,
                n.t,
                lse.dims(),
                lse.dtype()
            );
        }
        Ok(op.saved(lse))
    }

    /// The forward's per-row log-sum-exp, `(b, nh, t)` fp32.
    pub fn lse(&self) -> &Tensor {
        &self.lse
    }

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
            plan: self.plan,
            k: k.contiguous()?,
            v: v.contiguous()?,
            o: o.contiguous()?,
            dout: g.contiguous()?,
            lse: self.lse.clone(),
            mask: self.mask.clone(),
            seq_start: self.seq_start.clone(),
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
            let seq_start = host_seq_start(self.seq_start.as_ref())?;
            let keys = HostKeys { padding: &mask, seq_start: seq_start.as_deref() };
            let x = BwdIn { q, k: &k, v: &v, o: &o, dout: &dout, lse: &lse, keys };
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

/// The segment starts as a contiguous (b, t) u32 tensor on `q`'s device, or an error naming what
/// is wrong (values are not checked: they stay on the device).
fn seq_start_u32(seq_start: Option<&Tensor>, q: &Tensor, n: &Dims) -> Result<Option<Tensor>> {
    let Some(s) = seq_start else {
        return Ok(None);
    };
    if s.dims() != [n.b, n.t] || s.dtype() != DType::U32 {
        bail!(
            "attention: seq_start must be ({}, {}) u32, got {:?} {:?}",
            n.b,
            n.t,
            s.dims(),
            s.dtype()
        );
    }
    if !s.device().same_device(q.device()) {
        bail!(
            "attention: seq_start is on {:?}, q on {:?}",
            s.device().location(),
            q.device().location()
        );
    }
    Ok(Some(s.contiguous()?))
}

/// Causal attention `softmax(q·kᵀ·scale + mask)·v`, memory-efficient (no (t, t) tensor).
///
/// `q`: (b, nh, t, d); `k`, `v`: (b, nkv, t, d), nh a multiple of nkv (GQA: query head h reads
/// kv head `h / (nh / nkv)`); all the same float dtype. `key_mask`: the padding mask and, for rows
/// that pack several sequences, each token's sequence start ([`KeyMask`]). `window`: `Some(W)` lets
/// query i see keys `i−W < j <= i` (W keys including itself), `None` = full causal. `scale` multiplies the scores (Gemma 4: 1.0).
/// `plan`: the CUDA kernels (forward and backward). Fp32 scores and softmax, output in the input
/// dtype. Gradients for q, k and v.
pub fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    key_mask: KeyMask,
    window: Option<usize>,
    scale: f64,
    plan: &AttentionPlan,
) -> Result<Tensor> {
    let op = Attention::new(q, k, v, key_mask, window, scale, plan)?;
    q.contiguous()?
        .apply_op3(&k.contiguous()?, &v.contiguous()?, op)
}

/// [`attention`] without a graph, for explicit backward passes: the output and what
/// [`AttentionSaved::backward`] needs (same arguments and numerics as [`attention`]).
pub fn attention_saved(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    key_mask: KeyMask,
    window: Option<usize>,
    scale: f64,
    plan: &AttentionPlan,
) -> Result<(Tensor, AttentionSaved)> {
    let op = Attention::new(q, k, v, key_mask, window, scale, plan)?;
    let o = q
        .contiguous()?
        .apply_op3_no_bwd(&k.contiguous()?, &v.contiguous()?, &op)?;
    let lse = op.lse.get("attention")?;
    Ok((o, op.saved(lse)))
}

/// Composite attention with a dense additive mask: `softmax(scale·q·kᵀ + mask)·v` with fp32
/// scores, softmax ([`crate::softmax_last_dim`]) and `P·V`, one rounding to the input dtype (HF
/// sdpa's numerics). Materialises the `(b, nh, t, s)` scores.
///
/// `q`: (b, nh, t, d); `k`, `v`: (b, nkv, s, d) with nh a multiple of nkv; query head h reads kv
/// head `h / (nh / nkv)` with no copy of K/V (the query heads of each kv head are grouped).
/// `mask`: additive fp32, broadcastable to (b, nh, t, s), e.g. (b, 1, t, s). For what the fused
/// [`attention`] does not take (bidirectional batches, `s` cached keys for `t` new queries) and, through [`attention_slow`], its reference. Gradients through autograd, or
/// [`attention_dense_backward`] without a graph.
pub fn attention_dense(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: &Tensor,
    scale: f64,
) -> Result<Tensor> {
    let (b, nh, t, d) = q.dims4()?;
    let (nkv, s) = dense_dims(q, k, v)?;
    let f32_ = |x: &Tensor| x.to_dtype(DType::F32);
    let qg = f32_(q)?.reshape((b, nkv, nh / nkv * t, d))?;
    let scores = scaled(qg.matmul(&f32_(k)?.t()?)?, scale)?; // (b, nkv, nh/nkv·t, s)
    let scores = scores.reshape((b, nh, t, s))?.broadcast_add(mask)?;
    let p = crate::softmax_last_dim(&scores)?.reshape((b, nkv, nh / nkv * t, s))?;
    let out = p.matmul(&f32_(v)?)?; // (b, nkv, nh/nkv·t, d)
    out.reshape((b, nh, t, d))?.to_dtype(q.dtype())
}

/// The backward of [`attention_dense`]: `(dq, dk, dv)` in the inputs' dtype from the forward's
/// inputs and the output gradient `g (b, nh, t, d)`, in fp32 with the probabilities recomputed
/// (`dP = g·Vᵀ`, `dS = P ⊙ (dP − rowsum(P ⊙ dP))`, `dq = scale·dS·K`, `dk = scale·dSᵀ·q`,
/// `dv = Pᵀ·g`); K/V gradients sum over the query heads of each kv head. Records no graph.
pub fn attention_dense_backward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: &Tensor,
    scale: f64,
    g: &Tensor,
) -> Result<(Tensor, Tensor, Tensor)> {
    let (b, nh, t, d) = q.dims4()?;
    let (nkv, s) = dense_dims(q, k, v)?;
    if g.dims() != q.dims() {
        bail!(
            "attention_dense backward: grad {:?} must be q's {:?}",
            g.dims(),
            q.dims()
        );
    }
    let rows = nh / nkv * t;
    let f32_ = |x: &Tensor| x.detach().to_dtype(DType::F32);
    let (kf, vf) = (f32_(k)?, f32_(v)?);
    let qg = f32_(q)?.reshape((b, nkv, rows, d))?;
    let scores = scaled(qg.matmul(&kf.t()?)?, scale)?
        .reshape((b, nh, t, s))?
        .broadcast_add(mask)?;
    let p = crate::softmax_last_dim(&scores)?.reshape((b, nkv, rows, s))?;
    drop(scores);
    let gg = f32_(g)?.reshape((b, nkv, rows, d))?;
    let dp = gg.matmul(&vf.t()?)?; // (b, nkv, rows, s)
    let dot = (&p * &dp)?.sum_keepdim(candle_core::D::Minus1)?;
    let ds = scaled((&p * dp.broadcast_sub(&dot)?)?, scale)?;
    drop((dp, dot));
    let dq = ds.matmul(&kf)?.reshape((b, nh, t, d))?;
    let dk = ds.t()?.matmul(&qg)?; // (b, nkv, s, d)
    let dv = p.t()?.matmul(&gg)?;
    let dt = q.dtype();
    Ok((dq.to_dtype(dt)?, dk.to_dtype(dt)?, dv.to_dtype(dt)?))
}

/// `x·scale`, no kernel when `scale` is 1 (Gemma 4).
fn scaled(x: Tensor, scale: f64) -> Result<Tensor> {
    if scale == 1.0 {
        Ok(x)
    } else {
        x * scale
    }
}

/// `(nkv, s)` of [`attention_dense`]'s operands, or an error naming the mismatch.
fn dense_dims(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<(usize, usize)> {
    let (b, nh, _, d) = q.dims4()?;
    let (kb, nkv, s, kd) = k.dims4()?;
    if (kb, kd) != (b, d) || v.dims() != k.dims() || nkv == 0 || nh % nkv != 0 {
        bail!(
            "attention_dense: q {:?} (b, nh, t, d), k {:?} and v {:?} must be (b, nkv, s, d) with nh % nkv == 0",
            q.dims(),
            k.dims(),
            v.dims()
        );
    }
    Ok((nkv, s))
}

/// Composite reference for [`attention`]: [`attention_dense`] with the causal / window / key
/// mask (padding and sequence starts) as an additive finite-min mask (as transformers' eager path,
/// without its bf16 rounding of the scores). Materialises (b, nh, t, t).
pub fn attention_slow(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    key_mask: KeyMask,
    window: Option<usize>,
    scale: f64,
) -> Result<Tensor> {
    let n = dims(q, k, v, window, scale)?;
    let keep = key_mask_u8(key_mask.padding, q, &n)?.to_vec2::<u8>()?;
    let start = match seq_start_u32(key_mask.seq_start, q, &n)? {
        Some(s) => s.to_vec2::<u32>()?,
        None => vec![vec![0; n.t]; n.b],
    };
    let mut add = vec![0f32; n.b * n.t * n.t];
    for b in 0..n.b {
        for i in 0..n.t {
            for j in 0..n.t {
                let visible = j <= i
                    && (n.window == 0 || i - j < n.window)
                    && j >= start[b][i] as usize
                    && keep[b][j] != 0;
                if !visible {
                    add[(b * n.t + i) * n.t + j] = f32::MIN;
                }
            }
        }
    }
    let add = Tensor::from_vec(add, (n.b, 1, n.t, n.t), q.device())?;
    attention_dense(q, k, v, &add, scale)
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
        let m = masked.then_some(m);
        let mask = KeyMask {
            padding: m.as_ref(),
            seq_start: None,
        };
        let scale = 0.35;
        check_fused_vs_slow(
            &format!("attention {dtype:?} nh={nh} nkv={nkv} window={window:?} masked={masked}"),
            &[q, k, v],
            &[true, true, true],
            |x| {
                let plan = AttentionPlan::default();
                attention(&x[0], &x[1], &x[2], mask, window, scale, &plan)
            },
            |x| attention_slow(&x[0], &x[1], &x[2], mask, window, scale),
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

    /// The segment starts `(b, t)` of rows that pack sequences of the given lengths.
    fn seq_starts(rows: &[&[usize]], dev: &Device) -> Result<Tensor> {
        let t: usize = rows[0].iter().sum();
        let mut starts = Vec::new();
        for lens in rows {
            assert_eq!(
                lens.iter().sum::<usize>(),
                t,
                "rows of one batch have one length"
            );
            let mut first = 0;
            for &len in *lens {
                starts.extend(std::iter::repeat_n(first as u32, len));
                first += len;
            }
        }
        Tensor::from_vec(starts, (rows.len(), t), dev)
    }

    /// Packed rows (a sequence of length 1, sequence starts inside the sliding window, padding
    /// inside a sequence; no query left without a key): fused == the dense reference, forward
    /// and gradients.
    fn check_segmented(dtype: DType, nh: usize, nkv: usize, tol: (f64, f64)) -> Result<()> {
        let dev = Device::Cpu;
        let (b, t, d) = (2, 11, 8);
        let q = randn(&[b, nh, t, d], dtype, 1, &dev)?;
        let k = randn(&[b, nkv, t, d], dtype, 2, &dev)?;
        let v = randn(&[b, nkv, t, d], dtype, 3, &dev)?;
        let starts = seq_starts(&[&[4, 1, 6], &[7, 4]], &dev)?;
        let pad = Tensor::new(
            &[
                [1u8, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
                [1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0],
            ],
            &dev,
        )?;
        for (window, padded) in [
            (None, false),
            (Some(3), true),
            (Some(2), false),
            (None, true),
        ] {
            let mask = KeyMask {
                padding: padded.then_some(&pad),
                seq_start: Some(&starts),
            };
            let plan = AttentionPlan::default();
            check_fused_vs_slow(
                &format!("segmented {dtype:?} nh={nh} nkv={nkv} window={window:?} padded={padded}"),
                &[q.clone(), k.clone(), v.clone()],
                &[true, true, true],
                |x| attention(&x[0], &x[1], &x[2], mask, window, 0.35, &plan),
                |x| attention_slow(&x[0], &x[1], &x[2], mask, window, 0.35),
                tol,
            )?;
        }
        Ok(())
    }

    #[test]
    fn segments_match_slow_f32() -> Result<()> {
        check_segmented(DType::F32, 4, 2, (1e-5, 1e-4))?;
        check_segmented(DType::F32, 3, 1, (1e-5, 1e-4))
    }

    #[test]
    fn segments_match_slow_bf16() -> Result<()> {
        check_segmented(DType::BF16, 4, 2, (2e-2, 3e-2))
    }

    /// Each packed sequence's output is the output of that sequence alone (the reference mask
    /// is not involved), with the sliding window counted from the sequence's own tokens.
    #[test]
    fn segments_equal_each_sequence_alone() -> Result<()> {
        let dev = Device::Cpu;
        let (nh, nkv, t, d) = (4, 2, 11, 8);
        let q = randn(&[1, nh, t, d], DType::F32, 1, &dev)?;
        let k = randn(&[1, nkv, t, d], DType::F32, 2, &dev)?;
        let v = randn(&[1, nkv, t, d], DType::F32, 3, &dev)?;
        let lens = [4, 1, 6];
        let starts = seq_starts(&[&lens], &dev)?;
        let plan = AttentionPlan::default();
        for window in [None, Some(3)] {
            let mask = KeyMask {
                padding: None,
                seq_start: Some(&starts),
            };
            let packed = attention(&q, &k, &v, mask, window, 1.0, &plan)?;
            let mut first = 0;
            for len in lens {
                let part = |x: &Tensor| x.narrow(2, first, len);
                let alone = attention(
                    &part(&q)?,
                    &part(&k)?,
                    &part(&v)?,
                    KeyMask::default(),
                    window,
                    1.0,
                    &plan,
                )?;
                crate::testing::assert_close(
                    &format!("sequence at {first} window {window:?}"),
                    &part(&packed)?,
                    &alone,
                    1e-6,
                    1e-5,
                )?;
                first += len;
            }
        }
        Ok(())
    }

    #[test]
    fn seq_start_must_be_b_t_u32() -> Result<()> {
        let dev = Device::Cpu;
        let q = randn(&[2, 2, 5, 8], DType::F32, 1, &dev)?;
        let plan = AttentionPlan::default();
        for bad in [
            Tensor::zeros((2, 4), DType::U32, &dev)?,
            Tensor::zeros((2, 5), DType::U8, &dev)?,
        ] {
            let mask = KeyMask {
                padding: None,
                seq_start: Some(&bad),
            };
            let err = attention(&q, &q, &q, mask, None, 1.0, &plan).unwrap_err();
            assert!(
                err.to_string().contains("seq_start must be (2, 5) u32"),
                "{err}"
            );
        }
        Ok(())
    }

    /// The grouped query heads equal the `repeat_kv` formulation (basic Candle ops).
    #[test]
    fn dense_groups_query_heads_as_repeat_kv() -> Result<()> {
        let dev = Device::Cpu;
        let (b, nh, nkv, t, s, d) = (2, 4, 2, 3, 5, 6);
        let q = randn(&[b, nh, t, d], DType::F32, 1, &dev)?;
        let k = randn(&[b, nkv, s, d], DType::F32, 2, &dev)?;
        let v = randn(&[b, nkv, s, d], DType::F32, 3, &dev)?;
        let mask = (randn(&[b, 1, t, s], DType::F32, 4, &dev)? * 3.0)?;
        let got = attention_dense(&q, &k, &v, &mask, 0.5)?;
        let rep = |x: &Tensor| -> Result<Tensor> {
            x.unsqueeze(2)?
                .broadcast_as((b, nkv, nh / nkv, s, d))?
                .reshape((b, nh, s, d))
        };
        let scores = (q.matmul(&rep(&k)?.t()?)? * 0.5)?.broadcast_add(&mask)?;
        let want = crate::softmax_last_dim_slow(&scores)?.matmul(&rep(&v)?)?;
        crate::testing::assert_close("attention_dense", &got, &want, 1e-6, 1e-5)
    }

    #[test]
    fn dense_backward_matches_autograd() -> Result<()> {
        let dev = Device::Cpu;
        for (dtype, tol) in [(DType::F32, (1e-5, 1e-4)), (DType::BF16, (1e-2, 1e-2))] {
            let (b, nh, nkv, t, d) = (2, 4, 2, 5, 8);
            let x = [
                randn(&[b, nh, t, d], dtype, 1, &dev)?,
                randn(&[b, nkv, t, d], dtype, 2, &dev)?,
                randn(&[b, nkv, t, d], dtype, 3, &dev)?,
            ];
            let mask = (randn(&[b, 1, t, t], DType::F32, 4, &dev)? * 3.0)?;
            let g = randn(&[b, nh, t, d], dtype, 5, &dev)?;
            let vars = x
                .iter()
                .map(candle_core::Var::from_tensor)
                .collect::<Result<Vec<_>>>()?;
            let o = attention_dense(&vars[0], &vars[1], &vars[2], &mask, 0.35)?;
            let want = crate::backward_with_seed(&o, &g)?;
            let got = attention_dense_backward(&x[0], &x[1], &x[2], &mask, 0.35, &g)?;
            for (name, got, var) in [
                ("dq", got.0, &vars[0]),
                ("dk", got.1, &vars[1]),
                ("dv", got.2, &vars[2]),
            ] {
                let want = want.get(var).expect("a gradient");
                crate::testing::assert_close(
                    &format!("{name} {dtype:?}"),
                    &got,
                    want,
                    tol.0,
                    tol.1,
                )?;
            }
        }
        Ok(())
    }

    #[test]
    fn auto_backward_is_fused_at_256_and_at_512_only_for_long_sequences() {
        use AttentionBackward::{Auto, Blocked, Fused};
        let plan = |backward| AttentionPlan {
            backward,
            ..AttentionPlan::default()
        };
        // The 12B's block sizes: 256 rows at 2048 tokens, 64 at 8k, 16 at 32k.
        assert_eq!(plan(Auto).blocked_rows(1, 16, 2048), 256);
        assert_eq!(plan(Auto).blocked_rows(1, 16, 8192), 64);
        assert_eq!(plan(Auto).blocked_rows(1, 16, 32768), 16);
        let bf = DType::BF16;
        for (backward, dtype, t, d, runs) in [
            (Auto, bf, 2048, 256, Fused),
            (Auto, bf, 2048, 512, Blocked),
            (Auto, bf, 8192, 512, Blocked),
            (Auto, bf, 16384, 512, Fused),
            (Auto, bf, 32768, 512, Fused),
            // f32 and other head dims always take the blocked path; so does an explicit plan.
            (Auto, DType::F32, 32768, 256, Blocked),
            (Auto, bf, 32768, 128, Blocked),
            (Blocked, bf, 32768, 512, Blocked),
            (Fused, bf, 2048, 512, Fused),
        ] {
            let got = plan(backward).backward_for(dtype, (1, 16, t, d));
            assert_eq!(got, runs, "{backward:?} {dtype:?} t {t} d {d}");
        }
    }

    #[test]
    fn window_counts_the_query_itself() -> Result<()> {
        // v = one-hot of the key position: the output row shows which keys were attended
        let dev = Device::Cpu;
        let t = 8;
        let q = Tensor::zeros((1, 1, t, t), DType::F32, &dev)?;
        let v = Tensor::eye(t, DType::F32, &dev)?.reshape((1, 1, t, t))?;
        let plan = AttentionPlan::default();
        let o = attention(&q, &q, &v, KeyMask::default(), Some(4), 1.0, &plan)?;
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
        let o = attention(
            &q,
            &k,
            &k,
            KeyMask {
                padding: Some(&mask),
                seq_start: None,
            },
            None,
            1.0,
            &AttentionPlan::default(),
        )?;
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
