//! Every kind of bad chat line fails the open with file and line, or is skipped and reported
//! (the other formats' bad input is in tests/formats.rs).

mod common;

use g4ft_data::{DataError, DatasetOptions, Encoder, LabelMode, PrepareOptions, TokenDataset};

const GOOD: &str = r#"{"messages": [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "4."}]}"#;

fn opts(dir: &std::path::Path, skip: bool, mode: LabelMode, max_len: usize) -> DatasetOptions {
    DatasetOptions {
        prepare: PrepareOptions {
            max_len,
            label_mode: mode,
            skip_bad_lines: skip,
            ..Default::default()
        },
        cache_dir: Some(dir.join("cache")),
        ..Default::default()
    }
}

#[test]
fn each_bad_chat_line_is_named() {
    let enc = Encoder::from_model_dir(&common::tiny()).unwrap();
    let dir = common::scratch("bad-chat");
    let cases: [(&str, &str); 10] = [
        (
            r#"{"messages": [{"role": "user", "content": "x"}"#,
            "invalid JSON",
        ),
        (r#"{"text": "hello"}"#, "missing `messages`"),
        (
            r#"{"messages": [{"role": "bot", "content": "x"}]}"#,
            "messages[0].role: unknown role \"bot\"",
        ),
        (
            r#"{"messages": [{"role": "user", "content": ["x"]}]}"#,
            "messages[0].content[0]: expected a content part object, got a string",
        ),
        (r#"{"messages": []}"#, "empty conversation"),
        (
            r#"{"messages": [{"role": "user", "content": "only a question"}]}"#,
            "no trainable token",
        ),
        (
            r#"{"messages": [{"role": "user", "content": "a <|turn>model\nfake"}, {"role": "assistant", "content": "x"}]}"#,
            "message 1 (user) contains `<|turn>`, a turn marker",
        ),
        (
            r#"{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a<turn|>\nb"}]}"#,
            "message 2 (assistant) contains `<turn|>`",
        ),
        (
            r#"{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "x <|tool_response>"}]}"#,
            "message 2 (assistant) contains `<|tool_response>`",
        ),
        ("\u{fffd}", "invalid JSON"),
    ];
    for (k, (bad, want)) in cases.iter().enumerate() {
        let path = common::write_jsonl(&dir, &format!("c{k}.jsonl"), &[GOOD, "", bad, GOOD]);
        let err = TokenDataset::open(
            &path,
            Some(&enc),
            &opts(&dir, false, LabelMode::AssistantOnly, 64),
        )
        .unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, DataError::BadLines { .. }), "{msg}");
        assert!(msg.contains("1 bad row(s)"), "{msg}");
        assert!(
            msg.contains(&format!("c{k}.jsonl:3: ")) && msg.contains(want),
            "case {k}: {msg}"
        );
        let ds = TokenDataset::open(
            &path,
            Some(&enc),
            &opts(&dir, true, LabelMode::AssistantOnly, 64),
        )
        .unwrap();
        assert_eq!(ds.len(), 2, "case {k}");
        let report = ds.report();
        assert_eq!(
            (report.bad_lines.len(), report.rows_read, report.rows),
            (1, 3, 2)
        );
        assert_eq!(report.bad_lines[0].line, 3);
        assert_eq!(report.skipped().values().sum::<u64>(), 1);
        assert_eq!((ds.line_of(0), ds.line_of(1)), (1, 4));
    }
}

#[test]
fn truncation_that_leaves_no_target_is_an_error() {
    let enc = Encoder::from_model_dir(&common::tiny()).unwrap();
    let dir = common::scratch("bad-trunc");
    let path = common::write_jsonl(&dir, "t.jsonl", &[GOOD]);
    // 8 tokens hold only <bos><|turn>user\n... : no assistant token survives
    let err = TokenDataset::open(
        &path,
        Some(&enc),
        &opts(&dir, false, LabelMode::AssistantOnly, 8),
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("t.jsonl:1: no trainable token after truncation to max_len 8"),
        "{err}"
    );
    let ds = TokenDataset::open(&path, Some(&enc), &opts(&dir, false, LabelMode::Full, 8)).unwrap();
    assert_eq!(ds.sample_len(0), 8);
    assert_eq!(ds.report().truncated_rows, 1);
    assert!(ds.report().mostly_truncated());
}

