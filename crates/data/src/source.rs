//! Data files as streams of raw rows with their location: JSONL (one JSON object per line), a
//! JSON array of row objects (what `json.dump(rows)` and `Dataset.to_json(lines=False)` write),
//! Parquet (as Hugging Face `datasets` exports it: one column per field, nested lists and
//! structs), Arrow IPC ([`arrow`]: `save_to_disk` shards, `.arrow` files), or CSV / TSV
//! ([`csv`]). A `.csv` or `.tsv` extension makes a file CSV (its content cannot
//! tell); the other kinds are read from the content, not the name: the Parquet magic bytes
//! `PAR1`, Arrow's (`ARROW1`, or a stream's first continuation marker), gzip's and zstd's magic
//! bytes (the text is decompressed on the fly, CSV too), then a leading UTF-8 byte order mark is
//! skipped and a first `[` makes the file an array.
//!
//! JSONL lines are bounded in size before they are parsed: a line longer than `max_line_bytes`
//! is skipped through without being held in memory and reported as a bad row. Parquet rows are
//! read row group by row group through the `parquet` crate's record API (no Arrow) and become
//! the same JSON-like values a JSONL line parses to, absent struct fields as null (as `datasets`
//! returns them).

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use minijinja::Value;
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::reader::RowIter;
use parquet::record::Field;

use crate::error::{DataError, Result, RowError, SkipReason};

pub mod arrow;
pub mod csv;

pub use arrow::ArrowRows;
pub use csv::CsvRows;

/// Default bound on one JSONL line (bytes).
pub const DEFAULT_MAX_LINE_BYTES: usize = 16 << 20;

/// Where a row is in its file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Location {
    /// 1-based JSONL line, 1-based line a CSV record starts on, or 1-based Parquet or Arrow row.
    pub line: u64,
    /// 0-based Parquet row group or Arrow record batch; `None` for JSON and CSV.
    pub row_group: Option<u64>,
}

/// A row as read: JSONL text still to parse (in parallel), a Parquet, Arrow or CSV row already
/// converted, or a row-level failure.
#[derive(Debug)]
pub enum RawRow {
    /// One non-blank JSONL line.
    Json(String),
    /// One Parquet, Arrow or CSV row.
    Value(Value),
    /// A line too long or not UTF-8.
    Bad(RowError),
}

/// The rows of one data file, in file order.
pub enum Source {
    /// A JSONL file.
    Jsonl(JsonlRows),
    /// A JSON array of rows.
    JsonArray(ArrayRows),
    /// A Parquet file.
    Parquet(ParquetRows),
    /// An Arrow IPC file or stream.
    Arrow(ArrowRows),
    /// A CSV or TSV file.
    Csv(CsvRows),
}

/// The first bytes of `path`, as many as the longest magic (Arrow's `ARROW1`).
pub(super) fn first_bytes(path: &Path) -> Result<Vec<u8>> {
    let mut magic = Vec::with_capacity(6);
    File::open(path)
        .and_then(|f| f.take(6).read_to_end(&mut magic))
        .map_err(|e| DataError::io(path, e))?;
    Ok(magic)
}

/// A text stream: the file itself or its decompressed content.
pub(crate) type TextStream = BufReader<Box<dyn Read + Send>>;

impl Source {
    /// Opens `path` by its extension (CSV) or content (see the module doc); `max_line_bytes`
    /// bounds a JSONL line or a CSV record.
    pub fn open(path: &Path, max_line_bytes: usize) -> Result<Self> {
        let io = |e| DataError::io(path, e);
        let magic = first_bytes(path)?;
        let csv = csv::separator(path);
        if magic.starts_with(b"PAR1") && csv.is_none() {
            return ParquetRows::open(path).map(Source::Parquet);
        }
        if arrow::is_arrow(&magic) && csv.is_none() {
            return ArrowRows::open(path).map(Source::Arrow);
        }
        let file = File::open(path).map_err(io)?;
        let content: Box<dyn Read + Send> = match &magic[..magic.len().min(4)] {
            [0x1f, 0x8b, ..] => Box::new(flate2::read::MultiGzDecoder::new(file)),
            [0x28, 0xb5, 0x2f, 0xfd] => Box::new(zstd::Decoder::new(file).map_err(io)?),
            _ => Box::new(file),
        };
        let mut reader = BufReader::with_capacity(1 << 20, content);
        let head = reader.fill_buf().map_err(io)?;
        let bom = head.starts_with(b"\xef\xbb\xbf");
        let is_array = head[if bom { 3 } else { 0 }..]
            .iter()
            .find(|b| !b.is_ascii_whitespace())
            == Some(&b'[');
        if bom {
            reader.consume(3);
        }
        if let Some(sep) = csv {
            return CsvRows::open(path, reader, sep, max_line_bytes).map(Source::Csv);
        }
        if is_array {
            return ArrayRows::read(path, reader).map(Source::JsonArray);
        }
        Ok(Source::Jsonl(JsonlRows {
            path: path.to_path_buf(),
            reader,
            line: 0,
            max_line_bytes,
        }))
    }

