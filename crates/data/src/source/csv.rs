//! CSV and TSV files, read to the rows Hugging Face `datasets` 5.2.0 reads from them: its csv
//! builder runs pandas' `read_csv` with pandas' defaults over chunks of 10,000 rows, turns each
//! chunk into an Arrow table and casts every later chunk to the types of the first.
//!
//! - The first line that is not blank is the header. An empty name becomes `Unnamed: I` (I its
//!   0-based position); a repeated name becomes `name.1`, `name.2`, ... (skipping names the header
//!   already has; named columns are renamed before unnamed ones).
//! - Fields are separated by `,` (`\t` for `.tsv`); a field that starts with `"` is quoted (`""`
//!   inside is one `"`, text after the closing quote is appended); a `"` elsewhere is plain text.
//!   Records end at LF, CRLF or CR outside quotes. Lines that are empty or hold only spaces and
//!   tabs (that are not the separator) are skipped; a separator right after such a line ended by
//!   a lone CR is dropped, as pandas' tokenizer drops it. The file ending inside quotes is an
//!   error.
//! - A row with fewer fields than the header is padded with missing values; one with more is an
//!   error, except that a first row with K more fields than the header makes the first K fields
//!   of every row pandas' row index, which `datasets` keeps as the last columns
//!   `__index_level_0__`, ... (numbers the header's names do not take; a single index of integers
//!   in a constant nonzero step is a range index and is dropped).
//! - An empty field and pandas' default missing-value strings (`NA`, `null`, `NaN`, `N/A`, ...;
//!   exact, quoted or not) are null. Each column of a chunk gets one type: booleans when every
//!   value is `true` or `false` in any letter case; integers when every value is an integer and
//!   none is missing; floats when every value is a number (`1e5`, `.5`, `inf`, ...), or the
//!   column has integers and missing values (read as integers, then made floats: `-0` is `0.0`),
//!   or only missing values; text (each value exactly as written) otherwise. Spaces may stand
//!   around digits, not around `inf` (` inf` is text). Integers past 2^63 are unsigned
//!   64-bit integers when the column has only non-negative integers and no missing value.
//! - Later chunks are cast to the first chunk's types as Arrow casts: a number or boolean into a
//!   text column is its Arrow text (`0042` becomes `42`, `1.50` `1.5`, `True` `true`), a float
//!   into an integer column must be whole, a boolean into a number column is 0 or 1, a number into
//!   a boolean column is whether it is nonzero; text into a number or boolean column is an error.
//!
//! Where `datasets` would give something this reader cannot reproduce exactly, the file is an
//! error naming the line: integers beyond 64 bits, or past 2^63 beside a negative number (`-0`
//! too), a decimal or a missing value (a missing value whatever else the column holds; pandas
//! then reads the column as Python integers, text or floats depending on the other values, and
//! `datasets` refuses some of them), and text in a later chunk that Arrow would parse into a
//! number or boolean column (`datasets` then keeps what Arrow parses; this reader refuses all
//! text there).
//! Types are fixed per file: `datasets` fixes them for a whole split from its first file.

use std::collections::VecDeque;
use std::io::BufRead;
use std::path::{Path, PathBuf};

use minijinja::Value;

use super::{Location, RawRow, TextStream};
use crate::error::{DataError, Result};

/// Rows per chunk (the csv builder's `chunksize`): each chunk's columns are typed on their own.
const CHUNK_ROWS: usize = 10_000;

/// The strings pandas reads as a missing value by default (`keep_default_na`).
const MISSING: [&str; 19] = [
    "", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN",
    "<NA>", "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null",
];

