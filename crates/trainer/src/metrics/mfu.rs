//! FLOPs per token and MFU of frozen-base LoRA training, counted two ways:
//! - **model FLOPs** (`mfu_model`): the work the training step needs, whatever is recomputed —
//!   the usual MFU (PaLM's), with the factors of a frozen base;
//! - **hardware FLOPs** (`mfu_hw`): what runs, i.e. the model FLOPs plus a second forward of every
//!   layer the recompute policy recomputes ([`g4ft_gemma4::KeepMask`]), less what that recompute
//!   reuses from offloaded checkpoints (`o_proj` and `down_proj`; with the attention state, q/k/v
//!   and the attention too).
//!
//! Per token, with `N_l` the frozen matrices layer `l` multiplies each token by (its projections
//! q, k, v, o, gate, up, down — Gemma 4's global layers have no `v_proj` — plus its top-k experts
//! and router, and its per-layer-embedding gate and projection), `R_l` the part of `N_l` whose
//! outputs the recompute reuses instead of computing again, `N_head = vocab × hidden` (the
//! tied LM head), `N_once` the matrices run once in the forward with nothing to differentiate
//! (the per-layer-embedding model projection) and `A_l = 4 · n_heads · head_dim · ctx` one forward
//! of layer `l`'s attention (QKᵀ and PV):
//! ```text
//! model    = Σ_l (4·N_l + 3·A_l) + 4·N_head + 2·N_once
//! hardware = model + Σ_{l recomputed} (2·(N_l − R_l) + A_l)    (A_l left out where reused)
//! ctx = (T + 1) / 2                                  full (causal) attention, T = sequence length
//!     = (w(w + 1)/2 + (T − w)·w) / T                sliding window w = min(window, T)
//! ```
//! A frozen matrix costs 2 per token forward and 2 for the input gradient; no weight gradient is
//! computed (the usual 6·N counts one, which frozen-base LoRA does not need). The attention
//! backward is twice its forward (dQ, dK, dV, dP). The head runs once (never recomputed). Ignored:
//! the LoRA matmuls (r = 16: ~0.5% of N_lin), norms, RoPE, softmax, GeGLU and the loss. With
//! nothing recomputed hardware = model; with every layer recomputed hardware is the PyTorch +
//! PEFT baseline's `exact` count. The baseline reports its `brief` count instead,
//! `6·(Σ N_l + N_head + N_once) + 4·Σ A_l` (the head and `N_once` counted as if recomputed and
//! differentiated): 74.53 GFLOP/token for Gemma 4 12B at T = 2048 (`docs/benchmarks.md`); it is
//! kept as [`FlopsPerToken::brief`] to compare with the baseline's logs only.
//!
//! The peak is a *measured* bf16 matmul ceiling when given (`--peak-tflops`, what the reference
//! README uses: 714.6 TFLOP/s on one H200), else the vendor's dense bf16 number from
//! [`peak_tflops_for`].

use serde::Serialize;

/// One attention layer's shape for the FLOP count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct AttnLayer {
    /// Query heads.
    pub n_heads: usize,
    /// Head dim of this layer (Gemma 4: `head_dim` for sliding, `global_head_dim` for full layers).
    pub head_dim: usize,
    /// Sliding window in tokens, `None` for full attention.
    pub window: Option<usize>,
}

impl AttnLayer {
    /// `A_l`: FLOPs per token of one forward of this attention (QKᵀ and PV) at length `seq`.
    pub fn forward_flops(&self, seq: usize) -> f64 {
        let t = seq.max(1) as f64;
        let ctx = match self.window {
            None => (t + 1.0) / 2.0,
            Some(w) => {
                let w = (w as f64).min(t);
                (w * (w + 1.0) / 2.0 + (t - w) * w) / t
            }
        };
        4.0 * self.n_heads as f64 * self.head_dim as f64 * ctx
    }
}

/// One decoder layer for the FLOP count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LayerFlops {
    /// Elements of the frozen linear weights of the layer's projections (no LoRA).
    pub n_linear: u64,
    /// Elements of the layer's other frozen matrices every token is multiplied by: the experts
    /// each token is routed to (top-k: gate/up and down), the router, the per-layer-embedding
    /// gate and projection. 0 for the dense shapes.
    pub n_routed: u64,
    /// The attention shape.
    pub attention: AttnLayer,
    /// Whether the backward recomputes the layer (a second forward).
    pub recomputed: bool,
    /// Elements of the frozen matrices (of `n_linear`) whose outputs that recompute reuses
    /// instead of multiplying again: `o_proj` and the dense MLP's `down_proj` when offloaded
    /// checkpoints park the block outputs, and q/k/v when they park the attention state too.
    /// 0 otherwise.
    pub n_reused: u64,
    /// Whether that recompute reuses the attention's output instead of running it again
    /// (offloaded checkpoints that park the attention state).
    pub attention_reused: bool,
}

