//! Rendering, token and label fidelity against transformers 5.23 (fixtures made by
//! tools/reference/data/make_fixtures.py): the bundled template of assets/tiny, and the
//! tool-use template of tools/reference/data/gemma4-tools in its 12B/26B/31B and E2B/E4B
//! variants; seeded random conversations through all three (make_fuzz_fixtures.py); and torch's
//! randperm and DistributedSampler.

mod common;

use std::path::Path;

use g4ft_data::rows::{self, ChatRow, Format, Row};
use g4ft_data::template::{self, ChatTemplate};
use g4ft_data::{DistributedSampler, Encoder, LabelMode, RenderOptions};
use serde_json::Value;

/// The cases of a fixture file. A case with a `row` (or, in chat_fixtures.json, `messages`) gets
/// `row_json`: the row as JSON text with its keys in file order (serde_json's `Value` sorts
/// them; templates see the order through `dictsort` ties and key iteration).
fn fixtures(name: &str) -> Vec<Value> {
    let path = common::repo().join("tools/reference/data").join(name);
    let text = std::fs::read_to_string(path).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    let in_order: minijinja::Value = serde_json::from_str(&text).unwrap();
    let mut cases = v["cases"].as_array().unwrap().clone();
    for (i, case) in cases.iter_mut().enumerate() {
        let ordered = in_order
            .get_attr("cases")
            .and_then(|c| c.get_item(&minijinja::Value::from(i)))
            .unwrap();
        let field = |key: &str| ordered.get_attr(key).ok().filter(|v| !v.is_undefined());
        let row = match (field("row"), field("messages")) {
            (Some(row), _) => row,
            (None, Some(messages)) => minijinja::Value::from_iter([("messages", messages)]),
            (None, None) => continue,
        };
        case["row_json"] = Value::from(serde_json::to_string(&row).unwrap());
    }
    cases
}

/// The row as g4ft-data reads it, or why its checks reject it.
fn chat_row(row_json: &str) -> Result<ChatRow, String> {
    let v = rows::parse_json(row_json).map_err(|e| e.reason)?;
    match rows::parse(&v, Format::Chat, None).map_err(|e| e.reason)? {
        Row::Chat(chat) => Ok(chat),
        other => Err(format!("not a chat row: {other:?}")),
    }
}

/// Checks text, ids, assistant_only labels and full labels of every case (its `row_json`); a
/// case with `error` (transformers raised) must be rejected, by the row checks or by the template
/// (a message of `raise_exception` must be ours too), and must not encode. Returns the failures.
fn check_cases<'a>(
    cases: &[Value],
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
        let opts = RenderOptions {
            add_generation_prompt: case["kwargs"]["add_generation_prompt"]
                .as_bool()
                .unwrap_or(false),
            enable_thinking: case["kwargs"]["enable_thinking"].as_bool(),
        };
        let row_json = case["row_json"].as_str().unwrap();
        let rendered = chat_row(row_json).and_then(|chat| {
            let text = template_of(case).render(&chat.conversation, opts)?;
            Ok((chat, text))
        });
        if let Some(want) = case.get("error").and_then(Value::as_str) {
            match rendered {
                Ok((_, text)) => failures.push(format!(
                    "{name}: transformers raised {want:?}, we rendered {text:?}"
                )),
                Err(e) => {
                    let raised = want.strip_prefix("TemplateError: ");
                    if raised.is_some_and(|m| e.contains("chat:") && !e.contains(m)) {
                        failures.push(format!(
                            "{name}: transformers raised {want:?}, we raised {e:?}"
                        ));
                    }
                    if let Ok(chat) = chat_row(row_json) {
                        let row = Row::Chat(chat);
                        if let Ok(e) = encoder_of(case).encode(&row, 4096, LabelMode::Full) {
                            failures.push(format!("{name}: encoded a rejected row: {e:?}"));
                        }
                    }
                }
            }
            continue;
        }
        let (chat, text) = match rendered {
            Ok(r) => r,
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

/// An encoder for `dir`'s tokenizer with the given template (`name` names its scratch
/// directory) and `enable_thinking`.
fn encoder_with(name: &str, dir: &Path, template: &Path, thinking: Option<bool>) -> Encoder {
    let scratch = common::scratch(&format!("fuzz-{name}-{thinking:?}"));
    for file in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(dir.join(file), scratch.join(file)).unwrap();
    }
    std::fs::copy(template, scratch.join("chat_template.jinja")).unwrap();
    let enc = Encoder::from_model_dir(&scratch).unwrap();
    std::fs::remove_dir_all(&scratch).unwrap();
    match thinking {
        Some(on) => enc.with_enable_thinking(on),
        None => enc,
    }
}

#[test]
fn fuzzed_rows_match_transformers() {
    let tiny = common::tiny();
    let tools = common::repo().join("tools/reference/data/gemma4-tools");
    let templates = [
        ("tiny", tiny.as_path(), tiny.join("chat_template.jinja")),
        ("big", tools.as_path(), tools.join("chat_template.jinja")),
        (
            "e2b",
            tools.as_path(),
            tools.join("chat_template_e2b.jinja"),
        ),
    ];
    let encoders: Vec<((&str, Option<bool>), Encoder)> = templates
        .iter()
        .flat_map(|(name, dir, template)| {
            [None, Some(false), Some(true)].map(|thinking| {
                (
                    (*name, thinking),
                    encoder_with(name, dir, template, thinking),
                )
            })
        })
        .collect();
    let encoder_of = |case: &Value| {
        let key = (
            case["template"].as_str().unwrap(),
            case["kwargs"]["enable_thinking"].as_bool(),
        );
        &encoders.iter().find(|(k, _)| *k == key).unwrap().1
    };
    let cases = fixtures("fuzz_fixtures.json");
    for want in ["tiny", "big", "e2b"] {
        assert!(cases.iter().filter(|c| c["template"] == want).count() >= 50);
    }
    assert!(cases.iter().filter(|c| c.get("error").is_some()).count() >= 10);
    for case in cases.iter().filter(|c| c["template"] == "tiny") {
        // the bundled template is fed the messages alone, as in the test above
        let keys: Vec<&String> = case["row"].as_object().unwrap().keys().collect();
        assert_eq!(keys, ["messages"], "{}", case["name"]);
    }
    let failures = check_cases(
        &cases,
        |case| encoder_of(case).template().unwrap(),
        encoder_of,
    );
    assert!(
        failures.is_empty(),
        "{} of {} cases differ:\n{}",
        failures.len(),
        cases.len(),
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
