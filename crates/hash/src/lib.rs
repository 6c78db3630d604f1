//! Stable hashing and counter-based random numbers, one definition for the whole workspace.
//!
//! Everything here is a pure function of its inputs, the same on every platform, Rust version,
//! process and rank (unlike `std`'s `DefaultHasher` or a seeded generator whose state must be
//! shared). Two families:
//!
//! - [`Fnv1a64`] / [`fnv1a64`]: 64-bit FNV-1a over bytes, for names and cache keys (module paths
//!   of dropout keys and adapter inits, tensor names of random weights, data-cache keys, the
//!   config fingerprint of a checkpoint, DDP's parameter checksums). Not cryptographic: it tells
//!   accidental changes apart, which is all these uses need.
//! - [`mix64`] and the streams built on it: the SplitMix64 generator of Steele, Lea and Flood
//!   (2014; `java.util.SplittableRandom`). Element `i` of the stream with key `k` is
//!   [`stream_u64`]`(k, i) = mix64(k + (i + 1)·γ)`, so any element is computed directly, without
//!   walking a generator, and every rank draws the same values for the same key.
//!
//! ```
//! use g4ft_hash::{fnv1a64, stream_key, stream_unit_f64};
//! let key = stream_key(&[42, fnv1a64(b"model.layers.0.self_attn.q_proj"), 0]);
//! let u = stream_unit_f64(key, 7);
//! assert!((0.0..1.0).contains(&u));
//! assert_eq!(u, stream_unit_f64(key, 7)); // a pure function of (key, index)
//! ```

/// FNV-1a 64 offset basis.
const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
/// FNV-1a 64 prime, `2^40 + 2^8 + 0xb3`.
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// Incremental 64-bit FNV-1a hasher: [`Fnv1a64::update`] with bytes, then [`Fnv1a64::finish`].
#[derive(Debug, Clone)]
pub struct Fnv1a64(u64);

impl Default for Fnv1a64 {
    fn default() -> Self {
        Fnv1a64(FNV_OFFSET)
    }
}

impl Fnv1a64 {
    /// Feeds bytes (hashing `a` then `b` equals hashing their concatenation).
    pub fn update(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(FNV_PRIME);
        }
    }

    /// Feeds a length-prefixed field (the length as 8 little-endian bytes, then the bytes), so
    /// the fields ("ab", "c") and ("a", "bc") hash differently.
    pub fn field(&mut self, bytes: &[u8]) {
        self.update(&(bytes.len() as u64).to_le_bytes());
        self.update(bytes);
    }

    /// The hash of everything fed so far.
    pub fn finish(&self) -> u64 {
        self.0
    }
}

/// 64-bit FNV-1a of `bytes` in one call.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h = Fnv1a64::default();
    h.update(bytes);
    h.finish()
}

/// SplitMix64's increment γ = 2^64 / φ (the golden gamma), odd.
pub const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's finaliser (Stafford's "mix13"): a bijective 64-bit mixer with full avalanche.
/// SplitMix64 with state `s` outputs `mix64(s + γ)` and moves to `s + γ`.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Combines keys into one stream key; the order of `keys` matters.
pub fn stream_key(keys: &[u64]) -> u64 {
    keys.iter().fold(0x6A09_E667_F3BC_C909, |k, &x| {
        mix64(k ^ mix64(x.wrapping_add(GAMMA)))
    })
}

/// Element `i` of the stream `key`: 64 uniform random bits, the `i`-th output (0-based) of
/// SplitMix64 started from state `key`.
pub fn stream_u64(key: u64, i: u64) -> u64 {
    mix64(key.wrapping_add(i.wrapping_add(1).wrapping_mul(GAMMA)))
}

/// Element `i` of the stream `key` as a uniform `f64` in `[0, 1)` (the top 53 bits).
pub fn stream_unit_f64(key: u64, i: u64) -> f64 {
    (stream_u64(key, i) >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// One standard normal draw from two uniforms by Box–Muller: `√(−2·ln u1)·cos(2π·u2)`;
/// `u1` must be in `(0, 1]`.
pub fn box_muller(u1: f64, u2: f64) -> f64 {
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_reference_values() {
        // Test vectors of the FNV authors for FNV-1a 64.
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn fnv_is_incremental_and_fields_are_length_prefixed() {
        let mut h = Fnv1a64::default();
        h.update(b"foo");
        h.update(b"bar");
        assert_eq!(h.finish(), fnv1a64(b"foobar"));
        let (mut a, mut b) = (Fnv1a64::default(), Fnv1a64::default());
        a.field(b"ab");
        a.field(b"c");
        b.field(b"a");
        b.field(b"bc");
        assert_ne!(a.finish(), b.finish());
    }

    #[test]
    fn splitmix_reference_values() {
        // SplitMix64 seeded with 0: the first outputs of the reference C implementation
        // (splitmix64.c of Vigna's PRNG page).
        assert_eq!(stream_u64(0, 0), 0xE220_A839_7B1D_CDAF);
        assert_eq!(stream_u64(0, 1), 0x6E78_9E6A_A1B9_65F4);
        assert_eq!(mix64(GAMMA), stream_u64(0, 0));
    }

    #[test]
    fn unit_interval_mean() {
        let n = 100_000;
        let mean = (0..n).map(|i| stream_unit_f64(7, i)).sum::<f64>() / n as f64;
        // sd of the mean = sqrt(1/12 / n) ≈ 9.1e-4; allow 5 sd.
        assert!((mean - 0.5).abs() < 4.6e-3, "mean {mean}");
        assert!((0..n).all(|i| (0.0..1.0).contains(&stream_unit_f64(7, i))));
    }
}
