//! Which decoder layers [`crate::Gemma4Model::forward_backward`] recomputes in its backward walk
//! (`docs/layer-backward.md`, "Recompute policy").
//!
//! A recomputed layer saves only its input in the forward and runs again, keeping its tape, when
//! the walk reaches it (gradient checkpointing): least memory, one more forward of the layer. A
//! layer that *keeps* its activations keeps its tape from the forward until its backward: no second
//! forward, its tape held through the loss head and the walk down to it. The gradients are the same
//! either way (same kernels in the same order on the same inputs).

use crate::error::{Error, Result};

/// What the user asks for. [`crate::memory::MemoryModel::plan`] resolves it to a [`KeepMask`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Recompute {
    /// Recompute every layer (the least memory; the default).
    All,
    /// Recompute no layer: every layer keeps its activations, with whole tapes ([`KeepMask`]; the
    /// most memory, no second forward).
    None,
    /// Keep the activations of as many layers as fit `budget_bytes` of predicted peak memory (the
    /// last layers, which the backward walk frees first) and recompute the others; every layer,
    /// with whole tapes, where that fits.
    Auto {
        /// Bytes the step's predicted peak may reach (weights, adapters and optimizer included).
        budget_bytes: u64,
    },
}

/// What offloaded checkpoints ([`crate::Gemma4Model::set_offload_checkpoints`]) park in host
/// memory for each recomputed layer, from the least host memory to the most.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Parked {
    /// The layer's input alone (`b·t·H` elements): the recompute runs the whole layer again.
    Inputs,
    /// The input and the attention and MLP outputs before their norms (`3·b·t·H`): the recompute
    /// takes the outputs and skips the `o_proj` and `down_proj` frozen products.
    InputsAndOutputs,
    /// Those and the attention block's state: the raw q/k/v projections, the attention output and
    /// its log-sum-exp (for the 12B's sliding layers `3·b·t·H + 3·b·t·nh·d` elements, and `b·t·nh`
    /// fp32): the recompute runs neither the q/k/v frozen products nor the attention kernel,
    /// only the MLP's gate and up products, the norms and the adapters' down-projections.
    InputsOutputsAndAttention,
}

impl Parked {
    /// What `--offload-checkpoints` parks where the host's RAM holds it.
    pub const MOST: Parked = Parked::InputsOutputsAndAttention;

    /// What it parks, for messages: `inputs`, `inputs and outputs`, ...
    pub fn describe(self) -> &'static str {
        match self {
            Parked::Inputs => "inputs",
            Parked::InputsAndOutputs => "inputs and outputs",
            Parked::InputsOutputsAndAttention => "inputs, outputs and attention state",
        }
    }

    /// The next level down (less host memory), `None` from the least.
    pub fn smaller(self) -> Option<Parked> {
        match self {
            Parked::Inputs => None,
            Parked::InputsAndOutputs => Some(Parked::Inputs),
            Parked::InputsOutputsAndAttention => Some(Parked::InputsAndOutputs),
        }
    }

    /// Tensors parked per recomputed layer, at most (the input, the two block outputs, the raw
    /// q, k and v, the attention output and its log-sum-exp).
    pub const fn tensors_per_layer(self) -> usize {
        match self {
            Parked::Inputs => 1,
            Parked::InputsAndOutputs => 3,
            Parked::InputsOutputsAndAttention => 8,
        }
    }

    /// Whether a recompute at this level takes the output of the projection at `path` (a
    /// checkpoint module path ending in `self_attn.q_proj` ... `mlp.down_proj`) from the parked
    /// tensors instead of running its frozen product.
    pub fn reuses_projection(self, path: &str) -> bool {
        let ends = |names: &[&str]| names.iter().any(|n| path.ends_with(n));
        (self.outputs() && ends(&[".self_attn.o_proj", ".mlp.down_proj"]))
            || (self.attention()
                && ends(&[
                    ".self_attn.q_proj",
                    ".self_attn.k_proj",
                    ".self_attn.v_proj",
                ]))
    }

    /// Whether the block outputs are parked (the recompute skips `o_proj` and `down_proj`).
    pub fn outputs(self) -> bool {
        self >= Parked::InputsAndOutputs
    }

    /// Whether the attention state is parked (the recompute skips q/k/v and the attention).
    pub fn attention(self) -> bool {
        self >= Parked::InputsOutputsAndAttention
    }
}

