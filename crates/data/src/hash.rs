//! FNV-1a 64-bit hashing for cache keys (file contents, tokenizer, template).
//!
//! Not cryptographic: it detects accidental changes (an edited data file, another tokenizer),
//! which is all a cache key needs. Stable across Rust versions and platforms, unlike
//! `std::collections::hash_map::DefaultHasher`.

use std::io::Read;
use std::path::Path;

use crate::error::{DataError, Result};

const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const PRIME: u64 = 0x0000_0100_0000_01b3;

/// Incremental FNV-1a 64 hasher.
#[derive(Debug, Clone)]
pub struct Fnv64(u64);

impl Default for Fnv64 {
    fn default() -> Self {
        Fnv64(OFFSET)
    }
}

impl Fnv64 {
    /// Feeds bytes.
    pub fn update(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(PRIME);
        }
    }

    /// Feeds a length-prefixed field, so that ("ab", "c") and ("a", "bc") differ.
    pub fn field(&mut self, bytes: &[u8]) {
        self.update(&(bytes.len() as u64).to_le_bytes());
        self.update(bytes);
    }

    /// The hash so far.
    pub fn finish(&self) -> u64 {
        self.0
    }
}

/// Hash of bytes in one call.
pub fn fnv64(bytes: &[u8]) -> u64 {
    let mut h = Fnv64::default();
    h.update(bytes);
    h.finish()
}

/// Hash and length of a file's contents, read in 1 MiB blocks.
pub fn hash_file(path: &Path) -> Result<(u64, u64)> {
    let mut file = std::fs::File::open(path).map_err(|e| DataError::io(path, e))?;
    let mut buf = vec![0u8; 1 << 20];
    let mut h = Fnv64::default();
    let mut len = 0u64;
    loop {
        let n = file.read(&mut buf).map_err(|e| DataError::io(path, e))?;
        if n == 0 {
            return Ok((h.finish(), len));
        }
        h.update(&buf[..n]);
        len += n as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vectors() {
        // Reference values of FNV-1a 64 (from the FNV authors' test suite).
        assert_eq!(fnv64(b""), 0xcbf29ce484222325);
        assert_eq!(fnv64(b"a"), 0xaf63dc4c8601ec8c);
        assert_eq!(fnv64(b"foobar"), 0x85944171f73967e8);
    }

    #[test]
    fn fields_are_length_prefixed() {
        let (mut a, mut b) = (Fnv64::default(), Fnv64::default());
        a.field(b"ab");
        a.field(b"c");
        b.field(b"a");
        b.field(b"bc");
        assert_ne!(a.finish(), b.finish());
    }
}
