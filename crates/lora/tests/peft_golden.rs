//! Golden tests against PEFT 0.21 on the toy model (`tools/reference/lora/make_fixtures.py`):
//! PEFT-saved adapters load and give PEFT's outputs, loss and lora_A/lora_B gradients; targeting
//! and the trainable-parameter line match PEFT; merging matches `merge_and_unload`; saving
//! reproduces PEFT's files.
//!
//! Tolerance: rel 1e-4 of max|want| in f32 (the bar); the toy's values are O(1) and the
//! measured errors are ~1e-7, so a real semantic error (scale, transpose, missing term) fails.

mod common;

use candle_core::{Device, Tensor};
use common::{fixtures, load, Checks, Toy, TRAIN};
use g4ft_lora::{
    load_adapter, lora_parameters, merge_adapter_dir, peft_key, save_adapter, LoraConfig,
    LoraContext, MergeOptions, ParamReport, ProjectionShape, Targeting, KEY_PREFIX,
};

const CASES: [&str; 2] = ["list", "regex_rslora"];
const RTOL: f64 = 1e-4;

fn toy_with_peft_adapter(case: &str) -> (Toy, LoraConfig) {
    let mut toy = Toy::load_base();
    let cfg = load_adapter(
        &fixtures().join(case).join("adapter"),
        toy.projections.iter_mut(),
    )
    .unwrap_or_else(|e| panic!("{case}: {e}"));
    (toy, cfg)
}

#[test]
fn peft_adapter_forward_loss_and_grads_match() {
    let mut checks = Checks::default();
    for case in CASES {
        let (toy, _) = toy_with_peft_adapter(case);
        let golden = load(&fixtures().join(case).join("golden.safetensors"));
        let y = toy.forward(&golden["x"], &TRAIN).unwrap();
        checks.close(&format!("{case}/y"), &y, &golden["y"], RTOL);
        let loss = Toy::loss(&y).unwrap();
        checks.close(
            &format!("{case}/loss"),
            &loss.reshape(1).unwrap(),
            &golden["loss"],
            RTOL,
        );
        let grads = loss.backward().unwrap();
        let params = lora_parameters(toy.projections.iter());
        let n_golden = golden.keys().filter(|k| k.starts_with("grad.")).count();
        assert_eq!(
            params.len(),
            n_golden,
            "{case}: one gradient per PEFT trainable tensor"
        );
        for p in params {
            let key = format!("grad.{KEY_PREFIX}{}", p.name);
            let want = golden
                .get(&key)
                .unwrap_or_else(|| panic!("{case}: no {key} in fixture"));
            let got = grads
                .get(p.var.as_tensor())
                .unwrap_or_else(|| panic!("{case}: no grad for {}", p.name));
            checks.close(&format!("{case}/{key}"), got, want, RTOL);
        }
    }
    checks.finish();
}

#[test]
fn targeting_and_parameter_report_match_peft() {
    for case in CASES {
        let (toy, cfg) = toy_with_peft_adapter(case);
        let targets: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(fixtures().join(case).join("targets.json")).unwrap(),
        )
        .unwrap();
        let want: Vec<&str> = targets["targeted_module_names"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        let t = Targeting::new(&cfg).unwrap();
        let chosen = t.select(toy.projections.iter().map(|p| p.path())).unwrap();
        let mut got: Vec<&str> = toy
            .projections
            .iter()
            .zip(chosen)
            .filter(|(_, c)| *c)
            .map(|(p, _)| p.path())
            .collect();
        got.sort();
        assert_eq!(got, want, "{case}: targeted modules");
        let shapes: Vec<ProjectionShape> =
            toy.projections.iter().map(ProjectionShape::from).collect();
        let report = ParamReport::new(&cfg, &shapes, toy.base_params()).unwrap();
        assert_eq!(
            report.to_string(),
            targets["print_trainable_parameters"].as_str().unwrap(),
            "{case}"
        );
    }
}

#[test]
fn merge_matches_peft_merge_and_unload() {
    let mut checks = Checks::default();
    for case in CASES {
        let golden = load(&fixtures().join(case).join("golden.safetensors"));
        let base = load(&fixtures().join("base/model.safetensors"));
        for max_shard_bytes in [u64::MAX, 600] {
            let out = tempdir(&format!("merge_{case}_{max_shard_bytes}"));
            let report = merge_adapter_dir(
                &fixtures().join("base"),
                &fixtures().join(case).join("adapter"),
                &out,
                MergeOptions {
                    max_shard_bytes,
                    ..Default::default()
                },
            )
            .unwrap();
            let n_merged = golden.keys().filter(|k| k.starts_with("merged.")).count();
            assert_eq!(report.merged, n_merged, "{case}");
            assert!(out.join("config.json").exists(), "config.json copied");
            let merged = if report.shards.len() == 1 {
                load(&out.join("model.safetensors"))
            } else {
                let index: serde_json::Value = serde_json::from_str(
                    &std::fs::read_to_string(out.join("model.safetensors.index.json")).unwrap(),
                )
                .unwrap();
                assert_eq!(index["weight_map"].as_object().unwrap().len(), base.len());
                report.shards.iter().flat_map(|s| load(s)).collect()
            };
            assert_eq!(
                merged.len(),
                base.len(),
                "{case}: every base tensor written"
            );
            for (name, w) in &base {
                let got = &merged[name];
                match golden.get(&format!("merged.{name}")) {
                    Some(want) => {
                        assert_ne!(
                            got.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                            w.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                            "{case}: {name} must change"
                        );
                        checks.close(&format!("{case}/merged.{name}"), got, want, RTOL)
                    }
                    None => assert_eq!(
                        got.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                        w.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                        "{case}: {name} must be copied unchanged"
                    ),
                }
            }
        }
    }
    checks.finish();
}

