//! Mixture-of-experts routing on the device: top-k of the router probabilities, the stable
//! grouping of the `(token, slot)` assignments by expert, and the grouped matmul of the expert
//! projections over the grouped rows. Nothing here copies to the host or synchronises the device
//! on CUDA (`kernels/moe.cu`); the CPU path below is the plain-loop reference.
//!
//! Layout: `n` tokens each pick `k` experts, giving `n·k` assignments numbered `slot = token·k + j`
//! (`j`-th choice of the token). [`moe_group`] sorts the slots by expert, keeping slot order within
//! an expert (so each expert sees its tokens in token order, as transformers' per-expert loop does),
//! and returns the segment offsets of each expert in that order. The expert weights are stacked
//! `(E, N, K)`; [`grouped_matmul`] multiplies the rows of segment `e` by expert `e`'s matrix;
//! [`moe_combine`] weights the grouped rows and sums them back into token order (each token's
//! rows in ascending grouped position, i.e. ascending expert, in fp32: the order of transformers'
//! per-expert accumulation), and [`moe_combine_backward`] is its backward.

use crate::util::{cpu_slice, with_float_type, Elem, Storable};
use candle_core::{
    bail, CpuStorage, CustomOp1, CustomOp2, CustomOp3, DType, Layout, Result, Shape, Tensor,
};

/// Top-`k` expert indices of each row of `probs (n, E)` f32, in descending probability; equal
/// probabilities keep the lower expert index first (`torch.topk`'s order on ties, which the
/// router relies on). Returns `(n, k)` u32.
pub fn moe_topk(probs: &Tensor, k: usize) -> Result<Tensor> {
    let (_, e) = probs.dims2()?;
    if probs.dtype() != DType::F32 {
        bail!("moe_topk: probs must be f32, got {:?}", probs.dtype());
    }
    if k == 0 || k > e {
        bail!("moe_topk: k = {k} must be in 1..={e} (the number of experts)");
    }
    probs.contiguous()?.apply_op1_no_bwd(&TopK { k })
}

struct TopK {
    k: usize,
}

impl CustomOp1 for TopK {
    fn name(&self) -> &'static str {
        "moe-topk"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let p = cpu_slice::<f32>(s, l, self.name(), "probs")?;
        let (n, e) = l.shape().dims2()?;
        let mut idx = Vec::with_capacity(n * self.k);
        let mut order: Vec<u32> = Vec::with_capacity(e);
        for row in p.chunks(e) {
            order.clear();
            order.extend(0..e as u32);
            // A stable sort by descending probability keeps the lower index first on ties.
            order.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]));
            idx.extend_from_slice(&order[..self.k]);
        }
        Ok((CpuStorage::U32(idx), Shape::from((n, self.k))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (n, e) = l.shape().dims2()?;
        let idx = cuda_impl::topk(s, l, n, e, self.k)?;
        Ok((idx, Shape::from((n, self.k))))
    }
}

/// The assignments of [`moe_topk`]'s indices grouped by expert (see the module docs).
#[derive(Debug, Clone)]
pub struct MoeGroups {
    /// `(n·k,)` u32: the slots sorted by expert, slot order within an expert.
    pub order: Tensor,
    /// `(n·k,)` u32: the token of each sorted slot (`order / k`).
    pub token: Tensor,
    /// `(n·k,)` u32: the grouped position of each slot (the inverse of `order`).
    pub slot_pos: Tensor,
    /// `(E + 1,)` u32: expert `e`'s rows are `offsets[e]..offsets[e+1]` of the sorted order.
    pub offsets: Tensor,
    /// Number of experts `E`.
    pub num_experts: usize,
    /// Experts per token `k`.
    pub k: usize,
    /// Tokens `n`.
    pub n_tokens: usize,
}

/// Groups the `(n, k)` u32 expert indices by expert (stable), on the indices' device.
pub fn moe_group(idx: &Tensor, num_experts: usize) -> Result<MoeGroups> {
    let (n, k) = idx.dims2()?;
    if idx.dtype() != DType::U32 {
        bail!("moe_group: indices must be u32, got {:?}", idx.dtype());
    }
    let packed = idx
        .contiguous()?
        .apply_op1_no_bwd(&Group { num_experts, k })?;
    let m = n * k;
    Ok(MoeGroups {
        order: packed.narrow(0, 0, m)?,
        token: packed.narrow(0, m, m)?,
        slot_pos: packed.narrow(0, 2 * m, m)?,
        offsets: packed.narrow(0, 3 * m, num_experts + 1)?,
        num_experts,
        k,
        n_tokens: n,
    })
}