/// Per layer: does it keep its activations from the forward to its backward (`true`) or save only
/// its input and recompute (`false`)? And whether the kept layers' tapes are whole: they also
/// keep what their backward would otherwise recompute from the rest (the normed inputs of the
/// attention and the MLP, the roped queries, the `o_proj` input), more memory for less work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeepMask {
    keep: Vec<bool>,
    whole: bool,
}

impl KeepMask {
    /// Every one of `n_layers` layers recomputed.
    pub fn recompute_all(n_layers: usize) -> Self {
        Self::from_layers(vec![false; n_layers])
    }

    /// Every one of `n_layers` layers keeps its activations.
    pub fn keep_all(n_layers: usize) -> Self {
        Self::from_layers(vec![true; n_layers])
    }

    /// The last `kept` of `n_layers` layers keep their activations, the others are recomputed.
    pub fn keep_last(n_layers: usize, kept: usize) -> Self {
        let kept = kept.min(n_layers);
        Self::from_layers((0..n_layers).map(|i| i >= n_layers - kept).collect())
    }

    /// An explicit mask, `keep[i]` for layer `i` (tapes not whole).
    pub fn from_layers(keep: Vec<bool>) -> Self {
        KeepMask { keep, whole: false }
    }

    /// The same layers, their tapes whole or not.
    pub fn with_whole_tapes(self, whole: bool) -> Self {
        KeepMask { whole, ..self }
    }

    /// Whether the kept layers' tapes are whole.
    pub fn whole_tapes(&self) -> bool {
        self.whole
    }

    /// Layers covered.
    pub fn len(&self) -> usize {
        self.keep.len()
    }

    /// Covers no layer.
    pub fn is_empty(&self) -> bool {
        self.keep.is_empty()
    }

    /// Whether layer `i` keeps its activations.
    pub fn keeps(&self, i: usize) -> bool {
        self.keep[i]
    }

    /// Number of layers that keep their activations.
    pub fn kept(&self) -> usize {
        self.keep.iter().filter(|&&k| k).count()
    }

    /// Number of layers recomputed in the backward walk.
    pub fn recomputed(&self) -> usize {
        self.len() - self.kept()
    }

    /// The per-layer flags.
    pub fn as_slice(&self) -> &[bool] {
        &self.keep
    }

    /// An error unless the mask covers exactly `n_layers` layers.
    pub(crate) fn check_len(&self, n_layers: usize) -> Result<()> {
        if self.len() != n_layers {
            return Err(Error::KeepMask {
                mask_layers: self.len(),
                model_layers: n_layers,
            });
        }
        Ok(())
    }

    /// `none`, `all 48`, or the kept layers as ranges: `40-47`, `1, 3, 5`.
    pub fn describe_kept(&self) -> String {
        let mut ranges: Vec<(usize, usize)> = Vec::new();
        for (i, _) in self.keep.iter().enumerate().filter(|(_, &k)| k) {
            match ranges.last_mut() {
                Some((_, end)) if *end + 1 == i => *end = i,
                _ => ranges.push((i, i)),
            }
        }
        match ranges.as_slice() {
            [] => "none".into(),
            [(0, e)] if *e + 1 == self.len() => format!("all {}", self.len()),
            _ => ranges
                .iter()
                .map(|&(a, b)| {
                    if a == b {
                        a.to_string()
                    } else {
                        format!("{a}-{b}")
                    }
                })
                .collect::<Vec<_>>()
                .join(", "),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_count_and_describe_their_layers() {
        let m = KeepMask::keep_last(6, 2);
        assert_eq!(m.as_slice(), [false, false, false, false, true, true]);
        assert_eq!((m.kept(), m.recomputed()), (2, 4));
        assert_eq!(m.describe_kept(), "4-5");
        assert_eq!(KeepMask::keep_last(3, 9), KeepMask::keep_all(3));
        assert_eq!(KeepMask::keep_all(3).describe_kept(), "all 3");
        assert_eq!(KeepMask::recompute_all(3).describe_kept(), "none");
        let odd = KeepMask::from_layers(vec![false, true, false, true, true]);
        assert_eq!(odd.describe_kept(), "1, 3-4");
        assert!(odd.check_len(5).is_ok());
        assert!(odd.check_len(6).is_err());
    }
}
