//! CSV and TSV files read as Hugging Face `datasets` 5.2.0 reads them: every file of
//! tools/reference/data/csv must give the rows, column names and types `datasets` gave
//! (tools/reference/data/make_csv_fixtures.py wrote both), or be refused where `datasets`
//! refused it; CSV prompt/completion rows train as the same rows in JSONL do.

mod common;

use std::path::{Path, PathBuf};

use g4ft_data::files::{resolve_local, splits, SplitChoice};
use g4ft_data::source::{RawRow, Source, DEFAULT_MAX_LINE_BYTES};
use g4ft_data::{Encoder, LabelMode, TokenDataset};
use minijinja::value::{Value, ValueKind};

/// Files `datasets` reads but g4ft-data refuses, and why (`source::csv`'s module doc).
const REFUSED_HERE: [(&str, &str); 6] = [
    (
        "u64_and_negative.csv",
        "pandas keeps the integers as Python objects; datasets: text",
    ),
    (
        "u64_and_negative_zero.csv",
        "`-0` is signed text beside an integer past 2^63; datasets: text",
    ),
    (
        "u64_text_and_missing.csv",
        "an integer past 2^63 and a missing value in a text column; datasets: text, the missing \
         value null here but \"\" when the column holds more large integers",
    ),
    (
        "u64_and_float.csv",
        "pandas keeps the integers as Python objects; datasets: floats",
    ),
    (
        "u64_and_missing.csv",
        "datasets gives the integer as text and the missing value as \"\"",
    ),
    (
        "chunk_bool_then_text_bool.csv.gz",
        "Arrow parses the second chunk's text `True`, `1` into the boolean column",
    ),
];

fn csv_dir() -> PathBuf {
    common::repo().join("tools/reference/data/csv")
}

/// The fixture cases, parsed keeping the order of keys (column order).
fn cases() -> Vec<Value> {
    let path = common::repo().join("tools/reference/data/csv_fixtures.json");
    let all: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    all.get_attr("cases").unwrap().try_iter().unwrap().collect()
}

fn text(v: &Value) -> String {
    v.as_str().unwrap().to_string()
}

/// Every row of `path` with the line it starts on, or the error that stopped the reading.
fn read(path: &Path) -> Result<Vec<(u64, Value)>, String> {
    let mut source = Source::open(path, DEFAULT_MAX_LINE_BYTES).map_err(|e| e.to_string())?;
    let mut rows = Vec::new();
    while let Some((loc, raw)) = source.next_row().map_err(|e| e.to_string())? {
        match raw {
            RawRow::Value(v) => rows.push((loc.line, v)),
            other => panic!("{}: a CSV row is a value, got {other:?}", path.display()),
        }
    }
    Ok(rows)
}

/// A row as `name=type:value` items in column order; `floats` names the float64 columns, whose
/// infinite values the fixtures write as "inf" / "-inf".
fn canonical(row: &Value, floats: &[String]) -> Vec<String> {
    row.try_iter()
        .unwrap()
        .map(|key| {
            let v = row.get_item(&key).unwrap();
            let name = key.as_str().unwrap().to_string();
            let value = match v.kind() {
                ValueKind::None => "null".to_string(),
                ValueKind::Bool => format!("bool:{v}"),
                ValueKind::Number if v.is_integer() => format!("int:{v}"),
                ValueKind::Number => format!("float:{:?}", f64::try_from(v).unwrap()),
                ValueKind::String if floats.contains(&name) => {
                    format!("float:{:?}", v.as_str().unwrap().parse::<f64>().unwrap())
                }
                ValueKind::String => format!("str:{:?}", v.as_str().unwrap()),
                other => panic!("{name}: {other:?}"),
            };
            format!("{name}={value}")
        })
        .collect()
}

