//! Rendering, token and label fidelity against transformers 5.23 (fixtures made by
//! tools/reference/data/make_fixtures.py with assets/tiny), and torch's randperm and
//! DistributedSampler.

mod common;

use g4ft_data::{DistributedSampler, Encoder, LabelMode, Message, RenderOptions};
use serde_json::Value;

fn fixtures(name: &str) -> Vec<Value> {
    let path = common::repo().join("tools/reference/data").join(name);
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    v["cases"].as_array().unwrap().clone()
}

#[test]
fn chat_template_text_ids_and_labels_match_transformers() {
    let plain = Encoder::from_model_dir(&common::tiny()).unwrap();
    let thinking = Encoder::from_model_dir(&common::tiny())
        .unwrap()
        .with_enable_thinking(true);
    let cases = fixtures("chat_fixtures.json");
    assert!(cases.len() >= 10);
    let mut failures = Vec::new();
    for case in &cases {
        let name = case["name"].as_str().unwrap();
        let messages: Vec<Message> = serde_json::from_value(case["messages"].clone()).unwrap();
        let opts = RenderOptions {
            add_generation_prompt: case["kwargs"]["add_generation_prompt"]
                .as_bool()
                .unwrap_or(false),
            enable_thinking: case["kwargs"]["enable_thinking"].as_bool(),
        };
        let text = plain.template().render(&messages, opts).unwrap();
        if text != case["text"].as_str().unwrap() {
            failures.push(format!(
                "{name}: text\n  got  {text:?}\n  want {:?}",
                case["text"]
            ));
            continue;
        }
        let want_ids: Vec<u32> = serde_json::from_value(case["input_ids"].clone()).unwrap();
        let (ids, _) = plain.tokenize(&text).unwrap();
        if ids != want_ids {
            failures.push(format!("{name}: ids\n  got  {ids:?}\n  want {want_ids:?}"));
        }
        let Some(want_labels) = case.get("labels_assistant_only") else {
            continue;
        };
        let want_labels: Vec<i32> = serde_json::from_value(want_labels.clone()).unwrap();
        let enc = if opts.enable_thinking == Some(true) {
            &thinking
        } else {
            &plain
        };
        match enc.encode_chat(&messages, 4096, LabelMode::AssistantOnly) {
            Ok(e) if e.labels == want_labels && e.input_ids == want_ids => {}
            Ok(e) => failures.push(format!(
                "{name}: labels\n  got  {:?}\n  want {want_labels:?}",
                e.labels
            )),
            // a conversation whose only assistant turn is empty still trains its <turn|>
            Err(e) => failures.push(format!("{name}: encode failed: {e}")),
        }
        let full = enc.encode_chat(&messages, 4096, LabelMode::Full).unwrap();
        let ids_as_labels: Vec<i32> = want_ids.iter().map(|&i| i as i32).collect();
        assert_eq!(
            full.labels, ids_as_labels,
            "{name}: full labels are the ids"
        );
    }
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
