//! LoRA dropout on the adapter input, keyed so that a recompute replays the mask exactly.
//!
//! PEFT applies `nn.Dropout(p)` to the LoRA branch input only, one independent dropout per module;
//! kept elements are scaled by `1/(1-p)` (inverted dropout, as torch). The mask here is
//! `g4ft_ops::lora_dropout`'s counter-based hash (fused CPU/CUDA op with a backward, see
//! `crates/ops/src/dropout.rs`) under the key `[ctx.seed, ctx.micro_step, FNV-1a(module path)]`:
//! a pure function of the context and the module, so the layer recompute of layer-wise backward
//! gets the same mask, ranks (different `seed`) get different masks, and no generator state exists.
//! The bits cannot match PyTorch's generator.

use candle_core::{Result, Tensor};

use crate::linear::LoraContext;

/// The dropout key of module `path` under `ctx`: `[seed, micro_step, FNV-1a(path)]`.
pub fn dropout_key(ctx: &LoraContext, path: &str) -> [u64; 3] {
    g4ft_ops::dropout_key(ctx.seed, ctx.micro_step, path)
}

/// `dropout(x)` for the adapter input of module `path`: identity when `p == 0` or
/// `!ctx.training`; otherwise kept elements scaled by `1/(1-p)` in fp32 and rounded once to `x`'s
/// dtype, dropped ones 0. Differentiable in `x`. Errors when `p` is outside `[0, 1)`.
pub fn lora_dropout(x: &Tensor, p: f64, ctx: &LoraContext, path: &str) -> Result<Tensor> {
    if !ctx.training || p == 0.0 {
        return Ok(x.clone());
    }
    g4ft_ops::lora_dropout(x, p, dropout_key(ctx, path))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    fn ctx(seed: u64, micro_step: u64) -> LoraContext {
        LoraContext {
            training: true,
            track_grad: true,
            seed,
            micro_step,
        }
    }

    fn dropped_ones(n: usize, p: f64, c: LoraContext, path: &str) -> Vec<f32> {
        let x = Tensor::ones(n, DType::F32, &Device::Cpu).unwrap();
        lora_dropout(&x, p, &c, path).unwrap().to_vec1().unwrap()
    }

    #[test]
    fn replays_exactly_and_varies_with_every_key() {
        let path = "m.layers.0.self_attn.q_proj";
        let a = dropped_ones(960, 0.3, ctx(1, 7), path);
        assert_eq!(
            a,
            dropped_ones(960, 0.3, ctx(1, 7), path),
            "recompute must replay"
        );
        assert_ne!(
            a,
            dropped_ones(960, 0.3, ctx(2, 7), path),
            "seed (rank) changes the mask"
        );
        assert_ne!(
            a,
            dropped_ones(960, 0.3, ctx(1, 8), path),
            "micro_step changes the mask"
        );
        assert_ne!(
            a,
            dropped_ones(960, 0.3, ctx(1, 7), "m.layers.0.self_attn.k_proj")
        );
        let eval = LoraContext {
            training: false,
            ..ctx(1, 7)
        };
        assert!(dropped_ones(960, 0.3, eval, path).iter().all(|&v| v == 1.0));
    }

    #[test]
    fn keep_probability_and_inverted_scale() {
        let n = 1_000_000;
        for p in [0.05, 0.1, 0.5] {
            let y = dropped_ones(n, p, ctx(3, 11), "x.q_proj");
            let scale = (1.0 / (1.0 - p)) as f32;
            assert!(y.iter().all(|&m| m == 0.0 || m == scale));
            let kept = y.iter().filter(|&&m| m != 0.0).count() as f64 / n as f64;
            // binomial sd = sqrt(p(1-p)/n) <= 5e-4; allow 5 sd.
            let sd = (p * (1.0 - p) / n as f64).sqrt();
            assert!((kept - (1.0 - p)).abs() < 5.0 * sd, "p {p}: kept {kept}");
            let mean = y.iter().map(|&m| f64::from(m)).sum::<f64>() / n as f64;
            assert!(
                (mean - 1.0).abs() < 5.0 * sd / (1.0 - p),
                "p {p}: mean {mean}"
            );
        }
    }

    #[test]
    fn masks_of_different_modules_are_independent() {
        let n = 200_000;
        let a = dropped_ones(n, 0.5, ctx(0, 0), "l.0.q_proj");
        let b = dropped_ones(n, 0.5, ctx(0, 0), "l.0.k_proj");
        let both = a
            .iter()
            .zip(&b)
            .filter(|(x, y)| **x != 0.0 && **y != 0.0)
            .count();
        // independent: P(both kept) = 0.25, sd ≈ 9.7e-4.
        let both = both as f64 / n as f64;
        assert!((both - 0.25).abs() < 5e-3, "{both}");
    }

    #[test]
    fn bf16_input_keeps_dtype() {
        let vals = [1.5f32, -2.25, 3.0, 0.5];
        let x = Tensor::new(&vals, &Device::Cpu)
            .unwrap()
            .to_dtype(DType::BF16)
            .unwrap();
        let y = lora_dropout(&x, 0.5, &ctx(5, 0), "p").unwrap();
        assert_eq!(y.dtype(), DType::BF16);
        let y = y.to_dtype(DType::F32).unwrap().to_vec1::<f32>().unwrap();
        for (v, orig) in y.iter().zip(vals) {
            assert!(*v == 0.0 || *v == orig * 2.0, "{v} vs {orig}");
        }
    }
}
