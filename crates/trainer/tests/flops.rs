//! The FLOP shape `step::flops_model` reads off a real model (the bundled tiny one): offloaded
//! checkpoints that park the block outputs take `o_proj`'s and `down_proj`'s outputs from the first
//! forward, so the hardware count of a recomputed layer leaves exactly those two products out; the
//! model count never moves.

use std::path::Path;

use candle_core::{DType, Device};
use g4ft_gemma4::{Gemma4Model, KeepMask, Parked};
use g4ft_trainer::step;

#[test]
fn offloaded_checkpoints_leave_the_reused_products_out_of_the_hardware_flops() -> anyhow::Result<()>
{
    let tiny = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/tiny");
    let mut model =
        Gemma4Model::load(tiny.to_str().expect("utf-8 path"), DType::F32, &Device::Cpu)?;
    let cfg = model.config().clone();
    let n = cfg.layers.len();
    let seq = 64;
    model.set_keep_mask(KeepMask::recompute_all(n))?;
    let plain = step::flops_model(&model);
    model.set_offload_checkpoints(Some(Parked::InputsAndOutputs))?;
    let parked = step::flops_model(&model);
    let (h, reused) = (cfg.hidden_size, |l: &g4ft_gemma4::LayerConfig| {
        (cfg.num_attention_heads * l.head_dim + l.intermediate_size) as u64
    });
    for (i, l) in cfg.layers.iter().enumerate() {
        assert_eq!(plain.layers[i].n_reused, 0, "layer {i}");
        assert_eq!(parked.layers[i].n_reused, h as u64 * reused(l), "layer {i}");
    }
    // The inputs alone: the recompute runs every product again.
    model.set_offload_checkpoints(Some(Parked::Inputs))?;
    let inputs = step::flops_model(&model);
    assert!(inputs.layers.iter().all(|l| l.n_reused == 0));
    assert_eq!(inputs.flops_per_token(seq), plain.flops_per_token(seq));
    let (plain, parked) = (plain.flops_per_token(seq), parked.flops_per_token(seq));
    assert_eq!(plain.model, parked.model);
    let skipped: u64 = cfg.layers.iter().map(|l| 2 * h as u64 * reused(l)).sum();
    assert!((plain.hardware - parked.hardware - skipped as f64).abs() < 1e-6);
    // With the attention state too, the recompute runs no q/k/v product and no attention.
    model.set_offload_checkpoints(Some(Parked::InputsOutputsAndAttention))?;
    let state = step::flops_model(&model);
    let attention: u64 = cfg
        .layers
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let kv = if l.has_kv_proj() {
                l.num_key_value_heads * l.head_dim * if l.has_v_proj { 2 } else { 1 }
            } else {
                0
            };
            let skipped = h * (cfg.num_attention_heads * l.head_dim + kv);
            assert_eq!(
                state.layers[i].n_reused,
                skipped as u64 + h as u64 * reused(l)
            );
            assert!(state.layers[i].attention_reused);
            2 * skipped as u64
        })
        .sum();
    let state = state.flops_per_token(seq);
    let forward = state.attention_forward;
    assert!((parked.hardware - state.hardware - attention as f64 - forward).abs() < 1e-6);
    // Nothing recomputed: nothing reused either, what runs is the model's work.
    model.set_keep_mask(KeepMask::keep_all(n))?;
    let kept = step::flops_model(&model).flops_per_token(seq);
    assert_eq!(kept.hardware, kept.model);
    Ok(())
}
