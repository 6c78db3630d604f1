//! Arrow IPC files as rows: the stream format (what `datasets` writes for `save_to_disk` shards,
//! its cache files and `.arrow` data files) and the file format (`ARROW1`), read record batch by
//! record batch. Each row becomes the JSON-like value `datasets` hands a template: null for a
//! null cell or struct field, numbers, strings, lists and objects; dictionary-encoded columns as
//! their values; dates, times and decimals as their text (no chat or token column has them).
//! Columns `datasets` refuses are errors here too: a map, a union, a list view or a run-end
//! encoded array anywhere in a column's type (it has no feature type for them), and two columns
//! of one name. The files of one split must have one schema ([`check_one_schema`]).

use std::fs::File;
use std::io::BufReader;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Float16Type, Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, Int8Type, UInt16Type,
    UInt32Type, UInt64Type, UInt8Type,
};
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_cast::display::{ArrayFormatter, FormatOptions};
use arrow_ipc::reader::{FileReader, StreamReader};
use arrow_schema::{ArrowError, DataType, Fields, Schema, SchemaRef};
use minijinja::Value;

use super::{Location, RawRow};
use crate::error::{DataError, Result, RowError, SkipReason};

/// The first bytes of an Arrow IPC file in the file format.
const FILE_MAGIC: &[u8] = b"ARROW1";
/// The first bytes of an Arrow IPC stream (a message's continuation marker).
const STREAM_MAGIC: &[u8] = &[0xff, 0xff, 0xff, 0xff];

/// Whether `magic` (a file's first bytes) starts an Arrow IPC file or stream.
pub(super) fn is_arrow(magic: &[u8]) -> bool {
    magic.starts_with(STREAM_MAGIC) || magic.starts_with(FILE_MAGIC)
}

type Batches = Box<dyn Iterator<Item = std::result::Result<RecordBatch, ArrowError>> + Send>;

/// Rows of an Arrow IPC file, converted to JSON-like values.
pub struct ArrowRows {
    path: PathBuf,
    /// The file's schema.
    schema: SchemaRef,
    batches: Batches,
    /// The columns of the current record batch (dictionary-encoded ones decoded).
    columns: Vec<(String, ArrayRef)>,
    /// Rows in the current record batch.
    batch_rows: usize,
    /// Record batches read so far (the current one is the last of them).
    batches_read: u64,
    /// Next row of `batch`.
    row_in_batch: usize,
    /// Rows returned so far.
    rows: u64,
}

impl ArrowRows {
    /// Opens `path`, an Arrow IPC stream or file.
    pub(super) fn open(path: &Path) -> Result<Self> {
        let magic = super::first_bytes(path)?;
        let file = File::open(path).map_err(|e| DataError::io(path, e))?;
        let open = || -> std::result::Result<(SchemaRef, Batches), ArrowError> {
            Ok(if magic.starts_with(FILE_MAGIC) {
                let reader = FileReader::try_new_buffered(file, None)?;
                (reader.schema(), Box::new(reader))
            } else {
                let buffered = BufReader::with_capacity(1 << 20, file);
                let reader = StreamReader::try_new(buffered, None)?;
                (reader.schema(), Box::new(reader))
            })
        };
        let (schema, batches) = std::panic::catch_unwind(AssertUnwindSafe(open))
            .map_err(|panic| {
                arrow_error(
                    path,
                    format!("the file is corrupt ({})", panic_text(&panic)),
                )
            })?
            .map_err(|e| arrow_error(path, e.to_string()))?;
        check_columns(path, &schema)?;
        Ok(ArrowRows {
            path: path.to_path_buf(),
            schema,
            batches,
            columns: Vec::new(),
            batch_rows: 0,
            batches_read: 0,
            row_in_batch: 0,
            rows: 0,
        })
    }

