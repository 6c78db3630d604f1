//! The `score` example's logic (included from `examples/score.rs`): the dataset-level mean NLL
//! equals transformers' loss on the golden batch for any batch size, bad rows name their line,
//! and chat rows score as the token rows `prepare` makes of them.

#[allow(dead_code)]
#[path = "../examples/score.rs"]
mod score;

use candle_core::{DType, Device};
use g4ft::gemma4::Gemma4Model;

fn golden_dir() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/gemma4-a-unified-keqv")
}

fn write_jsonl(name: &str, lines: &[String]) -> String {
    let p = std::env::temp_dir().join(format!("g4ft-score-{name}-{}.jsonl", std::process::id()));
    std::fs::write(&p, lines.join("\n")).unwrap();
    p.to_str().unwrap().to_string()
}

#[test]
fn file_loss_matches_transformers_for_every_batch_size() {
    let g = candle_core::safetensors::load(golden_dir().join("golden.safetensors"), &Device::Cpu)
        .unwrap();
    let ids: Vec<Vec<i64>> = g["input_ids"].to_vec2().unwrap();
    let mask: Vec<Vec<i64>> = g["attention_mask"].to_vec2().unwrap();
    let labels: Vec<Vec<i64>> = g["labels"].to_vec2().unwrap();
    let want = g["loss"].to_vec1::<f32>().unwrap()[0] as f64;
    // Rows without their padding; row 0 has explicit labels, row 1 uses the default (= input_ids).
    let mut lines = Vec::new();
    for r in 0..ids.len() {
        let n = mask[r].iter().filter(|&&m| m == 1).count();
        let mut row = serde_json::json!({"input_ids": &ids[r][..n]});
        if labels[r][..n].contains(&-100) {
            row["labels"] = serde_json::json!(&labels[r][..n]);
        }
        lines.push(row.to_string());
    }
    let path = write_jsonl("ok", &lines);
    let model =
        Gemma4Model::load(golden_dir().to_str().unwrap(), DType::F32, &Device::Cpu).unwrap();
    let rows = score::read_rows(&data_args(&path), &golden_dir(), model.config()).unwrap();
    for bs in [1, 2] {
        let (sum, tokens) = score::score(&model, &rows, bs).unwrap();
        let got = sum / tokens as f64;
        assert!(
            (got - want).abs() <= 1e-5 * want,
            "batch size {bs}: {got} vs {want}"
        );
        assert_eq!(
            tokens,
            9 + 8,
            "shifted label tokens: row 0 labels 3..12, row 1 tokens 1..9"
        );
    }
}

/// `score`'s data flags for `path`, everything else at its default.
fn data_args(path: &str) -> score::DataArgs {
    score::DataArgs {
        data: path.to_string(),
        data_split: None,
        data_config: None,
        data_revision: None,
        labels: g4ft::trainer::config::LabelsKind::Auto,
        data_format: None,
        max_len: None,
        skip_bad_lines: false,
    }
}

#[test]
fn a_bad_row_names_its_line_and_skipped_ones_are_not_scored() {
    let model =
        Gemma4Model::load(golden_dir().to_str().unwrap(), DType::F32, &Device::Cpu).unwrap();
    let good = r#"{"input_ids": [2, 7, 9]}"#.to_string();
    let path = write_jsonl(
        "bad",
        &[good.clone(), r#"{"input_ids": [2, 500000]}"#.into()],
    );
    let err = format!(
        "{:#}",
        score::read_rows(&data_args(&path), &golden_dir(), model.config()).unwrap_err()
    );
    assert!(err.contains(&format!("{path}:2: ")), "{err}");
    let args = score::DataArgs {
        skip_bad_lines: true,
        ..data_args(&path)
    };
    let rows = score::read_rows(&args, &golden_dir(), model.config()).unwrap();
    assert_eq!(rows, [(vec![2, 7, 9], vec![2, 7, 9])]);
}

#[test]
fn chat_rows_score_as_the_token_rows_prepare_makes_of_them() {
    let tiny = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("assets/tiny");
    let model = Gemma4Model::load(tiny.to_str().unwrap(), DType::F32, &Device::Cpu).unwrap();
    let chats =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("assets/sample/chat.jsonl");
    let args = score::DataArgs {
        labels: g4ft::trainer::config::LabelsKind::AssistantOnly,
        max_len: Some(64),
        ..data_args(chats.to_str().unwrap())
    };
    let from_chats = score::read_rows(&args, &tiny, model.config()).unwrap();
    // What the `prepare` example writes: the same tokenization, as token rows.
    let encoder = g4ft::data::Encoder::from_model_dir(&tiny).unwrap();
    let opts = g4ft::data::PrepareOptions {
        max_len: 64,
        label_mode: g4ft::data::LabelMode::AssistantOnly,
        ..Default::default()
    };
    let mut lines = Vec::new();
    g4ft::data::tokenize_file(&chats, Some(&encoder), &opts, |_, row| {
        lines.push(
            serde_json::json!({"input_ids": row.input_ids, "labels": row.labels}).to_string(),
        );
        Ok(())
    })
    .unwrap();
    let tokens = write_jsonl("prepared", &lines);
    let from_tokens = score::read_rows(&data_args(&tokens), &tiny, model.config()).unwrap();
    assert_eq!(from_chats.len(), 400);
    assert_eq!(from_chats, from_tokens);
}
