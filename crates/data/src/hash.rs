//! FNV-1a 64-bit hashing ([`g4ft_hash`]) for cache keys (file contents, tokenizer, template).
//!
//! Not cryptographic: it detects accidental changes (an edited data file, another tokenizer),
//! which is all a cache key needs. Stable across Rust versions and platforms, unlike
//! `std::collections::hash_map::DefaultHasher`.

use std::io::Read;
use std::path::Path;

use crate::error::{DataError, Result};

pub(crate) use g4ft_hash::Fnv1a64 as Fnv64;

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
    fn file_hash_is_the_hash_of_its_bytes() {
        let path = std::env::temp_dir().join(format!("g4ft-hash-file-{}", std::process::id()));
        let bytes: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        let got = hash_file(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(got, (g4ft_hash::fnv1a64(&bytes), bytes.len() as u64));
    }
}
