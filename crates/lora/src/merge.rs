//! Merging adapters into a full Hugging Face checkpoint: `W' = W + scale·B·A`.
//!
//! Model-agnostic: the base checkpoint is read tensor by tensor (memory-mapped, one output shard in
//! memory at a time), the tensor `<module path>.weight` of every adapted module is replaced, and
//! everything else is copied bit for bit. Output is HF layout: `model.safetensors`, or
//! `model-0000i-of-0000n.safetensors` + `model.safetensors.index.json` when larger than
//! [`MergeOptions::max_shard_bytes`], plus every other regular file of the base directory
//! (`config.json`, tokenizer, chat template, ...).
//!
//! Arithmetic as PEFT's `merge_and_unload` (`peft/tuners/lora/layer.py`): the delta
//! `(B @ A)·scale` in fp32, cast to the weight's dtype, then added in that dtype.
//!
//! The output directory appears whole or not at all: the files are written into a staging
//! directory beside it (`.<name>.partial-<pid>`), removed if the merge fails, and renamed to the
//! output directory at the end. The output directory must not exist or be empty.
//!
//! The merged checkpoint lists the adapters merged into it ([`MERGED_ADAPTERS_NAME`], by
//! [`adapter_fingerprint`]), and [`check_not_merged`] refuses to apply one of them to it again
//! (`generate --model MERGED --adapter SAME`), which would add its delta twice.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};
use serde_json::{json, Value};

use crate::error::{io_err, CandleContext, LoraError, Result};
use crate::io::{read_adapter, write_safetensors, AdapterWeights};
use crate::linear::LoraLinear;
use crate::target::Targeting;
use g4ft_hash::Fnv1a64;

/// The file of a merged checkpoint that lists the fingerprints of the adapters merged into it
/// (the base's own list, if the base was merged too, then this merge's): `{"fingerprints": [..]}`.
pub const MERGED_ADAPTERS_NAME: &str = "merged_adapters.json";

/// transformers' single-file and index names.
const SINGLE_NAME: &str = "model.safetensors";
const INDEX_NAME: &str = "model.safetensors.index.json";

/// One adapter to fold into `<path>.weight`.
#[derive(Debug, Clone)]
pub struct MergeDelta {
    /// Module path; the base tensor is `<path>.weight`, shape (out, in).
    pub path: String,
    /// `lora_A` (r, in).
    pub a: Tensor,
    /// `lora_B` (out, r).
    pub b: Tensor,
    /// `alpha / r` or `alpha / √r`.
    pub scale: f64,
}

/// How the merged checkpoint is written.
#[derive(Debug, Clone, Copy)]
pub struct MergeOptions {
    /// Largest shard in bytes before a new one is started (a larger single tensor gets its own
    /// shard). Default 5 GB (`5_000_000_000`), the size most Hub checkpoints use.
    pub max_shard_bytes: u64,
    /// Floating-point dtype of the output (`F32`, `BF16` or `F16`); `None` keeps each tensor's.
    /// Weights are cast before the delta is added, as `from_pretrained(dtype=...)` followed by
    /// `merge_and_unload` does, and `dtype` / `torch_dtype` in `config.json` are set to match.
    pub dtype: Option<DType>,
    /// Called after each weight file is written (e.g. to print progress: a large model's merge
    /// takes minutes).
    pub on_shard: Option<fn(&ShardWritten)>,
}

impl Default for MergeOptions {
    fn default() -> Self {
        Self {
            max_shard_bytes: 5_000_000_000,
            dtype: None,
            on_shard: None,
        }
    }
}

/// Where a merge stands after writing a weight file ([`MergeOptions::on_shard`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardWritten {
    /// 1-based number of the file just written.
    pub shard: usize,
    /// Number of weight files.
    pub shards: usize,
    /// Tensor bytes written so far.
    pub bytes: u64,
    /// Tensor bytes of the whole checkpoint.
    pub total_bytes: u64,
}

/// What a merge wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MergeReport {
    /// Weight files written, in order.
    pub shards: Vec<PathBuf>,
    /// Number of weights that were changed.
    pub merged: usize,
    /// Total tensor bytes written.
    pub total_bytes: u64,
}

