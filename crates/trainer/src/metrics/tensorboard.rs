//! TensorBoard event files (`--report-to tensorboard`): scalars in the format TensorBoard and
//! PyTorch's `SummaryWriter` write, so `tensorboard --logdir OUTPUT/tensorboard` shows the run.
//!
//! A file is a sequence of TFRecords, each `u64 length (LE) · masked CRC-32C of the length ·
//! data · masked CRC-32C of the data`, the mask being `((crc >> 15) | (crc << 17)) + 0xa282ead8`.
//! Each record is one `tensorflow.Event` protobuf; the few fields used are encoded here:
//! ```text
//! Event      { double wall_time = 1; int64 step = 2; string file_version = 3;
//!              Summary summary = 5; SessionLog session_log = 7; }
//! Summary    { repeated Value value = 1; }    Value { string tag = 1; float simple_value = 2; }
//! SessionLog { Status status = 1; }           (START = 1)
//! ```
//! The first record names the format (`brain.Event:2`). A run resumed at step S starts its file
//! with a `SessionLog START` at step S + 1, which makes TensorBoard keep only the older points
//! before it (dropping the steps the resumed run repeats).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::{Error, Result};

/// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as TFRecord uses.
pub fn crc32c(data: &[u8]) -> u32 {
    const TABLE: [u32; 256] = {
        let mut t = [0u32; 256];
        let mut i = 0;
        while i < 256 {
            let mut c = i as u32;
            let mut k = 0;
            while k < 8 {
                c = if c & 1 != 0 {
                    (c >> 1) ^ 0x82F6_3B78
                } else {
                    c >> 1
                };
                k += 1;
            }
            t[i] = c;
            i += 1;
        }
        t
    };
    !data.iter().fold(!0u32, |c, &b| {
        TABLE[((c ^ b as u32) & 0xff) as usize] ^ (c >> 8)
    })
}

fn masked_crc(data: &[u8]) -> u32 {
    let c = crc32c(data);
    c.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// One TFRecord around `data`.
pub fn tf_record(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc(data).to_le_bytes());
    out
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Field key: number and wire type (0 varint, 1 fixed64, 2 length-delimited, 5 fixed32).
fn key(out: &mut Vec<u8>, field: u64, wire: u64) {
    varint(out, (field << 3) | wire);
}

fn bytes_field(out: &mut Vec<u8>, field: u64, data: &[u8]) {
    key(out, field, 2);
    varint(out, data.len() as u64);
    out.extend_from_slice(data);
}

/// What an event carries besides its time and step.
#[derive(Debug, Clone, PartialEq)]
pub enum EventKind<'a> {
    /// `file_version` (the first event of a file).
    FileVersion(&'a str),
    /// A summary with one scalar.
    Scalar {
        /// The series name, e.g. `train/loss`.
        tag: &'a str,
        /// Its value.
        value: f32,
    },
    /// `SessionLog { status: START }`: a (re)start at this step.
    Start,
}

/// The `tensorflow.Event` protobuf bytes.
pub fn event(wall_time: f64, step: i64, kind: &EventKind<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    key(&mut out, 1, 1);
    out.extend_from_slice(&wall_time.to_le_bytes());
    if step != 0 {
        key(&mut out, 2, 0);
        varint(&mut out, step as u64);
    }
    match kind {
        EventKind::FileVersion(v) => bytes_field(&mut out, 3, v.as_bytes()),
        EventKind::Scalar { tag, value } => {
            let mut v = Vec::new();
            bytes_field(&mut v, 1, tag.as_bytes());
            key(&mut v, 2, 5);
            v.extend_from_slice(&value.to_le_bytes());
            let mut summary = Vec::new();
            bytes_field(&mut summary, 1, &v);
            bytes_field(&mut out, 5, &summary);
        }
        EventKind::Start => {
            let mut log = Vec::new();
            key(&mut log, 1, 0);
            varint(&mut log, 1);
            bytes_field(&mut out, 7, &log);
        }
    }
    out
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// An open event file; every write is flushed so a running TensorBoard sees it.
#[derive(Debug)]
pub struct EventWriter {
    path: PathBuf,
    file: BufWriter<File>,
}

impl EventWriter {
    /// Creates `dir` and a new event file in it, named as TensorBoard's writer names them
    /// (`events.out.tfevents.<unix seconds>.<host>.<pid>.0`). `resumed_at`: the step a resumed
    /// run continues from (a `SessionLog START` at the step after it), 0 for a fresh run.
    pub fn create(dir: &Path, resumed_at: u64) -> Result<Self> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| Error::MetricsIo { path, source }
        };
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let wall = now();
        let path = dir.join(format!(
            "events.out.tfevents.{}.{}.{}.0",
            wall as u64,
            g4ft_wait::host_name(),
            std::process::id()
        ));
        let file = File::create(&path).map_err(io(&path))?;
        let mut w = Self {
            path,
            file: BufWriter::new(file),
        };
        w.write(wall, 0, &EventKind::FileVersion("brain.Event:2"))?;
        if resumed_at > 0 {
            w.write(wall, resumed_at as i64 + 1, &EventKind::Start)?;
        }
        Ok(w)
    }

    /// The file being written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends a scalar at `step`, stamped now.
    pub fn scalar(&mut self, tag: &str, step: u64, value: f64) -> Result<()> {
        let kind = EventKind::Scalar {
            tag,
            value: value as f32,
        };
        self.write(now(), step as i64, &kind)
    }

    fn write(&mut self, wall_time: f64, step: i64, kind: &EventKind<'_>) -> Result<()> {
        let record = tf_record(&event(wall_time, step, kind));
        self.file
            .write_all(&record)
            .and_then(|()| self.file.flush())
            .map_err(|source| Error::MetricsIo {
                path: self.path.clone(),
                source,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `tools/reference/trainer/tensorboard_fixture.json`: records written by the `tensorboard`
    /// package's own `RecordWriter` from `event_pb2.Event` messages.
    #[test]
    fn records_match_tensorboards_writer_byte_for_byte() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tools/reference/trainer/tensorboard_fixture.json");
        let fx: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let ours = [
            tf_record(&event(1.5, 0, &EventKind::FileVersion("brain.Event:2"))),
            tf_record(&event(
                2.25,
                3,
                &EventKind::Scalar {
                    tag: "train/loss",
                    value: 1.25,
                },
            )),
            tf_record(&event(
                1_747_000_000.125,
                123_456_789,
                &EventKind::Scalar {
                    tag: "train/lr",
                    value: 2e-4,
                },
            )),
            tf_record(&event(3.0, 21, &EventKind::Start)),
        ];
        let want = fx["records"].as_array().unwrap();
        assert_eq!(want.len(), ours.len());
        for (i, (w, o)) in want.iter().zip(&ours).enumerate() {
            let hex: String = o.iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(hex, w.as_str().unwrap(), "record {i}");
        }
    }

    #[test]
    fn crc32c_check_value() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(b""), 0);
    }
}
