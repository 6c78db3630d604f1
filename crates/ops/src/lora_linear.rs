//! A LoRA-adapted frozen linear layer as one op (`LoraLinear`):
//! `y = x·Wᵀ + scale·(drop(x)·Aᵀ)·Bᵀ` with `W (out, in)` frozen, `A (r, in)`, `B (out, r)`.
//!
//! Built from separate Candle ops, one projection records ~10 graph nodes (frozen matmul, dropout,
//! two adapter matmuls, transposes, the scale, the add), and Candle's backward zero-fills and adds a
//! gradient buffer for every argument of every node: ~6 extra passes over `(tokens, in|out)` per
//! projection (the largest item of an Nsight profile of the 12B step). As one node it costs one
//! gradient buffer for `x` and two tiny ones for `A` and `B`.
//!
//! On CUDA the forward is the frozen cuBLAS GEMM, `low = drop(x)·Aᵀ`, and the adapter term added
//! to `y` in place by `lora_up_add` (`crate::adapter_cuda`: `scale·low·Bᵀ` on the tensor cores,
//! one fma onto `y`, one rounding; a cuBLAS GEMM with `alpha = scale, beta = 1` for shapes it does
//! not take); the backward five
//! GEMMs: `dlow = scale·g·B`, `dx = g·W (+ dlow·A, through the dropout mask)`, `dA = dlowᵀ·drop(x)`,
//! `dB = scale·gᵀ·low`, with `low = drop(x)·Aᵀ` kept from the forward (`tokens × r`) and the
//! dropout mask regenerated from its key. With dropout on bf16 / f16 inputs of the usual shapes,
//! the three products that read `drop(x)` or go through its mask are kernels that apply the mask
//! as they read (`crate::adapter_cuda`): no dropout kernel, no `drop(x)` temporary. For bf16 /
//! f16 and ranks 8 to 32 the two products of `g` (`dlow` and `dB`) are one kernel that reads `g`
//! once for both, where the GEMMs read it once each. On the CPU
//! both directions are the composite of Candle ops ([`lora_linear_slow`]'s math), so the CPU tests
//! check the backward formulas against autograd.
//! Numerics: fp32 accumulation in every GEMM; the adapter term is added to the rounded base output
//! with one rounding (the composite rounds three times).

use crate::lora_geglu::LoraUp;
use crate::util::{Stash, Storable};
use candle_core::{bail, CpuStorage, CustomOp3, Layout, Result, Shape, Tensor};

/// Dropout of the adapter input: probability and counter-hash key ([`crate::dropout_key`]).
pub type LoraDropout = (f64, [u64; 3]);

/// A LoRA adapter's operands: the weights `a (r, in)` and `b (out, r)` (typically fp32 masters;
/// their gradients come back in their dtype) and, optionally, their copies in the activation
/// dtype made once for many calls (without them each call casts `a` and `b`).
#[derive(Debug, Clone, Copy)]
pub struct AdapterOperands<'a> {
    /// `A (r, in)`.
    pub a: &'a Tensor,
    /// `B (out, r)`.
    pub b: &'a Tensor,
    /// `(A, B)` in the activation dtype, if made already.
    pub copies: Option<(&'a Tensor, &'a Tensor)>,
}

impl<'a> AdapterOperands<'a> {
    /// `a` and `b`, cast by each call.
    pub fn new(a: &'a Tensor, b: &'a Tensor) -> Self {
        AdapterOperands { a, b, copies: None }
    }

    /// `a` and `b` with their copies `a_x`, `b_x` in the activation dtype (same shapes).
    pub fn with_copies(self, a_x: &'a Tensor, b_x: &'a Tensor) -> Self {
        AdapterOperands {
            copies: Some((a_x, b_x)),
            ..self
        }
    }
}

/// The forward op on `(x (m, in), a (r, in), b (out, r))`; stashes `low = drop(x)·Aᵀ`. `a`/`b` may
/// be fp32 master weights: the GEMMs read `a_x`/`b_x`, their copies in `x`'s dtype (no graph), and
/// the backward returns `dA`/`dB` in `a`/`b`'s dtype (fp32 straight from the GEMM accumulator).
struct LoraLinearOp {
    parts: LoraParts,
    low: Stash,
    /// `low` of an earlier forward on the same `x` (contiguous `(m, r)`), taken instead of
    /// computing it.
    kept: Option<Tensor>,
}