/// The field separator `datasets` reads a file with, from its name: `\t` for `.tsv`, `,` for
/// `.csv`, in either case, as the last extension once a compression one is set aside
/// (`rows.tsv.gz`; not `rows.csv.jsonl`); `None` for other files.
pub fn separator(path: &Path) -> Option<u8> {
    let name = path.file_name()?.to_str()?;
    let (_, extensions) = name.split_once('.')?;
    let mut extensions = extensions.rsplit('.').map(str::to_ascii_lowercase);
    let mut last = extensions.next()?;
    if COMPRESSION.contains(&last.as_str()) {
        last = extensions.next()?;
    }
    match last.as_str() {
        "csv" => Some(b','),
        "tsv" => Some(b'\t'),
        _ => None,
    }
}

/// Extensions of compressed files, set aside to find what they hold.
const COMPRESSION: [&str; 6] = ["gz", "zst", "bz2", "xz", "lz4", "zip"];

/// The rows of a CSV or TSV file, typed chunk by chunk (see the module doc).
pub struct CsvRows {
    path: PathBuf,
    records: Records,
    /// Output columns of the fields, in field order: the index fields first.
    fields: Vec<String>,
    /// How many leading fields are the row index.
    index_fields: usize,
    /// The first chunk's columns (output order: data, then kept index fields) and types.
    schema: Option<Vec<(String, Kind)>>,
    ready: VecDeque<(Location, RawRow)>,
}

impl CsvRows {
    /// Reads the header of `reader` (the file's text, byte order mark skipped).
    pub(crate) fn open(
        path: &Path,
        reader: TextStream,
        sep: u8,
        max_record_bytes: usize,
    ) -> Result<Self> {
        let mut records = Records::new(path, reader, sep, max_record_bytes);
        let Some((_, header)) = records.next()? else {
            return Err(bad(
                path,
                0,
                "the file is empty: a CSV file needs a header line".into(),
            ));
        };
        Ok(CsvRows {
            path: path.to_path_buf(),
            records,
            fields: column_names(header),
            index_fields: 0,
            schema: None,
            ready: VecDeque::new(),
        })
    }

    /// The next row and its location (the line its record starts on); `None` at the end.
    pub(crate) fn next_row(&mut self) -> Result<Option<(Location, RawRow)>> {
        if self.ready.is_empty() {
            self.read_chunk()?;
        }
        Ok(self.ready.pop_front())
    }

