//! Writes Rust-made adapters (non-zero B) plus the Rust outputs for the PEFT side of the round
//! trip: `tools/reference/lora/check_rust_adapter.py` loads each directory with
//! `PeftModel.from_pretrained` and `set_peft_model_state_dict` and compares outputs.
//!
//! ```text
//! cargo test -p g4ft-lora --test rust_adapter_export
//! /opt/refenv/bin/python tools/reference/lora/check_rust_adapter.py target/tmp/g4ft_lora/rust_adapter
//! ```
//! The test itself checks the Rust side: files load back and reproduce the outputs.

mod common;

use std::path::PathBuf;

use candle_core::{Device, Tensor};
use common::{fixtures, load, Toy};
use g4ft_lora::{
    attach, load_adapter, save_adapter, InitLoraWeights, LoraConfig, LoraContext, TargetModules,
};

/// Export root (also printed, for the Python check).
fn export_root() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("g4ft_lora/rust_adapter")
}

fn configs() -> Vec<(&'static str, LoraConfig)> {
    let mut regex = LoraConfig::new(
        2,
        6.0,
        TargetModules::Regex(
            r"model\.layers\.\d+\.(self_attn\.(q|v|o)_proj|mlp\.(up|down)_proj)".into(),
        ),
    );
    regex.use_rslora = true;
    regex.rank_pattern.insert("down_proj".into(), 3);
    regex
        .alpha_pattern
        .insert(r"layers\.1\.self_attn\.o_proj".into(), 1.5);
    regex.lora_dropout = 0.1;
    let mut list = LoraConfig::new(
        4,
        5.0,
        TargetModules::List(
            ["q_proj", "k_proj", "v_proj", "gate_proj"]
                .map(String::from)
                .to_vec(),
        ),
    );
    list.exclude_modules = Some(TargetModules::Regex(
        r".*layers\.1\.self_attn\.k_proj".into(),
    ));
    let mut out = vec![("regex_rslora_patterns", regex), ("list_exclude", list)];
    for (_, cfg) in &mut out {
        cfg.init_lora_weights = InitLoraWeights::Random; // non-zero B: outputs differ from the base
        cfg.task_type = None; // the toy is a plain nn.Module, not a causal LM
        cfg.base_model_name_or_path = Some("tools/reference/lora/fixtures/base".into());
    }
    out
}

#[test]
fn export_rust_adapters_for_peft() {
    let x = load(&fixtures().join("list/golden.safetensors"))["x"].clone();
    for (name, cfg) in configs() {
        let mut toy = Toy::load_base();
        let base_y = toy.forward(&x, &LoraContext::EVAL).unwrap();
        let adapted = attach(&cfg, toy.projections.iter_mut(), 20_251_129).unwrap();
        let y = toy.forward(&x, &LoraContext::EVAL).unwrap();
        let diff = (&y - &base_y)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!(
            diff > 1e-3,
            "{name}: adapter must change the output (diff {diff})"
        );
        let dir = export_root().join(name);
        let _ = std::fs::remove_dir_all(&dir);
        save_adapter(&dir, &cfg, toy.projections.iter()).unwrap();
        candle_core::safetensors::save(
            &[("x".to_string(), x.clone()), ("y".to_string(), y.clone())]
                .into_iter()
                .collect(),
            dir.join("rust_output.safetensors"),
        )
        .unwrap();
        // Rust side of the round trip: load into a fresh model, same outputs bit for bit.
        let mut fresh = Toy::load_base();
        load_adapter(&dir, fresh.projections.iter_mut()).unwrap();
        let y2 = fresh.forward(&x, &LoraContext::EVAL).unwrap();
        assert_eq!(flat(&y), flat(&y2), "{name}");
        let n = fresh
            .projections
            .iter()
            .filter(|p| p.adapter().is_some())
            .count();
        assert_eq!(n, adapted.len(), "{name}");
        println!(
            "{name}: {} adapted modules -> {}",
            adapted.len(),
            dir.display()
        );
    }
}

fn flat(t: &Tensor) -> Vec<f32> {
    t.to_device(&Device::Cpu)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}