/// The operands both directions read: frozen `w`, the adapter copies in `x`'s dtype, scale, dropout.
#[derive(Clone)]
struct LoraParts {
    w: Tensor,
    a_x: Tensor,
    b_x: Tensor,
    scale: f64,
    dropout: Option<LoraDropout>,
    /// Leave the adapter's up product `scale·low·Bᵀ` out of the output, for a consumer that adds
    /// it ([`lora_linear_saved_deferred`]).
    defer_up: bool,
}

/// `drop(x)` (identity without dropout).
fn dropped(x: &Tensor, dropout: Option<LoraDropout>) -> Result<Tensor> {
    match dropout {
        Some((p, key)) => crate::lora_dropout(x, p, key),
        None => Ok(x.clone()),
    }
}

/// The composite forward on detached 2-D tensors: `(y, low)` (`y` without the adapter term when
/// `p.defer_up`; `low` the `kept` one if given).
fn forward_composite(x: &Tensor, p: &LoraParts, kept: Option<&Tensor>) -> Result<(Tensor, Tensor)> {
    let low = match kept {
        Some(low) => low.clone(),
        None => low_composite(x, p)?,
    };
    let base = x.matmul(&p.w.t()?)?;
    let y = match p.defer_up {
        true => base,
        false => (base + up_term(&low, &p.b_x, p.scale)?)?,
    };
    Ok((y, low))
}

/// The composite's `low = drop(x)·Aᵀ` of a detached 2-D `x`.
fn low_composite(x: &Tensor, p: &LoraParts) -> Result<Tensor> {
    dropped(x, p.dropout)?.matmul(&p.a_x.t()?)
}

/// The composite's adapter term `(low·Bᵀ)·scale` (Candle ops in the activation dtype, each
/// rounded), shared with [`LoraUp::add_to`].
pub(crate) fn up_term(low: &Tensor, b: &Tensor, scale: f64) -> Result<Tensor> {
    low.matmul(&b.t()?)? * scale
}

/// A detached CPU tensor holding a copy of `(s, l)`.
fn cpu_tensor(s: &CpuStorage, l: &Layout, what: &str) -> Result<Tensor> {
    let op = "lora-linear";
    let dev = candle_core::Device::Cpu;
    crate::util::with_float_type!(s, op, T => {
        let v = crate::util::cpu_slice::<T>(s, l, op, what)?.to_vec();
        Tensor::from_vec(v, l.dims(), &dev)
    })
}

/// The storage of a contiguous CPU tensor.
fn cpu_storage(t: &Tensor) -> Result<CpuStorage> {
    let t = t.contiguous()?;
    let (s, l) = t.storage_and_layout();
    match &*s {
        candle_core::Storage::Cpu(cs) => {
            crate::util::with_float_type!(cs, "lora-linear", T => {
                Ok(T::storage(crate::util::cpu_slice::<T>(cs, l, "lora-linear", "output")?.to_vec()))
            })
        }
        _ => bail!("lora-linear: expected a CPU tensor"),
    }
}

impl CustomOp3 for LoraLinearOp {
    fn name(&self) -> &'static str {
        "lora-linear"
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
        let _ = (s2, l2, s3, l3); // the GEMMs read the cast copies a_x, b_x
        let x = cpu_tensor(s1, l1, "x")?;
        let (y, low) = forward_composite(&x, &self.parts, self.kept.as_ref())?;
        self.low.put(low);
        Ok((cpu_storage(&y)?, y.shape().clone()))
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
        let _ = (s2, l2, s3, l3); // the GEMMs read the cast copies a_x, b_x
        let (y, low) = cuda_impl::forward(&self.parts, (s1, l1), self.kept.as_ref())?;
        let (m, out) = (l1.dims()[0], self.parts.w.dim(0)?);
        self.low.put(match low {
            Some(low) => crate::util::tensor_from_storage(
                candle_core::Storage::Cuda(low),
                &[m, self.parts.a_x.dim(0)?],
            ),
            None => self.kept.clone().expect("no new low only with a kept one"),
        });
        Ok((y, Shape::from((m, out))))
    }

    fn bwd(
        &self,
        x: &Tensor,
        a: &Tensor,
        b: &Tensor,
        _res: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let low = self.low.get(self.name())?;
        let (dx, da, db) =
            self.parts
                .backward(x, &low, g, (a.dtype(), b.dtype()), DxTarget::New)?;
        Ok((Some(dx), Some(da), Some(db)))
    }
}

