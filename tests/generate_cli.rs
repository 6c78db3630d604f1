//! The `generate` example (included from `examples/generate.rs`) on the tiny model `assets/tiny`:
//! each input mode, batching, stop ids, sampling flags, the interactive chat and bad input.
//! Token-level parity with transformers is `crates/generate/tests/parity.rs`; here the example's
//! own logic is checked.

#[allow(dead_code)]
#[path = "../examples/generate.rs"]
mod generate;
#[allow(dead_code)]
#[path = "../examples/merge.rs"]
mod merge;

use std::path::PathBuf;

use candle_core::{DType, Device};
use clap::Parser;
use g4ft::data::Encoder;
use g4ft::gemma4::Gemma4Model;
use g4ft::generate::GenerationConfig;
use g4ft::lora::{attach, save_adapter, InitLoraWeights, LoraConfig, TargetModules};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn tiny() -> String {
    format!("{ROOT}/assets/tiny")
}

/// Runs the example with `flags` (after `--model assets/tiny`) and `stdin`; returns stdout.
fn run(flags: &[&str], stdin: &str) -> anyhow::Result<String> {
    run_model(&tiny(), flags, stdin)
}

/// [`run`] with another `--model`.
fn run_model(model: &str, flags: &[&str], stdin: &str) -> anyhow::Result<String> {
    let argv = ["generate", "--model", model]
        .into_iter()
        .chain(flags.iter().copied());
    let args = generate::Args::try_parse_from(argv)?;
    let mut out = Vec::new();
    generate::run(&args, &mut stdin.as_bytes(), &mut out)?;
    Ok(String::from_utf8(out)?)
}

fn write(name: &str, lines: &[String]) -> String {
    let p = std::env::temp_dir().join(format!("g4ft-generate-{name}-{}.jsonl", std::process::id()));
    std::fs::write(&p, lines.join("\n")).unwrap();
    p.display().to_string()
}

/// The first rows of the sample token file, cut to `lens` tokens (different lengths, all longer
/// than the tiny model's sliding window of 16).
fn token_rows(lens: &[usize]) -> Vec<Vec<u32>> {
    let text = std::fs::read_to_string(format!("{ROOT}/assets/sample/tokens.jsonl")).unwrap();
    text.lines()
        .zip(lens)
        .map(|(l, &n)| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            let ids: Vec<u32> = serde_json::from_value(v["input_ids"].clone()).unwrap();
            ids[..n].to_vec()
        })
        .collect()
}

fn output_ids(stdout: &str) -> Vec<Vec<u32>> {
    stdout
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            serde_json::from_value(v["output_ids"].clone()).unwrap()
        })
        .collect()
}

fn ids_file(name: &str, rows: &[Vec<u32>]) -> String {
    let lines: Vec<String> = rows
        .iter()
        .map(|r| serde_json::json!({"input_ids": r}).to_string())
        .collect();
    write(name, &lines)
}

#[test]
fn batches_of_any_size_give_the_same_tokens_and_stop_ids_stop() {
    let path = ids_file("batch", &token_rows(&[40, 23, 31]));
    let flags = |bs: &'static str| {
        vec![
            "--input-ids",
            &path,
            "--max-new-tokens",
            "10",
            "--ignore-eos",
            "--batch-size",
            bs,
        ]
    };
    let one = output_ids(&run(&flags("1"), "").unwrap());
    let three = output_ids(&run(&flags("3"), "").unwrap());
    assert_eq!(one.len(), 3);
    assert!(one.iter().all(|r| r.len() == 10), "{one:?}");
    assert_eq!(one, three, "left padding must not change a row's tokens");
    // Stopping on the token row 0 produces at step 3: its output ends there, with that token.
    let stop = one[0][3].to_string();
    let out = output_ids(
        &run(
            &[
                "--input-ids",
                &path,
                "--max-new-tokens",
                "10",
                "--stop-ids",
                &stop,
            ],
            "",
        )
        .unwrap(),
    );
    let first = one[0].iter().position(|t| t.to_string() == stop).unwrap();
    assert_eq!(out[0], one[0][..=first], "row 0 stops at the stop id");
    for (got, full) in out.iter().zip(&one).skip(1) {
        let end = full
            .iter()
            .position(|t| t.to_string() == stop)
            .map_or(10, |i| i + 1);
        assert_eq!(got, &full[..end]);
    }
    // bf16 runs the same path and gives the full length.
    let bf16 = output_ids(&run(&[&flags("3")[..], &["--dtype", "bf16"]].concat(), "").unwrap());
    assert!(bf16.iter().all(|r| r.len() == 10));
}