/// Packs `[order (m), token (m), slot_pos (m), offsets (E+1)]` into one u32 buffer.
struct Group {
    num_experts: usize,
    k: usize,
}

impl CustomOp1 for Group {
    fn name(&self) -> &'static str {
        "moe-group"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let idx = cpu_slice::<u32>(s, l, self.name(), "indices")?;
        let (m, e) = (idx.len(), self.num_experts);
        let mut offsets = vec![0u32; e + 1];
        for &x in idx {
            if x as usize >= e {
                bail!("moe-group: expert index {x} >= number of experts {e}");
            }
            offsets[x as usize + 1] += 1;
        }
        for i in 0..e {
            offsets[i + 1] += offsets[i];
        }
        let mut next = offsets.clone();
        let mut out = vec![0u32; 3 * m + e + 1];
        for (slot, &x) in idx.iter().enumerate() {
            let pos = next[x as usize] as usize;
            next[x as usize] += 1;
            out[pos] = slot as u32;
            out[m + pos] = (slot / self.k) as u32;
            out[2 * m + slot] = pos as u32;
        }
        out[3 * m..].copy_from_slice(&offsets);
        Ok((CpuStorage::U32(out), Shape::from(3 * m + e + 1)))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let m = l.shape().elem_count();
        let out = cuda_impl::group(s, l, m, self.num_experts, self.k)?;
        Ok((out, Shape::from(3 * m + self.num_experts + 1)))
    }
}

/// Grouped matmul over expert segments: row `r` of `x (m, K)`, in expert `e`'s segment of
/// `groups`, times expert `e`'s matrix of the stacked weights `w`. With `transpose_w` (the
/// forward of a `(E, N, K)` nn.Linear-style stack) `y[r] = x[r] · w[e]ᵀ`; without it (the
/// backward to the input of the same stack, `w (E, K, N)`) `y[r] = x[r] · w[e]`. Returns `(m, N)`
/// in `x`'s dtype, accumulated in fp32 (cuBLAS / tensor cores on CUDA, one kernel for all
/// experts). `w` is frozen: no gradient is recorded.
pub fn grouped_matmul(
    x: &Tensor,
    w: &Tensor,
    groups: &MoeGroups,
    transpose_w: bool,
) -> Result<Tensor> {
    let (m, kx) = x.dims2()?;
    let (e, d1, d2) = w.dims3()?;
    let (n_out, k_in) = if transpose_w { (d1, d2) } else { (d2, d1) };
    if kx != k_in || e != groups.num_experts || x.dtype() != w.dtype() {
        bail!(
            "grouped_matmul: x {:?} {:?} and weights {:?} {:?} (transpose_w = {transpose_w}) do not fit {} experts",
            x.dims(),
            x.dtype(),
            w.dims(),
            w.dtype(),
            groups.num_experts
        );
    }
    if groups.order.dim(0)? != m {
        bail!(
            "grouped_matmul: x has {m} rows, the grouping {}",
            groups.order.dim(0)?
        );
    }
    let op = GroupedMatmul {
        w: w.detach().contiguous()?,
        n_out,
        k_in,
        transpose_w,
    };
    x.contiguous()?
        .apply_op2_no_bwd(&groups.offsets.contiguous()?, &op)
}

struct GroupedMatmul {
    w: Tensor,
    n_out: usize,
    k_in: usize,
    transpose_w: bool,
}

