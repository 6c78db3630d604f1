//! The LoRA-wrapped linear layer and the per-forward context that drives dropout and tracking.

use candle_core::{DType, Result, Tensor, Var};
use g4ft_ops::{AdapterOperands, LoraUp};
use std::sync::Mutex;

/// Per-forward settings shared by every [`LoraLinear`] of a model.
///
/// `track_grad = false` is the no-graph forward of layer-wise checkpointing: adapters are used
/// through detached tensors so no graph is kept. The recompute of the same micro-batch must use an
/// identical context (same `seed`, `micro_step`) so dropout masks replay exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoraContext {
    /// Apply LoRA dropout (training) or not (evaluation).
    pub training: bool,
    /// Build an autograd graph through the adapter parameters.
    pub track_grad: bool,
    /// Per-rank dropout seed (the post's `SEED + rank`).
    pub seed: u64,
    /// Global micro-batch counter; keys the dropout masks together with the module path.
    pub micro_step: u64,
}

impl LoraContext {
    /// Evaluation: no dropout, no graph.
    pub const EVAL: LoraContext = LoraContext {
        training: false,
        track_grad: false,
        seed: 0,
        micro_step: 0,
    };
}

/// A trainable low-rank adapter: `A (r, in)` and `B (out, r)` in fp32.
#[derive(Debug, Clone)]
pub struct Adapter {
    /// `lora_A.weight`, shape (r, in), fp32.
    pub a: Var,
    /// `lora_B.weight`, shape (out, r), fp32.
    pub b: Var,
    /// `lora_alpha / r` (or `lora_alpha / sqrt(r)` with rsLoRA).
    pub scale: f64,
    /// Dropout probability on the adapter input.
    pub dropout: f64,
}

impl Adapter {
    /// The rank `r` (rows of `A`).
    pub fn rank(&self) -> usize {
        self.a.dims()[0]
    }
}

/// A frozen linear layer (no bias) with an optional LoRA adapter, named by its module path.
#[derive(Debug, Clone)]
pub struct LoraLinear {
    path: String,
    weight: Tensor,
    adapter: Option<Adapter>,
    held: HeldCopies,
}

/// The adapter's `(A, B)` in an activation dtype while a [`hold_adapter_copies`] guard lives. A
/// clone of the layer starts without them.
#[derive(Debug, Default)]
struct HeldCopies(Mutex<Option<(Tensor, Tensor)>>);

impl Clone for HeldCopies {
    fn clone(&self) -> Self {
        HeldCopies::default()
    }
}

impl HeldCopies {
    fn get(&self) -> Option<(Tensor, Tensor)> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set(&self, copies: Option<(Tensor, Tensor)>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = copies;
    }
}

impl LoraLinear {
    /// Wraps a frozen weight of shape (out, in) stored at `path` (`...self_attn.q_proj`).
    pub fn new(path: impl Into<String>, weight: Tensor) -> Self {
        Self {
            path: path.into(),
            weight: weight.detach(),
            adapter: None,
            held: HeldCopies::default(),
        }
    }

    /// Checkpoint module path, e.g. `model.language_model.layers.5.self_attn.q_proj`.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The frozen base weight (out, in).
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// `in_features`.
    pub fn in_features(&self) -> usize {
        self.weight.dims()[1]
    }

    /// `out_features`.
    pub fn out_features(&self) -> usize {
        self.weight.dims()[0]
    }

    /// The adapter, if one is attached.
    pub fn adapter(&self) -> Option<&Adapter> {
        self.adapter.as_ref()
    }

    /// Attaches (or removes) an adapter (dropping any held copies of the previous one).
    pub fn set_adapter(&mut self, adapter: Option<Adapter>) {
        self.adapter = adapter;
        self.held.set(None);
    }

    /// The held copies when they are in `dtype`.
    /// The adapter's dropout under `ctx` (training only), keyed by this layer's path.
    fn dropout(&self, ad: &Adapter, ctx: &LoraContext) -> Option<g4ft_ops::LoraDropout> {
        (ctx.training && ad.dropout > 0.0)
            .then(|| (ad.dropout, crate::dropout::dropout_key(ctx, &self.path)))
    }

    fn copies_in(&self, dtype: DType) -> Option<(Tensor, Tensor)> {
        self.held.get().filter(|(a, _)| a.dtype() == dtype)
    }