#[test]
fn the_tiny_model_stops_on_eos_and_end_of_turn() {
    let cfg = GenerationConfig::from_model_dir(&PathBuf::from(tiny())).unwrap();
    assert_eq!(cfg.eos_token_ids, vec![1, 106], "<eos> and <turn|>");
}

#[test]
fn prompt_and_chat_render_the_template_and_decode_the_reply() {
    let encoder = Encoder::from_model_dir(&PathBuf::from(tiny())).unwrap();
    let user = |c: &str| generate::message("user", c);
    let prompt_ids =
        generate::chat_prompt(&encoder, &[user("How many words are in: river stone?")]).unwrap();
    let reference = output_ids(
        &run(
            &[
                "--input-ids",
                &ids_file("prompt", std::slice::from_ref(&prompt_ids)),
                "--max-new-tokens",
                "12",
            ],
            "",
        )
        .unwrap(),
    )
    .remove(0);
    let want_text = encoder.tokenizer().decode(&reference, true).unwrap();
    let text = run(
        &[
            "--prompt",
            "How many words are in: river stone?",
            "--max-new-tokens",
            "12",
        ],
        "",
    )
    .unwrap();
    assert_eq!(text, format!("{want_text}\n"));

    // Chat rows: the trailing assistant message is the target, not part of the prompt.
    let chat = [
        serde_json::json!({"messages": [{"role": "user", "content": "How many words are in: river stone?"},
                                         {"role": "assistant", "content": "There are 2 words."}]})
        .to_string(),
        serde_json::json!({"messages": [{"role": "system", "content": "Be brief."},
                                         {"role": "user", "content": "Reverse the word 'river'."}]})
        .to_string(),
    ];
    let out = run(
        &["--chat", &write("chat", &chat), "--max-new-tokens", "12"],
        "",
    )
    .unwrap();
    let lines: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["reply"], serde_json::json!(want_text));
    assert!(["stop", "length"].contains(&lines[1]["finish_reason"].as_str().unwrap()));
}

#[test]
fn sampling_is_seeded_and_top_k_1_is_greedy() {
    let path = ids_file("sample", &token_rows(&[30, 18]));
    let base = [
        "--input-ids",
        path.as_str(),
        "--max-new-tokens",
        "16",
        "--ignore-eos",
    ];
    let with = |extra: &[&str]| output_ids(&run(&[&base[..], extra].concat(), "").unwrap());
    let greedy = with(&["--greedy"]);
    let a = with(&["--temperature", "1.5", "--seed", "7"]);
    assert_eq!(
        a,
        with(&["--temperature", "1.5", "--seed", "7"]),
        "same seed, same tokens"
    );
    assert_ne!(
        a,
        with(&["--temperature", "1.5", "--seed", "8"]),
        "another seed, other tokens"
    );
    assert_ne!(a, greedy);
    assert_eq!(with(&["--top-k", "1", "--seed", "3"]), greedy);
    // The tiny model's generation_config.json does not sample: no flag = greedy.
    assert_eq!(with(&[]), greedy);
}

#[test]
fn interactive_chat_keeps_the_history_and_resets() {
    let out = run(
        &["--interactive", "--max-new-tokens", "6"],
        "Hello\nAnd again?\n/reset\nHi\n\n",
    )
    .unwrap();
    assert_eq!(out.matches("> ").count(), 5, "{out:?}");
    assert_eq!(
        out.lines().count(),
        4,
        "three replies and the last prompt: {out:?}"
    );
}

