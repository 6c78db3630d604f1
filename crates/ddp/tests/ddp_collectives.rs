//! all_reduce (sum, avg) / broadcast / all_gather / barrier correctness over the CPU ring for
//! many sizes and dtypes, world sizes 1-4, through `ddprun` (the NCCL variant, scenario `nccl`,
//! runs on the GPU machine: `tools/gpu/run_nccl.sh`).

mod common;
use common::*;

fn collectives(world: usize) {
    let n = world.to_string();
    let o = ddprun(
        &["--standalone", "--nproc-per-node", &n],
        &["collectives"],
        20.0,
    );
    let t = text(&o);
    assert!(o.status.success(), "world {world}:\n{t}");
    for r in 0..world {
        assert!(
            t.contains(&format!("[rank {r}] OK collectives")),
            "world {world}, rank {r}:\n{t}"
        );
    }
}

#[test]
fn collectives_world_1() {
    collectives(1);
}

#[test]
fn collectives_world_2() {
    collectives(2);
}

#[test]
fn collectives_world_3() {
    collectives(3);
}

#[test]
fn collectives_world_4() {
    collectives(4);
}

/// Without `--features cuda` the NCCL scenario fails cleanly (non-zero, saying why).
#[cfg(not(feature = "cuda"))]
#[test]
fn nccl_scenario_needs_cuda() {
    let o = ddprun(&["--standalone", "--nproc-per-node", "1"], &["nccl"], 20.0);
    let t = text(&o);
    assert!(!o.status.success(), "{t}");
    assert!(
        t.contains("FAILED nccl") && t.contains("--features cuda"),
        "{t}"
    );
}
