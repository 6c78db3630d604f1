//! The dense MLP's gate / up adapter terms added in the GeGLU's pass over its inputs.
//!
//! [`crate::lora_linear`] adds an adapter's up product `scale·low·Bᵀ` to the projection's output
//! in place on CUDA (`kernels/lora.cu`, `lora_up_add`): a read and a write of the whole
//! `(m, out)` output, the widest of the layer for the MLP's gate and up, which the GeGLU then reads
//! once more. [`crate::lora_linear_saved_deferred`] leaves the term out and hands it over as a
//! [`LoraUp`]; [`gelu_tanh_mul_lora_up`] adds both terms to gate and up in place and writes the
//! GeGLU of the results in one pass (`lora_up_geglu`).
//!
//! Numerics: both kernels form the term as a fp32 tensor-core product of `low` and `B` (in the
//! activation dtype, the same fragments and order) and add it to the rounded projection output
//! with one fma and one rounding, so the fused pass gives the bits of the projection's own output;
//! the GeGLU then reads the rounded sums ([`crate::gelu_tanh_mul`]'s rounding). Where the kernels
//! do not apply, [`LoraUp::add_to`] adds the term as the projection's own forward does there.

use candle_core::{bail, Result, Tensor};

/// An adapter's up product left for the consumer of the projection's output: `scale·low·Bᵀ`, with
/// `low (m, r)` and `B (out, r)` in the activation dtype.
#[derive(Debug, Clone)]
pub struct LoraUp {
    pub(crate) low: Tensor,
    pub(crate) b: Tensor,
    pub(crate) scale: f64,
}

impl LoraUp {
    /// `y (..., out)` with the term added, in `y`'s memory on CUDA (`y` consumed: contiguous, owning
    /// its storage alone) with the projection's own numerics there
    /// (`lora_linear`'s CUDA forward: one rounding of the fp32 sum); on the CPU as the composite
    /// projection adds it (Candle ops in `y`'s dtype: the product, the scale and the sum each
    /// rounded).
    pub fn add_to(&self, y: Tensor) -> Result<Tensor> {
        let (m, out) = self.check(&y, "LoraUp::add_to")?;
        #[cfg(feature = "cuda")]
        if y.device().is_cuda() && y.is_contiguous() {
            cuda_impl::add_in_place(&y, self, (m, out))?;
            return Ok(y);
        }
        let term = crate::lora_linear::up_term(&self.low, &self.b, self.scale)?;
        (y.reshape((m, out))? + term)?.reshape(y.dims())
    }

    /// `(m, out)` of an output `y` this term fits (rows of `low`, rows of `B`, one dtype), or an
    /// error naming `op`.
    fn check(&self, y: &Tensor, op: &str) -> Result<(usize, usize)> {
        let (m, r) = self.low.dims2()?;
        let (out, br) = self.b.dims2()?;
        let fits = y.dims().last() == Some(&out) && y.elem_count() == m * out && br == r;
        if !fits || self.low.dtype() != y.dtype() || self.b.dtype() != y.dtype() {
            bail!(
                "{op}: output {:?} {:?} does not fit the adapter term's low {:?} {:?} and B {:?} {:?}",
                y.dims(),
                y.dtype(),
                self.low.dims(),
                self.low.dtype(),
                self.b.dims(),
                self.b.dtype()
            );
        }
        Ok((m, out))
    }
}

/// `(gate', up', gelu_tanh(gate')·up')` with `gate' = gate + gate_up's term` and
/// `up' = up + up_up's term` (numerics in the module doc), for the
/// explicit (graph-free) forward of a dense MLP whose gate and up projections both have adapters.
/// `gate` and `up` are consumed: on CUDA (bf16 / f16, the kernel's shapes) `gate'` and `up'` are
/// written over their memory, so each must be contiguous and own its storage alone. Records no
/// graph; the backward is [`crate::gelu_tanh_mul_backward`]'s on `(gate', up')`.
pub fn gelu_tanh_mul_lora_up(
    gate: Tensor,
    up: Tensor,
    gate_up: &LoraUp,
    up_up: &LoraUp,
) -> Result<(Tensor, Tensor, Tensor)> {
    let op = "gelu_tanh_mul_lora_up";
    let (m, n) = check_pair(op, (&gate, &up), (gate_up, up_up))?;
    #[cfg(feature = "cuda")]
    if gate.device().is_cuda() && gate.is_contiguous() && up.is_contiguous() {
        if let Some(act) = cuda_impl::run(op, (&gate, &up), (gate_up, up_up), (m, n), false)? {
            return Ok((gate, up, act));
        }
    }
    let _ = (m, n);
    unfused(gate, up, gate_up, up_up)
}