/// The model shape that the FLOP count needs (`g4ft_trainer::step::flops_model` fills it from a
/// model and its keep mask).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FlopsModel {
    /// Every decoder layer, in order.
    pub layers: Vec<LayerFlops>,
    /// `vocab_size × hidden_size` (the LM head, tied to the embedding).
    pub n_head: u64,
    /// Elements of the frozen matrices run once per token in the forward with no gradient through
    /// them (the per-layer-embedding model projection). 0 for the dense shapes.
    pub n_once: u64,
}

/// FLOPs per trained token at one sequence length.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct FlopsPerToken {
    /// Model FLOPs: the step's work without recompute (for `mfu_model`).
    pub model: f64,
    /// Hardware FLOPs: what runs under the recompute policy (for `mfu_hw`).
    pub hardware: f64,
    /// The PyTorch + PEFT baseline's `brief` convention (every layer recomputed, head counted 6×),
    /// for comparison with its logs only.
    pub brief: f64,
    /// `Σ A_l`: one forward of every layer's attention.
    pub attention_forward: f64,
}

impl FlopsModel {
    /// FLOPs per token at sequence length `seq` (tokens per sample; pass the padded length the
    /// step actually ran, or `max_len` for fixed-length benchmarks).
    pub fn flops_per_token(&self, seq: usize) -> FlopsPerToken {
        let (mut model, mut recompute, mut matrices, mut attention) = (0.0, 0.0, 0.0, 0.0);
        for l in &self.layers {
            let n = (l.n_linear + l.n_routed) as f64;
            let a = l.attention.forward_flops(seq);
            model += 4.0 * n + 3.0 * a;
            if l.recomputed {
                recompute += 2.0 * (n - l.n_reused as f64);
                if !l.attention_reused {
                    recompute += a;
                }
            }
            matrices += n;
            attention += a;
        }
        let (head, once) = (self.n_head as f64, self.n_once as f64);
        model += 4.0 * head + 2.0 * once;
        FlopsPerToken {
            model,
            hardware: model + recompute,
            brief: 6.0 * (matrices + head + once) + 4.0 * attention,
            attention_forward: attention,
        }
    }
}

/// Model FLOPs utilisation in [0, 1]: `tokens_per_s_per_device · flops_per_token / peak`.
/// Count only non-padding tokens so the number means useful work.
pub fn mfu(tokens_per_s_per_device: f64, flops_per_token: f64, peak_tflops: f64) -> f64 {
    tokens_per_s_per_device * flops_per_token / (peak_tflops * 1e12)
}

/// Vendor dense bf16 tensor-core peaks in TFLOP/s (no sparsity), matched by substring of the
/// CUDA device name. Sources: NVIDIA data sheets (H100/H200 SXM 989.4, H100 PCIe 756,
/// A100 312, L40S 362, L4 121, A10G 70 per AWS, RTX 4090 165.2). Measured ceilings are lower
/// (the reference measured 714.6 on an H200); pass `--peak-tflops` to use one.
pub const PEAK_BF16_TFLOPS: [(&str, f64); 8] = [
    ("H200", 989.4),
    ("H100 PCIe", 756.0),
    ("H100", 989.4),
    ("A100", 312.0),
    ("L40S", 362.0),
    ("L4", 121.0),
    ("A10G", 70.0),
    ("RTX 4090", 165.2),
];

/// The table's peak for a CUDA device name (first matching entry), `None` if unknown (CPU).
pub fn peak_tflops_for(device_name: &str) -> Option<f64> {
    PEAK_BF16_TFLOPS
        .iter()
        .find(|(k, _)| device_name.contains(k))
        .map(|&(_, v)| v)
}

/// The CUDA device's name as the driver reports it (`None` on the CPU).
pub fn device_name(device: &candle_core::Device) -> Option<String> {
    match device {
        #[cfg(feature = "cuda")]
        candle_core::Device::Cuda(d) => d.cuda_stream().context().name().ok(),
        _ => None,
    }
}

