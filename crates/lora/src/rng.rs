//! Counter-based hashing for reproducible adapter initialisation.
//!
//! Init values are a pure function of integer keys (the init seed, the FNV-1a hash of a module
//! path, the tensor, an element index), built on the SplitMix64 finaliser (Steele, Lea, Flood 2014;
//! the generator behind `java.util.SplittableRandom`). Element `i` of a stream with key `k` is
//! `mix(k + (i + 1)·γ)`, so every rank computes the same adapters without sharing generator state,
//! independently of module order. (Dropout masks use `g4ft_ops`' hash, see [`crate::lora_dropout`].)
//!
//! These are not PyTorch's bits: a PEFT run with the same seed draws different (equally
//! distributed) values. DDP broadcasts rank 0's parameters anyway.

/// SplitMix64's increment, `2^64 / φ`.
const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// The SplitMix64 finaliser: a bijective 64-bit mixer with full avalanche.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// 64-bit FNV-1a of a string (a module path), stable across platforms and runs.
pub fn fnv1a64(s: &str) -> u64 {
    s.bytes().fold(0xCBF2_9CE4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01B3)
    })
}

/// Combines keys into one stream key (order matters).
pub fn stream_key(keys: &[u64]) -> u64 {
    keys.iter().fold(0x6A09_E667_F3BC_C909, |k, &x| {
        mix64(k ^ mix64(x.wrapping_add(GAMMA)))
    })
}

/// Element `i` of the stream `key`: uniform 64 random bits.
pub fn stream_u64(key: u64, i: u64) -> u64 {
    mix64(key.wrapping_add(i.wrapping_add(1).wrapping_mul(GAMMA)))
}

/// Element `i` of the stream `key` as a uniform `f64` in `[0, 1)` (53 bits).
pub fn stream_unit_f64(key: u64, i: u64) -> f64 {
    (stream_u64(key, i) >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_reference_values() {
        // SplitMix64 seeded with 0: the first outputs of the reference C implementation
        // (https://prng.di.unimi.it/splitmix64.c).
        assert_eq!(stream_u64(0, 0), 0xE220_A839_7B1D_CDAF);
        assert_eq!(stream_u64(0, 1), 0x6E78_9E6A_A1B9_65F4);
    }

    #[test]
    fn fnv_reference_values() {
        assert_eq!(fnv1a64(""), 0xCBF2_9CE4_8422_2325);
        assert_eq!(fnv1a64("a"), 0xAF63_DC4C_8601_EC8C);
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