/// Where the backward writes `dx`.
pub(crate) enum DxTarget {
    /// A new buffer.
    New,
    /// Added to this gradient of `x` (on CUDA in its memory: `beta = 1` in the `dx` GEMM).
    Accumulate(Tensor),
    /// Over `x` itself, which dies here (on CUDA `dx` takes its memory after `dA` has read it).
    OverInput,
}

impl LoraParts {
    /// `(dx (m, in), dA, dB)` of the 2-D forward on `x` that kept `low`, the adapter gradients in
    /// `grad_dtype` (those of `a` and `b`), `dx` written as `target` says (the CPU always
    /// allocates; an accumulator is added).
    fn backward(
        &self,
        x: &Tensor,
        low: &Tensor,
        g: &Tensor,
        grad_dtype: (candle_core::DType, candle_core::DType),
        target: DxTarget,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let g = g.contiguous()?;
        let reused = match &target {
            DxTarget::New => None,
            DxTarget::Accumulate(acc) => Some(acc),
            DxTarget::OverInput => Some(x),
        };
        if let Some(t) = reused {
            if t.dims() != x.dims() || t.dtype() != x.dtype() || !t.is_contiguous() {
                bail!(
                    "lora_linear backward: dx target {:?} {:?} must be a contiguous {:?} {:?}",
                    t.dims(),
                    t.dtype(),
                    x.dims(),
                    x.dtype()
                );
            }
        }
        #[cfg(feature = "cuda")]
        if x.device().is_cuda() {
            let into = reused.map(|t| (t, matches!(target, DxTarget::Accumulate(_))));
            let (dx, dadb) = cuda_impl::backward(self, (x, low, &g), grad_dtype, into)?;
            let (r, inf, out) = (self.a_x.dim(0)?, self.a_x.dim(1)?, self.b_x.dim(0)?);
            let dadb = crate::util::tensor_from_storage(
                candle_core::Storage::Cuda(dadb),
                &[r * inf + out * r],
            );
            let da = dadb.narrow(0, 0, r * inf)?.reshape((r, inf))?;
            let db = dadb.narrow(0, r * inf, out * r)?.reshape((out, r))?;
            let dx = match (dx, target) {
                (Some(dx), _) => {
                    crate::util::tensor_from_storage(candle_core::Storage::Cuda(dx), x.dims())
                }
                (None, DxTarget::Accumulate(acc)) => acc,
                (None, DxTarget::OverInput) => x.clone(),
                (None, DxTarget::New) => bail!("lora_linear backward: no dx produced"),
            };
            return Ok((dx, da, db));
        }
        // The composite backward, in autograd's order: d(up) = scale·g, d(low) = d(up)·B,
        // dB = d(up)ᵀ·low, dA = d(low)ᵀ·drop(x), dx = g·W + drop'(d(low)·A).
        let dup = (&g * self.scale)?;
        let dlow = dup.matmul(&self.b_x)?;
        let db = dup.t()?.matmul(low)?.to_dtype(grad_dtype.1)?;
        let da = dlow
            .t()?
            .matmul(&dropped(x, self.dropout)?)?
            .to_dtype(grad_dtype.0)?;
        let dx = (g.matmul(&self.w)? + dropped(&dlow.matmul(&self.a_x)?, self.dropout)?)?;
        let dx = match target {
            DxTarget::Accumulate(acc) => (acc + dx)?,
            DxTarget::New | DxTarget::OverInput => dx,
        };
        Ok((dx, da, db))
    }
}