impl CustomOp2 for GroupedMatmul {
    fn name(&self) -> &'static str {
        "moe-grouped-matmul"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let op = self.name();
        let offsets = cpu_slice::<u32>(s2, l2, op, "offsets")?;
        let (m, kin, nout) = (l1.shape().dims2()?.0, self.k_in, self.n_out);
        with_float_type!(s1, op, T => {
            let x = cpu_slice::<T>(s1, l1, op, "x")?;
            let w = crate::util::with_cpu_storage(&self.w, op, "w", |s, l| {
                Ok(cpu_slice::<T>(s, l, op, "w")?.to_vec())
            })?;
            let mut y = vec![T::from_f32(0.0); m * nout];
            for (e, seg) in offsets.windows(2).enumerate() {
                let we = &w[e * nout * kin..(e + 1) * nout * kin];
                for r in seg[0] as usize..seg[1] as usize {
                    let xr = &x[r * kin..(r + 1) * kin];
                    for c in 0..nout {
                        let mut acc = 0f32;
                        for (i, xv) in xr.iter().enumerate() {
                            let wv = if self.transpose_w { we[c * kin + i] } else { we[i * nout + c] };
                            acc += xv.to_f32() * wv.to_f32();
                        }
                        y[r * nout + c] = T::from_f32(acc);
                    }
                }
            }
            Ok((T::storage(y), Shape::from((m, nout))))
        })
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let m = l1.shape().dims2()?.0;
        let y = cuda_impl::grouped_matmul(
            (s1, l1),
            (s2, l2),
            &self.w,
            m,
            self.n_out,
            self.k_in,
            self.transpose_w,
        )?;
        Ok((y, Shape::from((m, self.n_out))))
    }
}

/// Sums the grouped rows `y (n·k, h)` back into token order: `out[t] = Σ w[p] · y[p]` over the
/// grouped positions `p` of token `t`'s slots, in ascending `p`, in fp32, rounded once to `y`'s
/// dtype. `w (n·k,)` f32 in grouped order, or `None` for weight 1 (the backward's sum of the
/// grouped input gradients). Returns `(n, h)`. Records no graph.
pub fn moe_combine(y: &Tensor, w: Option<&Tensor>, groups: &MoeGroups) -> Result<Tensor> {
    let (m, _) = y.dims2()?;
    let n_slots = groups.slot_pos.dim(0)?;
    if m != n_slots {
        bail!("moe_combine: y has {m} rows, the grouping {n_slots}");
    }
    if let Some(w) = w {
        if w.dims() != [m] || w.dtype() != DType::F32 {
            bail!(
                "moe_combine: weights {:?} {:?} must be ({m},) f32",
                w.dims(),
                w.dtype()
            );
        }
    }
    let op = Combine {
        w: w.map(Tensor::contiguous).transpose()?,
        k: groups.k,
    };
    y.contiguous()?
        .apply_op2_no_bwd(&groups.slot_pos.contiguous()?, &op)
}

/// The backward of [`moe_combine`] with weights: from the output gradient `g (n, h)`, the grouped
/// rows' gradient `dy[p] = r(f32(g[t]) · w[p])` in `y`'s dtype and the weights' gradient
/// `dw[p] = Σ_h f32(g[t, h]) · f32(y[p, h])` (f32), `t` the token of position `p`.
pub fn moe_combine_backward(
    g: &Tensor,
    y: &Tensor,
    w: &Tensor,
    groups: &MoeGroups,
) -> Result<(Tensor, Tensor)> {
    let (m, h) = y.dims2()?;
    if g.dims() != [groups.n_tokens, h] || w.dims() != [m] || w.dtype() != DType::F32 {
        bail!(
            "moe_combine_backward: g {:?}, y {:?} and w {:?} do not fit {} tokens",
            g.dims(),
            y.dims(),
            w.dims(),
            groups.n_tokens
        );
    }
    let g = g.to_dtype(y.dtype())?.contiguous()?;
    let dy = gather(&g, Some(w), groups)?;
    let dw = y
        .contiguous()?
        .apply_op3_no_bwd(&g, &groups.token.contiguous()?, &GatherDot)?;
    Ok((dy, dw))
}

/// The rows of `x (n, h)` in grouped order, `(n·k, h)`: row `p` is token `token[p]`'s (the
/// experts' input; `index_select(&groups.token, 0)` without a graph, on CUDA in 16-byte packs).
pub fn moe_gather(x: &Tensor, groups: &MoeGroups) -> Result<Tensor> {
    let (n, _) = x.dims2()?;
    if n != groups.n_tokens {
        bail!(
            "moe_gather: x has {n} rows, the grouping {} tokens",
            groups.n_tokens
        );
    }
    gather(&x.contiguous()?, None, groups)
}

