//! Model FLOPs per token and MFU for frozen-base LoRA training with per-layer recompute, using
//! exactly the convention of the PyTorch + PEFT baseline we compare against (its
//! `flops_per_token(...)["brief"]`, `docs/benchmarks.md`), so our MFU and theirs compare.
//!
//! Per token, with `N_lin` the frozen linear weights of the decoder layers (q, k, v, o, gate, up,
//! down; Gemma 4's global layers have no `v_proj`), `N_routed` the other frozen matrices a token
//! goes through (its top-k experts and the router of each MoE layer, the per-layer-embedding
//! gates: 0 for the dense shapes, where the formula is the reference's) and
//! `N_head = vocab × hidden` (the tied LM head):
//! ```text
//! FLOPs/token = 6·(N_lin + N_routed + N_head) + Σ_layers 16 · n_heads · head_dim · ctx
//! ctx = (T + 1) / 2                                  full (causal) attention, T = sequence length
//!     = (w(w + 1)/2 + (T − w)·w) / T                sliding window w = min(window, T)
//! ```
//! The 6 = forward 2 + recomputed forward 2 + input-gradient backward 2: the base weights are
//! frozen, so no weight-gradient GEMM is done for them, and checkpointing recomputes each layer.
//! The attention term is `4·heads·head_dim·ctx` (QKᵀ and PV) per pass, times 4 passes (forward,
//! recompute, backward = 2× forward). Ignored: the LoRA matmuls (r = 16: ~0.5% of N_lin), norms,
//! RoPE, softmax, GeGLU and the loss. The head is not recomputed, so this overcounts it by
//! 2·N_head (the reference's `exact` variant, [`FlopsPerToken::exact`]); the `brief` value is
//! the one reported, 74.53 GFLOP/token for Gemma 4 12B at T = 2048.
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

/// The model shape that the FLOP count needs; the example fills it from the Gemma 4 config.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FlopsModel {
    /// Elements of the frozen linear weights in the decoder layers (no embeddings, no LoRA).
    pub n_linear: u64,
    /// Elements of the other frozen matrices every token is multiplied by: the experts each token
    /// is routed to (top-k of each MoE layer: gate/up and down), the routers, and the per-layer
    /// embedding gates and projections. 0 for the dense shapes.
    pub n_routed: u64,
    /// `vocab_size × hidden_size` (the LM head, tied to the embedding).
    pub n_head: u64,
    /// Every decoder layer's attention shape, in order.
    pub layers: Vec<AttnLayer>,
}

/// FLOPs per trained token at one sequence length.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct FlopsPerToken {
    /// `6·(N_lin + N_head) + attention`: the reported convention (the reference's `brief`).
    pub brief: f64,
    /// `6·N_lin + 4·N_head + attention`: the head is not recomputed.
    pub exact: f64,
    /// The attention term alone.
    pub attention: f64,
}

impl FlopsModel {
    /// FLOPs per token at sequence length `seq` (tokens per sample; pass the padded length the
    /// step actually ran, or `max_len` for fixed-length benchmarks).
    pub fn flops_per_token(&self, seq: usize) -> FlopsPerToken {
        let t = seq.max(1) as f64;
        let attention: f64 = self
            .layers
            .iter()
            .map(|l| {
                let ctx = match l.window {
                    None => (t + 1.0) / 2.0,
                    Some(w) => {
                        let w = (w as f64).min(t);
                        (w * (w + 1.0) / 2.0 + (t - w) * w) / t
                    }
                };
                16.0 * l.n_heads as f64 * l.head_dim as f64 * ctx
            })
            .sum();
        let (lin, head) = ((self.n_linear + self.n_routed) as f64, self.n_head as f64);
        FlopsPerToken {
            brief: 6.0 * (lin + head) + attention,
            exact: 6.0 * lin + 4.0 * head + attention,
            attention,
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
    fn gemma4_12b() -> FlopsModel {
        let (h, i, heads) = (3840u64, 15360u64, 16u64);
        let mlp = 3 * h * i;
        let sliding = h * heads * 256 * 2 + 2 * h * 8 * 256 + mlp; // q, o + k, v
        let full = h * heads * 512 * 2 + h * 512 + mlp; // q, o + k (k_eq_v)
        let layers: Vec<AttnLayer> = (0..48)
            .map(|l| {
                if l % 6 == 5 {
                    AttnLayer {
                        n_heads: 16,
                        head_dim: 512,
                        window: None,
                    }
                } else {
                    AttnLayer {
                        n_heads: 16,
                        head_dim: 256,
                        window: Some(1024),
                    }
                }
            })
            .collect();
        FlopsModel {
            n_linear: 40 * sliding + 8 * full,
            n_routed: 0,
            n_head: 262144 * h,
            layers,
        }
    }

    #[test]
    fn gemma4_12b_matches_the_pytorch_reference() {
        // The PyTorch baseline's count: 74.53 GFLOP/token at seq 2048.
        let f = gemma4_12b().flops_per_token(2048);
        assert!((f.brief / 1e9 - 74.53).abs() < 0.005, "{}", f.brief / 1e9);
        assert!((f.brief - f.exact - 2.0 * 262144.0 * 3840.0).abs() < 1.0);
        // The baseline's reported example: 2,478 tok/s on one H200 at 714.6 TFLOP/s is 25.8% MFU.
        let m = mfu(2478.0, f.brief, 714.6);
        assert!((m - 0.258).abs() < 0.0005, "{m}");
    }

    #[test]
    fn sliding_window_longer_than_sequence_is_causal() {
        let full = FlopsModel {
            n_linear: 0,
            n_routed: 0,
            n_head: 0,
            layers: vec![AttnLayer {
                n_heads: 1,
                head_dim: 1,
                window: None,
            }],
        };
        let wide = FlopsModel {
            n_linear: 0,
            n_routed: 0,
            n_head: 0,
            layers: vec![AttnLayer {
                n_heads: 1,
                head_dim: 1,
                window: Some(4096),
            }],
        };
        assert_eq!(
            full.flops_per_token(100).attention,
            wide.flops_per_token(100).attention
        );
        assert_eq!(full.flops_per_token(1).attention, 16.0);
    }

    #[test]
    fn peak_table_lookup() {
        assert_eq!(peak_tflops_for("NVIDIA H200"), Some(989.4));
        assert_eq!(peak_tflops_for("NVIDIA H100 PCIe"), Some(756.0));
        assert_eq!(peak_tflops_for("NVIDIA L40S"), Some(362.0));
        assert_eq!(peak_tflops_for("cpu"), None);
    }
}