/// Merges the PEFT adapter in `adapter_dir` into the checkpoint in `base_dir`, writing `out_dir`.
/// Needs no model code: module paths come from the adapter keys.
pub fn merge_adapter_dir(
    base_dir: &Path,
    adapter_dir: &Path,
    out_dir: &Path,
    opts: MergeOptions,
) -> Result<MergeReport> {
    let adapter = read_adapter(adapter_dir)?;
    let made_for = adapter.config.base_model_name_or_path.clone();
    let deltas = deltas_of(adapter)?;
    refuse_listed(
        &merged_fingerprints(base_dir)?,
        base_dir,
        adapter_dir,
        &deltas,
    )?;
    merge_deltas(base_dir, out_dir, &deltas, opts).map_err(|e| match e {
        LoraError::MissingKey { path, key, why } => LoraError::MissingKey {
            path,
            key,
            why: match &made_for {
                Some(base) => format!("{why}; the adapter was made for {base}"),
                None => why,
            },
        },
        e => e,
    })
}

/// The deltas of a PEFT adapter read from its files.
fn deltas_of(adapter: AdapterWeights) -> Result<Vec<MergeDelta>> {
    let targeting = Targeting::new(&adapter.config)?;
    Ok(adapter
        .modules
        .into_iter()
        .map(|(path, (a, b))| MergeDelta {
            scale: targeting.scale(&path),
            path,
            a,
            b,
        })
        .collect())
}

/// An adapter's identity, whatever its files or device: FNV-1a 64 over each module's path, its
/// scale and the f32 values of its A and B, in path order, as 16 hex digits.
pub fn adapter_fingerprint(deltas: &[MergeDelta]) -> Result<String> {
    let mut sorted: Vec<&MergeDelta> = deltas.iter().collect();
    sorted.sort_by(|x, y| x.path.cmp(&y.path));
    let mut h = Fnv1a64::default();
    for d in sorted {
        h.field(d.path.as_bytes());
        h.update(&d.scale.to_le_bytes());
        for t in [&d.a, &d.b] {
            let values: Vec<f32> = t
                .to_dtype(DType::F32)
                .and_then(|t| t.flatten_all())
                .and_then(|t| t.to_vec1())
                .ctx(|| format!("{}: adapter values", d.path))?;
            for v in values {
                h.update(&v.to_le_bytes());
            }
        }
    }
    Ok(format!("{:016x}", h.finish()))
}

/// The fingerprints listed in `model_dir`'s [`MERGED_ADAPTERS_NAME`] (none without the file).
fn merged_fingerprints(model_dir: &Path) -> Result<Vec<String>> {
    let path = model_dir.join(MERGED_ADAPTERS_NAME);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err(&path)(e)),
    };
    let bad = |msg: String| LoraError::Json {
        path: path.clone(),
        msg,
    };
    let value: Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    serde_json::from_value(value["fingerprints"].clone())
        .map_err(|e| bad(format!("`fingerprints`: {e}")))
}

/// Errors when the adapter in `adapter_dir` is one of those merged into the checkpoint in
/// `model_dir`: applying it to that checkpoint would add its delta a second time.
pub fn check_not_merged(model_dir: &Path, adapter_dir: &Path) -> Result<()> {
    let merged = merged_fingerprints(model_dir)?;
    if merged.is_empty() {
        return Ok(()); // nothing merged: no need to read the adapter
    }
    let deltas = deltas_of(read_adapter(adapter_dir)?)?;
    refuse_listed(&merged, model_dir, adapter_dir, &deltas)
}

/// [`LoraError::AlreadyMerged`] when `deltas` (the adapter in `adapter_dir`) are among the
/// fingerprints `merged` of the checkpoint in `model_dir`.
fn refuse_listed(
    merged: &[String],
    model_dir: &Path,
    adapter_dir: &Path,
    deltas: &[MergeDelta],
) -> Result<()> {
    if !merged.is_empty() && merged.contains(&adapter_fingerprint(deltas)?) {
        return Err(LoraError::AlreadyMerged {
            model: model_dir.to_path_buf(),
            adapter: adapter_dir.to_path_buf(),
        });
    }
    Ok(())
}

/// Merges the adapters currently attached to `projections` (e.g. after training).
pub fn merge_projections<'a>(
    base_dir: &Path,
    out_dir: &Path,
    projections: impl IntoIterator<Item = &'a LoraLinear>,
    opts: MergeOptions,
) -> Result<MergeReport> {
    let deltas: Vec<MergeDelta> = projections
        .into_iter()
        .filter_map(|p| {
            p.adapter().map(|ad| MergeDelta {
                path: p.path().to_string(),
                a: ad.a.as_detached_tensor(),
                b: ad.b.as_detached_tensor(),
                scale: ad.scale,
            })
        })
        .collect();
    merge_deltas(base_dir, out_dir, &deltas, opts)
}