/// `x·Wᵀ + scale·(drop(x)·Aᵀ)·Bᵀ` as one op (see the module doc). `x`: `(..., in)`; `w`: frozen
/// `(out, in)` in `x`'s dtype (never gets a gradient); the adapter's `a`: `(r, in)` and `b`:
/// `(out, r)`, both in one float dtype (typically fp32 master weights): the products use copies in
/// `x`'s dtype, as PEFT under autocast (`adapter.copies`, or cast here), and `a`/`b` get their
/// gradients in their own dtype. `dropout`: `Some((p, key))` with `0 < p < 1` applies
/// [`crate::lora_dropout`] to the adapter input. Returns `(..., out)`. Gradients for `x`, `a` and
/// `b`.
pub fn lora_linear(
    x: &Tensor,
    w: &Tensor,
    adapter: AdapterOperands<'_>,
    scale: f64,
    dropout: Option<LoraDropout>,
) -> Result<Tensor> {
    let op = operands(x.dims(), x.dtype(), w, adapter, scale, dropout, false, None)?;
    let (x2, out_dims) = rows(x, w)?;
    x2.apply_op3(&adapter.a.contiguous()?, &adapter.b.contiguous()?, op)?
        .reshape(out_dims)
}

/// What [`LoraLinearSaved::backward`] reads besides the input: the operands and
/// `low = drop(x)·Aᵀ`. The caller keeps (or recomputes) the input and passes it back.
pub struct LoraLinearSaved {
    parts: LoraParts,
    low: Tensor,
    grad_dtype: (candle_core::DType, candle_core::DType),
}

impl LoraLinearSaved {
    /// `low = drop(x)·Aᵀ (m, r)` of the forward, for a later forward on the same input to take
    /// (`kept_low` of [`lora_linear_saved`]).
    pub fn low(&self) -> &Tensor {
        &self.low
    }

    /// `(dx, dA, dB)` from the forward's input `x` and the output gradient `g` (the GEMMs autograd
    /// runs): `dx` in `x`'s shape and dtype, `dA`/`dB` in `a`/`b`'s dtype. Records no graph.
    pub fn backward(&self, x: &Tensor, g: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
        self.run(x, g, DxTarget::New)
    }

    /// [`LoraLinearSaved::backward`] with `dx` added to `acc` (another gradient of `x`, same shape,
    /// contiguous): on CUDA written into `acc`'s memory by the `dx` GEMM (`beta = 1`, no add
    /// kernel, no new buffer), so `acc` must own its storage alone; the CPU adds.
    pub fn backward_acc(
        &self,
        x: &Tensor,
        g: &Tensor,
        acc: Tensor,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let acc = acc.reshape(self.rows_of(x)?)?;
        self.run(x, g, DxTarget::Accumulate(acc))
    }

    /// [`LoraLinearSaved::backward`] for an input that dies here: on CUDA `dx` is written over
    /// `x`'s memory once `dA` has read it (no new `(m, in)` buffer), so `x` (contiguous) must own
    /// its storage alone; the CPU allocates.
    pub fn backward_over_input(&self, x: Tensor, g: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
        self.run(&x, g, DxTarget::OverInput)
    }

    /// `x`'s `(m, in)` view.
    fn rows_of(&self, x: &Tensor) -> Result<(usize, usize)> {
        let inf = self.parts.w.dim(1)?;
        Ok((x.elem_count() / inf.max(1), inf))
    }

    fn run(&self, x: &Tensor, g: &Tensor, target: DxTarget) -> Result<(Tensor, Tensor, Tensor)> {
        let (m, inf) = self.rows_of(x)?;
        let out = self.parts.w.dim(0)?;
        let fits = x.dims().last() == Some(&inf) && m == self.low.dim(0)?;
        if !fits || x.dtype() != self.low.dtype() {
            bail!(
                "lora_linear backward: input {:?} {:?} is not the forward's ({} rows of {inf}, {:?})",
                x.dims(),
                x.dtype(),
                self.low.dim(0)?,
                self.low.dtype()
            );
        }
        if g.elem_count() != m * out || g.dtype() != x.dtype() {
            bail!(
                "lora_linear backward: grad {:?} {:?} does not fit the forward's output ({m} rows of {out}, {:?})",
                g.dims(),
                g.dtype(),
                x.dtype()
            );
        }
        let x2 = x.reshape((m, inf))?;
        let g = g.reshape((m, out))?;
        let (dx, da, db) = self
            .parts
            .backward(&x2, &self.low, &g, self.grad_dtype, target)?;
        Ok((dx.reshape(x.dims())?, da, db))
    }
}