    /// `x (..., in) → (..., out)`: frozen base GEMM plus `dropout(x)·Aᵀ·Bᵀ·scale` as one fused op
    /// ([`g4ft_ops::lora_linear`]), the adapter matmuls in `x`'s dtype from the fp32 weights, whose
    /// gradients come back in fp32. Dropout (training only) follows [`crate::lora_dropout`]: its mask is
    /// keyed on `(ctx.seed, ctx.micro_step, path)`, so a recompute with the same context replays it.
    pub fn forward(&self, x: &Tensor, ctx: &LoraContext) -> Result<Tensor> {
        let Some(ad) = &self.adapter else {
            return g4ft_ops::linear_frozen(x, &self.weight);
        };
        let (a, b) = if ctx.track_grad {
            (ad.a.as_tensor().clone(), ad.b.as_tensor().clone())
        } else {
            (ad.a.as_detached_tensor(), ad.b.as_detached_tensor())
        };
        let dropout = self.dropout(ad, ctx);
        let copies = self.copies_in(x.dtype());
        g4ft_ops::lora_linear(
            x,
            &self.weight,
            with_held(&a, &b, &copies),
            ad.scale,
            dropout,
        )
    }

    /// [`LoraLinear::forward`] without a graph, for explicit backward passes: the output and what
    /// [`ProjectionSaved::backward`] needs. Same numerics and dropout masks as `forward` with the
    /// same context (`ctx.track_grad` is ignored). `kept_low`: [`ProjectionSaved::low`] of an
    /// earlier call on the same `x` and context, taken instead of running the adapter's down
    /// product again (ignored without an adapter).
    pub fn forward_saved(
        &self,
        x: &Tensor,
        kept_low: Option<&Tensor>,
        ctx: &LoraContext,
    ) -> Result<(Tensor, ProjectionSaved)> {
        let (y, saved, _) = self.saved_forward(x, kept_low, ctx, Output::Whole)?;
        Ok((y.expect("asked for the output"), saved))
    }

    /// [`LoraLinear::forward_saved`] whose output leaves out the adapter's up product, returned
    /// for the consumer to add ([`g4ft_ops::lora_linear_saved_deferred`]; `None` without an
    /// adapter, when the output is complete).
    pub fn forward_saved_deferred(
        &self,
        x: &Tensor,
        kept_low: Option<&Tensor>,
        ctx: &LoraContext,
    ) -> Result<(Tensor, ProjectionSaved, Option<LoraUp>)> {
        let (y, saved, up) = self.saved_forward(x, kept_low, ctx, Output::WithoutUp)?;
        Ok((y.expect("asked for the output"), saved, up))
    }

    /// What [`LoraLinear::forward_saved`] keeps, without its output, for a recompute that holds the
    /// output already: neither the frozen product nor the adapter's up product runs
    /// ([`g4ft_ops::lora_linear_saved_state`]: the same saved bits; with `kept_low` nothing runs).
    pub fn forward_saved_state(
        &self,
        x: &Tensor,
        kept_low: Option<&Tensor>,
        ctx: &LoraContext,
    ) -> Result<ProjectionSaved> {
        Ok(self.saved_forward(x, kept_low, ctx, Output::StateOnly)?.1)
    }

    /// The saved state of a projection whose output a recompute already holds: from `kept_low`
    /// alone where it has one, or no adapter ([`g4ft_ops::lora_linear_saved_state_of_low`]: the
    /// input is not read), otherwise [`LoraLinear::forward_saved_state`] on the input `x`, which
    /// must then be given ([`LoraLinear::recall_reads_input`]).
    pub fn recalled_state(
        &self,
        x: Option<&Tensor>,
        kept_low: Option<&Tensor>,
        ctx: &LoraContext,
    ) -> Result<ProjectionSaved> {
        let Some(ad) = &self.adapter else {
            return Ok(ProjectionSaved::Frozen(self.weight.clone()));
        };
        let Some(low) = kept_low else {
            let Some(x) = x else {
                candle_core::bail!(
                    "{}: the saved state needs the input without a kept down product",
                    self.path
                );
            };
            return self.forward_saved_state(x, None, ctx);
        };
        let dropout = self.dropout(ad, ctx);
        let copies = self.copies_in(low.dtype());
        let operands = with_held(ad.a.as_tensor(), ad.b.as_tensor(), &copies);
        let saved = g4ft_ops::lora_linear_saved_state_of_low(
            &self.weight,
            operands,
            ad.scale,
            dropout,
            low,
        )?;
        Ok(ProjectionSaved::Lora {
            saved,
            a: ad.a.clone(),
            b: ad.b.clone(),
        })
    }