/// Writes `base + deltas` to `out_dir` (see the module doc). Errors when `out_dir` exists and is
/// not an empty directory, when a delta's `<path>.weight` is not in the base checkpoint or has a
/// shape other than `(out, in)` of its adapter, and on I/O errors (naming the file); a failed
/// merge leaves `out_dir` as it was.
pub fn merge_deltas(
    base_dir: &Path,
    out_dir: &Path,
    deltas: &[MergeDelta],
    opts: MergeOptions,
) -> Result<MergeReport> {
    if let Some(dt) = opts.dtype {
        torch_dtype_name(dt).ok_or_else(|| LoraError::Safetensors {
            path: out_dir.to_path_buf(),
            msg: format!("merge dtype must be f32, bf16 or f16, got {dt:?}"),
        })?;
    }
    let out_exists = out_dir.exists();
    if out_exists && !is_empty_dir(out_dir)? {
        return Err(LoraError::OutputExists {
            path: out_dir.to_path_buf(),
        });
    }
    let staging = staging_dir(out_dir)?;
    let written = write_merged(base_dir, &staging, deltas, opts).and_then(|report| {
        if out_exists {
            std::fs::remove_dir(out_dir).map_err(io_err(out_dir))?;
        }
        std::fs::rename(&staging, out_dir).map_err(io_err(out_dir))?;
        Ok(report)
    });
    match written {
        Ok(mut report) => {
            for shard in &mut report.shards {
                *shard = out_dir.join(shard.file_name().expect("a shard is a file"));
            }
            Ok(report)
        }
        Err(e) => {
            // Best effort: the error that stopped the merge is the one to report.
            let _ = std::fs::remove_dir_all(&staging);
            Err(e)
        }
    }
}

/// Whether `dir` is a directory with no entries.
fn is_empty_dir(dir: &Path) -> Result<bool> {
    if !dir.is_dir() {
        return Ok(false);
    }
    Ok(std::fs::read_dir(dir)
        .map_err(io_err(dir))?
        .next()
        .is_none())
}

/// A fresh `.<name>.partial-<pid>` beside `out_dir` (one left by a crashed merge of the same
/// process id is removed first).
fn staging_dir(out_dir: &Path) -> Result<PathBuf> {
    let name = out_dir
        .file_name()
        .ok_or_else(|| LoraError::Io {
            path: out_dir.to_path_buf(),
            source: std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "the output directory needs a name",
            ),
        })?
        .to_string_lossy();
    let staging = out_dir.with_file_name(format!(".{name}.partial-{}", std::process::id()));
    if staging.exists() {
        std::fs::remove_dir_all(&staging).map_err(io_err(&staging))?;
    }
    std::fs::create_dir_all(&staging).map_err(io_err(&staging))?;
    Ok(staging)
}