/// [`gelu_tanh_mul_lora_up`]'s `act` alone (the same bits), for a forward that needs neither
/// `gate'` nor `up'` afterwards: on CUDA (where the fused kernel applies) written over `gate`'s
/// memory, the sums stored nowhere, which saves two of the pass's three writes. `gate` and `up`
/// are consumed; `gate` must be contiguous and own its storage alone.
pub fn gelu_tanh_mul_lora_up_act(
    gate: Tensor,
    up: Tensor,
    gate_up: &LoraUp,
    up_up: &LoraUp,
) -> Result<Tensor> {
    let op = "gelu_tanh_mul_lora_up_act";
    let (m, n) = check_pair(op, (&gate, &up), (gate_up, up_up))?;
    #[cfg(feature = "cuda")]
    if gate.device().is_cuda() && gate.is_contiguous() && up.is_contiguous() {
        if let Some(act) = cuda_impl::run(op, (&gate, &up), (gate_up, up_up), (m, n), true)? {
            return Ok(act);
        }
    }
    let _ = (m, n);
    Ok(unfused(gate, up, gate_up, up_up)?.2)
}

/// `(m, n)` of `gate` and `up` when they match each other and their terms, or an error naming
/// `op`.
fn check_pair(
    op: &str,
    (gate, up): (&Tensor, &Tensor),
    (gu, uu): (&LoraUp, &LoraUp),
) -> Result<(usize, usize)> {
    if gate.dims() != up.dims() || gate.dtype() != up.dtype() {
        bail!(
            "{op}: gate {:?} {:?} and up {:?} {:?} must match",
            gate.dims(),
            gate.dtype(),
            up.dims(),
            up.dtype()
        );
    }
    let mn = gu.check(gate, op)?;
    uu.check(up, op)?;
    Ok(mn)
}

/// The terms added as each projection adds its own, then the GeGLU: where the kernel does not
/// apply.
fn unfused(
    gate: Tensor,
    up: Tensor,
    gate_up: &LoraUp,
    up_up: &LoraUp,
) -> Result<(Tensor, Tensor, Tensor)> {
    let gate = gate_up.add_to(gate)?;
    let up = up_up.add_to(up)?;
    let act = crate::gelu_tanh_mul(&gate, &up)?;
    Ok((gate, up, act))
}

#[cfg(feature = "cuda")]
mod cuda_impl {
    use super::LoraUp;
    use crate::adapter_cuda::{self, UpTerm};
    use crate::cuda;
    use candle_core::{Result, Tensor};