/// [`lora_linear`] without a graph, for explicit backward passes: the output and what
/// [`LoraLinearSaved::backward`] needs with the same input (same arguments and numerics as
/// [`lora_linear`]). `kept_low`: [`LoraLinearSaved::low`] of an earlier call on the same `x`
/// with the same arguments, taken instead of running the adapter's down product again (the same
/// bits).
pub fn lora_linear_saved(
    x: &Tensor,
    w: &Tensor,
    adapter: AdapterOperands<'_>,
    scale: f64,
    dropout: Option<LoraDropout>,
    kept_low: Option<&Tensor>,
) -> Result<(Tensor, LoraLinearSaved)> {
    saved_forward(x, w, adapter, scale, dropout, false, kept_low)
}

/// [`lora_linear_saved`] whose output leaves out the adapter's up product: `(x·Wᵀ, saved, up)`
/// with `up` the term `scale·low·Bᵀ` for the consumer of the output to add
/// ([`crate::gelu_tanh_mul_lora_up`] adds two in the GeGLU's pass, [`LoraUp::add_to`] one alone).
/// The saved state, `kept_low` and the backward are [`lora_linear_saved`]'s.
pub fn lora_linear_saved_deferred(
    x: &Tensor,
    w: &Tensor,
    adapter: AdapterOperands<'_>,
    scale: f64,
    dropout: Option<LoraDropout>,
    kept_low: Option<&Tensor>,
) -> Result<(Tensor, LoraLinearSaved, LoraUp)> {
    let (y, saved) = saved_forward(x, w, adapter, scale, dropout, true, kept_low)?;
    let up = LoraUp {
        low: saved.low.clone(),
        b: saved.parts.b_x.clone(),
        scale,
    };
    Ok((y, saved, up))
}

/// What [`lora_linear_saved`] keeps for the backward, without its output: `low = drop(x)·Aᵀ`
/// alone, the same bits, for a recompute that already holds the output (the frozen product and
/// the adapter's up product are skipped; with `kept_low` nothing runs).
pub fn lora_linear_saved_state(
    x: &Tensor,
    w: &Tensor,
    adapter: AdapterOperands<'_>,
    scale: f64,
    dropout: Option<LoraDropout>,
    kept_low: Option<&Tensor>,
) -> Result<LoraLinearSaved> {
    let op = operands(
        x.dims(),
        x.dtype(),
        w,
        adapter,
        scale,
        dropout,
        false,
        kept_low,
    )?;
    let low = match op.kept {
        Some(low) => low,
        None => down_product(&rows(x, w)?.0, &op.parts)?,
    };
    Ok(LoraLinearSaved {
        low,
        parts: op.parts,
        grad_dtype: (adapter.a.dtype(), adapter.b.dtype()),
    })
}

/// [`lora_linear_saved_state`] with `kept_low (m, r)` and without `x`, which it would not read:
/// for a recompute that holds both the projection's output and its down product, so that the
/// input need not be computed at all (the backward takes it as an argument).
pub fn lora_linear_saved_state_of_low(
    w: &Tensor,
    adapter: AdapterOperands<'_>,
    scale: f64,
    dropout: Option<LoraDropout>,
    kept_low: &Tensor,
) -> Result<LoraLinearSaved> {
    let dims = [kept_low.dim(0)?, w.dim(1)?];
    let op = operands(
        &dims,
        kept_low.dtype(),
        w,
        adapter,
        scale,
        dropout,
        false,
        Some(kept_low),
    )?;
    Ok(LoraLinearSaved {
        low: kept_low.detach().contiguous()?,
        parts: op.parts,
        grad_dtype: (adapter.a.dtype(), adapter.b.dtype()),
    })
}

/// `low = drop(x)·Aᵀ` of the contiguous 2-D `x` alone (the down kernel on CUDA, the composite on the
/// CPU).
fn down_product(x2: &Tensor, parts: &LoraParts) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if x2.device().is_cuda() {
        let (m, r) = (x2.dim(0)?, parts.a_x.dim(0)?);
        let (s, l) = x2.storage_and_layout();
        let low = cuda_impl::low(parts, (crate::cuda::cuda_of(&s, "lora-linear", "x")?, l))?;
        return Ok(crate::util::tensor_from_storage(
            candle_core::Storage::Cuda(low),
            &[m, r],
        ));
    }
    low_composite(x2, parts)
}

