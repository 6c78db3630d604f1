//! The `score` example's logic (included from `examples/score.rs`): the file-level mean NLL equals
//! transformers' loss on the golden batch for any batch size, and bad lines name their number.

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
    let rows = score::read_rows(&path, model.config().vocab_size).unwrap();
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

#[test]
fn bad_lines_name_their_line_number() {
    let cases = [
        (r#"{"input_ids": [2, 5, "x"]}"#, ":2: invalid row"),
        (r#"{"input_ids": []}"#, ":2: input_ids is empty"),
        (
            r#"{"input_ids": [2, 5], "labels": [5]}"#,
            ":2: labels has 1 values",
        ),
        (r#"{"input_ids": [2, 500000]}"#, ":2: token id 500000"),
        (r#"{"ids": [2]}"#, ":2: invalid row"),
        (
            r#"{"messages": [{"role": "user", "content": "hi"}]}"#,
            ":2: invalid row (score reads token rows: tokenize chat or text rows with the `prepare`",
        ),
    ];
    for (i, (bad, want)) in cases.iter().enumerate() {
        let path = write_jsonl(
            &format!("bad{i}"),
            &[r#"{"input_ids": [2, 7, 9]}"#.to_string(), bad.to_string()],
        );
        let err = format!("{:#}", score::read_rows(&path, 128).unwrap_err());
        assert!(err.contains(want), "{bad}: {err}");
    }
    let nothing = [
        r#"{"input_ids": [2]}"#,
        r#"{"input_ids": [2, 7], "labels": [7, -100]}"#,
    ];
    let path = write_jsonl("nothing", &nothing.map(String::from));
    let err = format!("{:#}", score::read_rows(&path, 128).unwrap_err());
    assert!(err.contains("no token to score"), "{err}");
}
