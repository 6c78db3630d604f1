//! Data files as streams of raw rows with their location: JSONL (one JSON object per line) or
//! Parquet (as Hugging Face `datasets` exports it: one column per field, nested lists and
//! structs), recognised by the Parquet magic bytes `PAR1`.
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

/// Default bound on one JSONL line (bytes).
pub const DEFAULT_MAX_LINE_BYTES: usize = 16 << 20;

/// Where a row is in its file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Location {
    /// 1-based JSONL line, or 1-based Parquet row.
    pub line: u64,
    /// 0-based Parquet row group; `None` for JSONL.
    pub row_group: Option<u64>,
}

/// A row as read: JSONL text still to parse (in parallel), a Parquet row already converted, or a
/// row-level failure.
#[derive(Debug)]
pub enum RawRow {
    /// One non-blank JSONL line.
    Json(String),
    /// One Parquet row.
    Value(Value),
    /// A line too long or not UTF-8.
    Bad(RowError),
}

/// The rows of one data file, in file order.
pub enum Source {
    /// A JSONL file.
    Jsonl(JsonlRows),
    /// A Parquet file.
    Parquet(ParquetRows),
}

impl Source {
    /// Opens `path` as Parquet when it starts with `PAR1`, else as JSONL.
    pub fn open(path: &Path, max_line_bytes: usize) -> Result<Self> {
        let mut file = File::open(path).map_err(|e| DataError::io(path, e))?;
        let mut magic = [0u8; 4];
        let n = file.read(&mut magic).map_err(|e| DataError::io(path, e))?;
        if n == 4 && &magic == b"PAR1" {
            return ParquetRows::open(path).map(Source::Parquet);
        }
        let file = File::open(path).map_err(|e| DataError::io(path, e))?;
        Ok(Source::Jsonl(JsonlRows {
            path: path.to_path_buf(),
            reader: BufReader::with_capacity(1 << 20, file),
            line: 0,
            max_line_bytes,
        }))
    }

    /// The next row and its location; `None` at the end. File-level failures (I/O, a corrupt
    /// Parquet page) are errors.
    pub fn next_row(&mut self) -> Result<Option<(Location, RawRow)>> {
        match self {
            Source::Jsonl(j) => j.next_row(),
            Source::Parquet(p) => p.next_row(),
        }
    }
}

/// Bounded line reader of a JSONL file; blank lines are skipped.
pub struct JsonlRows {
    path: PathBuf,
    reader: BufReader<File>,
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
        let value = Value::from_iter(
            row.get_column_iter()
                .map(|(name, field)| (name.clone(), field_value(field))),
        );
        Ok(Some((loc, RawRow::Value(value))))
    }
}

/// A Parquet field as the value Python's `datasets` would hand a template.
fn field_value(f: &Field) -> Value {
    match f {
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
        Field::Group(row) => Value::from_iter(
            row.get_column_iter()
                .map(|(name, field)| (name.clone(), field_value(field))),
        ),
        Field::ListInternal(list) => {
            Value::from(list.elements().iter().map(field_value).collect::<Vec<_>>())
        }
        Field::MapInternal(map) => Value::from_iter(
            map.entries()
                .iter()
                .map(|(k, v)| (field_value(k), field_value(v))),
        ),
        // Bytes, decimals, dates and times: their text (no chat or token column has them)
        other => Value::from(other.to_string()),
    }
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