/// [`lora_linear_saved`], with the adapter term left out of `y` when `defer_up`.
fn saved_forward(
    x: &Tensor,
    w: &Tensor,
    adapter: AdapterOperands<'_>,
    scale: f64,
    dropout: Option<LoraDropout>,
    defer_up: bool,
    kept_low: Option<&Tensor>,
) -> Result<(Tensor, LoraLinearSaved)> {
    let (a, b) = (adapter.a, adapter.b);
    let op = operands(
        x.dims(),
        x.dtype(),
        w,
        adapter,
        scale,
        dropout,
        defer_up,
        kept_low,
    )?;
    let (x2, out_dims) = rows(x, w)?;
    let y = x2
        .apply_op3_no_bwd(&a.detach().contiguous()?, &b.detach().contiguous()?, &op)?
        .reshape(out_dims)?;
    let saved = LoraLinearSaved {
        low: op.low.get("lora-linear")?,
        parts: op.parts,
        grad_dtype: (a.dtype(), b.dtype()),
    };
    Ok((y, saved))
}

/// `x (..., in)` as a contiguous `(m, in)` tensor and the output dims `(..., out)` of `w (out, in)`
/// (shapes checked by [`operands`]).
fn rows(x: &Tensor, w: &Tensor) -> Result<(Tensor, Vec<usize>)> {
    let (out, inf) = w.dims2()?;
    let dims = x.dims();
    let mut out_dims = dims[..dims.len() - 1].to_vec();
    let m: usize = out_dims.iter().product();
    out_dims.push(out);
    Ok((x.reshape((m, inf))?.contiguous()?, out_dims))
}

/// The op's operands for an input of `dims` in `dtype` (and a kept `low`), checked against each
/// other.
#[allow(clippy::too_many_arguments)]
fn operands(
    dims: &[usize],
    dtype: candle_core::DType,
    w: &Tensor,
    adapter: AdapterOperands<'_>,
    scale: f64,
    dropout: Option<LoraDropout>,
    defer_up: bool,
    kept_low: Option<&Tensor>,
) -> Result<LoraLinearOp> {
    let (a, b) = (adapter.a, adapter.b);
    let (out, inf) = w.dims2()?;
    let (r, ain) = a.dims2()?;
    let (bout, br) = b.dims2()?;
    let Some((&last, lead)) = dims.split_last() else {
        bail!("lora_linear: x must have at least one dimension");
    };
    if last != inf || ain != inf || bout != out || br != r {
        bail!(
            "lora_linear: x {dims:?}, w {:?} (out, in), a {:?} (r, in), b {:?} (out, r) do not fit",
            w.dims(),
            a.dims(),
            b.dims()
        );
    }
    if w.dtype() != dtype || a.dtype() != b.dtype() {
        bail!(
            "lora_linear: w {:?} must have x's dtype {:?}, and a {:?} and b {:?} one dtype",
            w.dtype(),
            dtype,
            a.dtype(),
            b.dtype()
        );
    }
    if let Some((p, _)) = dropout {
        if !(p > 0.0 && p < 1.0) {
            bail!("lora_linear: dropout p must be in (0, 1), got {p} (pass None for no dropout)");
        }
    }
    let m: usize = lead.iter().product();
    if let Some(low) = kept_low {
        if low.dims() != [m, r] || low.dtype() != dtype {
            bail!(
                "lora_linear: the kept low {:?} {:?} must be ({m}, {r}) in x's dtype {:?}",
                low.dims(),
                low.dtype(),
                dtype
            );
        }
    }
    let (a_x, b_x) = match adapter.copies {
        Some((a_x, b_x)) => {
            if a_x.dims() != a.dims()
                || b_x.dims() != b.dims()
                || a_x.dtype() != dtype
                || b_x.dtype() != dtype
            {
                bail!(
                    "lora_linear: the adapter copies a {:?} {:?} and b {:?} {:?} must have a's and b's shapes {:?}, {:?} in x's dtype {:?}",
                    a_x.dims(),
                    a_x.dtype(),
                    b_x.dims(),
                    b_x.dtype(),
                    a.dims(),
                    b.dims(),
                    dtype
                );
            }
            (a_x.detach().contiguous()?, b_x.detach().contiguous()?)
        }
        None => {
            let cast = |t: &Tensor| t.detach().to_dtype(dtype)?.contiguous();
            (cast(a)?, cast(b)?)
        }
    };
    let op = LoraLinearOp {
        parts: LoraParts {
            w: w.detach().contiguous()?,
            a_x,
            b_x,
            scale,
            dropout,
            defer_up,
        },
        low: Stash::default(),
        kept: kept_low.map(|low| low.detach().contiguous()).transpose()?,
    };
    Ok(op)
}

