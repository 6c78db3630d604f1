//! PyTorch TCPStore wire protocol (client and server halves share these codecs).
//!
//! Mirrors `torch/csrc/distributed/c10d/TCPStoreBackend.hpp` (PyTorch 2.8–2.11): one `u8` command,
//! then arguments; strings and blobs are `u64 length` + bytes; integers are raw native-endian
//! (little-endian on x86-64 and aarch64). The first message on every connection must be
//! `VALIDATE` with [`VALIDATION_MAGIC`], or the server drops the connection.

use std::io::{self, Read, Write};

/// Magic number sent with `VALIDATE` (`c10d::detail::validationMagicNumber`).
pub const VALIDATION_MAGIC: u32 = 0x3C85_F7CE;

/// Largest string or blob either side accepts (guards against reading garbage lengths).
pub const MAX_BLOB: u64 = 1 << 30;

/// Command bytes (`c10d::detail::QueryType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Cmd {
    /// `u32` magic; no reply.
    Validate = 0,
    /// key, value; no reply.
    Set = 1,
    /// key, expected, desired; reply value.
    CompareSet = 2,
    /// key; reply value.
    Get = 3,
    /// key, `i64`; reply `i64`.
    Add = 4,
    /// `u64 n`, keys; reply `u8` (0 ready, 1 not ready).
    Check = 5,
    /// `u64 n`, keys; reply `u8` 0 (stop waiting) once all exist.
    Wait = 6,
    /// reply `i64`.
    GetNumKeys = 7,
    /// key; reply `i64` deleted count.
    DeleteKey = 8,
    /// key, value; no reply.
    Append = 9,
    /// `u64 n`, keys; reply n values.
    MultiGet = 10,
    /// `u64 n`, then n (key, value) pairs; no reply.
    MultiSet = 11,
    /// after a timed-out WAIT; reply `u8` 1 (wait canceled).
    CancelWait = 12,
    /// `u32` nonce; reply the same `u32`.
    Ping = 13,
}

impl Cmd {
    /// Decodes a command byte.
    pub fn from_u8(b: u8) -> Option<Cmd> {
        use Cmd::*;
        Some(match b {
            0 => Validate,
            1 => Set,
            2 => CompareSet,
            3 => Get,
            4 => Add,
            5 => Check,
            6 => Wait,
            7 => GetNumKeys,
            8 => DeleteKey,
            9 => Append,
            10 => MultiGet,
            11 => MultiSet,
            12 => CancelWait,
            13 => Ping,
            _ => return None,
        })
    }
}

/// `WaitResponseType::STOP_WAITING`.
pub const STOP_WAITING: u8 = 0;
/// `WaitResponseType::WAIT_CANCELED`.
pub const WAIT_CANCELED: u8 = 1;
/// `CheckResponseType::READY`.
pub const READY: u8 = 0;
/// `CheckResponseType::NOT_READY`.
pub const NOT_READY: u8 = 1;

/// Appends a `u64`-length-prefixed blob.
pub fn put_blob(buf: &mut Vec<u8>, b: &[u8]) {
    buf.extend_from_slice(&(b.len() as u64).to_ne_bytes());
    buf.extend_from_slice(b);
}

/// Reads a `u64`-length-prefixed blob.
pub fn read_blob(r: &mut impl Read) -> io::Result<Vec<u8>> {
    let n = read_u64(r)?;
    if n > MAX_BLOB {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("blob length {n} exceeds {MAX_BLOB}"),
        ));
    }
    let mut v = vec![0u8; n as usize];
    r.read_exact(&mut v)?;
    Ok(v)
}

/// Reads a blob and decodes it as UTF-8 (keys).
pub fn read_string(r: &mut impl Read) -> io::Result<String> {
    String::from_utf8(read_blob(r)?)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("key not UTF-8: {e}")))
}

/// Reads one byte.
pub fn read_u8(r: &mut impl Read) -> io::Result<u8> {
    let mut b = [0u8; 1];
    r.read_exact(&mut b)?;
    Ok(b[0])
}

/// Reads a native-endian `u32`.
pub fn read_u32(r: &mut impl Read) -> io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_ne_bytes(b))
}

/// Reads a native-endian `u64`.
pub fn read_u64(r: &mut impl Read) -> io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_ne_bytes(b))
}

/// Reads a native-endian `i64`.
pub fn read_i64(r: &mut impl Read) -> io::Result<i64> {
    Ok(read_u64(r)? as i64)
}

/// Writes a whole request or reply in one call (one TCP segment for small messages).
pub fn send(w: &mut impl Write, buf: &[u8]) -> io::Result<()> {
    w.write_all(buf)?;
    w.flush()
}