#[test]
fn every_file_reads_as_datasets_reads_it() {
    let cases = cases();
    assert!(cases.len() >= 70, "{}", cases.len());
    let mut compared = 0;
    for case in &cases {
        let file = text(&case.get_attr("file").unwrap());
        let got = read(&csv_dir().join(&file));
        let refused_here = REFUSED_HERE.iter().find(|(f, _)| *f == file);
        let error = case.get_attr("error").unwrap();
        if !error.is_undefined() {
            // A file without data rows: datasets refuses the empty split; here it has no rows.
            let no_rows = matches!(&got, Ok(rows) if rows.is_empty());
            assert!(
                got.is_err() || no_rows,
                "{file}: datasets refused it ({error}): {got:?}"
            );
            continue;
        }
        if let Some((_, why)) = refused_here {
            let err = got.expect_err(&file);
            assert!(err.contains(&file), "{file}: {err} ({why})");
            continue;
        }
        let got = got.unwrap_or_else(|e| panic!("{file}: datasets reads it, here: {e}"));
        let features = case.get_attr("features").unwrap();
        let columns: Vec<String> = features.try_iter().unwrap().map(|k| text(&k)).collect();
        let floats: Vec<String> = columns
            .iter()
            .filter(|c| text(&features.get_attr(c).unwrap()) == "float64")
            .cloned()
            .collect();
        let mut want = Vec::new();
        for run in case.get_attr("rows").unwrap().try_iter().unwrap() {
            let count = usize::try_from(run.get_item_by_index(0).unwrap()).unwrap();
            let row = canonical(&run.get_item_by_index(1).unwrap(), &floats);
            want.extend(std::iter::repeat_n(row, count));
        }
        assert_eq!(got.len(), want.len(), "{file}: rows");
        for (i, ((line, row), want)) in got.iter().zip(&want).enumerate() {
            let keys: Vec<String> = row.try_iter().unwrap().map(|k| text(&k)).collect();
            assert_eq!(keys, columns, "{file}: row {i} (line {line}): columns");
            assert_eq!(
                &canonical(row, &floats),
                want,
                "{file}: row {i} (line {line})"
            );
        }
        compared += 1;
    }
    assert!(compared >= 50, "{compared}");
    for (file, _) in REFUSED_HERE {
        assert!(
            cases
                .iter()
                .any(|c| text(&c.get_attr("file").unwrap()) == file),
            "{file}"
        );
    }
}

#[test]
fn rows_are_located_by_the_line_they_start_on_and_errors_name_it() {
    let lines = |file: &str| -> Vec<u64> {
        read(&csv_dir().join(file))
            .unwrap()
            .iter()
            .map(|(l, _)| *l)
            .collect()
    };
    // Quoted newlines (LF, CRLF, blank lines) inside records; lone CRs; skipped blank lines.
    assert_eq!(lines("quoting.csv"), [2, 4, 5, 6]);
    assert_eq!(lines("cr.csv"), [2, 3]);
    assert_eq!(lines("blank_lines.csv"), [5, 8]);
    let errors = [
        (
            "long_row_later.csv",
            ":3: expected 2 fields, saw 3 (a separator in a field",
        ),
        (
            "unterminated_quote.csv",
            ":3: the file ends inside the quoted field",
        ),
        ("invalid_utf8.csv", ":3: invalid UTF-8"),
        (
            "int_past_u64.csv",
            ":2: column `a`: the integer \"99999999999999999999\" is beyond 64 bits",
        ),
        (
            "u64_and_negative_zero.csv",
            ":3: column `a`: the integer \"9223372036854775808\" is past 2^63 and line 2 holds \
             the negative number \"-0\"",
        ),
        (
            "chunk_int_then_text.csv.gz",
            ":10002: column `a`: the text \"x\" cannot be read as integer, the type the first \
             10000 rows gave",
        ),
    ];
    for (file, want) in errors {
        let e = read(&csv_dir().join(file)).unwrap_err();
        assert!(e.contains(&format!("{file}{want}")), "{e}");
    }
    // A record longer than the line limit (a quote left open) stops the reading early.
    let dir = common::scratch("csv-long-record");
    let path = dir.join("open_quote.csv");
    std::fs::write(&path, format!("text\nok\n\"{}\n", "x".repeat(3 << 20))).unwrap();
    let mut source = Source::open(&path, 1 << 20).unwrap();
    let e = source.next_row().unwrap_err().to_string();
    assert!(
        e.contains("open_quote.csv:3: the record that starts here is longer than 1048576 bytes"),
        "{e}"
    );
}

