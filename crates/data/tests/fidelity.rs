//! Rendering, token and label fidelity against transformers 5.23 (fixtures made by
//! tools/reference/data/make_fixtures.py): the bundled template of assets/tiny, and the
//! tool-use template of tools/reference/data/gemma4-tools in its 12B/26B/31B and E2B/E4B
//! variants; and torch's randperm and DistributedSampler.

mod common;

use g4ft_data::rows::{self, Format, Row};
use g4ft_data::template::{self, ChatTemplate};
use g4ft_data::{DistributedSampler, Encoder, LabelMode, RenderOptions};
use serde_json::Value;

fn fixtures(name: &str) -> Vec<Value> {
    let path = common::repo().join("tools/reference/data").join(name);
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    v["cases"].as_array().unwrap().clone()
}

fn chat_row(row: &Value) -> Row {
    let v = rows::parse_json(&row.to_string()).unwrap();
    rows::parse(&v, Format::Chat, None).unwrap()
}

/// Checks text, ids, assistant_only labels and full labels of every case; returns the failures.
fn check_cases<'a>(
    cases: &[Value],
    row_of: impl Fn(&Value) -> Value,
    template_of: impl Fn(&Value) -> &'a ChatTemplate,
    encoder_of: impl Fn(&Value) -> &'a Encoder,
) -> Vec<String> {
    let mut failures = Vec::new();
    for case in cases {
        let name = format!(
            "{} ({})",
            case["name"].as_str().unwrap(),
            case["template"].as_str().unwrap_or("tiny")
        );
        let Row::Chat(chat) = chat_row(&row_of(case)) else {
            panic!("{name}: not a chat row")
        };
        let opts = RenderOptions {
            add_generation_prompt: case["kwargs"]["add_generation_prompt"]
                .as_bool()
                .unwrap_or(false),
            enable_thinking: case["kwargs"]["enable_thinking"].as_bool(),
        };
        let text = match template_of(case).render(&chat.conversation, opts) {
            Ok(t) => t,
            Err(e) => {
                failures.push(format!("{name}: render failed: {e}"));
                continue;
            }
        };
        if text != case["text"].as_str().unwrap() {
            failures.push(format!(
                "{name}: text\n  got  {text:?}\n  want {:?}",
                case["text"]
            ));
            continue;
        }
        let enc = encoder_of(case);
        let want_ids: Vec<u32> = serde_json::from_value(case["input_ids"].clone()).unwrap();
        let (ids, _) = enc.tokenize(&text).unwrap();
        if ids != want_ids {
            failures.push(format!("{name}: ids\n  got  {ids:?}\n  want {want_ids:?}"));
        }
        let Some(want_labels) = case.get("labels_assistant_only") else {
            continue;
        };
        let want_labels: Vec<i32> = serde_json::from_value(want_labels.clone()).unwrap();
        let row = Row::Chat(chat);
        match enc.encode(&row, 4096, LabelMode::AssistantOnly) {
            Ok(e) if e.labels == want_labels && e.input_ids == want_ids => {}
            Ok(e) => failures.push(format!(
                "{name}: labels\n  got  {:?}\n  want {want_labels:?}",
                e.labels
            )),
            Err(e) => failures.push(format!("{name}: encode failed: {}", e.reason)),
        }
        let full = enc.encode(&row, 4096, LabelMode::Full).unwrap();
        let ids_as_labels: Vec<i32> = want_ids.iter().map(|&i| i as i32).collect();
        assert_eq!(
            full.labels, ids_as_labels,
            "{name}: full labels are the ids"
        );
    }
    failures
}

#[test]
fn bundled_template_text_ids_and_labels_match_transformers() {
    let plain = Encoder::from_model_dir(&common::tiny()).unwrap();
    let thinking = Encoder::from_model_dir(&common::tiny())
        .unwrap()
        .with_enable_thinking(true);
    let cases = fixtures("chat_fixtures.json");
    assert!(cases.len() >= 10);
    let failures = check_cases(
        &cases,
        |case| serde_json::json!({"messages": case["messages"]}),
        |_| plain.template().unwrap(),
        |case| {
            if case["kwargs"]["enable_thinking"].as_bool() == Some(true) {
                &thinking
            } else {
                &plain
            }
        },
    );
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn tool_use_rows_match_transformers_for_both_template_variants() {
    let dir = common::repo().join("tools/reference/data/gemma4-tools");
    let enc = Encoder::from_model_dir(&dir).unwrap();
    let e2b_path = dir.join("chat_template_e2b.jinja");
    let e2b = ChatTemplate::new(
        std::fs::read_to_string(&e2b_path).unwrap(),
        e2b_path,
        template::special_tokens(&dir).unwrap(),
    )
    .unwrap();
    let cases = fixtures("tool_fixtures.json");
    let variants: Vec<&str> = cases
        .iter()
        .map(|c| c["template"].as_str().unwrap())
        .collect();
    assert!(cases.len() >= 20 && variants.contains(&"e2b"));
    let failures = check_cases(
        &cases,
        |case| case["row"].clone(),
        |case| match case["template"].as_str() {
            Some("e2b") => &e2b,
            _ => enc.template().unwrap(),
        },
        |_| &enc,
    );
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn randperm_and_distributed_sampler_match_torch() {
    for case in fixtures("sampler_fixtures.json") {
        let n = case["n"].as_u64().unwrap() as usize;
        let world = case["world"].as_u64().unwrap() as usize;
        let seed = case["seed"].as_u64().unwrap();
        let epoch = case["epoch"].as_u64().unwrap();
        let want_perm: Vec<usize> = serde_json::from_value(case["randperm"].clone()).unwrap();
        assert_eq!(
            g4ft_data::randperm::randperm(n, seed + epoch),
            want_perm,
            "randperm {case}"
        );
        for rank in 0..world {
            let mut s = DistributedSampler::new(n, world, rank)
                .unwrap()
                .with_seed(seed)
                .with_shuffle(case["shuffle"].as_bool().unwrap())
                .with_drop_last(case["drop_last"].as_bool().unwrap());
            s.set_epoch(epoch);
            let want: Vec<usize> = serde_json::from_value(case["ranks"][rank].clone()).unwrap();
            assert_eq!(s.indices(), want, "rank {rank} of {case}");
        }
    }
}