/// `out[p] = r(f32(x[token[p]]) · w[p])` (`w` None: 1) for the grouped positions `p`.
fn gather(x: &Tensor, w: Option<&Tensor>, groups: &MoeGroups) -> Result<Tensor> {
    let op = Gather {
        w: w.map(Tensor::contiguous).transpose()?,
    };
    x.apply_op2_no_bwd(&groups.token.contiguous()?, &op)
}

/// `(x (n, h), token (m,))` → `(m, h)`: `out[p] = r(f32(x[token[p]]) · w[p])`, `w (m,)` f32 or 1.
struct Gather {
    w: Option<Tensor>,
}

impl CustomOp2 for Gather {
    fn name(&self) -> &'static str {
        "moe-gather"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let op = self.name();
        let (_, h) = l1.shape().dims2()?;
        let token = cpu_slice::<u32>(s2, l2, op, "token")?;
        let w = match &self.w {
            Some(w) => Some(crate::util::with_cpu_storage(w, op, "w", |s, l| {
                Ok(cpu_slice::<f32>(s, l, op, "w")?.to_vec())
            })?),
            None => None,
        };
        with_float_type!(s1, op, T => {
            let x = cpu_slice::<T>(s1, l1, op, "x")?;
            let mut out = Vec::with_capacity(token.len() * h);
            for (p, &t) in token.iter().enumerate() {
                let row = &x[t as usize * h..(t as usize + 1) * h];
                let wp = w.as_ref().map_or(1.0, |w| w[p]);
                out.extend(row.iter().map(|v| T::from_f32(v.to_f32() * wp)));
            }
            Ok((T::storage(out), Shape::from((token.len(), h))))
        })
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (_, h) = l1.shape().dims2()?;
        let m = l2.shape().elem_count();
        let out = cuda_impl::gather((s1, l1), self.w.as_ref(), (s2, l2), m, h)?;
        Ok((out, Shape::from((m, h))))
    }
}

/// `(y (m, h), g (n, h), token (m,))` → `(m,)` f32: `Σ_h f32(g[token[p], h]) · f32(y[p, h])`.
struct GatherDot;

impl CustomOp3 for GatherDot {
    fn name(&self) -> &'static str {
        "moe-gather-dot"
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
        let (m, h) = l1.shape().dims2()?;
        let token = cpu_slice::<u32>(s3, l3, op, "token")?;
        with_float_type!(s1, op, T => {
            let y = cpu_slice::<T>(s1, l1, op, "y")?;
            let g = cpu_slice::<T>(s2, l2, op, "g")?;
            let dw = (0..m)
                .map(|p| {
                    let t = token[p] as usize;
                    y[p * h..(p + 1) * h]
                        .iter()
                        .zip(&g[t * h..(t + 1) * h])
                        .map(|(a, b)| a.to_f32() * b.to_f32())
                        .sum::<f32>()
                })
                .collect();
            Ok((CpuStorage::F32(dw), Shape::from(m)))
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
        let (m, h) = l1.shape().dims2()?;
        let dw = cuda_impl::gather_dot((s1, l1), (s2, l2), (s3, l3), m, h)?;
        Ok((dw, Shape::from(m)))
    }
}

/// `(y (m, h), slot_pos (n·k,))` → `(n, h)` (see [`moe_combine`]).
struct Combine {
    w: Option<Tensor>,
    k: usize,
}

impl CustomOp2 for Combine {
    fn name(&self) -> &'static str {
        "moe-combine"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let op = self.name();
        let (m, h) = l1.shape().dims2()?;
        let slot_pos = cpu_slice::<u32>(s2, l2, op, "slot_pos")?;
        let w = self
            .w
            .as_ref()
            .map(|w| {
                crate::util::with_cpu_storage(w, op, "w", |s, l| {
                    Ok(cpu_slice::<f32>(s, l, op, "w")?.to_vec())
                })
            })
            .transpose()?;
        let n = m / self.k;
        with_float_type!(s1, op, T => {
            let y = cpu_slice::<T>(s1, l1, op, "y")?;
            let mut out = Vec::with_capacity(n * h);
            let mut acc = vec![0f32; h];
            let mut pos: Vec<usize> = Vec::with_capacity(self.k);
            for t in 0..n {
                pos.clear();
                pos.extend(slot_pos[t * self.k..(t + 1) * self.k].iter().map(|&p| p as usize));
                pos.sort_unstable();
                acc.fill(0.0);
                for &p in &pos {
                    let wp = w.as_ref().map_or(1.0, |w| w[p]);
                    for (a, v) in acc.iter_mut().zip(&y[p * h..(p + 1) * h]) {
                        *a += v.to_f32() * wp;
                    }
                }
                out.extend(acc.iter().map(|&a| T::from_f32(a)));
            }
            Ok((T::storage(out), Shape::from((n, h))))
        })
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (m, h) = l1.shape().dims2()?;
        let n = m / self.k;
        let out = cuda_impl::combine((s1, l1), (s2, l2), self.w.as_ref(), n, h, self.k)?;
        Ok((out, Shape::from((n, h))))
    }
}