    /// Reads the next chunk of rows, types its columns and casts them to the file's schema.
    fn read_chunk(&mut self) -> Result<()> {
        let mut rows: Vec<(u64, Vec<String>)> = Vec::with_capacity(CHUNK_ROWS);
        while rows.len() < CHUNK_ROWS {
            let Some((line, fields)) = self.records.next()? else {
                break;
            };
            if self.schema.is_none() && rows.is_empty() && fields.len() > self.fields.len() {
                // pandas' implicit row index: the first row's extra leading fields.
                self.index_fields = fields.len() - self.fields.len();
                let index = index_names(&self.fields, self.index_fields);
                self.fields.splice(0..0, index);
            }
            if fields.len() > self.fields.len() {
                return Err(bad(
                    &self.path,
                    line,
                    format!(
                        "expected {} fields, saw {} (a separator in a field that is not quoted?)",
                        self.fields.len(),
                        fields.len()
                    ),
                ));
            }
            rows.push((line, fields));
        }
        if rows.is_empty() {
            return Ok(());
        }
        let at = |line: u64, why: String| bad(&self.path, line, why);
        let mut columns: Vec<(usize, Kind)> = Vec::with_capacity(self.fields.len());
        for f in 0..self.fields.len() {
            let cells = rows
                .iter()
                .map(|(line, r)| (*line, r.get(f).map(String::as_str)));
            let kind = column_kind(cells)
                .map_err(|(line, why)| at(line, format!("column `{}`: {why}", self.fields[f])))?;
            columns.push((f, kind));
        }
        // Data columns first, then the index fields, unless they are a range index.
        let range = self.index_fields == 1 && is_range(&rows, columns[0].1);
        columns.rotate_left(self.index_fields);
        if range {
            columns.pop();
        }
        let first_line = rows[0].0;
        let schema = self.schema.get_or_insert_with(|| {
            columns
                .iter()
                .map(|&(f, k)| (self.fields[f].clone(), k))
                .collect()
        });
        if let Some(&(f, _)) = columns
            .iter()
            .find(|(f, _)| !schema.iter().any(|(n, _)| *n == self.fields[*f]))
        {
            return Err(at(
                first_line,
                format!(
                    "the rows from here on have a column `{}` that the first {CHUNK_ROWS} rows \
                     do not have (datasets refuses such a file)",
                    self.fields[f]
                ),
            ));
        }
        let sources: Vec<Option<(usize, Kind)>> = schema
            .iter()
            .map(|(name, _)| {
                columns
                    .iter()
                    .copied()
                    .find(|&(f, _)| self.fields[f] == *name)
            })
            .collect();
        // A row index of several levels keeps one value per level for equal values: its zeros
        // all take the sign of the first one (`-0` then `0` read as `-0.0` twice).
        let first_zero: Vec<Option<f64>> = (0..self.fields.len())
            .map(|f| {
                let kind = columns.iter().find(|c| c.0 == f).map(|c| c.1)?;
                if self.index_fields < 2 || f >= self.index_fields {
                    return None;
                }
                rows.iter()
                    .find_map(|(_, r)| match typed(r.get(f).map(String::as_str), kind) {
                        Cell::Float(x) if x == 0.0 => Some(x),
                        _ => None,
                    })
            })
            .collect();
        for (line, fields) in rows {
            let mut row = Vec::with_capacity(schema.len());
            for ((name, target), source) in schema.iter().zip(&sources) {
                let cell = match source {
                    Some((f, kind)) => match typed(fields.get(*f).map(String::as_str), *kind) {
                        Cell::Float(x) if x == 0.0 => Cell::Float(first_zero[*f].unwrap_or(x)),
                        cell => cell,
                    },
                    None => Cell::Null,
                };
                let value = cast(cell, *target).map_err(|why| {
                    at(
                        line,
                        format!(
                            "column `{name}`: {why}, the type the first {CHUNK_ROWS} rows gave \
                             the column (datasets casts later rows to it)"
                        ),
                    )
                })?;
                row.push((name.clone(), value));
            }
            let loc = Location {
                line,
                row_group: None,
            };
            self.ready
                .push_back((loc, RawRow::Value(Value::from_iter(row))));
        }
        Ok(())
    }
}

fn bad(path: &Path, line: u64, reason: String) -> DataError {
    DataError::BadFile {
        path: path.to_path_buf(),
        line,
        reason,
    }
}

/// The names of `n` index levels: `__index_level_J__` for the smallest numbers J whose names the
/// header does not have (as pyarrow names an unnamed pandas index).
fn index_names(header: &[String], n: usize) -> Vec<String> {
    (0..)
        .map(|j| format!("__index_level_{j}__"))
        .filter(|name| !header.contains(name))
        .take(n)
        .collect()
}

/// The header's names as pandas makes them unique (see the module doc).
fn column_names(header: Vec<String>) -> Vec<String> {
    let unnamed: Vec<bool> = header.iter().map(String::is_empty).collect();
    let mut names: Vec<String> = header
        .into_iter()
        .enumerate()
        .map(|(i, n)| {
            if n.is_empty() {
                format!("Unnamed: {i}")
            } else {
                n
            }
        })
        .collect();
    let order = (0..names.len())
        .filter(|&i| !unnamed[i])
        .chain((0..names.len()).filter(|&i| unnamed[i]));
    let mut counts: std::collections::HashMap<String, usize> = Default::default();
    for i in order.collect::<Vec<_>>() {
        let name = names[i].clone();
        let mut n = counts.get(&name).copied().unwrap_or(0);
        if n > 0 {
            while names.contains(&format!("{name}.{n}")) {
                n += 1;
            }
            counts.insert(name.clone(), n + 1);
            names[i] = format!("{name}.{n}");
            counts.insert(names[i].clone(), 1);
        } else {
            counts.insert(name, 1);
        }
    }
    names
}