    /// The next row and its location; `None` at the end. File-level failures (I/O, a corrupt
    /// Parquet page, Arrow message or compressed stream) are errors.
    pub fn next_row(&mut self) -> Result<Option<(Location, RawRow)>> {
        match self {
            Source::Jsonl(j) => j.next_row(),
            Source::JsonArray(a) => Ok(a.rows.next()),
            Source::Parquet(p) => p.next_row(),
            Source::Arrow(a) => a.next_row(),
            Source::Csv(c) => c.next_row(),
        }
    }
}

/// The elements of a JSON array file, each as its JSON text, located by the line it starts on.
/// The whole file is read at once (as `datasets` reads such a file).
pub struct ArrayRows {
    rows: std::vec::IntoIter<(Location, RawRow)>,
}

impl ArrayRows {
    fn read(path: &Path, mut reader: TextStream) -> Result<Self> {
        let mut text = String::new();
        reader.read_to_string(&mut text).map_err(|e| {
            let what = if e.kind() == std::io::ErrorKind::InvalidData {
                "a JSON array file must be UTF-8 text".to_string()
            } else {
                e.to_string()
            };
            DataError::BadFile {
                path: path.to_path_buf(),
                line: 0,
                reason: what,
            }
        })?;
        let elements: Vec<&serde_json::value::RawValue> =
            serde_json::from_str(&text).map_err(|e| DataError::BadFile {
                path: path.to_path_buf(),
                line: e.line() as u64,
                reason: format!(
                    "a file that starts with `[` is read as one JSON array of rows: {e}"
                ),
            })?;
        let start = text.as_ptr() as usize;
        let mut line = 1u64;
        let mut counted = 0usize;
        let rows: Vec<(Location, RawRow)> = elements
            .iter()
            .map(|raw| {
                let at = raw.get().as_ptr() as usize - start;
                line += text.as_bytes()[counted..at]
                    .iter()
                    .filter(|&&b| b == b'\n')
                    .count() as u64;
                counted = at;
                let loc = Location {
                    line,
                    row_group: None,
                };
                (loc, RawRow::Json(raw.get().to_string()))
            })
            .collect();
        Ok(ArrayRows {
            rows: rows.into_iter(),
        })
    }
}

/// Bounded line reader of a JSONL file; blank lines are skipped.
pub struct JsonlRows {
    path: PathBuf,
    reader: TextStream,
    line: u64,
    max_line_bytes: usize,
}

impl JsonlRows {
    fn next_row(&mut self) -> Result<Option<(Location, RawRow)>> {
        loop {
            let mut buf = Vec::new();
            let Some(total) = self.read_line(&mut buf)? else {
                return Ok(None);
            };
            self.line += 1;
            let loc = Location {
                line: self.line,
                row_group: None,
            };
            if total > self.max_line_bytes {
                let why = format!(
                    "the line is {total} bytes, above the limit of {} bytes (--max-line-bytes); \
                     it was not parsed",
                    self.max_line_bytes
                );
                return Ok(Some((
                    loc,
                    RawRow::Bad(RowError::new(SkipReason::LineTooLong, why)),
                )));
            }
            match String::from_utf8(buf) {
                Ok(s) if s.trim().is_empty() => continue,
                Ok(s) => return Ok(Some((loc, RawRow::Json(s)))),
                Err(e) => {
                    let why = format!("invalid UTF-8: {}", e.utf8_error());
                    return Ok(Some((
                        loc,
                        RawRow::Bad(RowError::new(SkipReason::InvalidUtf8, why)),
                    )));
                }
            }
        }
    }

    /// Reads one line into `buf` (at most `max_line_bytes` of it are kept); returns its full
    /// length without the newline, or `None` at the end of the file.
    fn read_line(&mut self, buf: &mut Vec<u8>) -> Result<Option<usize>> {
        let mut total = 0usize;
        let mut any = false;
        loop {
            let avail = self
                .reader
                .fill_buf()
                .map_err(|e| DataError::io(&self.path, e))?;
            if avail.is_empty() {
                return Ok(any.then_some(total));
            }
            any = true;
            let (chunk, used, done) = match avail.iter().position(|&b| b == b'\n') {
                Some(i) => (&avail[..i], i + 1, true),
                None => (avail, avail.len(), false),
            };
            total += chunk.len();
            if total <= self.max_line_bytes {
                buf.extend_from_slice(chunk);
            } else {
                buf.clear(); // over the limit: count the rest, keep nothing
            }
            self.reader.consume(used);
            if done {
                return Ok(Some(total));
            }
        }
    }
}

/// Rows of a Parquet file, converted to JSON-like values.
pub struct ParquetRows {
    path: PathBuf,
    rows: RowIter<'static>,
    /// First row (0-based) of each row group, and the total at the end.
    group_starts: Vec<u64>,
    next: u64,
}