    /// Whether [`LoraLinear::recalled_state`] reads the input given `kept_low`.
    pub fn recall_reads_input(&self, kept_low: Option<&Tensor>) -> bool {
        self.adapter.is_some() && kept_low.is_none()
    }

    fn saved_forward(
        &self,
        x: &Tensor,
        kept_low: Option<&Tensor>,
        ctx: &LoraContext,
        output: Output,
    ) -> Result<(Option<Tensor>, ProjectionSaved, Option<LoraUp>)> {
        let Some(ad) = &self.adapter else {
            let y = match output {
                Output::StateOnly => None,
                _ => Some(g4ft_ops::linear_frozen(&x.detach(), &self.weight)?),
            };
            return Ok((y, ProjectionSaved::Frozen(self.weight.clone()), None));
        };
        let dropout = self.dropout(ad, ctx);
        let copies = self.copies_in(x.dtype());
        let operands = with_held(ad.a.as_tensor(), ad.b.as_tensor(), &copies);
        let w = &self.weight;
        let (y, saved, up) = match output {
            Output::Whole => {
                let (y, saved) =
                    g4ft_ops::lora_linear_saved(x, w, operands, ad.scale, dropout, kept_low)?;
                (Some(y), saved, None)
            }
            Output::WithoutUp => {
                let (y, saved, up) = g4ft_ops::lora_linear_saved_deferred(
                    x, w, operands, ad.scale, dropout, kept_low,
                )?;
                (Some(y), saved, Some(up))
            }
            Output::StateOnly => {
                let saved =
                    g4ft_ops::lora_linear_saved_state(x, w, operands, ad.scale, dropout, kept_low)?;
                (None, saved, None)
            }
        };
        let saved = ProjectionSaved::Lora {
            saved,
            a: ad.a.clone(),
            b: ad.b.clone(),
        };
        Ok((y, saved, up))
    }
}

/// What [`LoraLinear`]'s saved forwards compute besides the saved state.
#[derive(Debug, Clone, Copy)]
enum Output {
    /// The whole output.
    Whole,
    /// The output without the adapter's up product (handed back for the consumer to add).
    WithoutUp,
    /// No output: the saved state alone.
    StateOnly,
}

/// The copies of [`hold_adapter_copies`]; dropping it releases them (forwards cast again).
#[must_use = "the copies are released when the guard is dropped"]
pub struct AdapterCopies<'p> {
    holders: Vec<&'p LoraLinear>,
}

impl Drop for AdapterCopies<'_> {
    fn drop(&mut self) {
        for p in &self.holders {
            p.held.set(None);
        }
    }
}

/// Casts the adapters of `projections` to `dtype` together (one op: a single launch on CUDA for
/// up to 8 projections, `g4ft_ops::cast_together`), and has every forward in that dtype read these
/// copies until the returned guard drops (otherwise each forward casts its `A` and `B`: two
/// launches per projection). The adapters' values must not change meanwhile: hold it over one
/// decoder layer's forward, say, not across an optimizer update. Projections without an adapter,
/// and those already holding copies in `dtype` (an enclosing guard's), are left as they are.
/// Saved state keeps the copies it read alive after the guard drops.
pub fn hold_adapter_copies<'p>(
    projections: impl IntoIterator<Item = &'p LoraLinear>,
    dtype: DType,
) -> Result<AdapterCopies<'p>> {
    let holders: Vec<&LoraLinear> = projections
        .into_iter()
        .filter(|p| p.adapter.is_some() && p.copies_in(dtype).is_none())
        .collect();
    let sources: Vec<Tensor> = holders
        .iter()
        .flat_map(|p| p.adapter.iter())
        .flat_map(|ad| [ad.a.as_detached_tensor(), ad.b.as_detached_tensor()])
        .collect();
    let refs: Vec<&Tensor> = sources.iter().collect();
    let copies = g4ft_ops::cast_together(&refs, dtype)?;
    for (p, ab) in holders.iter().zip(copies.chunks_exact(2)) {
        p.held.set(Some((ab[0].clone(), ab[1].clone())));
    }
    Ok(AdapterCopies { holders })
}

/// The adapter operands `a`, `b` with the held copies, if any.
fn with_held<'t>(
    a: &'t Tensor,
    b: &'t Tensor,
    copies: &'t Option<(Tensor, Tensor)>,
) -> AdapterOperands<'t> {
    let operands = AdapterOperands::new(a, b);
    match copies {
        Some((ax, bx)) => operands.with_copies(ax, bx),
        None => operands,
    }
}

