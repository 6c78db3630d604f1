//! Optional batching strategies over the sampler's global order: length grouping and packing.
//!
//! Both keep what DDP needs: the plan is a pure function of (seed, epoch, lengths), so it is
//! identical on every rank, and every rank gets the same number of batches.
//! * Length grouping (like transformers' `group_by_length`) sorts each window of
//!   `world * batch_size * mega_batch_mult` consecutive entries of the global order by length,
//!   longest first. A window maps onto whole local batches of every rank, so a batch holds
//!   samples of similar length and batch `j` has similar lengths on all ranks.
//! * Packing puts several samples into one row of at most `pack_len` tokens (first fit over a
//!   seed-shuffled order with a bounded number of open rows). Packs are built once per loader
//!   (not per epoch), so the number of rows — and `len()` — is the same every epoch; the
//!   sampler then shuffles and shards the packs like samples.

use crate::randperm::randperm;

/// How samples become batch rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Batching {
    /// One sample per row, batches in sampler order (the post).
    #[default]
    Plain,
    /// One sample per row, similar lengths batched together.
    GroupByLength {
        /// Window size in global batches (transformers uses 50).
        mega_batch_mult: usize,
    },
    /// Several samples per row, up to `pack_len` tokens, with per-sample position ids.
    Packed {
        /// Row capacity in tokens (usually the dataset's `max_len`).
        pack_len: usize,
    },
}

/// Sorts each window of `window` entries of `order` by `lengths[unit]`, longest first (stable).
pub fn group_by_length(order: &mut [usize], lengths: &[usize], window: usize) {
    for chunk in order.chunks_mut(window.max(1)) {
        chunk.sort_by_key(|&u| std::cmp::Reverse(lengths[u]));
    }
}

/// Open rows kept while packing; bounds the cost to O(n * OPEN_ROWS).
const OPEN_ROWS: usize = 64;

/// Packs samples (by length) into rows of at most `capacity` tokens. Every sample appears in
/// exactly one row; the order within a row is the shuffled order. `lengths[i] <= capacity`.
pub fn pack(lengths: &[usize], capacity: usize, seed: u64) -> Vec<Vec<usize>> {
    let mut closed = Vec::new();
    let mut open: Vec<(usize, Vec<usize>)> = Vec::new(); // (free tokens, samples)
    for i in randperm(lengths.len(), seed) {
        let len = lengths[i];
        if let Some(row) = open.iter_mut().find(|(free, _)| *free >= len) {
            row.0 -= len;
            row.1.push(i);
            continue;
        }
        if open.len() == OPEN_ROWS {
            // close the fullest row to make room
            let k = (0..open.len())
                .min_by_key(|&k| open[k].0)
                .expect("OPEN_ROWS > 0");
            closed.push(open.swap_remove(k).1);
        }
        open.push((capacity - len, vec![i]));
    }
    closed.extend(open.into_iter().map(|(_, row)| row));
    closed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_covers_every_sample_within_capacity() {
        let lengths: Vec<usize> = (0..500).map(|i| 1 + (i * 37) % 64).collect();
        let rows = pack(&lengths, 64, 9);
        let mut seen: Vec<usize> = rows.iter().flatten().copied().collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..500).collect::<Vec<_>>());
        assert!(rows
            .iter()
            .all(|r| r.iter().map(|&i| lengths[i]).sum::<usize>() <= 64));
        let total: usize = lengths.iter().sum();
        assert!(
            rows.len() * 64 < total * 13 / 10,
            "packing is too loose: {} rows",
            rows.len()
        );
        assert_eq!(rows, pack(&lengths, 64, 9), "deterministic");
    }

    #[test]
    fn grouping_sorts_windows() {
        let lengths = vec![5, 1, 9, 3, 7, 2];
        let mut order = vec![0, 1, 2, 3, 4, 5];
        group_by_length(&mut order, &lengths, 3);
        assert_eq!(order, vec![2, 0, 1, 4, 3, 5]);
    }
}