/// Writes the merged checkpoint into `dir` (an empty directory).
fn write_merged(
    base_dir: &Path,
    dir: &Path,
    deltas: &[MergeDelta],
    opts: MergeOptions,
) -> Result<MergeReport> {
    let inputs = input_shards(base_dir)?;
    // SAFETY: the base checkpoint files must not be modified while the merge runs (the mmaps
    // would change under us); they are only read.
    let base =
        unsafe { MmapedSafetensors::multi(&inputs) }.map_err(|e| LoraError::Safetensors {
            path: base_dir.to_path_buf(),
            msg: e.to_string(),
        })?;
    let out_bytes = |view: &safetensors::tensor::TensorView| -> u64 {
        let n = view.data().len() as u64;
        match (opts.dtype, DType::try_from(view.dtype())) {
            (Some(dt), Ok(src)) if src.is_float() => {
                n / src.size_in_bytes() as u64 * dt.size_in_bytes() as u64
            }
            _ => n,
        }
    };
    let mut sizes: Vec<(String, u64)> = base
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            let n = out_bytes(&view);
            (name, n)
        })
        .collect();
    sizes.sort();
    let by_key: BTreeMap<String, &MergeDelta> = deltas
        .iter()
        .map(|d| (format!("{}.weight", d.path), d))
        .collect();
    if let Some(key) = by_key
        .keys()
        .find(|k| sizes.binary_search_by(|(n, _)| n.as_str().cmp(k)).is_err())
    {
        return Err(LoraError::MissingKey {
            path: base_dir.to_path_buf(),
            key: key.clone(),
            why: "the adapter changes this module but the base checkpoint has no such weight"
                .into(),
        });
    }
    let plan = plan_shards(&sizes, opts.max_shard_bytes);
    let n = plan.len();
    let mut report = MergeReport {
        shards: Vec::new(),
        merged: 0,
        total_bytes: sizes.iter().map(|(_, s)| s).sum(),
    };
    let mut weight_map = BTreeMap::new();
    let mut written = 0;
    for (i, names) in plan.iter().enumerate() {
        let file = if n == 1 {
            SINGLE_NAME.to_string()
        } else {
            format!("model-{:05}-of-{n:05}.safetensors", i + 1)
        };
        let mut tensors = Vec::with_capacity(names.len());
        let mut shard_bytes = 0;
        for name in names {
            let w = base
                .load(name, &Device::Cpu)
                .ctx(|| format!("{}: {name}", base_dir.display()))?;
            let w = match opts.dtype {
                Some(dt) if w.dtype().is_float() && w.dtype() != dt => w
                    .to_dtype(dt)
                    .ctx(|| format!("{}: {name} to {dt:?}", base_dir.display()))?,
                _ => w,
            };
            let w = match by_key.get(name.as_str()) {
                Some(d) => {
                    report.merged += 1;
                    apply_delta(&w, d, base_dir, name)?
                }
                None => w,
            };
            weight_map.insert(name.clone(), file.clone());
            shard_bytes += (w.elem_count() * w.dtype().size_in_bytes()) as u64;
            tensors.push((name.clone(), w));
        }
        let path = dir.join(&file);
        write_safetensors(&path, tensors)?;
        report.shards.push(path);
        written += shard_bytes;
        if let Some(on_shard) = opts.on_shard {
            on_shard(&ShardWritten {
                shard: i + 1,
                shards: n,
                bytes: written,
                total_bytes: report.total_bytes,
            });
        }
    }
    if n > 1 {
        let index =
            json!({"metadata": {"total_size": report.total_bytes}, "weight_map": weight_map});
        write_json(&dir.join(INDEX_NAME), &index)?;
    }
    copy_side_files(base_dir, dir)?;
    let mut merged = merged_fingerprints(base_dir)?;
    merged.push(adapter_fingerprint(deltas)?);
    write_json(
        &dir.join(MERGED_ADAPTERS_NAME),
        &json!({ "fingerprints": merged }),
    )?;
    if let Some(dt) = opts.dtype {
        set_config_dtype(&dir.join("config.json"), dt)?;
    }
    Ok(report)
}

/// transformers' name of a floating dtype.
fn torch_dtype_name(dt: DType) -> Option<&'static str> {
    match dt {
        DType::F32 => Some("float32"),
        DType::BF16 => Some("bfloat16"),
        DType::F16 => Some("float16"),
        _ => None,
    }
}

/// Sets `dtype` / `torch_dtype` wherever `config.json` has them (top level and nested configs
/// such as `text_config`); a directory without `config.json` is left alone.
fn set_config_dtype(path: &Path, dt: DType) -> Result<()> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_err(path)(e)),
    };
    let mut v: Value = serde_json::from_str(&text).map_err(|e| LoraError::Json {
        path: path.to_path_buf(),
        msg: e.to_string(),
    })?;
    let name = torch_dtype_name(dt).expect("checked before the merge");
    fn visit(v: &mut Value, name: &str) {
        if let Value::Object(map) = v {
            for (k, x) in map.iter_mut() {
                if (k == "dtype" || k == "torch_dtype") && x.is_string() {
                    *x = Value::from(name);
                } else {
                    visit(x, name);
                }
            }
        }
    }
    visit(&mut v, name);
    write_json(path, &v)
}

