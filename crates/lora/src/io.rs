//! PEFT adapter files: `adapter_config.json` + `adapter_model.safetensors`.
//!
//! Layout as PEFT 0.21 writes it (`peft/utils/save_and_load.py`): keys
//! `base_model.model.<module path>.lora_A.weight` (r, in) and `.lora_B.weight` (out, r), fp32,
//! safetensors metadata `{"format": "pt"}`. Loading is strict where PEFT only warns: every key must
//! name a projection of the model that the config targets, every targeted projection must have
//! both tensors, and shapes must agree with the model and with the config's `r` / `rank_pattern`.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor, Var};

use crate::config::LoraConfig;
use crate::error::{io_err, CandleContext, LoraError, Result};
use crate::linear::{Adapter, LoraLinear};
use crate::target::Targeting;

/// PEFT's `CONFIG_NAME`.
pub const CONFIG_NAME: &str = "adapter_config.json";
/// PEFT's `SAFETENSORS_WEIGHTS_NAME`.
pub const WEIGHTS_NAME: &str = "adapter_model.safetensors";
/// Prefix PEFT puts before module paths (`PeftModel.base_model.model`).
pub const KEY_PREFIX: &str = "base_model.model.";

/// The PEFT key of `lora_A` / `lora_B` (`which` = "lora_A" | "lora_B") of module `path`.
pub fn peft_key(path: &str, which: &str) -> String {
    format!("{KEY_PREFIX}{path}.{which}.weight")
}

/// An adapter read from disk, not yet bound to a model: config plus `path → (A, B)` on the CPU in
/// fp32, with key names validated.
#[derive(Debug, Clone)]
pub struct AdapterWeights {
    /// The parsed `adapter_config.json`.
    pub config: LoraConfig,
    /// `module path → (lora_A (r, in), lora_B (out, r))`, fp32, CPU.
    pub modules: BTreeMap<String, (Tensor, Tensor)>,
    /// The safetensors file the tensors came from (for error messages).
    pub file: PathBuf,
}

/// Reads `dir/adapter_config.json` and `dir/adapter_model.safetensors`. Errors on keys that are not
/// `base_model.model.<path>.lora_{A,B}.weight` (embedding LoRA, DoRA magnitudes, biases,
/// `modules_to_save` weights), on a module with only one of A/B, on A/B ranks that disagree and
/// on NaN or infinite values.
pub fn read_adapter(dir: &Path) -> Result<AdapterWeights> {
    let config = LoraConfig::from_dir(dir)?;
    let file = dir.join(WEIGHTS_NAME);
    if !file.exists() {
        let hint = if dir.join("adapter_model.bin").exists() {
            "; only adapter_model.bin (pickle) is present: re-save it with safe_serialization=True"
        } else {
            ""
        };
        return Err(LoraError::Safetensors {
            path: file,
            msg: format!("file not found{hint}"),
        });
    }
    let tensors = candle_core::safetensors::load(&file, &Device::Cpu).map_err(|e| {
        LoraError::Safetensors {
            path: file.clone(),
            msg: e.to_string(),
        }
    })?;
    let mut halves: BTreeMap<String, [Option<Tensor>; 2]> = BTreeMap::new();
    for (key, t) in tensors {
        let (path, slot) = parse_key(&key).ok_or_else(|| LoraError::Key {
            path: file.clone(),
            key: key.clone(),
            msg: "not a LoRA linear tensor (expected base_model.model.<module>.lora_A.weight or \
                  .lora_B.weight; embedding LoRA, DoRA, lora biases and modules_to_save are not \
                  supported)"
                .into(),
        })?;
        let t = t
            .to_dtype(DType::F32)
            .ctx(|| format!("{}: {key}: cast to f32", file.display()))?;
        check_finite(&file, &key, &t)?;
        halves.entry(path.to_string()).or_default()[slot] = Some(t);
    }
    let mut modules = BTreeMap::new();
    for (path, [a, b]) in halves {
        let missing = |which: &str| LoraError::MissingKey {
            path: file.clone(),
            key: peft_key(&path, which),
            why: "every adapted module needs both lora_A and lora_B".into(),
        };
        let a = a.ok_or_else(|| missing("lora_A"))?;
        let b = b.ok_or_else(|| missing("lora_B"))?;
        check_rank(&file, &path, &a, &b)?;
        modules.insert(path, (a, b));
    }
    Ok(AdapterWeights {
        config,
        modules,
        file,
    })
}

