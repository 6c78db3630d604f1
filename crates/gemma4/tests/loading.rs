//! Checkpoint loading: text-only prefix, sharded files, and the errors for a missing tensor, a
//! wrong shape and an unreadable file (each must name the tensor / shapes / file).

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use common::{golden, golden_dir, Checks, GoldenBatch};
use g4ft_gemma4::Gemma4Model;
use g4ft_lora::LoraContext;

const CASE: &str = "gemma4-a-unified-keqv";

fn tmp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("g4ft-gemma4-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::copy(golden_dir(CASE).join("config.json"), d.join("config.json")).unwrap();
    d
}

fn tensors() -> HashMap<String, Tensor> {
    candle_core::safetensors::load(golden_dir(CASE).join("model.safetensors"), &Device::Cpu)
        .unwrap()
}

fn logits(dir: &Path) -> Tensor {
    let batch = GoldenBatch::new(&golden(CASE));
    let model = Gemma4Model::load(dir.to_str().unwrap(), DType::F32, &Device::Cpu).unwrap();
    model.forward(&batch.tokens(), &LoraContext::EVAL).unwrap()
}

#[test]
fn text_only_prefix_and_shards_load_the_same_model() {
    let want = logits(&golden_dir(CASE));
    let mut checks = Checks::default();
    // Text-only save: `model.*`, vision tensors dropped.
    let dir = tmp_dir("textonly");
    let renamed: HashMap<String, Tensor> = tensors()
        .into_iter()
        .filter_map(|(k, v)| {
            k.strip_prefix("model.language_model.")
                .map(|r| (format!("model.{r}"), v))
        })
        .collect();
    candle_core::safetensors::save(&renamed, dir.join("model.safetensors")).unwrap();
    checks.close("logits (model.* prefix)", &logits(&dir), &want, 0.0, 0.0);
    let model = Gemma4Model::load(dir.to_str().unwrap(), DType::F32, &Device::Cpu).unwrap();
    assert_eq!(model.prefix(), "model");
    assert!(model
        .projections()
        .next()
        .unwrap()
        .path()
        .starts_with("model.layers.0."));

    // Two shards + index.json.
    let dir = tmp_dir("sharded");
    let all = tensors();
    let (mut a, mut b) = (HashMap::new(), HashMap::new());
    let mut map = serde_json::Map::new();
    for (i, (k, v)) in all.into_iter().enumerate() {
        let (file, part) = if i % 2 == 0 {
            ("model-00001-of-00002.safetensors", &mut a)
        } else {
            ("model-00002-of-00002.safetensors", &mut b)
        };
        map.insert(k.clone(), file.into());
        part.insert(k, v);
    }
    candle_core::safetensors::save(&a, dir.join("model-00001-of-00002.safetensors")).unwrap();
    candle_core::safetensors::save(&b, dir.join("model-00002-of-00002.safetensors")).unwrap();
    let index = serde_json::json!({"metadata": {}, "weight_map": map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    checks.close("logits (sharded)", &logits(&dir), &want, 0.0, 0.0);
    checks.finish();
}

fn load_err(dir: &Path) -> String {
    Gemma4Model::load(dir.to_str().unwrap(), DType::F32, &Device::Cpu)
        .expect_err("loading must fail")
        .to_string()
}

#[test]
fn missing_tensor_wrong_shape_and_bad_file_are_named() {
    let name = "model.language_model.layers.2.self_attn.k_norm.weight";
    // Missing tensor.
    let dir = tmp_dir("missing");
    let mut t = tensors();
    t.remove(name);
    candle_core::safetensors::save(&t, dir.join("model.safetensors")).unwrap();
    let e = load_err(&dir);
    assert!(
        e.contains(name) && e.contains("[16]") && e.contains("model.safetensors"),
        "{e}"
    );

    // Wrong shape.
    let dir = tmp_dir("shape");
    let mut t = tensors();
    t.insert(
        name.into(),
        Tensor::zeros(8, DType::F32, &Device::Cpu).unwrap(),
    );
    candle_core::safetensors::save(&t, dir.join("model.safetensors")).unwrap();
    let e = load_err(&dir);
    assert!(
        e.contains(name) && e.contains("expected [16], got [8]"),
        "{e}"
    );
    assert!(
        e.contains(&dir.join("model.safetensors").display().to_string()),
        "{e}"
    );

    // Unreadable file.
    let dir = tmp_dir("garbage");
    std::fs::write(dir.join("model.safetensors"), b"not a safetensors file").unwrap();
    let e = load_err(&dir);
    assert!(e.contains("model.safetensors"), "{e}");

    // Not a model directory / id.
    let e = Gemma4Model::load("./definitely/not/here", DType::F32, &Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(e.contains("./definitely/not/here"), "{e}");
}

#[test]
fn hub_cache_is_used_offline() {
    // A fake hf-hub cache: $HF_HOME/hub/models--org--tiny/{refs/main, snapshots/<rev>/...}.
    let home = std::env::temp_dir().join(format!("g4ft-gemma4-hfhome-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&home);
    let repo = home.join("hub").join("models--g4ft--tiny-unified");
    let snap = repo.join("snapshots").join("0123456789abcdef");
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs").join("main"), "0123456789abcdef").unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(golden_dir(CASE).join(f), snap.join(f)).unwrap();
    }
    // Only this test touches HF_HOME / HF_HUB_OFFLINE in this test binary.
    std::env::set_var("HF_HOME", &home);
    std::env::set_var("HF_HUB_OFFLINE", "1");
    let model = Gemma4Model::load("g4ft/tiny-unified", DType::F32, &Device::Cpu).unwrap();
    assert_eq!(model.config().num_hidden_layers, 6);
    let e = Gemma4Model::load("g4ft/not-cached", DType::F32, &Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("g4ft/not-cached") && e.contains("HF_HUB_OFFLINE"),
        "{e}"
    );
}