#[cfg(feature = "cuda")]
#[path = "moe_cuda.rs"]
mod cuda_impl;

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn topk_breaks_ties_toward_the_lower_expert() -> Result<()> {
        let p = Tensor::new(
            &[[0.1f32, 0.3, 0.3, 0.3], [0.4, 0.1, 0.4, 0.1]],
            &Device::Cpu,
        )?;
        let idx = moe_topk(&p, 2)?.to_vec2::<u32>()?;
        assert_eq!(idx, vec![vec![1, 2], vec![0, 2]]);
        Ok(())
    }

    #[test]
    fn grouping_is_stable_and_matmul_matches_per_expert_products() -> Result<()> {
        let dev = Device::Cpu;
        // 3 tokens, k = 2, 3 experts.
        let idx = Tensor::new(&[[2u32, 0], [0, 2], [2, 1]], &dev)?;
        let g = moe_group(&idx, 3)?;
        assert_eq!(g.order.to_vec1::<u32>()?, vec![1, 2, 5, 0, 3, 4]);
        assert_eq!(g.token.to_vec1::<u32>()?, vec![0, 1, 2, 0, 1, 2]);
        assert_eq!(g.offsets.to_vec1::<u32>()?, vec![0, 2, 3, 6]);
        let x = Tensor::randn(0f32, 1., (6, 4), &dev)?;
        let w = Tensor::randn(0f32, 1., (3, 5, 4), &dev)?;
        let y = grouped_matmul(&x, &w, &g, true)?;
        let wt = w.transpose(1, 2)?.contiguous()?;
        let yt = grouped_matmul(&x, &wt, &g, false)?;
        for (r, e) in [(0, 0), (1, 0), (2, 1), (3, 2), (4, 2), (5, 2)] {
            let want = x.narrow(0, r, 1)?.matmul(&w.get(e)?.t()?)?;
            for got in [&y, &yt] {
                let diff = (got.narrow(0, r, 1)? - &want)?
                    .abs()?
                    .max_all()?
                    .to_scalar::<f32>()?;
                assert!(diff < 1e-5, "row {r}: {diff}");
            }
        }
        Ok(())
    }

    #[test]
    fn gather_is_index_select_and_its_weighted_form_scales_rows() -> Result<()> {
        let dev = Device::Cpu;
        let idx = Tensor::new(&[[2u32, 0], [0, 2], [2, 1]], &dev)?;
        let g = moe_group(&idx, 3)?;
        let x = Tensor::randn(0f32, 1., (3, 4), &dev)?.to_dtype(DType::BF16)?;
        let rows = moe_gather(&x, &g)?;
        let want = x.index_select(&g.token, 0)?;
        assert_eq!(rows.to_vec2::<half::bf16>()?, want.to_vec2::<half::bf16>()?);
        let w = Tensor::new(&[0.5f32, 2., 1., -1., 0.25, 3.], &dev)?;
        // Each row is scaled in f32 and rounded once to bf16: the same bits as the f32
        // product cast with `to_dtype`, whatever the magnitudes the random draw gives.
        let scaled = gather(&x, Some(&w), &g)?;
        let want = want
            .to_dtype(DType::F32)?
            .broadcast_mul(&w.unsqueeze(1)?)?
            .to_dtype(DType::BF16)?;
        assert_eq!(
            scaled.to_vec2::<half::bf16>()?,
            want.to_vec2::<half::bf16>()?
        );
        assert!(moe_gather(&x.narrow(0, 0, 2)?, &g).is_err());
        Ok(())
    }
}