impl ParquetRows {
    fn open(path: &Path) -> Result<Self> {
        let bad = |e: parquet::errors::ParquetError| DataError::Parquet {
            path: path.to_path_buf(),
            msg: e.to_string(),
        };
        let file = File::open(path).map_err(|e| DataError::io(path, e))?;
        let reader = SerializedFileReader::new(file).map_err(bad)?;
        let mut group_starts = vec![0u64];
        for g in reader.metadata().row_groups() {
            let last = *group_starts.last().expect("starts with 0");
            group_starts.push(last + g.num_rows().max(0) as u64);
        }
        let rows = RowIter::from_file_into(Box::new(reader));
        Ok(ParquetRows {
            path: path.to_path_buf(),
            rows,
            group_starts,
            next: 0,
        })
    }

    fn group_of(&self, row: u64) -> u64 {
        (self.group_starts.partition_point(|&s| s <= row) - 1) as u64
    }

    fn next_row(&mut self) -> Result<Option<(Location, RawRow)>> {
        let index = self.next;
        let Some(row) = self.rows.next() else {
            return Ok(None);
        };
        let group = self.group_of(index);
        let row = row.map_err(|e| DataError::Parquet {
            path: self.path.clone(),
            msg: format!("row {} (row group {group}): {e}", index + 1),
        })?;
        self.next += 1;
        let loc = Location {
            line: index + 1,
            row_group: Some(group),
        };
        let value = row
            .get_column_iter()
            .map(|(name, field)| Ok((name.clone(), field_value(field)?)))
            .collect::<std::result::Result<Vec<_>, String>>();
        let raw = match value {
            Ok(fields) => RawRow::Value(Value::from_iter(fields)),
            Err(why) => RawRow::Bad(RowError::new(SkipReason::InvalidUtf8, why)),
        };
        Ok(Some((loc, raw)))
    }
}

/// A Parquet field as the value Python's `datasets` would hand a template; binary data that is
/// not UTF-8 text is an error (its bytes would otherwise be trained as a list of numbers).
fn field_value(f: &Field) -> std::result::Result<Value, String> {
    let group = |row: &parquet::record::Row| {
        row.get_column_iter()
            .map(|(name, field)| Ok((name.clone(), field_value(field)?)))
            .collect::<std::result::Result<Vec<_>, String>>()
            .map(Value::from_iter)
    };
    Ok(match f {
        Field::Null => Value::from(()),
        Field::Bool(b) => Value::from(*b),
        Field::Byte(x) => Value::from(*x),
        Field::Short(x) => Value::from(*x),
        Field::Int(x) => Value::from(*x),
        Field::Long(x) => Value::from(*x),
        Field::UByte(x) => Value::from(*x),
        Field::UShort(x) => Value::from(*x),
        Field::UInt(x) => Value::from(*x),
        Field::ULong(x) => Value::from(*x),
        Field::Float16(x) => Value::from(f64::from(f32::from(*x))),
        Field::Float(x) => Value::from(f64::from(*x)),
        Field::Double(x) => Value::from(*x),
        Field::Str(s) => Value::from(s.as_str()),
        // A string column written without its UTF-8 annotation
        Field::Bytes(b) => match std::str::from_utf8(b.data()) {
            Ok(s) => Value::from(s),
            Err(e) => {
                return Err(format!(
                    "a binary column holds bytes that are not UTF-8 text ({e})"
                ))
            }
        },
        Field::Group(row) => group(row)?,
        Field::ListInternal(list) => Value::from(
            list.elements()
                .iter()
                .map(field_value)
                .collect::<std::result::Result<Vec<_>, String>>()?,
        ),
        Field::MapInternal(map) => Value::from_iter(
            map.entries()
                .iter()
                .map(|(k, v)| Ok((field_value(k)?, field_value(v)?)))
                .collect::<std::result::Result<Vec<_>, String>>()?,
        ),
        // Decimals, dates and times: their text (no chat or token column has them)
        other => Value::from(other.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_lines_are_skipped_without_being_kept() {
        let dir = std::env::temp_dir().join(format!("g4ft-source-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("x.jsonl");
        let long = "x".repeat(5000);
        std::fs::write(&path, format!("{{\"a\": 1}}\n\n{long}\n{{\"b\": 2}}")).unwrap();
        let mut s = Source::open(&path, 1000).unwrap();
        let mut got = Vec::new();
        while let Some((loc, row)) = s.next_row().unwrap() {
            got.push((loc.line, format!("{row:?}")));
        }
        assert_eq!(got.len(), 3);
        assert_eq!(got[0], (1, "Json(\"{\\\"a\\\": 1}\")".into()));
        assert_eq!(got[1].0, 3);
        assert!(
            got[1].1.contains("LineTooLong") && got[1].1.contains("5000 bytes"),
            "{}",
            got[1].1
        );
        assert_eq!(got[2], (4, "Json(\"{\\\"b\\\": 2}\")".into()));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