/// A column's type in Arrow's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Bool,
    Int,
    UInt,
    Float,
    /// Integers and missing values: pandas reads the integers, then makes them floats (`-0`
    /// becomes `0.0`).
    IntsAsFloat,
    Text,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Bool => "boolean",
            Kind::Int => "integer",
            Kind::UInt => "unsigned integer",
            Kind::Float | Kind::IntsAsFloat => "float",
            Kind::Text => "text",
        }
    }
}

/// How pandas reads one field that is not missing.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Token {
    Bool,
    Int(i64),
    /// Above `i64::MAX`, within `u64`.
    Big,
    /// An integer beyond 64 bits.
    Huge,
    Float,
    Text,
}

/// The whitespace pandas allows around a number (C's `isspace`).
fn is_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\x0b' | '\x0c' | '\r')
}

fn is_missing(field: Option<&str>) -> bool {
    field.is_none_or(|s| MISSING.contains(&s))
}

fn token(s: &str) -> Token {
    if s.eq_ignore_ascii_case("true") || s.eq_ignore_ascii_case("false") {
        return Token::Bool;
    }
    let t = s.trim_matches(is_space);
    let digits = t.strip_prefix(['+', '-']).unwrap_or(t);
    if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        return match (t.parse::<i64>(), t.parse::<u64>()) {
            (Ok(i), _) => Token::Int(i),
            (_, Ok(_)) => Token::Big,
            _ => Token::Huge,
        };
    }
    // pandas allows whitespace around digits only: ` inf` is text.
    if is_float(t) && !(t.len() != s.len() && is_infinity(t)) {
        Token::Float
    } else {
        Token::Text
    }
}

/// `inf` or `infinity` in any letter case, with an optional sign.
fn is_infinity(t: &str) -> bool {
    let t = t.strip_prefix(['+', '-']).unwrap_or(t);
    t.eq_ignore_ascii_case("inf") || t.eq_ignore_ascii_case("infinity")
}

/// pandas' float syntax: a sign, digits with an optional point (a digit on one side of it),
/// an optional exponent; or `inf` / `infinity` in any case.
fn is_float(t: &str) -> bool {
    if is_infinity(t) {
        return true;
    }
    let t = t.strip_prefix(['+', '-']).unwrap_or(t);
    let (mantissa, exponent) = match t.find(['e', 'E']) {
        Some(i) => (&t[..i], Some(&t[i + 1..])),
        None => (t, None),
    };
    let (whole, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let all_digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    let mantissa_ok =
        all_digits(whole) && all_digits(frac) && !(whole.is_empty() && frac.is_empty());
    let exponent_ok = exponent.is_none_or(|e| {
        let e = e.strip_prefix(['+', '-']).unwrap_or(e);
        !e.is_empty() && all_digits(e)
    });
    mantissa_ok && exponent_ok
}

/// A value seen in a column: its line and its text.
type Seen<'a> = (u64, &'a str);