/// [`peak_tflops_for`] of `device`: the data-sheet bf16 peak of a known GPU, `None` otherwise.
pub fn device_peak_tflops(device: &candle_core::Device) -> Option<f64> {
    device_name(device).and_then(|n| peak_tflops_for(&n))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Gemma 4 12B text decoder (`crates/gemma4/tests/configs/gemma-4-12B-it.json`): 48 layers,
    /// every sixth full attention (head_dim 512, 1 kv head, no v_proj), others sliding 1024
    /// (head_dim 256, 8 kv heads); hidden 3840, intermediate 15360, 16 heads, vocab 262144.
    /// `recomputed(l)`: whether layer `l` is recomputed.
    fn gemma4_12b(recomputed: impl Fn(usize) -> bool) -> FlopsModel {
        let (h, i, heads) = (3840u64, 15360u64, 16u64);
        let mlp = 3 * h * i;
        let sliding = h * heads * 256 * 2 + 2 * h * 8 * 256 + mlp; // q, o + k, v
        let full = h * heads * 512 * 2 + h * 512 + mlp; // q, o + k (k_eq_v)
        let layers = (0..48)
            .map(|l| {
                let is_full = l % 6 == 5;
                LayerFlops {
                    n_linear: if is_full { full } else { sliding },
                    n_routed: 0,
                    attention: AttnLayer {
                        n_heads: 16,
                        head_dim: if is_full { 512 } else { 256 },
                        window: (!is_full).then_some(1024),
                    },
                    recomputed: recomputed(l),
                    n_reused: 0,
                    attention_reused: false,
                }
            })
            .collect();
        FlopsModel {
            layers,
            n_head: 262144 * h,
            n_once: 0,
        }
    }

    #[test]
    fn gemma4_12b_matches_the_pytorch_reference() {
        // The PyTorch baseline's count: 74.53 GFLOP/token at seq 2048, its `exact` variant 2·N_head
        // less; every layer recomputed runs exactly `exact`.
        let f = gemma4_12b(|_| true).flops_per_token(2048);
        assert!((f.brief / 1e9 - 74.53).abs() < 0.005, "{}", f.brief / 1e9);
        let n_head = 262144.0 * 3840.0;
        assert!((f.brief - f.hardware - 2.0 * n_head).abs() < 1.0);
        // The baseline's reported example: 2,478 tok/s on one H200 at 714.6 TFLOP/s is 25.8% MFU.
        let m = mfu(2478.0, f.brief, 714.6);
        assert!((m - 0.258).abs() < 0.0005, "{m}");
    }

    #[test]
    fn model_flops_do_not_depend_on_the_recompute_and_hardware_adds_the_second_forwards() {
        let seq = 2048;
        let all = gemma4_12b(|_| true).flops_per_token(seq);
        let none = gemma4_12b(|_| false).flops_per_token(seq);
        let half = gemma4_12b(|l| l >= 24).flops_per_token(seq);
        // Nothing recomputed: what runs is the model's work, to the last FLOP.
        assert_eq!(none.hardware, none.model);
        assert_eq!((all.model, half.model), (none.model, none.model));
        assert_eq!(none.brief, all.brief);
        // Every layer recomputed: one more forward of every layer = 2·ΣN_l + ΣA_l; the head and
        // the backward are not repeated. 12B at 2048: ΣN_l = 10,899,947,520.
        let n_layers = 10_899_947_520.0;
        let fwd = 2.0 * n_layers + all.attention_forward;
        assert!((all.hardware - all.model - fwd).abs() < 1.0);
        // Model FLOPs: 4·(ΣN_l + N_head) + 3·ΣA_l, i.e. 49.9 GFLOP/token, 0.69 of the hardware.
        let want = 4.0 * (n_layers + 262144.0 * 3840.0) + 3.0 * all.attention_forward;
        assert!((all.model - want).abs() < 1.0);
        assert!(
            (all.model / 1e9 - 49.94).abs() < 0.01,
            "{}",
            all.model / 1e9
        );
        assert!((all.model / all.hardware - 0.689).abs() < 0.001);
        // Layers 24..48 recomputed (4 of the 8 full ones among them): between the two, by their
        // second forwards.
        let second: f64 = gemma4_12b(|_| true).layers[24..]
            .iter()
            .map(|l| 2.0 * l.n_linear as f64 + l.attention.forward_flops(seq))
            .sum();
        assert!((half.hardware - half.model - second).abs() < 1.0);
        assert!(none.hardware < half.hardware && half.hardware < all.hardware);
    }

    #[test]
    fn a_recompute_that_reuses_parked_outputs_counts_only_the_products_it_runs() {
        // Offloaded checkpoints: every layer recomputed, o_proj (16·256 or 16·512 wide input)
        // and down_proj (15,360 wide) reused from the first forward.
        let seq = 2048;
        let all = gemma4_12b(|_| true);
        let mut parked = all.clone();
        for (l, layer) in parked.layers.iter_mut().enumerate() {
            let head_dim = if l % 6 == 5 { 512 } else { 256 };
            layer.n_reused = 3840 * 16 * head_dim + 3840 * 15360;
        }
        let (all, parked) = (all.flops_per_token(seq), parked.flops_per_token(seq));
        assert_eq!(parked.model, all.model);
        // 40 sliding + 8 full layers, 2 FLOPs per reused element.
        let reused = 2.0 * 3840.0 * (40.0 * (4096.0 + 15360.0) + 8.0 * (8192.0 + 15360.0));
        assert!((all.hardware - parked.hardware - reused).abs() < 1.0);
        assert!(parked.model < parked.hardware);
    }

    #[test]
    fn sliding_window_longer_than_sequence_is_causal() {
        let full = AttnLayer {
            n_heads: 1,
            head_dim: 1,
            window: None,
        };
        let wide = AttnLayer {
            window: Some(4096),
            ..full
        };
        assert_eq!(full.forward_flops(100), wide.forward_flops(100));
        assert_eq!(full.forward_flops(1), 4.0);
    }

    #[test]
    fn peak_table_lookup() {
        assert_eq!(peak_tflops_for("NVIDIA H200"), Some(989.4));
        assert_eq!(peak_tflops_for("NVIDIA H100 PCIe"), Some(756.0));
        assert_eq!(peak_tflops_for("NVIDIA L40S"), Some(362.0));
        assert_eq!(peak_tflops_for("cpu"), None);
    }
}
