//! Every dataset format: what it trains, and a bad-input case naming the line (or Parquet row
//! and row group) and the field. Parquet files are the ones Hugging Face `datasets` wrote
//! (tools/reference/data/make_parquet_fixtures.py).

mod common;

use std::path::{Path, PathBuf};

use g4ft_data::{DataError, DatasetOptions, Encoder, Format, LabelMode, TokenDataset, IGNORE};
use serde_json::Value;

fn tools_dir() -> PathBuf {
    common::repo().join("tools/reference/data/gemma4-tools")
}

fn parquet(name: &str) -> PathBuf {
    common::repo()
        .join("tools/reference/data/parquet")
        .join(name)
}

fn opts(dir: &Path, mode: LabelMode) -> DatasetOptions {
    common::options(dir, mode)
}

fn open(path: &Path, enc: Option<&Encoder>, o: &DatasetOptions) -> Result<TokenDataset, String> {
    TokenDataset::open(path, enc, o).map_err(|e| e.to_string())
}

/// Decoded text of the trained tokens of sample `i`.
fn trained_text(enc: &Encoder, ds: &TokenDataset, i: usize) -> String {
    let s = ds.sample(i).unwrap();
    let ids: Vec<u32> = s
        .labels
        .iter()
        .filter(|&&l| l != IGNORE)
        .map(|&l| l as u32)
        .collect();
    enc.tokenizer().decode(&ids, false).unwrap()
}

#[test]
fn parquet_chat_rows_match_transformers_on_what_datasets_reads_back() {
    let enc = Encoder::from_model_dir(&tools_dir()).unwrap();
    let dir = common::scratch("fmt-parquet-chat");
    let ds = open(
        &parquet("chat.parquet"),
        Some(&enc),
        &opts(&dir, LabelMode::AssistantOnly),
    )
    .unwrap();
    let cases = common::parquet_chat_cases();
    assert_eq!(ds.len(), cases.len());
    assert_eq!(ds.report().format, Some(Format::Chat));
    for (i, case) in cases.iter().enumerate() {
        common::assert_sample_is(&ds, i, case);
        assert_eq!(ds.line_of(i), i as u64 + 1);
    }
}

#[test]
fn parquet_token_rows_and_bad_rows_name_row_and_row_group() {
    let dir = common::scratch("fmt-parquet-tokens");
    // no tokenizer needed; the row without labels trains every token under `auto`
    let ds = open(
        &parquet("tokens.parquet"),
        None,
        &opts(&dir, LabelMode::Auto),
    )
    .unwrap();
    assert_eq!(ds.len(), 3);
    assert_eq!(ds.sample(0).unwrap().labels, vec![-100, -100, 20, 106]);
    assert_eq!(ds.sample(1).unwrap().labels, vec![2, 30, 31]);
    let err = open(
        &parquet("tokens.parquet"),
        None,
        &opts(&dir, LabelMode::AssistantOnly),
    )
    .unwrap_err();
    assert!(
        err.contains(
            "tokens.parquet: row 2 (row group 0): labels: missing; --labels assistant_only needs"
        ),
        "{err}"
    );
    let enc = Encoder::from_model_dir(&tools_dir()).unwrap();
    let err = open(
        &parquet("bad.parquet"),
        Some(&enc),
        &opts(&dir, LabelMode::Auto),
    )
    .unwrap_err();
    assert!(
        err.contains("bad.parquet: row 4 (row group 1): messages[0].role: unknown role \"bot\""),
        "{err}"
    );
    // a cut file is a parquet error naming the file
    match common::open_cut_copy(&parquet("tokens.parquet"), &dir) {
        (DataError::Parquet { path, .. }, cut) => assert_eq!(path, cut),
        other => panic!("expected a parquet error, got {other:?}"),
    }
}

#[test]
fn sharegpt_trains_like_the_same_chat_and_names_bad_speakers() {
    let enc = Encoder::from_model_dir(&common::tiny()).unwrap();
    let dir = common::scratch("fmt-sharegpt");
    let share = common::write_jsonl(
        &dir,
        "s.jsonl",
        &[
            r#"{"system": "Be brief.", "conversations": [{"from": "human", "value": "What is 2 + 2?"}, {"from": "gpt", "value": "4."}]}"#,
        ],
    );
    let chat = common::write_jsonl(
        &dir,
        "c.jsonl",
        &[
            r#"{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "4."}]}"#,
        ],
    );
    let o = opts(&dir, LabelMode::AssistantOnly);
    let a = open(&share, Some(&enc), &o).unwrap();
    let b = open(&chat, Some(&enc), &o).unwrap();
    assert_eq!(a.report().format, Some(Format::ShareGpt));
    assert_eq!(a.sample(0).unwrap(), b.sample(0).unwrap());
    assert_eq!(trained_text(&enc, &a, 0), "4.<turn|>");
    let bad = common::write_jsonl(
        &dir,
        "b.jsonl",
        &[
            r#"{"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}"#,
            r#"{"conversations": [{"from": "human", "value": "q"}, {"from": "robot", "value": "a"}]}"#,
        ],
    );
    let err = open(&bad, Some(&enc), &o).unwrap_err();
    assert!(
        err.contains("b.jsonl:2: conversations[1].from: unknown speaker \"robot\""),
        "{err}"
    );
}

