//! Faults turn into prompt errors, never hangs: a killed rank, a skipped collective, a rank that
//! never arrives. Workers are spawned without a launcher so that their own behaviour is tested.

mod common;
use common::*;
use std::time::Duration;

#[test]
fn killed_rank_makes_the_others_fail_promptly() {
    let runs = spawn_world(3, &["kill", "1"], 5.0, 20);
    for r in &runs {
        assert_ne!(r.code, Some(0), "rank {} exited 0:\n{}", r.rank, r.text);
        assert!(
            r.finished,
            "rank {} still running after 20 s:\n{}",
            r.rank, r.text
        );
        if r.rank != 1 {
            assert!(
                r.elapsed < Duration::from_secs(5),
                "rank {} took {:?}",
                r.rank,
                r.elapsed
            );
            assert!(r.text.contains("peer rank"), "rank {}:\n{}", r.rank, r.text);
        }
    }
}

#[test]
fn a_failing_rank_is_named_by_the_others() {
    // With rank 0 hosting the store, a failing rank 0 must keep it up until the others have read
    // its error.
    for (victim, rank0_store) in [(0, true), (1, true), (0, false)] {
        let args = ["fail-first", &victim.to_string()];
        let runs = if rank0_store {
            spawn_world_rank0_store(3, &args, 10.0, 30)
        } else {
            spawn_world(3, &args, 10.0, 30)
        };
        let own = format!("bad record at data.jsonl:3 (rank {victim}'s own error)");
        for r in &runs {
            assert_eq!(r.code, Some(1), "rank {}:\n{}", r.rank, r.text);
            assert!(r.text.contains(&own), "rank {}:\n{}", r.rank, r.text);
            if r.rank != victim {
                assert!(
                    r.text
                        .contains(&format!("rank {victim} failed first: {own}")),
                    "rank {}:\n{}",
                    r.rank,
                    r.text
                );
                assert!(
                    !r.text.contains("Broken pipe"),
                    "rank {}:\n{}",
                    r.rank,
                    r.text
                );
                assert!(r.elapsed < Duration::from_secs(10), "{:?}", r.elapsed);
            }
        }
    }
}

#[test]
fn skipped_collective_is_a_desync_error() {
    let runs = spawn_world(2, &["skip"], 5.0, 20);
    for r in &runs {
        assert_eq!(r.code, Some(1), "rank {}:\n{}", r.rank, r.text);
    }
    let all: String = runs.iter().map(|r| r.text.clone()).collect();
    assert!(all.contains("collective desync at #2"), "{all}");
    assert!(
        all.contains("all_reduce(sum) #2") && all.contains("barrier #2"),
        "{all}"
    );
    assert!(
        all.contains("ddp_test_worker.rs"),
        "call site missing:\n{all}"
    );
}

#[test]
fn queued_all_reduce_reports_a_desync_at_wait() {
    // The store agreement as NCCL runs it: deferred from queuing to `Work::wait`.
    let runs = spawn_world(2, &["async-skip"], 5.0, 20);
    for r in &runs {
        assert_eq!(r.code, Some(1), "rank {}:\n{}", r.rank, r.text);
        assert!(r.elapsed < Duration::from_secs(10), "{:?}", r.elapsed);
    }
    let all: String = runs.iter().map(|r| r.text.clone()).collect();
    assert!(all.contains("collective desync at #2"), "{all}");
    assert!(
        all.contains("all_reduce(sum) #2") && all.contains("barrier #2"),
        "{all}"
    );
}

#[test]
fn a_late_rank_is_reported_while_the_others_wait() {
    // A 20 s timeout: the first notice is due after 2 s, and rank 1 arrives after 3.5 s.
    let runs = spawn_world(3, &["late", "1", "3.5"], 20.0, 30);
    for r in &runs {
        assert_eq!(r.code, Some(0), "rank {}:\n{}", r.rank, r.text);
        if r.rank != 1 {
            assert!(
                r.text
                    .contains(&format!("rank {}/3: still waiting for", r.rank))
                    && r.text.contains("barrier")
                    && r.text.contains("ranks [1] did not arrive")
                    && r.text.contains("of the 20 s collective timeout"),
                "rank {}:\n{}",
                r.rank,
                r.text
            );
        }
    }
}

#[test]
fn missing_rank_times_out_naming_it() {
    let runs = spawn_world(3, &["late", "2"], 1.0, 6);
    let r0 = &runs[0];
    assert_eq!(r0.code, Some(1), "{}", r0.text);
    assert!(r0.elapsed < Duration::from_secs(10), "{:?}", r0.elapsed);
    let all: String = runs.iter().map(|r| r.text.clone()).collect();
    assert!(
        all.contains("timed out after 1s") && all.contains("ranks [2] did not arrive"),
        "{all}"
    );
}