/// Composite reference for [`lora_linear`]: frozen matmul, dropout, two adapter matmuls, scale,
/// add, each a Candle op with autograd's backward.
pub fn lora_linear_slow(
    x: &Tensor,
    w: &Tensor,
    a: &Tensor,
    b: &Tensor,
    scale: f64,
    dropout: Option<LoraDropout>,
) -> Result<Tensor> {
    let base = crate::linear_frozen(x, w)?;
    let (a, b) = (a.to_dtype(x.dtype())?, b.to_dtype(x.dtype())?);
    let low = dropped(x, dropout)?.broadcast_matmul(&a.t()?)?;
    base + (low.broadcast_matmul(&b.t()?)? * scale)?
}

#[cfg(feature = "cuda")]
#[path = "lora_linear_cuda.rs"]
pub(crate) mod cuda_impl;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{check_fused_vs_slow, randn};
    use candle_core::{DType, Device};

    /// `x` and `w` in `dtype`, the adapter in `adapter` (fp32 master weights with bf16 `x`).
    fn check(
        (dtype, adapter): (DType, DType),
        dropout: Option<LoraDropout>,
        tol: (f64, f64),
    ) -> Result<()> {
        let dev = Device::Cpu;
        let (b, t, inf, out, r) = (2, 5, 12, 7, 4);
        let w = randn(&[out, inf], dtype, 4, &dev)?;
        check_fused_vs_slow(
            &format!("lora_linear {dtype:?} adapter {adapter:?} dropout={dropout:?}"),
            &[
                randn(&[b, t, inf], dtype, 1, &dev)?,
                randn(&[r, inf], adapter, 2, &dev)?,
                randn(&[out, r], adapter, 3, &dev)?,
            ],
            &[true, true, true],
            |x| lora_linear(&x[0], &w, AdapterOperands::new(&x[1], &x[2]), 2.0, dropout),
            |x| lora_linear_slow(&x[0], &w, &x[1], &x[2], 2.0, dropout),
            tol,
        )
    }

    #[test]
    fn fused_matches_slow() -> Result<()> {
        let key = crate::dropout_key(7, 3, "layers.0.mlp.up_proj");
        let (f32_, bf16) = (DType::F32, DType::BF16);
        check((f32_, f32_), None, (1e-5, 1e-5))?;
        check((f32_, f32_), Some((0.25, key)), (1e-5, 1e-5))?;
        check((bf16, bf16), Some((0.25, key)), (5e-2, 2e-2))?;
        check((bf16, f32_), Some((0.25, key)), (5e-2, 2e-2))
    }

    #[test]
    fn rejects_bad_shapes_and_dropout() -> Result<()> {
        let dev = Device::Cpu;
        let x = Tensor::zeros((3, 8), DType::F32, &dev)?;
        let w = Tensor::zeros((5, 8), DType::F32, &dev)?;
        let a = Tensor::zeros((2, 8), DType::F32, &dev)?;
        let b = Tensor::zeros((5, 2), DType::F32, &dev)?;
        assert!(lora_linear(&x, &w, AdapterOperands::new(&a, &b.t()?), 1.0, None).is_err());
        let e = lora_linear(
            &x,
            &w,
            AdapterOperands::new(&a, &b),
            1.0,
            Some((0.0, [0; 3])),
        )
        .unwrap_err();
        assert!(e.to_string().contains("dropout p"), "{e}");
        let a16 = a.to_dtype(DType::BF16)?;
        let e = lora_linear(
            &x,
            &w,
            AdapterOperands::new(&a, &b).with_copies(&a16, &b),
            1.0,
            None,
        )
        .unwrap_err();
        assert!(e.to_string().contains("adapter copies"), "{e}");
        Ok(())
    }

    /// The saved state built from a kept down product alone gives the backward's bits of the one
    /// built beside its input; a kept low that does not fit the adapter is refused.
    #[test]
    fn state_of_a_kept_low_gives_the_same_backward() -> Result<()> {
        let dev = Device::Cpu;
        let (bf16, f32_) = (DType::BF16, DType::F32);
        let x = randn(&[2, 5, 12], bf16, 1, &dev)?;
        let w = randn(&[7, 12], bf16, 4, &dev)?;
        let (a, b) = (
            randn(&[4, 12], f32_, 2, &dev)?,
            randn(&[7, 4], f32_, 3, &dev)?,
        );
        let ops = AdapterOperands::new(&a, &b);
        let drop = Some((0.25, crate::dropout_key(7, 3, "layers.0.self_attn.o_proj")));
        let (_, first) = lora_linear_saved(&x, &w, ops, 2.0, drop, None)?;
        let low = first.low().clone();
        let with_x = lora_linear_saved_state(&x, &w, ops, 2.0, drop, Some(&low))?;
        let of_low = lora_linear_saved_state_of_low(&w, ops, 2.0, drop, &low)?;
        let g = randn(&[2, 5, 7], bf16, 9, &dev)?;
        let (d1, d2) = (with_x.backward(&x, &g)?, of_low.backward(&x, &g)?);
        for (p, q) in [(&d1.0, &d2.0), (&d1.1, &d2.1), (&d1.2, &d2.2)] {
            let d = (p.to_dtype(f32_)? - q.to_dtype(f32_)?)?.abs()?.max_all()?;
            assert_eq!(d.to_scalar::<f32>()?, 0.0);
        }
        let wrong = low.narrow(1, 0, 2)?;
        match lora_linear_saved_state_of_low(&w, ops, 2.0, drop, &wrong) {
            Err(e) => assert!(e.to_string().contains("kept low"), "{e}"),
            Ok(_) => panic!("a kept low of rank 2 for an adapter of rank 4 was taken"),
        }
        Ok(())
    }

    /// Copies made beforehand give the bits of the per-call cast: output, saved backward, and the
    /// graph op's gradients (which still reach the fp32 masters, in fp32).
    #[test]
    fn adapter_copies_give_the_cast_bits() -> Result<()> {
        let dev = Device::Cpu;
        let (bf16, f32_) = (DType::BF16, DType::F32);
        let x = randn(&[2, 5, 12], bf16, 1, &dev)?;
        let w = randn(&[7, 12], bf16, 4, &dev)?;
        let a = candle_core::Var::from_tensor(&randn(&[4, 12], f32_, 2, &dev)?)?;
        let b = candle_core::Var::from_tensor(&randn(&[7, 4], f32_, 3, &dev)?)?;
        let (a16, b16) = (a.to_dtype(bf16)?, b.to_dtype(bf16)?);
        let key = crate::dropout_key(7, 3, "layers.0.mlp.up_proj");
        let plain = AdapterOperands::new(&a, &b);
        let held = plain.with_copies(&a16, &b16);
        let same = |p: &Tensor, q: &Tensor| -> Result<()> {
            assert_eq!(p.dtype(), q.dtype());
            let d = (p.to_dtype(f32_)? - q.to_dtype(f32_)?)?.abs()?.max_all()?;
            assert_eq!(d.to_scalar::<f32>()?, 0.0);
            Ok(())
        };
        let g = randn(&[2, 5, 7], bf16, 9, &dev)?;
        let (y1, s1) = lora_linear_saved(&x, &w, plain, 2.0, Some((0.25, key)), None)?;
        let (y2, s2) = lora_linear_saved(&x, &w, held, 2.0, Some((0.25, key)), None)?;
        same(&y1, &y2)?;
        let (d1, d2) = (s1.backward(&x, &g)?, s2.backward(&x, &g)?);
        for (p, q) in [(&d1.0, &d2.0), (&d1.1, &d2.1), (&d1.2, &d2.2)] {
            same(p, q)?;
        }
        assert_eq!(d2.1.dtype(), f32_, "dA in the master's dtype");
        let g1 = crate::backward_with_seed(&lora_linear(&x, &w, plain, 2.0, None)?, &g)?;
        let g2 = crate::backward_with_seed(&lora_linear(&x, &w, held, 2.0, None)?, &g)?;
        for v in [&a, &b] {
            same(g1.get(v).expect("grad"), g2.get(v).expect("grad"))?;
        }
        Ok(())
    }
}