#[test]
fn prompt_completion_trains_the_completion_only_by_default() {
    let enc = Encoder::from_model_dir(&common::tiny()).unwrap();
    let dir = common::scratch("fmt-pc");
    let path = common::write_jsonl(
        &dir,
        "pc.jsonl",
        &[
            r#"{"prompt": "What is 2 + 2? ", "completion": "It is 4."}"#,
            r#"{"prompt": [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "5?"}, {"role": "user", "content": "Sure?"}], "completion": [{"role": "assistant", "content": "No: 4."}]}"#,
        ],
    );
    let ds = open(&path, Some(&enc), &opts(&dir, LabelMode::Auto)).unwrap();
    assert_eq!(ds.report().format, Some(Format::PromptCompletion));
    // strings: <bos> prompt completion <eos>, the completion and the EOS trained
    let s = ds.sample(0).unwrap();
    assert_eq!(s.input_ids[0], 2);
    assert_eq!(
        *s.input_ids.last().unwrap(),
        106,
        "eos_token <turn|> appended"
    );
    assert_eq!(trained_text(&enc, &ds, 0), "It is 4.<turn|>");
    // messages: only the completion's model turn, not the prompt's assistant message
    assert_eq!(trained_text(&enc, &ds, 1), "No: 4.<turn|>");
    let full = open(&path, Some(&enc), &opts(&dir, LabelMode::Full)).unwrap();
    let s = full.sample(1).unwrap();
    assert!(s
        .labels
        .iter()
        .zip(&s.input_ids)
        .all(|(&l, &i)| l == i as i32));
    let bad = common::write_jsonl(
        &dir,
        "bad.jsonl",
        &[
            r#"{"prompt": "q", "completion": "a"}"#,
            r#"{"prompt": "q", "completion": [{"role": "assistant", "content": "a"}]}"#,
        ],
    );
    let err = open(&bad, Some(&enc), &opts(&dir, LabelMode::Auto)).unwrap_err();
    assert!(
        err.contains(
            "bad.jsonl:2: `prompt` and `completion` must both be strings or both be message lists"
        ),
        "{err}"
    );
}

