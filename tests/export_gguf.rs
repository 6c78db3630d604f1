//! `examples/export.rs`: PEFT adapters of the tiny Gemma 4 models as llama.cpp GGUF adapters, read
//! back with candle's GGUF reader: metadata, one `lora_a`/`lora_b` pair per module under
//! llama.cpp's tensor names, shapes, values, and `alpha / r · B` equal to PEFT's `scale · B`
//! (also under rsLoRA + rank_pattern, where the scale ratio is folded into `lora_b`).
//! The files are what `tools/reference/lora/check_gguf.py` reads with the `gguf` package.

#[allow(dead_code)]
#[path = "../examples/export.rs"]
mod export;

use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file;
use candle_core::{DType, Device, Tensor};
use g4ft::gemma4::gguf_names::gguf_tensor_name;
use g4ft::gemma4::Gemma4Model;
use g4ft::lora::{
    attach, read_adapter, save_adapter, InitLoraWeights, LoraConfig, TargetModules, Targeting,
};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const POST_REGEX: &str =
    r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)";

fn case_dir(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("g4ft_gguf/{name}"));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn max_abs(t: &Tensor) -> f32 {
    t.abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

/// Exports `dir/adapter` to `dir/adapter.gguf` and checks it against the adapter; returns the
/// number of folded modules.
fn export_and_check(dir: &Path, dtype: &str, tol: f32) -> usize {
    let args = export::Args {
        adapter: dir.join("adapter"),
        gguf: dir.join("adapter.gguf"),
        dtype: dtype.into(),
    };
    let report = export::run(&args).unwrap();
    let adapter = read_adapter(&args.adapter).unwrap();
    let targeting = Targeting::new(&adapter.config).unwrap();
    let mut f = std::fs::File::open(&args.gguf).unwrap();
    let content = gguf_file::Content::read(&mut f).unwrap();
    let s = |k: &str| content.metadata[k].to_string().unwrap().clone();
    assert_eq!(s("general.architecture"), "gemma4");
    assert_eq!(s("general.type"), "adapter");
    assert_eq!(s("adapter.type"), "lora");
    let alpha = content.metadata["adapter.lora.alpha"].to_f32().unwrap();
    assert_eq!(alpha as f64, adapter.config.lora_alpha);
    assert_eq!(content.tensor_infos.len(), 2 * adapter.modules.len());
    assert_eq!(report.tensors, content.tensor_infos.len());
    for (module, (a, b)) in &adapter.modules {
        let name = gguf_tensor_name(module).unwrap();
        let mut read = |suffix: &str| {
            content
                .tensor(&mut f, &format!("{name}.{suffix}"), &Device::Cpu)
                .unwrap_or_else(|e| panic!("{name}.{suffix}: {e}"))
                .dequantize(&Device::Cpu)
                .unwrap()
        };
        let ga = read("lora_a");
        let gb = read("lora_b");
        assert_eq!(ga.dims(), a.dims(), "{module}: lora_a is A (r, in)");
        assert_eq!(gb.dims(), b.dims(), "{module}: lora_b is B (out, r)");
        let r = a.dims()[0] as f64;
        let llama = (gb * (alpha as f64 / r)).unwrap();
        let peft = (b * targeting.scale(module)).unwrap();
        let da = max_abs(&(ga - a).unwrap()) / max_abs(a);
        let db = max_abs(&(llama - &peft).unwrap()) / max_abs(&peft);
        assert!(
            da <= tol && db <= tol,
            "{module}: A rel {da:.2e}, scaled B rel {db:.2e}"
        );
    }
    report.folded
}

#[test]
fn the_output_is_never_the_adapter_itself_and_its_folder_is_made() {
    let dir = case_dir("outputs");
    let src =
        PathBuf::from(ROOT).join("tools/reference/lora/fixtures/gemma4-a-unified-keqv/adapter");
    let weights = src.join("adapter_model.safetensors");
    let before = std::fs::read(&weights).unwrap();
    let export = |gguf: PathBuf| {
        let args = export::Args {
            adapter: src.clone(),
            gguf,
            dtype: "f32".into(),
        };
        export::run(&args).map_err(|e| format!("{e:#}"))
    };
    let err = export(weights.clone()).unwrap_err();
    assert!(
        err.contains("is the adapter's own adapter_model.safetensors"),
        "{err}"
    );
    assert_eq!(
        std::fs::read(&weights).unwrap(),
        before,
        "the adapter is untouched"
    );
    let err = export(dir.clone()).unwrap_err();
    assert!(
        err.contains("is a directory; give the file to write"),
        "{err}"
    );
    let nested = dir.join("new/folder/adapter.gguf");
    export(nested.clone()).unwrap();
    assert!(nested.is_file());
}

#[test]
fn peft_adapters_export_with_llama_cpp_names_shapes_and_values() {
    for v in ["a-unified-keqv", "b-ple-kvshare", "c-moe", "d-dense-keqv"] {
        let dir = case_dir(&format!("{v}-peft"));
        let src =
            PathBuf::from(ROOT).join(format!("tools/reference/lora/fixtures/gemma4-{v}/adapter"));
        std::fs::create_dir_all(dir.join("adapter")).unwrap();
        for f in ["adapter_config.json", "adapter_model.safetensors"] {
            std::fs::copy(src.join(f), dir.join("adapter").join(f)).unwrap();
        }
        assert_eq!(
            export_and_check(&dir, "f32", 0.0),
            0,
            "{v}: alpha / r needs no fold"
        );
    }
}

#[test]
fn rslora_and_rank_patterns_fold_into_lora_b() {
    let v = "b-ple-kvshare";
    let base = PathBuf::from(ROOT).join(format!("tests/golden/gemma4-{v}"));
    let mut m = Gemma4Model::load(base.to_str().unwrap(), DType::F32, &Device::Cpu).unwrap();
    let mut cfg = LoraConfig::new(4, 8.0, TargetModules::Regex(POST_REGEX.into()));
    cfg.use_rslora = true;
    cfg.rank_pattern.insert("down_proj".into(), 2);
    cfg.init_lora_weights = InitLoraWeights::Random;
    cfg.base_model_name_or_path = Some(format!("tests/golden/gemma4-{v}"));
    attach(&cfg, m.projections_mut(), 23).unwrap();
    for (name, dtype, tol) in [("rslora-f32", "f32", 1e-6), ("rslora-bf16", "bf16", 8e-3)] {
        let dir = case_dir(&format!("{v}-{name}"));
        save_adapter(&dir.join("adapter"), &cfg, m.projections()).unwrap();
        let folded = export_and_check(&dir, dtype, tol);
        let modules = m.projections().filter(|p| p.adapter().is_some()).count();
        assert_eq!(
            folded, modules,
            "rsLoRA: every scale differs from alpha / r"
        );
    }
    let bad = export::run(&export::Args {
        adapter: PathBuf::from("/nonexistent/adapter"),
        gguf: std::env::temp_dir().join("x.gguf"),
        dtype: "f32".into(),
    })
    .unwrap_err();
    assert!(
        format!("{bad:#}").contains("/nonexistent/adapter"),
        "{bad:#}"
    );
}