/// The type pandas gives a column of one chunk; `(line, why)` for a column whose values pandas
/// keeps as Python integers (naming the integer and what beside it makes pandas do so).
fn column_kind<'a>(
    cells: impl Iterator<Item = (u64, Option<&'a str>)>,
) -> std::result::Result<Kind, (u64, String)> {
    let (mut bools, mut ints, mut floats, mut text) = (0, 0, 0, false);
    // The first of each kind of value that stops an integer past 2^63 from being read: its line
    // and its text.
    let (mut missing, mut negative, mut decimal) = (None, None, None);
    // The first integer past 2^63 and the first beyond 64 bits.
    let (mut big, mut huge): (Option<Seen>, Option<Seen>) = (None, None);
    for (line, cell) in cells {
        if is_missing(cell) {
            missing.get_or_insert((line, cell.unwrap_or_default()));
            continue;
        }
        let value = cell.unwrap_or_default();
        match token(value) {
            Token::Text => text = true,
            Token::Bool => bools += 1,
            Token::Int(_) => {
                ints += 1;
                // `-0` too: pandas reads no signed text as an unsigned integer.
                if value.trim_matches(is_space).starts_with('-') {
                    negative.get_or_insert((line, value));
                }
            }
            Token::Big => {
                ints += 1;
                big.get_or_insert((line, value));
            }
            Token::Huge => {
                ints += 1;
                huge.get_or_insert((line, value));
            }
            Token::Float => {
                floats += 1;
                decimal.get_or_insert((line, value));
            }
        }
    }
    let python_ints = |(line, value): (u64, &str), why: String| {
        Err((
            line,
            format!(
                "the integer {value:?} {why}; pandas keeps such integers as Python objects, \
                 which are not read here"
            ),
        ))
    };
    let beside = |what: &str, (line, value): (u64, &str)| {
        format!("is past 2^63 and line {line} holds {what} {value:?}")
    };
    // A missing value beside them becomes text or a float in `datasets`, whatever else the
    // column holds.
    if let (Some(at), Some(m)) = (big.or(huge), missing) {
        return python_ints(at, beside("the missing value", m));
    }
    if text {
        return Ok(Kind::Text);
    }
    if bools > 0 {
        return Ok(if ints + floats == 0 {
            Kind::Bool
        } else {
            Kind::Text
        });
    }
    if let Some(at) = huge {
        return python_ints(at, "is beyond 64 bits".into());
    }
    if let Some(at) = big {
        return match (negative, decimal) {
            (Some(n), _) => python_ints(at, beside("the negative number", n)),
            (_, Some(d)) => python_ints(at, beside("the decimal", d)),
            (None, None) => Ok(Kind::UInt),
        };
    }
    Ok(match (ints, floats, missing) {
        (_, 0, None) if ints > 0 => Kind::Int,
        (_, 0, Some(_)) if ints > 0 => Kind::IntsAsFloat,
        _ => Kind::Float,
    })
}

/// Whether the single index field of `rows` is a range index pandas drops: integers, at least
/// two, in a constant nonzero step that stays within 64 bits.
fn is_range(rows: &[(u64, Vec<String>)], kind: Kind) -> bool {
    if kind != Kind::Int || rows.len() < 2 {
        return false;
    }
    let value = |r: &(u64, Vec<String>)| match typed(r.1.first().map(String::as_str), kind) {
        Cell::Int(i) => i128::from(i),
        _ => unreachable!("an integer column has integers"),
    };
    let values: Vec<i128> = rows.iter().map(value).collect();
    let step = values[1] - values[0];
    let stop = values[values.len() - 1] + step;
    step != 0 && values.windows(2).all(|w| w[1] - w[0] == step) && i64::try_from(stop).is_ok()
}

/// A field's value in its chunk's column type.
#[derive(Debug, Clone, PartialEq)]
enum Cell {
    Null,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    Text(String),
}

fn typed(field: Option<&str>, kind: Kind) -> Cell {
    let Some(s) = field.filter(|s| !MISSING.contains(s)) else {
        return Cell::Null;
    };
    let number = s.trim_matches(is_space);
    match kind {
        Kind::Text => Cell::Text(s.to_string()),
        Kind::Bool => Cell::Bool(s.eq_ignore_ascii_case("true")),
        Kind::Int => Cell::Int(number.parse().expect("an integer column holds integers")),
        Kind::UInt => Cell::UInt(number.parse().expect("an unsigned column holds integers")),
        Kind::Float => Cell::Float(number.parse().expect("a float column holds numbers")),
        Kind::IntsAsFloat => {
            Cell::Float(number.parse::<i64>().expect("the column holds integers") as f64)
        }
    }
}