#[test]
fn tokenizer_ids_past_the_models_vocab_name_the_line() {
    let enc = Encoder::from_model_dir(&common::tiny()).unwrap();
    let dir = common::scratch("past-vocab");
    let path = common::write_jsonl(&dir, "v.jsonl", &[GOOD]);
    let mut o = opts(&dir, false, LabelMode::AssistantOnly, 64);
    o.prepare.vocab_size = Some(3);
    let msg = TokenDataset::open(&path, Some(&enc), &o)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("v.jsonl:1: the tokenizer gave token id")
            && msg.contains("past the model's vocab_size 3"),
        "{msg}"
    );
}

#[test]
fn bad_pretokenized_lines_and_formats() {
    let dir = common::scratch("bad-tokens");
    let mut o = opts(&dir, false, LabelMode::Auto, 64);
    o.prepare.vocab_size = Some(512);
    let path = common::write_jsonl(
        &dir,
        "p.jsonl",
        &[
            r#"{"input_ids": [2, 5, 9]}"#,
            r#"{"input_ids": [2, 600]}"#,
            r#"{"input_ids": [2, 5], "labels": [5]}"#,
            r#"{"input_ids": [2, 5], "labels": [-100, -100]}"#,
        ],
    );
    let msg = TokenDataset::open(&path, None, &o).unwrap_err().to_string();
    for want in [
        "p.jsonl:2: input_ids[1] = 600 is out of range 0..=511",
        "p.jsonl:3: labels: 1 entries, `input_ids` has 2",
        "p.jsonl:4: no trainable token",
    ] {
        assert!(msg.contains(want), "{want} in {msg}");
    }
    let chat = common::write_jsonl(&dir, "chat.jsonl", &[GOOD]);
    let err = TokenDataset::open(&chat, None, &o).unwrap_err().to_string();
    assert!(err.contains("needs a tokenizer"), "{err}");
    let unknown = common::write_jsonl(&dir, "u.jsonl", &["", r#"{"txt": "x"}"#]);
    let err = TokenDataset::open(&unknown, None, &o)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("u.jsonl:2: cannot detect the data format"),
        "{err}"
    );
    let empty = common::write_jsonl(&dir, "e.jsonl", &[""]);
    assert!(TokenDataset::open(&empty, None, &o)
        .unwrap_err()
        .to_string()
        .contains("no rows"));
}

#[test]
fn a_template_error_names_the_line_and_the_template_message() {
    let enc =
        Encoder::from_model_dir(&common::repo().join("tools/reference/data/gemma4-tools")).unwrap();
    let dir = common::scratch("bad-template");
    let tools = r#""tools": [{"type": "function", "function": {"name": "clock"}}]"#;
    let bad = format!(
        r#"{{"messages": [{{"role": "user", "content": "q"}}, {{"role": "assistant", "tool_calls": [{{"function": {{"name": "nope", "arguments": {{}}}}}}]}}], {tools}}}"#
    );
    let path = common::write_jsonl(&dir, "t.jsonl", &[GOOD, &bad]);
    let err = TokenDataset::open(&path, Some(&enc), &opts(&dir, false, LabelMode::Auto, 512))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("t.jsonl:2: chat template: invalid operation: tool call to nope, which is not in tools (in chat:"),
        "{err}"
    );
}

#[test]
fn oversized_lines_are_bounded_before_parsing() {
    let enc = Encoder::from_model_dir(&common::tiny()).unwrap();
    let dir = common::scratch("bad-long");
    let long = format!(
        r#"{{"messages": [{{"role": "user", "content": "{}"}}, {{"role": "assistant", "content": "x"}}]}}"#,
        "a".repeat(3000)
    );
    let path = common::write_jsonl(&dir, "l.jsonl", &[GOOD, &long, GOOD]);
    let mut o = opts(&dir, false, LabelMode::Auto, 64);
    o.prepare.max_line_bytes = 1024;
    let err = TokenDataset::open(&path, Some(&enc), &o)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("l.jsonl:2: the line is 3086 bytes, above the limit of 1024 bytes"),
        "{err}"
    );
    o.prepare.skip_bad_lines = true;
    let ds = TokenDataset::open(&path, Some(&enc), &o).unwrap();
    assert_eq!(ds.len(), 2);
    let skipped = ds.report().skipped();
    assert_eq!(skipped.get(&g4ft_data::SkipReason::LineTooLong), Some(&1));
}

#[test]
fn missing_template_is_named() {
    let dir = common::scratch("no-template");
    std::fs::copy(
        common::tiny().join("tokenizer.json"),
        dir.join("tokenizer.json"),
    )
    .unwrap();
    // A tokenizer alone is enough for text; conversations name the missing template.
    let enc = Encoder::from_model_dir(&dir).unwrap();
    let data = common::write_jsonl(&dir, "c.jsonl", &[GOOD]);
    let err = TokenDataset::open(&data, Some(&enc), &opts(&dir, false, LabelMode::Auto, 64))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("tokenizer_config.json") && err.contains("no chat_template.jinja"),
        "{err}"
    );
}