/// Every value of `t` (f32, CPU) must be finite.
fn check_finite(file: &Path, key: &str, t: &Tensor) -> Result<()> {
    let values = t
        .flatten_all()
        .and_then(|v| v.to_vec1::<f32>())
        .ctx(|| format!("{}: {key}: read values", file.display()))?;
    let mut bad = values.iter().enumerate().filter(|(_, v)| !v.is_finite());
    let Some((first, _)) = bad.next() else {
        return Ok(());
    };
    Err(LoraError::NonFinite {
        path: file.to_path_buf(),
        key: key.to_string(),
        count: 1 + bad.count(),
        total: values.len(),
        first,
    })
}

/// `base_model.model.<path>.lora_A.weight` → (`<path>`, 0); `lora_B` → 1.
fn parse_key(key: &str) -> Option<(&str, usize)> {
    let rest = key.strip_prefix(KEY_PREFIX)?;
    if let Some(p) = rest.strip_suffix(".lora_A.weight") {
        Some((p, 0))
    } else {
        rest.strip_suffix(".lora_B.weight").map(|p| (p, 1))
    }
}

/// A (r, in) and B (out, r) must be 2-D and share r.
fn check_rank(file: &Path, path: &str, a: &Tensor, b: &Tensor) -> Result<()> {
    let (ad, bd) = (a.dims(), b.dims());
    if ad.len() != 2 || bd.len() != 2 || ad[0] != bd[1] {
        return Err(LoraError::Shape {
            path: file.to_path_buf(),
            key: peft_key(path, "lora_B"),
            expected: vec![
                bd.first().copied().unwrap_or(0),
                ad.first().copied().unwrap_or(0),
            ],
            got: bd.to_vec(),
            hint: format!(
                "; lora_A has shape {ad:?}, so lora_B must be (out, {})",
                ad.first().unwrap_or(&0)
            ),
        });
    }
    Ok(())
}

/// Loads a PEFT adapter directory into the model's projections (model order) and returns its
/// config. Projections the config does not target lose any adapter they had. Adapters are used in
/// evaluation with [`crate::LoraContext::EVAL`], or trained further.
///
/// Errors (naming file, key, expected and actual shape) when a key names a module the model does
/// not have or the config does not target, when a targeted module has no tensors, or when a shape
/// disagrees with the module's `(out, in)` or the config's `r` / `rank_pattern`.
pub fn load_adapter<'a>(
    dir: &Path,
    projections: impl IntoIterator<Item = &'a mut LoraLinear>,
) -> Result<LoraConfig> {
    let AdapterWeights {
        config,
        mut modules,
        file,
    } = read_adapter(dir)?;
    let targeting = Targeting::new(&config)?;
    let mut projections: Vec<&mut LoraLinear> = projections.into_iter().collect();
    let chosen = targeting.select(projections.iter().map(|p| p.path()))?;
    for (proj, chosen) in projections.iter_mut().zip(chosen) {
        let path = proj.path().to_string();
        let Some((a, b)) = modules.remove(&path) else {
            if chosen {
                return Err(LoraError::MissingKey {
                    path: file,
                    key: peft_key(&path, "lora_A"),
                    why: format!("adapter_config.json targets {path}"),
                });
            }
            proj.set_adapter(None);
            continue;
        };
        if !chosen {
            return Err(LoraError::Key {
                path: file,
                key: peft_key(&path, "lora_A"),
                msg: format!(
                    "module {path} is not selected by target_modules {}",
                    config.target_modules
                ),
            });
        }
        let r = targeting.rank(&path);
        let hint = format!(
            "; module {path} is ({}, {}) and adapter_config.json says r = {r}",
            proj.out_features(),
            proj.in_features()
        );
        expect_shape(
            &file,
            &peft_key(&path, "lora_A"),
            &a,
            &[r, proj.in_features()],
            &hint,
        )?;
        expect_shape(
            &file,
            &peft_key(&path, "lora_B"),
            &b,
            &[proj.out_features(), r],
            &hint,
        )?;
        let device = proj.weight().device().clone();
        let to_var = |t: Tensor, which: &str| {
            t.to_device(&device)
                .and_then(|t| Var::from_tensor(&t))
                .ctx(|| format!("{}: {}", file.display(), peft_key(&path, which)))
        };
        proj.set_adapter(Some(Adapter {
            a: to_var(a, "lora_A")?,
            b: to_var(b, "lora_B")?,
            scale: targeting.scale(&path),
            dropout: config.lora_dropout,
        }));
    }
    if let Some(path) = modules.keys().next() {
        let examples: Vec<&str> = projections.iter().take(3).map(|p| p.path()).collect();
        return Err(LoraError::Key {
            path: file,
            key: peft_key(path, "lora_A"),
            msg: format!(
                "the model has no module {path} (its paths look like {}); was the adapter trained \
                 on a different model class (`model.language_model.layers` vs `model.layers`)?",
                examples.join(", ")
            ),
        });
    }
    Ok(config)
}