/// `cell` cast to `target` as Arrow's safe cast does; the error says what could not be cast.
fn cast(cell: Cell, target: Kind) -> std::result::Result<Value, String> {
    let fail = |what: String| Err(format!("{what} cannot be read as {}", target.name()));
    Ok(match (cell, target) {
        (Cell::Null, _) => Value::from(()),
        (Cell::Text(s), Kind::Text) => Value::from(s),
        (Cell::Text(s), _) => return fail(format!("the text {s:?}")),
        (Cell::Bool(b), Kind::Bool) => Value::from(b),
        (Cell::Bool(b), Kind::Text) => Value::from(if b { "true" } else { "false" }),
        (Cell::Bool(b), Kind::Int) => Value::from(i64::from(b)),
        (Cell::Bool(b), Kind::UInt) => Value::from(u64::from(b)),
        (Cell::Bool(b), Kind::Float | Kind::IntsAsFloat) => Value::from(f64::from(u8::from(b))),
        (Cell::Int(i), Kind::Int) => Value::from(i),
        (Cell::Int(i), Kind::UInt) => match u64::try_from(i) {
            Ok(u) => Value::from(u),
            Err(_) => return fail(format!("the integer {i}")),
        },
        (Cell::UInt(u), Kind::UInt) => Value::from(u),
        (Cell::UInt(u), Kind::Int) => match i64::try_from(u) {
            Ok(i) => Value::from(i),
            Err(_) => return fail(format!("the integer {u}")),
        },
        (Cell::Int(i), Kind::Text) => Value::from(i.to_string()),
        (Cell::UInt(u), Kind::Text) => Value::from(u.to_string()),
        (Cell::Int(i), Kind::Bool) => Value::from(i != 0),
        (Cell::UInt(u), Kind::Bool) => Value::from(u != 0),
        (Cell::Int(i), Kind::Float | Kind::IntsAsFloat) if i.unsigned_abs() <= 1 << 53 => {
            Value::from(i as f64)
        }
        (Cell::UInt(u), Kind::Float | Kind::IntsAsFloat) if u <= 1 << 53 => Value::from(u as f64),
        (Cell::Int(i), Kind::Float | Kind::IntsAsFloat) => return fail(format!("the integer {i}")),
        (Cell::UInt(u), Kind::Float | Kind::IntsAsFloat) => {
            return fail(format!("the integer {u}"))
        }
        (Cell::Float(x), Kind::Float | Kind::IntsAsFloat) => Value::from(x),
        (Cell::Float(x), Kind::Text) => Value::from(arrow_float_text(x)),
        (Cell::Float(x), Kind::Bool) => Value::from(x != 0.0),
        (Cell::Float(x), Kind::Int)
            if x.fract() == 0.0 && x >= -(2f64.powi(63)) && x < 2f64.powi(63) =>
        {
            Value::from(x as i64)
        }
        (Cell::Float(x), Kind::UInt) if x.fract() == 0.0 && x >= 0.0 && x < 2f64.powi(64) => {
            Value::from(x as u64)
        }
        (Cell::Float(x), _) => return fail(format!("the float {x}")),
    })
}

/// A float as Arrow casts it to text: the shortest digits that read back to it, in positional
/// notation for decimal exponents -6 to 9 (`0.000001`, `123456789.125`, `2`), else in scientific
/// notation (`1e-7`, `1.5e+10`); `inf`, `-inf`, `-0`.
fn arrow_float_text(x: f64) -> String {
    if x.is_infinite() {
        return if x > 0.0 { "inf" } else { "-inf" }.into();
    }
    if x == 0.0 {
        return if x.is_sign_negative() { "-0" } else { "0" }.into();
    }
    let (digits, exp) = shortest_digits(x.abs());
    let mantissa = match digits.split_at(1) {
        (first, "") => first.to_string(),
        (first, rest) => format!("{first}.{rest}"),
    };
    let sign = if x < 0.0 { "-" } else { "" };
    if (-6..10).contains(&exp) {
        let text = if exp < 0 {
            format!("0.{}{digits}", "0".repeat((-exp - 1) as usize))
        } else {
            let point = exp as usize + 1;
            let padded = format!("{digits:0<point$}");
            match padded.split_at(point) {
                (whole, "") => whole.to_string(),
                (whole, frac) => format!("{whole}.{frac}"),
            }
        };
        return format!("{sign}{text}");
    }
    let exp_sign = if exp > 0 { "+" } else { "-" };
    format!("{sign}{mantissa}e{exp_sign}{}", exp.abs())
}