#[test]
fn text_rows_get_one_bos_and_an_eos_and_train_everything() {
    let enc = Encoder::from_model_dir(&common::tiny()).unwrap();
    let dir = common::scratch("fmt-text");
    let path = common::write_jsonl(
        &dir,
        "t.jsonl",
        &[
            r#"{"text": "Paris is in France."}"#,
            r#"{"text": "<bos>Already has one.<turn|>"}"#,
        ],
    );
    let ds = open(&path, Some(&enc), &opts(&dir, LabelMode::Auto)).unwrap();
    for i in 0..2 {
        let s = ds.sample(i).unwrap();
        assert_eq!(
            s.input_ids.iter().filter(|&&t| t == 2).count(),
            1,
            "one BOS"
        );
        assert_eq!(s.input_ids[0], 2);
        assert_eq!(
            s.input_ids.iter().filter(|&&t| t == 106).count(),
            1,
            "one EOS"
        );
        assert!(s
            .labels
            .iter()
            .zip(&s.input_ids)
            .all(|(&l, &i)| l == i as i32));
    }
    let err = open(&path, Some(&enc), &opts(&dir, LabelMode::AssistantOnly)).unwrap_err();
    assert!(
        err.contains("plain text: it has no assistant turns"),
        "{err}"
    );
    let bad = common::write_jsonl(
        &dir,
        "b.jsonl",
        &[r#"{"text": "ok"}"#, r#"{"text": ["no"]}"#],
    );
    let err = open(&bad, Some(&enc), &opts(&dir, LabelMode::Auto)).unwrap_err();
    assert!(
        err.contains("b.jsonl:2: text: expected a string, got an array"),
        "{err}"
    );
    // without a tokenizer, text is a clear error before any row
    let err = open(&path, None, &opts(&dir, LabelMode::Auto)).unwrap_err();
    assert!(err.contains("is text data: it needs a tokenizer"), "{err}");
}

#[test]
fn a_given_format_wins_over_detection() {
    let enc = Encoder::from_model_dir(&common::tiny()).unwrap();
    let dir = common::scratch("fmt-given");
    let path = common::write_jsonl(
        &dir,
        "x.jsonl",
        &[
            r#"{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "text": "plain words"}"#,
        ],
    );
    let detected = open(&path, Some(&enc), &opts(&dir, LabelMode::Auto)).unwrap();
    let mut o = opts(&dir, LabelMode::Auto);
    o.prepare.format = Some(Format::Text);
    let given = open(&path, Some(&enc), &o).unwrap();
    assert_eq!(detected.report().format, Some(Format::Chat));
    assert_eq!(given.report().format, Some(Format::Text));
    assert_ne!(detected.cache_paths(), given.cache_paths());
    let words = enc
        .tokenizer()
        .decode(&given.sample(0).unwrap().input_ids, false)
        .unwrap();
    assert_eq!(words, "<bos>plain words<turn|>");
}

#[test]
fn every_parquet_codec_reads_the_same_rows() {
    let enc = Encoder::from_model_dir(&tools_dir()).unwrap();
    let dir = common::scratch("fmt-parquet-codecs");
    let o = opts(&dir, LabelMode::AssistantOnly);
    let want = common::samples(&open(&parquet("chat.parquet"), Some(&enc), &o).unwrap());
    assert_eq!(want.len(), 6);
    for codec in ["zstd", "gzip", "lz4", "brotli"] {
        let name = format!("chat_{codec}.parquet");
        let got = open(&parquet(&name), Some(&enc), &o).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(common::samples(&got), want, "{name}");
    }
}

#[test]
fn a_binary_text_column_is_text_and_bytes_that_are_not_utf8_are_a_bad_row() {
    let enc = Encoder::from_model_dir(&common::tiny()).unwrap();
    let dir = common::scratch("fmt-parquet-binary");
    let path = parquet("text_binary.parquet");
    let err = open(&path, Some(&enc), &opts(&dir, LabelMode::Auto)).unwrap_err();
    assert!(
        err.contains(
            "text_binary.parquet: row 3 (row group 0): a binary column holds bytes that are not \
             UTF-8 text"
        ),
        "{err}"
    );
    let mut o = opts(&dir, LabelMode::Auto);
    o.prepare.skip_bad_lines = true;
    let ds = open(&path, Some(&enc), &o).unwrap();
    assert_eq!(ds.len(), 2);
    let text = enc
        .tokenizer()
        .decode(&ds.sample(1).unwrap().input_ids, true)
        .unwrap();
    assert!(text.contains("café au lait"), "{text}");
}

#[test]
fn json_files_as_people_save_them_read_like_the_jsonl() {
    use std::io::Write;
    let enc = Encoder::from_model_dir(&common::tiny()).unwrap();
    let dir = common::scratch("fmt-json-shapes");
    let o = opts(&dir, LabelMode::AssistantOnly);
    let jsonl = std::fs::read_to_string(common::repo().join("assets/sample/chat.jsonl")).unwrap();
    let lines: Vec<&str> = jsonl.lines().take(12).collect();
    let plain = dir.join("plain.jsonl");
    std::fs::write(&plain, lines.join("\n")).unwrap();
    let want = common::samples(&open(&plain, Some(&enc), &o).unwrap());
    assert_eq!(want.len(), 12);
    let rows: Vec<Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(lines.join("\n").as_bytes()).unwrap();
    let variants: [(&str, Vec<u8>); 5] = [
        (
            "bom_crlf.jsonl",
            format!("\u{feff}{}\r\n", lines.join("\r\n")).into_bytes(),
        ),
        ("array.json", serde_json::to_vec(&rows).unwrap()),
        (
            "array_indented.json",
            serde_json::to_vec_pretty(&rows).unwrap(),
        ),
        ("chat.jsonl.gz", gz.finish().unwrap()),
        (
            "chat.jsonl.zst",
            zstd::encode_all(lines.join("\n").as_bytes(), 3).unwrap(),
        ),
    ];
    for (name, bytes) in variants {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        let got = open(&path, Some(&enc), &o).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(common::samples(&got), want, "{name}");
    }
    // An array's rows are located by the line they start on; a broken array by where it breaks.
    let mut bad_rows = rows[..3].to_vec();
    bad_rows[1] = serde_json::json!({"messages": [{"role": "bot", "content": "x"}]});
    let bad = dir.join("bad_row.json");
    std::fs::write(&bad, serde_json::to_vec_pretty(&bad_rows).unwrap()).unwrap();
    let second_line = 1
        + serde_json::to_string_pretty(&rows[0])
            .unwrap()
            .lines()
            .count()
        + 1;
    let err = open(&bad, Some(&enc), &o).unwrap_err();
    assert!(
        err.contains(&format!(
            "bad_row.json:{second_line}: messages[0].role: unknown role"
        )),
        "{err}"
    );
    let broken = dir.join("broken.json");
    std::fs::write(&broken, "[\n  {\"messages\": []},\n  {\"messages\": \n").unwrap();
    let err = open(&broken, Some(&enc), &o).unwrap_err();
    assert!(
        err.contains("broken.json:4: a file that starts with `[` is read as one JSON array"),
        "{err}"
    );
}