/// `W + ((B @ A)·scale).to(W.dtype)`, checking shapes.
fn apply_delta(w: &Tensor, d: &MergeDelta, base_dir: &Path, name: &str) -> Result<Tensor> {
    let (out_f, r) = d.b.dims2().ctx(|| format!("{}: lora_B", d.path))?;
    let (_, in_f) = d.a.dims2().ctx(|| format!("{}: lora_A", d.path))?;
    if w.dims() != [out_f, in_f] {
        return Err(LoraError::Shape {
            path: base_dir.to_path_buf(),
            key: name.to_string(),
            expected: vec![out_f, in_f],
            got: w.dims().to_vec(),
            hint: format!("; the adapter's lora_B is ({out_f}, {r}) and lora_A ({r}, {in_f})"),
        });
    }
    let ctx = || format!("merging {}", d.path);
    let a =
        d.a.to_device(&Device::Cpu)
            .and_then(|t| t.to_dtype(DType::F32))
            .ctx(ctx)?;
    let b =
        d.b.to_device(&Device::Cpu)
            .and_then(|t| t.to_dtype(DType::F32))
            .ctx(ctx)?;
    let delta = (b.matmul(&a).ctx(ctx)? * d.scale).ctx(ctx)?; // (out, in) f32
    (w + delta.to_dtype(w.dtype()).ctx(ctx)?).ctx(ctx)
}

/// Greedy split of (name, bytes) in name order into shards of at most `max` bytes.
fn plan_shards(sizes: &[(String, u64)], max: u64) -> Vec<Vec<String>> {
    let mut plan: Vec<Vec<String>> = vec![Vec::new()];
    let mut used = 0u64;
    for (name, size) in sizes {
        let current = plan.last_mut().expect("plan starts with one shard");
        if !current.is_empty() && used + size > max {
            plan.push(Vec::new());
            used = 0;
        }
        plan.last_mut()
            .expect("plan is never empty")
            .push(name.clone());
        used += size;
    }
    plan
}

/// The base weight files: the index's shards, or the single `model.safetensors`.
fn input_shards(base_dir: &Path) -> Result<Vec<PathBuf>> {
    let index = base_dir.join(INDEX_NAME);
    if index.exists() {
        let text = std::fs::read_to_string(&index).map_err(io_err(&index))?;
        let v: Value = serde_json::from_str(&text).map_err(|e| LoraError::Json {
            path: index.clone(),
            msg: e.to_string(),
        })?;
        let map = v
            .get("weight_map")
            .and_then(Value::as_object)
            .ok_or_else(|| LoraError::Json {
                path: index.clone(),
                msg: "missing object `weight_map`".into(),
            })?;
        let mut files: Vec<&str> = map.values().filter_map(Value::as_str).collect();
        files.sort();
        files.dedup();
        return Ok(files.into_iter().map(|f| base_dir.join(f)).collect());
    }
    let single = base_dir.join(SINGLE_NAME);
    if single.exists() {
        return Ok(vec![single]);
    }
    Err(LoraError::Safetensors {
        path: base_dir.to_path_buf(),
        msg: format!("no {SINGLE_NAME} or {INDEX_NAME}: not a safetensors checkpoint directory"),
    })
}

/// Copies every regular file of `base_dir` except weights (`*.safetensors`, the index,
/// `pytorch_model*.bin`).
fn copy_side_files(base_dir: &Path, out_dir: &Path) -> Result<()> {
    for entry in std::fs::read_dir(base_dir).map_err(io_err(base_dir))? {
        let entry = entry.map_err(io_err(base_dir))?;
        let name = entry.file_name().to_string_lossy().to_string();
        let is_weights = name.ends_with(".safetensors")
            || name == INDEX_NAME
            || name.starts_with("pytorch_model");
        if is_weights || !entry.path().is_file() {
            continue;
        }
        std::fs::copy(entry.path(), out_dir.join(&name)).map_err(io_err(entry.path()))?;
    }
    Ok(())
}

fn write_json(path: &Path, v: &Value) -> Result<()> {
    let text = serde_json::to_string_pretty(v)
        .expect("a JSON value built from plain data always serialises");
    std::fs::write(path, text).map_err(io_err(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_split_greedily() {
        let sizes: Vec<(String, u64)> = [("a", 4), ("b", 4), ("c", 10), ("d", 1)]
            .iter()
            .map(|(n, s)| (n.to_string(), *s))
            .collect();
        let plan = plan_shards(&sizes, 8);
        assert_eq!(plan, vec![vec!["a", "b"], vec!["c"], vec!["d"]]);
        assert_eq!(plan_shards(&sizes, 100).len(), 1);
    }
}