    pub(super) fn next_row(&mut self) -> Result<Option<(Location, RawRow)>> {
        loop {
            if self.row_in_batch < self.batch_rows {
                let i = self.row_in_batch;
                self.row_in_batch += 1;
                self.rows += 1;
                let loc = Location {
                    line: self.rows,
                    row_group: Some(self.batches_read - 1),
                };
                let raw = match row_value(&self.columns, i) {
                    Ok(v) => RawRow::Value(v),
                    Err(e) => RawRow::Bad(e),
                };
                return Ok(Some((loc, raw)));
            }
            // arrow-ipc panics on some corrupt messages: a panic is this file's error.
            let next = std::panic::catch_unwind(AssertUnwindSafe(|| self.batches.next())).map_err(
                |panic| {
                    arrow_error(
                        &self.path,
                        format!(
                            "record batch {}: the file is corrupt ({})",
                            self.batches_read,
                            panic_text(&panic)
                        ),
                    )
                },
            )?;
            match next {
                None => return Ok(None),
                Some(Err(e)) => {
                    return Err(arrow_error(
                        &self.path,
                        format!("record batch {}: {e}", self.batches_read),
                    ))
                }
                Some(Ok(batch)) => {
                    self.batches_read += 1;
                    self.batch_rows = batch.num_rows();
                    self.row_in_batch = 0;
                    self.columns = columns(&self.path, &batch)?;
                }
            }
        }
    }
}

fn arrow_error(path: &Path, msg: String) -> DataError {
    DataError::Arrow {
        path: path.to_path_buf(),
        msg,
    }
}

/// The columns of `batch` by name, dictionary-encoded ones decoded to their values.
fn columns(path: &Path, batch: &RecordBatch) -> Result<Vec<(String, ArrayRef)>> {
    let schema = batch.schema();
    let mut out = Vec::with_capacity(batch.num_columns());
    for (field, col) in schema.fields().iter().zip(batch.columns()) {
        let (name, ty) = (field.name(), field.data_type());
        let col = match ty {
            DataType::Dictionary(_, values) => arrow_cast::cast(col, values)
                .map_err(|e| arrow_error(path, format!("column `{name}`: {e}")))?,
            _ => col.clone(),
        };
        out.push((name.clone(), col));
    }
    Ok(out)
}

/// An error for a schema `datasets` refuses: a column of a type it has no feature type for, or
/// two columns of one name.
fn check_columns(path: &Path, schema: &Schema) -> Result<()> {
    for (i, field) in schema.fields().iter().enumerate() {
        let (name, ty) = (field.name(), field.data_type());
        if let Some(what) = unread(ty) {
            return Err(arrow_error(
                path,
                format!(
                    "column `{name}` is of type {ty}; {what} has no `datasets` feature type \
                     (`datasets` refuses the file), so it is not read here either"
                ),
            ));
        }
        if schema.fields()[..i].iter().any(|f| f.name() == name) {
            return Err(arrow_error(
                path,
                format!("two columns are named `{name}` (`datasets` refuses the file)"),
            ));
        }
    }
    Ok(())
}

/// What in `ty` `datasets` has no feature type for, if anything.
fn unread(ty: &DataType) -> Option<&'static str> {
    match ty {
        DataType::Map(..) => Some("a map"),
        DataType::Union(..) => Some("a union"),
        DataType::ListView(_) | DataType::LargeListView(_) => Some("a list view"),
        DataType::RunEndEncoded(..) => Some("a run-end encoded array"),
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => {
            unread(f.data_type())
        }
        DataType::Struct(fields) => fields.iter().find_map(|f| unread(f.data_type())),
        DataType::Dictionary(_, v) => unread(v),
        _ => None,
    }
}