    /// The device of a CUDA tensor, or an error naming `op`.
    fn device<'a>(t: &'a Tensor, op: &str) -> Result<&'a candle_core::CudaDevice> {
        match t.device() {
            candle_core::Device::Cuda(dev) => Ok(dev),
            _ => candle_core::bail!("{op}: expected a CUDA tensor"),
        }
    }

    /// The term's operands as the kernels take them (addresses of contiguous copies, which `keep`
    /// holds until the caller's launches are queued).
    fn operands(t: &LoraUp, op: &str, keep: &mut Vec<Tensor>) -> Result<UpTerm> {
        let (low, b) = (t.low.contiguous()?, t.b.contiguous()?);
        let term = UpTerm {
            low: cuda::addr_of(&low, op, "low")?,
            b: cuda::addr_of(&b, op, "B")?,
            scale: t.scale as f32,
        };
        keep.extend([low, b]);
        Ok(term)
    }

    /// `y += term` in `y`'s memory ([`crate::lora_linear`]'s CUDA forward adds its term so).
    pub(super) fn add_in_place(y: &Tensor, t: &LoraUp, (m, out): (usize, usize)) -> Result<()> {
        let op = "LoraUp::add_to";
        let mut keep = Vec::new();
        let term = operands(t, op, &mut keep)?;
        let dims = (m, out, t.low.dim(1)?);
        let yp = cuda::addr_of(y, op, "y")?;
        // SAFETY: contiguous tensors of the checked shapes, alive to the end of this call (the
        // stream runs in order); y owns its storage alone (add_to's contract).
        unsafe {
            crate::lora_linear::cuda_impl::add_up_term(device(y, op)?, y.dtype(), yp, term, dims)
        }
    }

    /// The fused kernel's `act`, with gate and up updated in place, or with `over_gate` written
    /// over gate (gate and up left as they were); `None` where the kernel does not take these
    /// operands (the caller adds the terms alone).
    pub(super) fn run(
        op: &str,
        (gate, up): (&Tensor, &Tensor),
        (gu, uu): (&LoraUp, &LoraUp),
        (m, n): (usize, usize),
        over_gate: bool,
    ) -> Result<Option<Tensor>> {
        let dt = gate.dtype();
        let r = gu.low.dim(1)?;
        let mut keep = Vec::new();
        let terms = (operands(gu, op, &mut keep)?, operands(uu, op, &mut keep)?);
        let outs = (
            cuda::addr_of(gate, op, "gate")?,
            cuda::addr_of(up, op, "up")?,
        );
        let fits = uu.low.dim(1)? == r
            && adapter_cuda::up_applies(dt, (m, n, r), &[outs.0, outs.1], &[terms.0, terms.1]);
        if !fits {
            return Ok(None);
        }
        let dev = device(gate, op)?;
        if over_gate {
            // SAFETY: as below; act is written over gate, which the caller hands over.
            unsafe { adapter_cuda::up_geglu_over_gate(dev, dt, outs, terms, (m, n, r)) }?;
            return Ok(Some(gate.clone()));
        }
        // SAFETY: contiguous tensors of the checked shapes, alive to the end of this call (the
        // stream runs in order: later users of gate and up come after the kernel); gate and up own
        // their storage alone (the caller's contract).
        let act = unsafe { adapter_cuda::up_geglu(dev, dt, outs, terms, (m, n, r)) }?;
        let act = crate::util::tensor_from_storage(candle_core::Storage::Cuda(act), gate.dims());
        Ok(Some(act))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{diff, randn};
    use crate::{gelu_tanh_mul, lora_linear_saved, lora_linear_saved_deferred, AdapterOperands};
    use candle_core::{DType, Device};

    /// Deferred gate / up projections + the fused GeGLU give the bits of the projections' own
    /// outputs and of their GeGLU (the unfused path) on the CPU, and so does the `act`-only pass.
    #[test]
    fn deferred_terms_in_the_geglu_match_the_projections() -> Result<()> {
        let dev = Device::Cpu;
        let (m, inf, n, r) = (6, 16, 24, 8);
        for dtype in [DType::F32, DType::BF16] {
            let x = randn(&[2, m / 2, inf], dtype, 1, &dev)?;
            let proj = |seed: u64| -> Result<(Tensor, Tensor, Tensor)> {
                Ok((
                    randn(&[n, inf], dtype, seed, &dev)?,
                    randn(&[r, inf], DType::F32, seed + 1, &dev)?,
                    randn(&[n, r], DType::F32, seed + 2, &dev)?,
                ))
            };
            let (gp, upp) = (proj(10)?, proj(20)?);
            let key = crate::dropout_key(3, 1, "mlp");
            let run = |(w, a, b): &(Tensor, Tensor, Tensor), scale| {
                let ops = AdapterOperands::new(a, b);
                let (y, _) = lora_linear_saved(&x, w, ops, scale, Some((0.25, key)), None)?;
                let (base, _, term) =
                    lora_linear_saved_deferred(&x, w, ops, scale, Some((0.25, key)), None)?;
                Ok::<_, candle_core::Error>((y, base, term))
            };
            let (gate, gate_base, gate_term) = run(&gp, 2.0)?;
            let (up, up_base, up_term) = run(&upp, 0.5)?;
            let act_only = gelu_tanh_mul_lora_up_act(
                gate_base.copy()?,
                up_base.copy()?,
                &gate_term,
                &up_term,
            )?;
            let (g2, u2, act) = gelu_tanh_mul_lora_up(gate_base, up_base, &gate_term, &up_term)?;
            let want = gelu_tanh_mul(&gate, &up)?;
            let checks = [
                ("gate", &g2, &gate),
                ("up", &u2, &up),
                ("act", &act, &want),
                ("act alone", &act_only, &want),
            ];
            for (what, got, want) in checks {
                let (abs, _, _) = diff(got, want, 1e-3)?;
                assert_eq!(abs, 0.0, "{dtype:?} {what}");
            }
        }
        Ok(())
    }

    #[test]
    fn rejects_a_term_that_does_not_fit() -> Result<()> {
        let dev = Device::Cpu;
        let y = Tensor::zeros((4, 8), DType::F32, &dev)?;
        let term = LoraUp {
            low: Tensor::zeros((4, 2), DType::F32, &dev)?,
            b: Tensor::zeros((6, 2), DType::F32, &dev)?,
            scale: 1.0,
        };
        let e = term.add_to(y.clone()).unwrap_err();
        assert!(e.to_string().contains("does not fit"), "{e}");
        let e = gelu_tanh_mul_lora_up(y.clone(), y, &term, &term).unwrap_err();
        assert!(e.to_string().contains("does not fit"), "{e}");
        Ok(())
    }
}