/// What the backward of one projection reads, from [`LoraLinear::forward_saved`].
pub enum ProjectionSaved {
    /// No adapter: `dx = g·W`.
    Frozen(Tensor),
    /// An adapter: the fused op's saved state and the parameters its gradients belong to.
    Lora {
        /// The fused op's saved tensors.
        saved: g4ft_ops::LoraLinearSaved,
        /// `lora_A.weight`.
        a: Var,
        /// `lora_B.weight`.
        b: Var,
    },
}

impl ProjectionSaved {
    /// The adapter's `low = drop(x)·Aᵀ` of the forward (`None` without an adapter), for a later
    /// forward on the same input to take (`kept_low` of [`LoraLinear::forward_saved`]).
    pub fn low(&self) -> Option<&Tensor> {
        match self {
            ProjectionSaved::Frozen(_) => None,
            ProjectionSaved::Lora { saved, .. } => Some(saved.low()),
        }
    }

    /// `dx` from the forward's input `x` and the output gradient `g`; the adapter's `dA`/`dB`
    /// (fp32) go into `grads`.
    pub fn backward(&self, x: &Tensor, g: &Tensor, grads: &mut AdapterGrads) -> Result<Tensor> {
        self.finish(g, grads, |saved| saved.backward(x, g))
    }

    /// [`ProjectionSaved::backward`] with `dx` added to `acc` (another gradient of `x`; on CUDA
    /// accumulated in `acc`'s memory, see [`g4ft_ops::LoraLinearSaved::backward_acc`]).
    pub fn backward_acc(
        &self,
        x: &Tensor,
        g: &Tensor,
        acc: Tensor,
        grads: &mut AdapterGrads,
    ) -> Result<Tensor> {
        match self {
            ProjectionSaved::Frozen(w) => acc + g.broadcast_matmul(w)?,
            ProjectionSaved::Lora { saved, .. } => {
                self.finish(g, grads, |_| saved.backward_acc(x, g, acc))
            }
        }
    }

    /// [`ProjectionSaved::backward`] for an input that dies here: on CUDA `dx` takes `x`'s memory
    /// (see [`g4ft_ops::LoraLinearSaved::backward_over_input`]).
    pub fn backward_over_input(
        &self,
        x: Tensor,
        g: &Tensor,
        grads: &mut AdapterGrads,
    ) -> Result<Tensor> {
        match self {
            ProjectionSaved::Frozen(_) => self.backward(&x, g, grads),
            ProjectionSaved::Lora { saved, .. } => {
                self.finish(g, grads, |_| saved.backward_over_input(x, g))
            }
        }
    }

    /// `g·W` for a frozen projection; otherwise runs `lora` and records its `dA`/`dB`.
    fn finish(
        &self,
        g: &Tensor,
        grads: &mut AdapterGrads,
        lora: impl FnOnce(&g4ft_ops::LoraLinearSaved) -> Result<(Tensor, Tensor, Tensor)>,
    ) -> Result<Tensor> {
        match self {
            ProjectionSaved::Frozen(w) => g.broadcast_matmul(w),
            ProjectionSaved::Lora { saved, a, b } => {
                let (dx, da, db) = lora(saved)?;
                grads.push(a, da)?;
                grads.push(b, db)?;
                Ok(dx)
            }
        }
    }
}

/// Gradients of adapter parameters, each tagged with its `Var` (what an explicit backward
/// produces for one layer; a small list, looked up by tensor id).
#[derive(Debug, Default)]
pub struct AdapterGrads(Vec<(Var, Tensor)>);

impl AdapterGrads {
    /// Records `grad` for `var` (a later gradient of the same `var` is added to it).
    pub fn push(&mut self, var: &Var, grad: Tensor) -> Result<()> {
        match self.0.iter_mut().find(|(v, _)| v.id() == var.id()) {
            Some((_, g)) => *g = (&*g + grad)?,
            None => self.0.push((var.clone(), grad)),
        }
        Ok(())
    }

    /// The gradient of `var`, if recorded.
    pub fn get(&self, var: &Var) -> Option<&Tensor> {
        self.0
            .iter()
            .find(|(v, _)| v.id() == var.id())
            .map(|(_, g)| g)
    }

    /// Number of recorded gradients.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}
