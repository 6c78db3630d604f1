//! `torch.randperm(n, generator=torch.Generator().manual_seed(seed))` on the CPU, bit for bit.
//!
//! PyTorch's CPU generator is MT19937 seeded with the low 32 bits of the seed
//! (`at::mt19937(seed)`), and CPU `randperm` for `n < 2^32 / 20` is a forward Fisher-Yates
//! shuffle: for `i in 0..n-1`, `z = random() % (n - i)`, swap `r[i]` and `r[i + z]`, where
//! `random()` is one 32-bit MT19937 output (aten/src/ATen/native/TensorFactories.cpp,
//! `randperm_cpu`). Checked against torch 2.11 in `tools/reference/data/sampler_fixtures.json`.
//! Larger `n` (over 214 million rows) takes another path in PyTorch; we keep this one, so such
//! permutations are deterministic and identical on every rank but differ from PyTorch's.

/// The 32-bit Mersenne Twister (MT19937).
pub struct Mt19937 {
    state: [u32; 624],
    index: usize,
}

impl Mt19937 {
    /// Seeds like `std::mt19937(seed)` / PyTorch's `manual_seed` (low 32 bits).
    pub fn new(seed: u64) -> Self {
        let mut state = [0u32; 624];
        state[0] = seed as u32;
        for i in 1..624 {
            let prev = state[i - 1];
            state[i] = 1_812_433_253u32
                .wrapping_mul(prev ^ (prev >> 30))
                .wrapping_add(i as u32);
        }
        Mt19937 { state, index: 624 }
    }

    fn twist(&mut self) {
        for i in 0..624 {
            let y = (self.state[i] & 0x8000_0000) | (self.state[(i + 1) % 624] & 0x7fff_ffff);
            let mut next = self.state[(i + 397) % 624] ^ (y >> 1);
            if y & 1 != 0 {
                next ^= 0x9908_b0df;
            }
            self.state[i] = next;
        }
        self.index = 0;
    }

    /// Next 32-bit output.
    pub fn next_u32(&mut self) -> u32 {
        if self.index >= 624 {
            self.twist();
        }
        let mut y = self.state[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }
}

/// `torch.randperm(n)` with a generator seeded with `seed`.
pub fn randperm(n: usize, seed: u64) -> Vec<usize> {
    let mut rng = Mt19937::new(seed);
    let mut r: Vec<usize> = (0..n).collect();
    for i in 0..n.saturating_sub(1) {
        let z = (rng.next_u32() as u64 % (n - i) as u64) as usize;
        r.swap(i, i + z);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mt19937_reference_output() {
        // std::mt19937 with the default seed 5489: the 10000th output is 4123659995 (C++ standard).
        let mut rng = Mt19937::new(5489);
        let mut last = 0;
        for _ in 0..10_000 {
            last = rng.next_u32();
        }
        assert_eq!(last, 4_123_659_995);
    }

    #[test]
    fn is_a_permutation() {
        let mut p = randperm(1000, 7);
        p.sort_unstable();
        assert_eq!(p, (0..1000).collect::<Vec<_>>());
        assert!(randperm(0, 1).is_empty());
        assert_eq!(randperm(1, 1), vec![0]);
    }
}