/// An error unless every Arrow file among `files` has the first one's columns, of the same
/// types or of types whose values cast to them unchanged: `datasets` casts a split's files to
/// its first file's schema, which is not done here.
pub fn check_one_schema(files: &[PathBuf]) -> Result<()> {
    let mut first: Option<(&Path, SchemaRef)> = None;
    for path in files {
        if !is_arrow(&super::first_bytes(path)?) {
            continue;
        }
        let schema = ArrowRows::open(path)?.schema;
        match &first {
            None => first = Some((path, schema)),
            Some((p, want)) if !same_columns(want, &schema) => {
                return Err(arrow_error(
                    path,
                    format!(
                        "its columns ({}) are not those of {} ({}); `datasets` casts every file \
                         of a split to its first file's columns, which is not done here: write \
                         the files with one schema",
                        describe(&schema),
                        p.display(),
                        describe(want)
                    ),
                ))
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// Whether two schemas have the same columns in the same order, of types whose values read the
/// same once cast to the first's (integers of any width, strings or binaries of any offset size,
/// dictionaries as their values; floats of another width would round).
fn same_columns(a: &Schema, b: &Schema) -> bool {
    same_fields(a.fields(), b.fields())
}

fn same_fields(a: &Fields, b: &Fields) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x.name() == y.name() && same_type(x.data_type(), y.data_type()))
}

fn same_type(a: &DataType, b: &DataType) -> bool {
    use DataType::*;
    match (a, b) {
        (Dictionary(_, a), b) | (b, Dictionary(_, a)) => same_type(a, b),
        (List(a) | LargeList(a), List(b) | LargeList(b)) => same_type(a.data_type(), b.data_type()),
        (Struct(a), Struct(b)) => same_fields(a, b),
        _ if a.is_integer() && b.is_integer() => true,
        (Utf8 | LargeUtf8 | Utf8View, Utf8 | LargeUtf8 | Utf8View) => true,
        (Binary | LargeBinary | BinaryView, Binary | LargeBinary | BinaryView) => true,
        _ => a == b,
    }
}

fn describe(schema: &Schema) -> String {
    let fields: Vec<String> = schema
        .fields()
        .iter()
        .map(|f| format!("{}: {}", f.name(), f.data_type()))
        .collect();
    fields.join(", ")
}

/// Row `i` of a record batch's columns as an object.
fn row_value(columns: &[(String, ArrayRef)], i: usize) -> std::result::Result<Value, RowError> {
    columns
        .iter()
        .map(|(name, col)| {
            let value = cell(col.as_ref(), i)
                .map_err(|e| RowError::new(e.kind, format!("{name}: {}", e.reason)))?;
            Ok((name.clone(), value))
        })
        .collect::<std::result::Result<Vec<_>, RowError>>()
        .map(Value::from_iter)
}

/// A panic's message.
fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    match (panic.downcast_ref::<&str>(), panic.downcast_ref::<String>()) {
        (Some(s), _) => s.to_string(),
        (_, Some(s)) => s.clone(),
        _ => "a panic in the Arrow reader".into(),
    }
}

/// Element `i` of `array` as `datasets` would return it (see the module doc); binary data that
/// is not UTF-8 text, and a date or time out of range, are errors (bad rows).
fn cell(array: &dyn Array, i: usize) -> std::result::Result<Value, RowError> {
    if array.is_null(i) || array.data_type() == &DataType::Null {
        return Ok(Value::from(()));
    }
    let list = |values: &dyn Array| {
        (0..values.len())
            .map(|j| cell(values, j))
            .collect::<std::result::Result<Vec<_>, RowError>>()
            .map(Value::from)
    };
    let text = |bytes: &[u8]| match std::str::from_utf8(bytes) {
        Ok(s) => Ok(Value::from(s)),
        Err(e) => Err(RowError::new(
            SkipReason::InvalidUtf8,
            format!("a binary column holds bytes that are not UTF-8 text ({e})"),
        )),
    };
    Ok(match array.data_type() {
        DataType::Boolean => Value::from(array.as_boolean().value(i)),
        DataType::Int8 => Value::from(array.as_primitive::<Int8Type>().value(i)),
        DataType::Int16 => Value::from(array.as_primitive::<Int16Type>().value(i)),
        DataType::Int32 => Value::from(array.as_primitive::<Int32Type>().value(i)),
        DataType::Int64 => Value::from(array.as_primitive::<Int64Type>().value(i)),
        DataType::UInt8 => Value::from(array.as_primitive::<UInt8Type>().value(i)),
        DataType::UInt16 => Value::from(array.as_primitive::<UInt16Type>().value(i)),
        DataType::UInt32 => Value::from(array.as_primitive::<UInt32Type>().value(i)),
        DataType::UInt64 => Value::from(array.as_primitive::<UInt64Type>().value(i)),
        DataType::Float16 => Value::from(array.as_primitive::<Float16Type>().value(i).to_f64()),
        DataType::Float32 => Value::from(f64::from(array.as_primitive::<Float32Type>().value(i))),
        DataType::Float64 => Value::from(array.as_primitive::<Float64Type>().value(i)),
        DataType::Utf8 => Value::from(array.as_string::<i32>().value(i)),
        DataType::LargeUtf8 => Value::from(array.as_string::<i64>().value(i)),
        DataType::Utf8View => Value::from(array.as_string_view().value(i)),
        DataType::Binary => text(array.as_binary::<i32>().value(i))?,
        DataType::LargeBinary => text(array.as_binary::<i64>().value(i))?,
        DataType::BinaryView => text(array.as_binary_view().value(i))?,
        DataType::FixedSizeBinary(_) => text(array.as_fixed_size_binary().value(i))?,
        DataType::List(_) => list(array.as_list::<i32>().value(i).as_ref())?,
        DataType::LargeList(_) => list(array.as_list::<i64>().value(i).as_ref())?,
        DataType::FixedSizeList(..) => list(array.as_fixed_size_list().value(i).as_ref())?,
        DataType::Struct(fields) => {
            let s = array.as_struct();
            fields
                .iter()
                .zip(s.columns())
                .map(|(f, col)| Ok((f.name().clone(), cell(col.as_ref(), i)?)))
                .collect::<std::result::Result<Vec<_>, RowError>>()
                .map(Value::from_iter)?
        }
        DataType::Dictionary(..) => {
            // A dictionary inside a list or struct (top-level ones are decoded per batch).
            let d = array.as_any_dictionary();
            let key = cell(d.keys(), i)?.as_usize();
            match key.filter(|&k| k < d.values().len()) {
                Some(k) => cell(d.values().as_ref(), k)?,
                None => return Err(RowError::field("a dictionary key is out of range")),
            }
        }
        // Dates, times, durations, decimals: their text
        ty => {
            let options = FormatOptions::default().with_display_error(false);
            let as_text = ArrayFormatter::try_new(array, &options)
                .and_then(|format| format.value(i).try_to_string());
            match as_text {
                Ok(text) => Value::from(text),
                Err(e) => {
                    return Err(RowError::field(format!(
                        "a value of type {ty} that has no text ({e})"
                    )))
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{
        DictionaryArray, Int32Array, StringArray, StructArray, TimestampSecondArray,
    };
    use arrow_schema::Field;

    use super::*;

    #[test]
    fn nested_dictionaries_read_their_values_and_bad_times_are_bad_rows() {
        let keys = Int32Array::from(vec![Some(2), None, Some(0)]);
        let values = StringArray::from(vec!["a", "b", "c"]);
        let dict: ArrayRef = Arc::new(DictionaryArray::try_new(keys, Arc::new(values)).unwrap());
        let field = Field::new("d", dict.data_type().clone(), true);
        let record = StructArray::from(vec![(Arc::new(field), dict)]);
        let got: Vec<String> = (0..3)
            .map(|i| cell(&record, i).unwrap().to_string())
            .collect();
        assert_eq!(got, [r#"{"d": "c"}"#, r#"{"d": None}"#, r#"{"d": "a"}"#]);

        let times = TimestampSecondArray::from(vec![0, i64::MAX]);
        assert_eq!(cell(&times, 0).unwrap().to_string(), "1970-01-01T00:00:00");
        let err = cell(&times, 1).unwrap_err();
        assert_eq!(err.kind, SkipReason::BadField);
        assert!(err.reason.contains("has no text"), "{}", err.reason);
    }
}