/// The shortest decimal digits that read back to `x` (> 0) and its decimal exponent; of two
/// such digit strings equally close to `x`, the one ending in an even digit, as Arrow writes it
/// (Rust's `{:e}` takes the upper one).
fn shortest_digits(x: f64) -> (String, i32) {
    let split = |sci: &str| {
        let (mantissa, exp) = sci.split_once('e').expect("{:e} has an exponent");
        let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
        (digits, exp.parse::<i32>().expect("{:e} exponent"))
    };
    let (digits, exp) = split(&format!("{x:e}"));
    // Every f64 has at most 767 significant decimal digits: this is its exact value.
    let (exact, exact_exp) = split(&format!("{x:.767e}"));
    let n = digits.len();
    let tie = exact_exp == exp
        && exact.as_bytes()[n] == b'5'
        && exact.as_bytes()[n + 1..].iter().all(|&d| d == b'0');
    let below = &exact[..n];
    if tie && (below.as_bytes()[n - 1] - b'0').is_multiple_of(2) {
        return (below.to_string(), exp);
    }
    (digits, exp)
}

/// The records of a CSV text: fields split and unquoted, blank and whitespace-only lines skipped.
struct Records {
    path: PathBuf,
    reader: TextStream,
    sep: u8,
    max_bytes: usize,
    /// The line of the next byte (1-based).
    line: u64,
    after_cr: bool,
    /// A skipped line just ended with CR: a separator next is dropped, as pandas' tokenizer
    /// drops it (it takes the byte after such a CR as the LF of a CRLF or a separator).
    drop_separator: bool,
}

/// Where the tokenizer is within a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Before a record: blank lines are skipped here.
    RecordStart,
    /// Spaces and tabs at the start of a line (skipped if the line ends).
    Whitespace,
    FieldStart,
    Unquoted,
    Quoted,
    /// A quote inside a quoted field: the closing one, or the first of `""`.
    QuoteInQuoted,
}

impl Records {
    fn new(path: &Path, reader: TextStream, sep: u8, max_bytes: usize) -> Self {
        Records {
            path: path.to_path_buf(),
            reader,
            sep,
            max_bytes,
            line: 1,
            after_cr: false,
            drop_separator: false,
        }
    }

