//! DDP semantics through `ddprun`: equivalence with single-process training, one reduction per
//! optimizer step under `no_sync`, unused parameters, replica drift, rank-0 decisions.

mod common;
use common::*;

fn train(world: usize, micro: usize, accum: usize) -> Vec<Vec<f32>> {
    let out = std::env::temp_dir().join(format!(
        "g4ft-ddp-train-{}-{world}-{micro}-{accum}.json",
        std::process::id()
    ));
    let n = world.to_string();
    let (m, a, path) = (
        micro.to_string(),
        accum.to_string(),
        out.display().to_string(),
    );
    let o = ddprun(
        &["--standalone", "--nproc-per-node", &n],
        &["train", &m, &a, &path],
        20.0,
    );
    assert!(o.status.success(), "train world {world}:\n{}", text(&o));
    let vals: Vec<Vec<f32>> =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let _ = std::fs::remove_file(&out);
    vals
}

fn assert_close(got: &[Vec<f32>], want: &[Vec<f32>], what: &str) {
    for (p, (g, w)) in got.iter().zip(want).enumerate() {
        for (i, (a, b)) in g.iter().zip(w).enumerate() {
            assert!(
                (a - b).abs() <= 1e-6,
                "{what}: param {p}[{i}]: {a} vs {b} (diff {:e})",
                (a - b).abs()
            );
        }
    }
}

#[test]
fn ddp_matches_single_process_without_accumulation() {
    let one = train(1, 4, 1);
    assert_close(&train(2, 2, 1), &one, "2 ranks x 2 vs 1 rank x 4");
    assert_close(&train(4, 1, 1), &one, "4 ranks x 1 vs 1 rank x 4");
}

#[test]
fn ddp_matches_single_process_with_accumulation() {
    let one = train(1, 4, 3);
    assert_close(
        &train(2, 2, 3),
        &one,
        "2 ranks x 2 x 3 accum vs 1 rank x 4 x 3 accum",
    );
    assert_ne!(
        train(1, 4, 1),
        one,
        "accumulation must change the result (test sanity)"
    );
}

#[test]
fn no_sync_issues_one_reduction_per_step() {
    let o = ddprun(
        &["--standalone", "--nproc-per-node", "2"],
        &["nosync", "4", "3"],
        20.0,
    );
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(
        t.contains("[rank 0] all_reduce per step 2 buckets 2"),
        "{t}"
    );
}

#[test]
fn unused_parameter_is_named_or_zero_filled() {
    let o = ddprun(
        &["--standalone", "--nproc-per-node", "2"],
        &["unused", "0"],
        20.0,
    );
    let t = text(&o);
    assert!(!o.status.success(), "{t}");
    // Each rank finds it on its own; the launcher stops the other on the first exit, so which
    // rank gets to print is a race.
    assert!(
        t.contains("got no gradient")
            && t.contains("linear.bias")
            && (t.contains("rank 0/2") || t.contains("rank 1/2")),
        "{t}"
    );
    let o = ddprun(
        &["--standalone", "--nproc-per-node", "2"],
        &["unused", "1"],
        20.0,
    );
    assert!(o.status.success(), "{}", text(&o));
}

#[test]
fn parameter_drift_is_detected() {
    let o = ddprun(&["--standalone", "--nproc-per-node", "2"], &["drift"], 20.0);
    let t = text(&o);
    assert!(!o.status.success(), "{t}");
    assert!(
        t.contains("parameters drifted") && t.contains("linear.bias differs on rank"),
        "{t}"
    );
}

#[test]
fn rank0_decisions_reach_every_rank() {
    let o = ddprun(
        &["--standalone", "--nproc-per-node", "3"],
        &["decide"],
        20.0,
    );
    assert!(o.status.success(), "{}", text(&o));
}