#[test]
fn saving_reproduces_peft_files() {
    for case in CASES {
        let (toy, cfg) = toy_with_peft_adapter(case);
        let out = tempdir(&format!("resave_{case}"));
        save_adapter(&out, &cfg, toy.projections.iter()).unwrap();
        let peft = load(
            &fixtures()
                .join(case)
                .join("adapter/adapter_model.safetensors"),
        );
        let ours = load(&out.join("adapter_model.safetensors"));
        let mut keys: Vec<&String> = ours.keys().collect();
        keys.sort();
        let mut want: Vec<&String> = peft.keys().collect();
        want.sort();
        assert_eq!(keys, want, "{case}: same tensor keys as PEFT");
        for (k, t) in &peft {
            assert_eq!(ours[k].dtype(), candle_core::DType::F32);
            assert_eq!(
                ours[k].flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                t.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                "{case}: {k}"
            );
        }
        let metadata = safetensors_metadata(&out.join("adapter_model.safetensors"));
        assert_eq!(metadata, serde_json::json!({"format": "pt"}));
        // Reload what we wrote: same config, same outputs bit for bit.
        assert_eq!(LoraConfig::from_dir(&out).unwrap(), cfg);
        let mut again = Toy::load_base();
        load_adapter(&out, again.projections.iter_mut()).unwrap();
        let x = &load(&fixtures().join(case).join("golden.safetensors"))["x"];
        let y1 = toy
            .forward(x, &LoraContext::EVAL)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let y2 = again
            .forward(x, &LoraContext::EVAL)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        assert_eq!(y1, y2, "{case}");
        assert!(peft_key("a.b", "lora_A").starts_with(KEY_PREFIX));
    }
}

#[test]
fn load_errors_name_file_key_and_shapes() {
    let dir = tempdir("bad_rank");
    let src = fixtures().join("list/adapter");
    // r = 4 in the files; claim r = 2.
    let text = std::fs::read_to_string(src.join("adapter_config.json"))
        .unwrap()
        .replace("\"r\": 4", "\"r\": 2");
    std::fs::write(dir.join("adapter_config.json"), text).unwrap();
    std::fs::copy(
        src.join("adapter_model.safetensors"),
        dir.join("adapter_model.safetensors"),
    )
    .unwrap();
    let mut toy = Toy::load_base();
    let err = load_adapter(&dir, toy.projections.iter_mut())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("adapter_model.safetensors")
            && err.contains("lora_A.weight")
            && err.contains("expected shape [2, "),
        "{err}"
    );
    // A model whose paths do not match the adapter's keys.
    let mut renamed: Vec<g4ft_lora::LoraLinear> = Toy::load_base()
        .projections
        .iter()
        .map(|p| {
            g4ft_lora::LoraLinear::new(
                p.path()
                    .replace("model.layers", "model.language_model.layers"),
                p.weight().clone(),
            )
        })
        .collect();
    let err = load_adapter(&src, renamed.iter_mut())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("missing tensor") || err.contains("has no module"),
        "{err}"
    );
}

#[test]
fn an_adapter_with_a_nan_is_refused_naming_the_tensor() {
    let dir = tempdir("nan");
    let src = fixtures().join("list/adapter");
    std::fs::copy(
        src.join("adapter_config.json"),
        dir.join("adapter_config.json"),
    )
    .unwrap();
    let file = src.join("adapter_model.safetensors");
    let mut tensors = load(&file);
    let key = tensors
        .keys()
        .find(|k| k.ends_with("lora_B.weight"))
        .unwrap()
        .clone();
    let b = &tensors[&key];
    let (total, dims) = (b.elem_count(), b.dims().to_vec());
    let mut values = b.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    values[3] = f32::NAN;
    values[total - 1] = f32::INFINITY;
    tensors.insert(
        key.clone(),
        Tensor::from_vec(values, dims, &Device::Cpu).unwrap(),
    );
    g4ft_lora::write_safetensors(
        &dir.join("adapter_model.safetensors"),
        tensors.into_iter().collect(),
    )
    .unwrap();
    let err = g4ft_lora::read_adapter(&dir).unwrap_err().to_string();
    assert!(
        err.contains("adapter_model.safetensors")
            && err.contains(&format!(
                "{key}: 2 of {total} values are not finite (NaN or ±inf; the first at flat index 3)"
            )),
        "{err}"
    );
}

fn tempdir(name: &str) -> std::path::PathBuf {
    let d = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("g4ft_lora")
        .join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn safetensors_metadata(path: &std::path::Path) -> serde_json::Value {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    header["__metadata__"].clone()
}