    /// The next record and the line it starts on; `None` at the end of the text.
    fn next(&mut self) -> Result<Option<(u64, Vec<String>)>> {
        let mut state = State::RecordStart;
        let (mut start, mut quote_line, mut size) = (self.line, self.line, 0usize);
        let mut fields: Vec<Vec<u8>> = Vec::new();
        let mut field: Vec<u8> = Vec::new();
        loop {
            let buf = self
                .reader
                .fill_buf()
                .map_err(|e| DataError::io(&self.path, e))?;
            if buf.is_empty() {
                match state {
                    State::RecordStart | State::Whitespace => return Ok(None),
                    State::Quoted => {
                        return Err(bad(
                            &self.path,
                            quote_line,
                            "the file ends inside the quoted field that starts here (a \" \
                             without its closing \")"
                                .into(),
                        ))
                    }
                    _ => {
                        fields.push(field);
                        return self.record(start, fields).map(Some);
                    }
                }
            }
            let mut used = 0;
            let mut done = false;
            for &b in buf {
                used += 1;
                size += 1;
                let newline = b == b'\n' || b == b'\r';
                let line = self.line;
                if newline && !(b == b'\n' && self.after_cr) {
                    self.line += 1;
                }
                self.after_cr = b == b'\r';
                if std::mem::take(&mut self.drop_separator) && b == self.sep {
                    continue;
                }
                let blank = (b == b' ' || b == b'\t') && b != self.sep;
                if state == State::Whitespace && !newline && !blank {
                    state = State::Unquoted; // the spaces open a field
                }
                match state {
                    State::RecordStart if newline => {
                        self.drop_separator = b == b'\r';
                        size = 0;
                    }
                    State::RecordStart if blank => {
                        start = line;
                        field.push(b);
                        state = State::Whitespace;
                    }
                    State::Whitespace if newline => {
                        field.clear();
                        size = 0;
                        self.drop_separator = b == b'\r';
                        state = State::RecordStart;
                    }
                    State::Whitespace => field.push(b),
                    State::Quoted if b == b'"' => state = State::QuoteInQuoted,
                    State::Quoted => field.push(b),
                    State::QuoteInQuoted if b == b'"' => {
                        field.push(b);
                        state = State::Quoted;
                    }
                    _ => {
                        if state == State::RecordStart {
                            start = line;
                        }
                        if b == self.sep {
                            fields.push(std::mem::take(&mut field));
                            state = State::FieldStart;
                        } else if newline {
                            fields.push(std::mem::take(&mut field));
                            done = true;
                            break;
                        } else if b == b'"'
                            && matches!(state, State::RecordStart | State::FieldStart)
                        {
                            quote_line = line;
                            state = State::Quoted;
                        } else {
                            field.push(b);
                            state = State::Unquoted;
                        }
                    }
                }
            }
            self.reader.consume(used);
            if done {
                return self.record(start, fields).map(Some);
            }
            if size > self.max_bytes && state != State::RecordStart {
                return Err(bad(
                    &self.path,
                    start,
                    format!(
                        "the record that starts here is longer than {} bytes (--max-line-bytes); \
                         a quoted field without its closing \"?",
                        self.max_bytes
                    ),
                ));
            }
        }
    }

    /// A record's fields as text; bytes that are not UTF-8 make the file an error (pandas reads
    /// it as UTF-8 text).
    fn record(&self, line: u64, fields: Vec<Vec<u8>>) -> Result<(u64, Vec<String>)> {
        let fields = fields
            .into_iter()
            .map(|f| String::from_utf8(f).map_err(|e| e.utf8_error()))
            .collect::<std::result::Result<Vec<String>, _>>()
            .map_err(|e| {
                bad(
                    &self.path,
                    line,
                    format!("invalid UTF-8 ({e}): a CSV file must be UTF-8 text"),
                )
            })?;
        Ok((line, fields))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_read_as_arrow_writes_them() {
        let cases = [
            (2.0, "2"),
            (1.5, "1.5"),
            (1e20, "1e+20"),
            (1e16, "1e+16"),
            (123456789.125, "123456789.125"),
            (1234567890.0, "1234567890"),
            (12345678901.0, "1.2345678901e+10"),
            (1e-6, "0.000001"),
            (1.25e-6, "0.00000125"),
            (1e-7, "1e-7"),
            (-1.5e-10, "-1.5e-10"),
            (-0.0, "-0"),
            (f64::NEG_INFINITY, "-inf"),
        ];
        for (x, want) in cases {
            assert_eq!(arrow_float_text(x), want, "{x:e}");
        }
    }

    #[test]
    fn names_are_made_unique_as_pandas_makes_them() {
        let names = |h: &[&str]| column_names(h.iter().map(|s| s.to_string()).collect());
        assert_eq!(names(&["a", "a", "a.1", "a"]), ["a", "a.2", "a.1", "a.3"]);
        assert_eq!(
            names(&["", "Unnamed: 0", ""]),
            ["Unnamed: 0.1", "Unnamed: 0", "Unnamed: 2"]
        );
    }
}
