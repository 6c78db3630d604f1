//! `memory_plan` as a user runs it on the 12B's config: its predicted peak holds what the budget's
//! rows say is held, `--recompute auto` keeps as many layers as its budget allows and no more, and
//! `--longest-within-gb`'s answer fits where one step longer does not; bad flag sets are one
//! error line.

mod common;

use std::collections::BTreeMap;
use std::process::Command;

use common::{example, ROOT};

const CONFIG: &str = "crates/gemma4/tests/configs/gemma-4-12B-it.json";

/// Exit success, stdout and stderr of `memory_plan --config CONFIG args`.
fn memory_plan(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(example("memory_plan"))
        .args(["--config", CONFIG])
        .args(args)
        .current_dir(ROOT)
        .output()
        .expect("run memory_plan");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

/// The `key=value` numbers of the `PLAN` line of a successful run.
fn plan_line(args: &[&str]) -> BTreeMap<String, f64> {
    let (ok, out, err) = memory_plan(args);
    assert!(ok, "memory_plan {args:?} failed: {err}");
    let line = out
        .lines()
        .find_map(|l| l.strip_prefix("PLAN "))
        .unwrap_or_else(|| panic!("no PLAN line in:\n{out}"));
    line.split_whitespace()
        .map(|kv| {
            let (k, v) = kv.split_once('=').expect("key=value");
            (k.to_string(), v.parse().expect("a number"))
        })
        .collect()
}

#[test]
fn the_peak_holds_every_held_term_and_auto_keeps_what_its_budget_allows() {
    let all = plan_line(&["--seq", "32768", "--recompute", "all"]);
    let none = plan_line(&["--seq", "32768", "--recompute", "none"]);
    for plan in [&all, &none] {
        let held = plan["weights_gb"] + plan["lora_state_gb"] + plan["saved_gb"] + plan["kept_gb"];
        assert!(plan["peak_gb"] >= held, "{plan:?}");
    }
    assert_eq!((all["kept_layers"], none["kept_layers"]), (0.0, 48.0));

    // A budget between the two keeps some layers, fewer for a smaller budget, within each.
    let mut kept = Vec::new();
    for budget in [80.0, 120.0] {
        let gb = budget.to_string();
        let auto = plan_line(&[
            "--seq",
            "32768",
            "--recompute",
            "auto",
            "--memory-budget-gb",
            &gb,
        ]);
        assert!(auto["peak_gb"] <= budget, "{auto:?}");
        kept.push(auto["kept_layers"]);
    }
    assert!(
        0.0 < kept[0] && kept[0] < kept[1] && kept[1] < 48.0,
        "{kept:?}"
    );
}

#[test]
fn the_longest_sequence_fits_and_one_step_longer_does_not() {
    let (ok, out, err) = memory_plan(&["--recompute", "all", "--longest-within-gb", "60"]);
    assert!(ok, "{err}");
    let number_after = |prefix: &str| -> f64 {
        let rest = out
            .lines()
            .find_map(|l| l.split_once(prefix).map(|(_, r)| r))
            .unwrap_or_else(|| panic!("no `{prefix}` in:\n{out}"));
        rest.split_whitespace().next().unwrap().parse().unwrap()
    };
    let longest = number_after("longest sequence within 60 GB: ");
    let next_peak = number_after(" tokens: predicted peak ");
    assert!(next_peak > 60.0, "{out}");
    let at_longest = plan_line(&["--recompute", "all", "--seq", &longest.to_string()]);
    assert!(at_longest["peak_gb"] <= 60.0, "{at_longest:?}");
    let longer = (longest as usize + 1024).to_string();
    let at_longer = plan_line(&["--recompute", "all", "--seq", &longer]);
    assert_eq!(at_longer["peak_gb"], next_peak, "{out}");
}

#[test]
fn flag_sets_that_cannot_plan_are_one_error_line() {
    for (args, says) in [
        (&["--recompute", "auto"][..], "--memory-budget-gb"),
        (&["--host-memory-gb", "5"][..], "--offload-checkpoints"),
        (&["--longest-within-gb=-1"][..], "positive"),
        (&["--longest-within-gb", "0.5"][..], "not even 1024 tokens"),
    ] {
        let (ok, _, err) = memory_plan(args);
        assert!(!ok, "{args:?} must fail");
        assert!(
            err.starts_with("error: ") && err.contains(says),
            "{args:?}: {err}"
        );
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
    }
}