fn expect_shape(file: &Path, key: &str, t: &Tensor, expected: &[usize], hint: &str) -> Result<()> {
    if t.dims() == expected {
        return Ok(());
    }
    Err(LoraError::Shape {
        path: file.to_path_buf(),
        key: key.to_string(),
        expected: expected.to_vec(),
        got: t.dims().to_vec(),
        hint: hint.to_string(),
    })
}

/// Writes `dir/adapter_config.json` and `dir/adapter_model.safetensors` (fp32, metadata
/// `format: pt`) for the adapters of `projections`, creating `dir`.
///
/// Errors when `config` does not describe the adapters (a targeted module without adapter, an
/// adapter on an untargeted module, or a rank other than the config's), since PEFT could not load
/// the result.
pub fn save_adapter<'a>(
    dir: &Path,
    config: &LoraConfig,
    projections: impl IntoIterator<Item = &'a LoraLinear>,
) -> Result<()> {
    config.validate("LoraConfig")?;
    let targeting = Targeting::new(config)?;
    let mut tensors: Vec<(String, Tensor)> = Vec::new();
    for proj in projections {
        let path = proj.path();
        let mismatch = |msg: String| LoraError::Config {
            source_name: "save_adapter".into(),
            field: "target_modules".into(),
            msg,
        };
        match (proj.adapter(), targeting.is_target(path)) {
            (None, false) => continue,
            (None, true) => return Err(mismatch(format!("targets {path}, which has no adapter"))),
            (Some(_), false) => {
                return Err(mismatch(format!(
                    "does not target {path}, which has an adapter"
                )))
            }
            (Some(ad), true) => {
                if ad.rank() != targeting.rank(path) {
                    return Err(LoraError::Config {
                        source_name: "save_adapter".into(),
                        field: "r".into(),
                        msg: format!(
                            "{path} has rank {}, config says {}",
                            ad.rank(),
                            targeting.rank(path)
                        ),
                    });
                }
                for (which, var) in [("lora_A", &ad.a), ("lora_B", &ad.b)] {
                    let t = var
                        .as_detached_tensor()
                        .to_dtype(DType::F32)
                        .and_then(|t| t.to_device(&Device::Cpu))
                        .ctx(|| format!("{path}: {which} to CPU f32"))?;
                    tensors.push((peft_key(path, which), t));
                }
            }
        }
    }
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    let cfg_path = dir.join(CONFIG_NAME);
    std::fs::write(&cfg_path, config.to_json_string()).map_err(io_err(&cfg_path))?;
    write_safetensors(&dir.join(WEIGHTS_NAME), tensors)
}

/// Writes `tensors` to the safetensors file `path` with PEFT/transformers' metadata
/// `{"format": "pt"}`: atomically (a temporary file renamed into place), and with the
/// permissions of a file this process creates (`0o666` less the umask, as the JSON files beside
/// it), which the safetensors crate's temporary file (mode `0o600`) would not give: weights
/// other users of a shared machine (a serving process, a teammate) could not read.
pub fn write_safetensors(path: &Path, tensors: Vec<(String, Tensor)>) -> Result<()> {
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize_to_file(tensors, Some(metadata), path).map_err(|e| {
        LoraError::Safetensors {
            path: path.to_path_buf(),
            msg: e.to_string(),
        }
    })?;
    give_created_mode(path)
}

/// Sets `path`'s permission bits to those of a file created beside it now (a probe file,
/// removed at once): the process umask applied to `0o666`.
#[cfg(unix)]
fn give_created_mode(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let name = path
        .file_name()
        .map_or_else(Default::default, |n| n.to_string_lossy());
    let probe = path.with_file_name(format!(".{name}.mode-probe-{}", std::process::id()));
    let created = std::fs::File::create(&probe)
        .and_then(|f| f.metadata())
        .map(|m| m.permissions().mode() & 0o777);
    let _ = std::fs::remove_file(&probe);
    let mode = created.map_err(io_err(&probe))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(io_err(path))
}

/// Permission bits are the file system's default where there is no umask.
#[cfg(not(unix))]
fn give_created_mode(_path: &Path) -> Result<()> {
    Ok(())
}
