//! Config parsing and derivation against the six release configs (`docs/gemma4.md` §1, §2).

use g4ft_gemma4::{Config, KvSharing, LayerType, RopeType};

fn load(name: &str) -> Config {
    let path = format!("{}/tests/configs/{name}", env!("CARGO_MANIFEST_DIR"));
    Config::from_file(&path).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn lora_params(cfg: &Config, r: u64) -> u64 {
    cfg.projection_shapes("model.language_model")
        .iter()
        .map(|p| r * (p.in_features + p.out_features) as u64)
        .sum()
}

#[test]
fn parameter_counts_match_transformers() {
    // (file, text params, LoRA r=16 on q,k,v,o,gate,up,down) from `docs/gemma4.md` §1 (transformers 5.23 / PEFT 0.21).
    let table = [
        ("gemma-4-E2B-it.json", 4_628_569_344u64, 24_158_208u64),
        ("gemma-4-E4B-it.json", 7_463_013_376, 34_881_536),
        ("gemma-4-12B.json", 11_907_350_272, 65_568_768),
        ("gemma-4-12B-it.json", 11_907_350_272, 65_568_768),
        ("gemma-4-26B-A4B-it.json", 25_233_141_760, 18_585_600),
        ("gemma-4-31B-it.json", 30_697_345_280, 122_429_440),
    ];
    for (file, params, lora) in table {
        let cfg = load(file);
        assert_eq!(cfg.num_text_parameters(), params, "{file}: text parameters");
        assert_eq!(lora_params(&cfg, 16), lora, "{file}: LoRA r=16 parameters");
    }
}

#[test]
fn twelve_b_per_layer_settings() {
    let cfg = load("gemma-4-12B.json");
    assert_eq!(cfg.model_type, "gemma4_unified");
    assert_eq!(cfg.text_model_type, "gemma4_unified_text");
    assert_eq!(cfg.sliding_window, 1024);
    assert_eq!(cfg.hidden_size_per_layer_input, 0);
    assert!(cfg.moe.is_none());
    for (i, l) in cfg.layers.iter().enumerate() {
        let full = (i + 1) % 6 == 0;
        assert_eq!(l.layer_type == LayerType::Full, full, "layer {i}");
        if full {
            assert_eq!(
                (l.head_dim, l.num_key_value_heads, l.has_v_proj),
                (512, 1, false)
            );
        } else {
            assert_eq!(
                (l.head_dim, l.num_key_value_heads, l.has_v_proj),
                (256, 8, true)
            );
        }
        assert_eq!(l.kv_sharing, KvSharing::None);
        assert_eq!(l.intermediate_size, 15360);
    }
    assert_eq!(cfg.rope_full.rope_type, RopeType::Proportional);
    assert_eq!(cfg.rope_full.partial_rotary_factor, 0.25);
    assert_eq!(cfg.rope_sliding.rope_theta, 10_000.0);
    let shapes = cfg.projection_shapes("model.language_model");
    let q5 = shapes
        .iter()
        .find(|s| s.path == "model.language_model.layers.5.self_attn.q_proj")
        .expect("layer 5 q_proj");
    assert_eq!((q5.out_features, q5.in_features), (8192, 3840));
    assert!(!shapes
        .iter()
        .any(|s| s.path.ends_with("layers.5.self_attn.v_proj")));
}

#[test]
fn e2b_kv_sharing_and_double_wide() {
    let cfg = load("gemma-4-E2B-it.json");
    assert_eq!(cfg.layers[13].kv_sharing, KvSharing::Store);
    assert_eq!(cfg.layers[14].kv_sharing, KvSharing::Store);
    for i in 15..35 {
        let producer = if cfg.layers[i].layer_type == LayerType::Full {
            14
        } else {
            13
        };
        assert_eq!(
            cfg.layers[i].kv_sharing,
            KvSharing::Reuse { producer },
            "layer {i}"
        );
        assert_eq!(cfg.layers[i].intermediate_size, 12288);
    }
    assert_eq!(cfg.layers[14].intermediate_size, 6144);
    // E2B is not k_eq_v: full layers keep 1 kv head (num_global_key_value_heads ignored) and v_proj.
    assert_eq!(
        (cfg.layers[4].head_dim, cfg.layers[4].num_key_value_heads),
        (512, 1)
    );
    assert!(cfg.layers[4].has_v_proj);
    let e4b = load("gemma-4-E4B-it.json");
    assert_eq!(e4b.layers[22].kv_sharing, KvSharing::Store);
    assert_eq!(e4b.layers[23].kv_sharing, KvSharing::Store);
    assert_eq!(e4b.layers[41].kv_sharing, KvSharing::Reuse { producer: 23 });
}

/// The `per_layer_config` form (written by transformers >= 5.16) gives the same derived config.
#[test]
fn per_layer_config_form_is_equivalent() {
    for file in [
        "gemma-4-12B.json",
        "gemma-4-E2B-it.json",
        "gemma-4-26B-A4B-it.json",
    ] {
        let path = format!("{}/tests/configs/{file}", env!("CARGO_MANIFEST_DIR"));
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let tc = v["text_config"].as_object_mut().unwrap();
        let gd = tc.remove("global_head_dim").unwrap();
        let gkv = tc.remove("num_global_key_value_heads").unwrap();
        let k_eq_v = tc["attention_k_eq_v"].as_bool().unwrap();
        let kv = tc["num_key_value_heads"].clone();
        let mut plc = serde_json::Map::new();
        for (i, t) in tc["layer_types"].as_array().unwrap().iter().enumerate() {
            if t == "full_attention" {
                let mut o = serde_json::Map::new();
                o.insert("head_dim".into(), gd.clone());
                if k_eq_v && !gkv.is_null() && gkv != kv {
                    o.insert("num_key_value_heads".into(), gkv.clone());
                }
                plc.insert(format!("{i:02}"), o.into());
            }
        }
        tc.insert("per_layer_config".into(), plc.into());
        let a = Config::from_file(&path).unwrap();
        let b = Config::from_json_str(&v.to_string(), file).unwrap();
        assert_eq!(a, b, "{file}");
    }
}

#[test]
fn bare_text_config_defaults_and_errors() {
    // Bare text config: layer_types derived, last layer forced full.
    let cfg = Config::from_json_str(
        r#"{"model_type":"gemma4_text","num_hidden_layers":4,"hidden_size":32,"vocab_size":64,
            "layer_types":["sliding_attention","full_attention","sliding_attention","sliding_attention"]}"#,
        "t.json",
    )
    .unwrap();
    let types: Vec<_> = cfg.layers.iter().map(|l| l.layer_type).collect();
    assert_eq!(
        types,
        [
            LayerType::Sliding,
            LayerType::Full,
            LayerType::Sliding,
            LayerType::Full
        ]
    );
    assert_eq!(cfg.sliding_window, 512);
    assert_eq!(cfg.hidden_size_per_layer_input, 256);
    let cfg = Config::from_json_str(
        r#"{"model_type":"gemma4_unified_text","num_hidden_layers":7}"#,
        "u.json",
    )
    .unwrap();
    assert_eq!(cfg.sliding_window, 1024);
    assert_eq!(cfg.hidden_size_per_layer_input, 0);
    assert_eq!(cfg.layers[5].layer_type, LayerType::Full);
    assert_eq!(cfg.layers[6].layer_type, LayerType::Full);

    let err = Config::from_json_str(
        r#"{"model_type":"gemma4","text_config":{"num_hidden_layers":2,"layer_types":["x","y"]}}"#,
        "bad.json",
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("bad.json") && err.contains("text_config.layer_types[0]"),
        "{err}"
    );
    // Settings the model does not implement name their field instead of training differently.
    for (field, value) in [
        ("attention_dropout", "0.1"),
        ("attention_bias", "true"),
        ("hidden_activation", "\"silu\""),
    ] {
        let json = format!(r#"{{"model_type":"gemma4_text","{field}":{value}}}"#);
        let err = Config::from_json_str(&json, "x.json")
            .unwrap_err()
            .to_string();
        assert!(err.contains("x.json") && err.contains(field), "{err}");
    }
    Config::from_json_str(
        r#"{"model_type":"gemma4_text","attention_dropout":0.0}"#,
        "zero.json",
    )
    .unwrap();
    let err = Config::from_json_str(r#"{"model_type":"llama"}"#, "l.json")
        .unwrap_err()
        .to_string();
    assert!(err.contains("model_type") && err.contains("llama"), "{err}");
    let err = Config::from_json_str(
        r#"{"model_type":"gemma4_text","num_hidden_layers":4,"num_kv_shared_layers":3,
            "layer_types":["full_attention","sliding_attention","sliding_attention","full_attention"]}"#,
        "s.json",
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("num_kv_shared_layers") && err.contains("sliding_attention"),
        "{err}"
    );
}

#[test]
fn a_model_directory_reads_its_config_and_a_training_config_is_named() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let tiny = root.join("assets/tiny");
    assert_eq!(
        Config::from_file(&tiny).unwrap(),
        Config::from_file(tiny.join("config.json")).unwrap()
    );
    let msg = Config::from_file(root.join("configs/tiny-cpu.toml"))
        .unwrap_err()
        .to_string();
    assert!(msg.contains("a TOML file is a training config"), "{msg}");
}