#[test]
fn prompt_completion_csv_trains_as_the_same_rows_in_jsonl() {
    let dir = common::scratch("csv-prompt-completion");
    let (enc, opts) = (
        Encoder::from_model_dir(&common::tiny()).unwrap(),
        common::options(&dir, LabelMode::Auto),
    );
    // The rows datasets read from the CSV, written as JSONL.
    let case = cases()
        .into_iter()
        .find(|c| text(&c.get_attr("file").unwrap()) == "prompt_completion.csv")
        .unwrap();
    let lines: Vec<String> = case
        .get_attr("rows")
        .unwrap()
        .try_iter()
        .unwrap()
        .map(|run| serde_json::to_string(&run.get_item_by_index(1).unwrap()).unwrap())
        .collect();
    let jsonl = dir.join("rows.jsonl");
    std::fs::write(&jsonl, lines.join("\n") + "\n").unwrap();
    let csv = csv_dir().join("prompt_completion.csv");
    let from_json = TokenDataset::open(&jsonl, Some(&enc), &opts).unwrap();
    let from_csv = TokenDataset::open(&csv, Some(&enc), &opts).unwrap();
    assert_eq!(from_csv.len(), 3);
    assert_eq!(common::samples(&from_csv), common::samples(&from_json));
    assert_eq!(
        from_csv.report().format.unwrap().as_str(),
        "prompt_completion"
    );
    assert_eq!((from_csv.line_of(1), from_csv.line_of(2)), (3, 4));
    // A folder of CSV shards is one dataset, the shards' rows in order; so is a glob of TSVs.
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::copy(&csv, data.join("part-0.csv")).unwrap();
    std::fs::copy(&csv, data.join("part-1.csv")).unwrap();
    let files = resolve_local(data.to_str().unwrap(), SplitChoice::train(None))
        .unwrap()
        .unwrap();
    let both = TokenDataset::open_files(&files, Some(&enc), &opts).unwrap();
    let twice = [common::samples(&from_json), common::samples(&from_json)].concat();
    assert_eq!(common::samples(&both), twice);
    let tsv = std::fs::read_to_string(&csv)
        .unwrap()
        .replacen(',', "\t", 1);
    std::fs::write(dir.join("rows.tsv"), tsv.replace("\",\"", "\"\t\"")).unwrap();
    let glob = format!("{}/*.tsv", dir.display());
    let files = resolve_local(&glob, SplitChoice::train(None))
        .unwrap()
        .unwrap();
    let from_tsv = TokenDataset::open_files(&files, Some(&enc), &opts).unwrap();
    assert_eq!(common::samples(&from_tsv), common::samples(&from_json));
    // A text field datasets reads as a number is a bad row, as it is in TRL.
    std::fs::write(dir.join("numbers.csv"), "text\n1.5\n2\n").unwrap();
    let err = TokenDataset::open(&dir.join("numbers.csv"), Some(&enc), &opts).unwrap_err();
    assert!(
        err.to_string()
            .contains("numbers.csv:2: text: expected a string, got"),
        "{err}"
    );
}

#[test]
fn csv_splits_need_one_separator_and_no_card_options() {
    let names = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let got = splits(
        &names(&["a.csv", "b.csv.gz"]),
        None,
        SplitChoice::train(None),
    )
    .unwrap();
    assert_eq!(
        got.splits,
        [("train".to_string(), names(&["a.csv", "b.csv.gz"]))]
    );
    let err = splits(&names(&["a.csv", "b.tsv"]), None, SplitChoice::train(None)).unwrap_err();
    assert!(
        err.contains("split `train` has both .csv and .tsv files (a.csv, b.tsv)"),
        "{err}"
    );
    let card = "---\nconfigs:\n- config_name: default\n  data_files: '*.csv'\n  sep: ';'\n---\n";
    let err = splits(&names(&["a.csv"]), Some(card), SplitChoice::train(None)).unwrap_err();
    assert!(
        err.contains("the dataset card sets sep for datasets' csv builder"),
        "{err}"
    );
}

#[test]
fn a_csv_and_a_tsv_of_one_content_and_stem_are_two_caches() {
    let dir = common::scratch("csv-tsv-cache");
    let content = "text\nhello,world\tfoo\n";
    std::fs::write(dir.join("d.csv"), content).unwrap();
    std::fs::write(dir.join("d.tsv"), content).unwrap();
    let enc = Encoder::from_model_dir(&common::tiny()).unwrap();
    let opts = common::options(&dir, LabelMode::Auto);
    let ids = |name: &str| {
        let ds = TokenDataset::open(&dir.join(name), Some(&enc), &opts).unwrap();
        ds.sample(0).unwrap().input_ids
    };
    // Read with `,` the text is `world\tfoo` (`hello` is the row index); with a tab, `foo`.
    let (csv, tsv) = (ids("d.csv"), ids("d.tsv"));
    assert_ne!(csv, tsv);
    assert_eq!(tsv, ids("d.tsv"), "the second open reads the cache");
}

#[test]
fn blank_lines_before_a_record_do_not_count_toward_its_size() {
    let dir = common::scratch("csv-blank-size");
    let path = dir.join("blanks.csv");
    std::fs::write(&path, format!("text\n{}hello\n", "  \n".repeat(200))).unwrap();
    let mut source = Source::open(&path, 100).unwrap();
    let (loc, _) = source.next_row().unwrap().unwrap();
    assert_eq!(loc.line, 202);
}