#[test]
fn bad_input_is_named() {
    let path = write(
        "bad",
        &[
            r#"{"input_ids": [2, 7, 9]}"#.into(),
            r#"{"input_ids": [2, 99999]}"#.into(),
        ],
    );
    let err = format!("{:#}", run(&["--input-ids", &path], "").unwrap_err());
    assert!(err.contains(":2:") && err.contains("99999"), "{err}");
    let path = write(
        "badchat",
        &[r#"{"messages": [{"role": "assistant", "content": "hi"}]}"#.into()],
    );
    let err = format!("{:#}", run(&["--chat", &path], "").unwrap_err());
    assert!(
        err.contains(":1: no message before the assistant reply"),
        "{err}"
    );
    let err = format!(
        "{:#}",
        run(&["--prompt", "x", "--temperature", "0"], "").unwrap_err()
    );
    assert!(err.contains("temperature: must be > 0"), "{err}");
    let err = format!(
        "{:#}",
        run(&["--prompt", "x", "--stop-ids", "600"], "").unwrap_err()
    );
    assert!(err.contains("stop id 600"), "{err}");
    assert!(
        run(&["--prompt", "x", "--greedy", "--top-k", "3"], "").is_err(),
        "conflicting flags"
    );
    assert!(run(&[], "").is_err(), "an input is required");
}

/// `merge` then `generate --model MERGED` gives the tokens of `generate --adapter`; a bf16 merge
/// writes bf16 tensors, says so in config.json and copies the tokenizer and chat template.
#[test]
fn a_merged_model_generates_what_the_adapter_generates() {
    let tmp = std::env::temp_dir().join(format!("g4ft-merge-tiny-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let mut m = Gemma4Model::load(&tiny(), DType::F32, &Device::Cpu).unwrap();
    let mut cfg = LoraConfig::new(
        4,
        32.0,
        TargetModules::Regex(
            r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)".into(),
        ),
    );
    cfg.init_lora_weights = InitLoraWeights::Random;
    attach(&cfg, m.projections_mut(), 17).unwrap();
    let adapter = tmp.join("adapter");
    save_adapter(&adapter, &cfg, m.projections()).unwrap();
    let merge_to = |dir: &str, dtype: Option<&str>| {
        let out = tmp.join(dir);
        let args = merge::Args {
            model: tiny(),
            adapter: adapter.clone(),
            out: out.clone(),
            dtype: dtype.map(str::to_string),
            max_shard_bytes: 200_000,
        };
        let report = merge::run(&args).unwrap();
        assert_eq!(
            report.merged,
            m.projections().filter(|p| p.adapter().is_some()).count()
        );
        out.display().to_string()
    };
    let merged = merge_to("merged", None);

    let path = ids_file("merged", &token_rows(&[33, 20]));
    let flags = [
        "--input-ids",
        path.as_str(),
        "--max-new-tokens",
        "12",
        "--ignore-eos",
    ];
    let adapter_s = adapter.display().to_string();
    let with_adapter =
        output_ids(&run(&[&flags[..], &["--adapter", &adapter_s]].concat(), "").unwrap());
    assert_ne!(
        with_adapter,
        output_ids(&run(&flags, "").unwrap()),
        "the adapter changes the reply"
    );
    assert_eq!(
        output_ids(&run_model(&merged, &flags, "").unwrap()),
        with_adapter
    );
    // The adapter on the model it is merged into would count twice.
    let err = run_model(
        &merged,
        &[&flags[..], &["--adapter", &adapter_s]].concat(),
        "",
    )
    .unwrap_err();
    assert!(
        format!("{err:#}").contains("this adapter is already merged into"),
        "{err:#}"
    );

    let bf16 = PathBuf::from(merge_to("merged-bf16", Some("bf16")));
    assert!(
        bf16.join("model.safetensors.index.json").exists(),
        "sharded"
    );
    for f in [
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "generation_config.json",
    ] {
        assert_eq!(
            std::fs::read(bf16.join(f)).unwrap(),
            std::fs::read(PathBuf::from(tiny()).join(f)).unwrap(),
            "{f} copied"
        );
    }
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(bf16.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["dtype"], "bfloat16");
    for shard in std::fs::read_dir(&bf16).unwrap() {
        let p = shard.unwrap().path();
        if p.extension().is_some_and(|e| e == "safetensors") {
            let ts = candle_core::safetensors::load(&p, &Device::Cpu).unwrap();
            assert!(
                ts.values().all(|t| t.dtype() == DType::BF16),
                "{}",
                p.display()
            );
        }
    }
    let out = output_ids(
        &run_model(
            bf16.to_str().unwrap(),
            &[&flags[..], &["--dtype", "bf16"]].concat(),
            "",
        )
        .unwrap(),
    );
    assert!(out.iter().all(|r| r.len() == 12));
    let _ = std::fs::remove_dir_all(&tmp);
}
