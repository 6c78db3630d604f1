//! How a merge writes its output: the output directory appears whole or not at all (a failed
//! merge leaves neither it nor its staging directory), a directory holding files is refused and
//! left as it was, and the progress callback sees every weight file.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use candle_core::{DType, Device, Tensor};
use common::fixtures;
use g4ft_lora::{
    check_not_merged, merge_adapter_dir, merge_deltas, LoraError, MergeDelta, MergeOptions,
    ShardWritten,
};

/// A fresh, absent directory under the test target's temporary folder.
fn absent_dir(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("g4ft_lora_merge")
        .join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(d.parent().unwrap()).unwrap();
    d
}

/// Entries of `dir`'s parent whose name starts with `.<dir name>.partial-`.
fn leftover_staging(dir: &Path) -> Vec<String> {
    let prefix = format!(".{}.partial-", dir.file_name().unwrap().to_string_lossy());
    std::fs::read_dir(dir.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&prefix))
        .collect()
}

static WRITTEN: Mutex<Vec<ShardWritten>> = Mutex::new(Vec::new());

fn record(p: &ShardWritten) {
    WRITTEN.lock().unwrap().push(p.clone());
}

#[test]
fn a_merge_reports_each_weight_file_and_leaves_no_staging() {
    let out = absent_dir("progress");
    let report = merge_adapter_dir(
        &fixtures().join("base"),
        &fixtures().join("list/adapter"),
        &out,
        MergeOptions {
            max_shard_bytes: 600,
            on_shard: Some(record),
            ..Default::default()
        },
    )
    .unwrap();
    let written = WRITTEN.lock().unwrap().clone();
    let n = report.shards.len();
    assert!(n > 1, "600-byte shards split the toy base: {n}");
    let numbers: Vec<(usize, usize)> = written.iter().map(|p| (p.shard, p.shards)).collect();
    assert_eq!(numbers, (1..=n).map(|i| (i, n)).collect::<Vec<_>>());
    assert!(written.windows(2).all(|w| w[0].bytes < w[1].bytes));
    let last = written.last().unwrap();
    assert_eq!(
        (last.bytes, last.total_bytes),
        (report.total_bytes, report.total_bytes)
    );
    for shard in &report.shards {
        assert!(
            shard.starts_with(&out) && shard.exists(),
            "{}",
            shard.display()
        );
    }
    assert!(leftover_staging(&out).is_empty());
}

#[test]
fn a_failed_merge_leaves_no_output_and_no_staging() {
    let base = fixtures().join("base");
    let out = absent_dir("failed");
    // A delta whose (out, in) is not the weight's: found once the shards are being written.
    let bad = MergeDelta {
        path: "model.layers.0.self_attn.q_proj".into(),
        a: Tensor::zeros((2, 3), DType::F32, &Device::Cpu).unwrap(),
        b: Tensor::zeros((5, 2), DType::F32, &Device::Cpu).unwrap(),
        scale: 1.0,
    };
    let opts = MergeOptions {
        max_shard_bytes: 600,
        ..Default::default()
    };
    let err = merge_deltas(&base, &out, &[bad], opts).unwrap_err();
    assert!(
        err.to_string().contains("q_proj.weight: expected shape"),
        "{err}"
    );
    assert!(!out.exists(), "no output directory after a failed merge");
    assert!(leftover_staging(&out).is_empty());
}

#[test]
fn a_directory_holding_files_is_refused_and_left_as_it_was() {
    let out = absent_dir("occupied");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("notes.txt"), "keep me").unwrap();
    let err = merge_adapter_dir(
        &fixtures().join("base"),
        &fixtures().join("list/adapter"),
        &out,
        MergeOptions::default(),
    )
    .unwrap_err();
    assert!(matches!(err, LoraError::OutputExists { .. }), "{err}");
    assert!(
        err.to_string().contains("choose a new output directory"),
        "{err}"
    );
    let entries: Vec<_> = std::fs::read_dir(&out).unwrap().collect();
    assert_eq!(entries.len(), 1);
    assert_eq!(
        std::fs::read_to_string(out.join("notes.txt")).unwrap(),
        "keep me"
    );
    assert!(leftover_staging(&out).is_empty());
}

#[test]
fn an_adapter_is_not_applied_again_to_a_model_it_is_merged_into() {
    let (base, list) = (fixtures().join("base"), fixtures().join("list/adapter"));
    let other = fixtures().join("regex_rslora/adapter");
    let once = absent_dir("once");
    merge_adapter_dir(&base, &list, &once, MergeOptions::default()).unwrap();
    check_not_merged(&base, &list).unwrap();
    check_not_merged(&once, &other).unwrap();
    let err = check_not_merged(&once, &list).unwrap_err();
    assert!(matches!(err, LoraError::AlreadyMerged { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("applying it again would add it twice"),
        "{err}"
    );
    // Merging it again is refused too; another adapter on top keeps both in the list.
    let twice = absent_dir("twice");
    let err = merge_adapter_dir(&once, &list, &twice, MergeOptions::default()).unwrap_err();
    assert!(matches!(err, LoraError::AlreadyMerged { .. }), "{err}");
    assert!(!twice.exists());
    merge_adapter_dir(&once, &other, &twice, MergeOptions::default()).unwrap();
    for adapter in [&list, &other] {
        assert!(check_not_merged(&twice, adapter).is_err());
    }
}

#[test]
fn merging_into_another_model_names_the_model_the_adapter_was_made_for() {
    let out = absent_dir("elsewhere");
    let err = merge_adapter_dir(
        &fixtures().join("base"),
        &fixtures().join("gemma4-c-moe/adapter"),
        &out,
        MergeOptions::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("missing tensor")
            && err.contains("the adapter was made for tests/golden/gemma4-c-moe"),
        "{err}"
    );
    assert!(!out.exists());
}