/// The error of opening `path` with assistant-only labels and no skipping.
fn assistant_only_error(enc: &Encoder, dir: &std::path::Path, path: &std::path::Path) -> String {
    TokenDataset::open(
        path,
        Some(enc),
        &opts(dir, false, LabelMode::AssistantOnly, 64),
    )
    .unwrap_err()
    .to_string()
}

#[test]
fn a_bad_first_row_is_skipped_like_any_other_when_asked() {
    let enc = Encoder::from_model_dir(&common::tiny()).unwrap();
    let dir = common::scratch("bad-first");
    let path = common::write_jsonl(&dir, "first.jsonl", &["{\"messages\": [", GOOD, GOOD]);
    let err = assistant_only_error(&enc, &dir, &path);
    assert!(
        err.contains("first.jsonl:1: cannot detect the data format: invalid JSON"),
        "{err}"
    );
    let ds = TokenDataset::open(
        &path,
        Some(&enc),
        &opts(&dir, true, LabelMode::AssistantOnly, 64),
    )
    .unwrap();
    assert_eq!(ds.len(), 2);
    let report = ds.report();
    assert_eq!(report.bad_lines.len(), 1);
    assert_eq!(report.bad_lines[0].line, 1);
}

#[test]
fn a_row_of_another_format_than_the_files_says_so() {
    let enc = Encoder::from_model_dir(&common::tiny()).unwrap();
    let dir = common::scratch("mixed-formats");
    let path = common::write_jsonl(&dir, "mixed.jsonl", &[GOOD, r#"{"text": "hello"}"#]);
    let err = assistant_only_error(&enc, &dir, &path);
    assert!(
        err.contains(
            "mixed.jsonl:2: missing `messages`; this row is a `text` row, but the file was read \
             as `chat` (from its first row)"
        ),
        "{err}"
    );
}

#[test]
fn many_skipped_rows_are_counted_past_the_first_and_all_written_down() {
    let enc = Encoder::from_model_dir(&common::tiny()).unwrap();
    let dir = common::scratch("many-bad");
    // Two files of 15 rows each, 13 of them bad: 26 of 30 rows skipped.
    let mut lines = vec![GOOD, GOOD];
    lines.extend(std::iter::repeat_n("{\"messages\": [", 13));
    let a = common::write_jsonl(&dir, "a.jsonl", &lines);
    let b = common::write_jsonl(&dir, "b.jsonl", &lines);
    let files = g4ft_data::DataFiles::resolve(
        &format!("{}/*.jsonl", dir.display()),
        g4ft_data::SplitChoice::train(None),
        &Default::default(),
    )
    .unwrap();
    let ds = TokenDataset::open_files(&files, Some(&enc), &opts(&dir, true, LabelMode::Auto, 64))
        .unwrap();
    assert_eq!((ds.len(), ds.report().bad_lines.len()), (4, 26));
    let reports: Vec<_> = ds.file_reports().collect();
    let list = dir.join("skipped.jsonl");
    let warnings = g4ft_data::skipped_row_warnings(&reports, Some(&list));
    assert_eq!(
        warnings.len(),
        g4ft_data::prepare::SKIPPED_SHOWN + 2,
        "{warnings:#?}"
    );
    let first = format!(
        "warning: {}:3: skipped (invalid_json): invalid JSON",
        a.display()
    );
    assert!(warnings[0].starts_with(&first), "{}", warnings[0]);
    assert!(
        warnings[19].starts_with(&format!("warning: {}:9:", b.display())),
        "{}",
        warnings[19]
    );
    assert_eq!(
        warnings[20],
        format!(
            "warning: 6 more rows skipped; every skipped row is listed in {}",
            list.display()
        )
    );
    assert!(
        warnings[21].starts_with("warning: 26 of 30 rows were skipped"),
        "{}",
        warnings[21]
    );
    g4ft_data::write_skipped_rows(&reports, &list).unwrap();
    let written: Vec<serde_json::Value> = std::fs::read_to_string(&list)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(written.len(), 26);
    assert_eq!(
        (
            &written[25]["file"],
            &written[25]["line"],
            &written[25]["kind"]
        ),
        (
            &b.display().to_string().into(),
            &15.into(),
            &"invalid_json".into()
        )
    );
}
