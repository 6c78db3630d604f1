//! `DistributedSampler` with PyTorch's semantics (torch/utils/data/distributed.py, 2.11).
//!
//! The global order is `torch.randperm(len)` seeded with `seed + epoch` (bit-identical to
//! PyTorch, see [`crate::randperm`]) or `0..len` without shuffling. Without `drop_last` it is
//! padded to `total_size` by wrapping around (repeating the order from its start, several times
//! when `len < num_replicas`); with `drop_last` the tail is trimmed. Rank `r` takes positions
//! `r, r + W, r + 2W, ...`, so every rank gets exactly `num_samples` indices, the shards are
//! disjoint except for the padding duplicates, and every rank computes the same global order
//! with no communication. `set_start` skips the first samples of this rank's shard (mid-epoch
//! resume, like torchdata's stateful sampler).

use crate::error::{DataError, Result};
use crate::randperm::randperm;

/// Shards dataset indices across `num_replicas` ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DistributedSampler {
    len: usize,
    num_replicas: usize,
    rank: usize,
    shuffle: bool,
    seed: u64,
    drop_last: bool,
    epoch: u64,
    start: usize,
}

impl DistributedSampler {
    /// PyTorch's defaults: `shuffle=True, seed=0, drop_last=False`, epoch 0.
    /// Errors when `len == 0`, `num_replicas == 0` or `rank >= num_replicas`.
    pub fn new(len: usize, num_replicas: usize, rank: usize) -> Result<Self> {
        if len == 0 {
            return Err(DataError::Config {
                field: "dataset",
                msg: "the dataset is empty".into(),
            });
        }
        if rank >= num_replicas {
            return Err(DataError::Config {
                field: "rank",
                msg: format!("expected rank < num_replicas ({num_replicas}), got {rank}"),
            });
        }
        Ok(DistributedSampler {
            len,
            num_replicas,
            rank,
            shuffle: true,
            seed: 0,
            drop_last: false,
            epoch: 0,
            start: 0,
        })
    }

    /// Shuffle each epoch (default true).
    pub fn with_shuffle(mut self, shuffle: bool) -> Self {
        self.shuffle = shuffle;
        self
    }

    /// Seed shared by all ranks (default 0).
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Trim instead of padding (default false).
    pub fn with_drop_last(mut self, drop_last: bool) -> Self {
        self.drop_last = drop_last;
        self
    }

    /// Selects the epoch's permutation; call at the start of every epoch, on every rank.
    pub fn set_epoch(&mut self, epoch: u64) {
        self.epoch = epoch;
    }

    /// Skips the first `start` samples of this rank's shard (resume mid-epoch).
    pub fn set_start(&mut self, start: usize) {
        self.start = start;
    }

    /// The current epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// World size.
    pub fn num_replicas(&self) -> usize {
        self.num_replicas
    }

    /// Samples it shards: the dataset's length (`len(dataset)`).
    pub fn dataset_len(&self) -> usize {
        self.len
    }

    /// Samples per rank per epoch (PyTorch's `num_samples`, same on every rank).
    pub fn num_samples(&self) -> usize {
        let w = self.num_replicas;
        if self.drop_last && !self.len.is_multiple_of(w) {
            self.len.saturating_sub(w).div_ceil(w)
        } else {
            self.len.div_ceil(w)
        }
    }

    /// `num_samples * num_replicas`.
    pub fn total_size(&self) -> usize {
        self.num_samples() * self.num_replicas
    }

    /// The epoch's global order, padded or trimmed to `total_size` (identical on every rank).
    pub fn global_order(&self) -> Vec<usize> {
        let mut order = if self.shuffle {
            randperm(self.len, self.seed.wrapping_add(self.epoch))
        } else {
            (0..self.len).collect()
        };
        let total = self.total_size();
        if total <= order.len() {
            order.truncate(total);
        } else {
            let base = order.clone();
            order.extend(base.iter().cycle().take(total - base.len()));
        }
        order
    }

    /// This rank's positions `rank, rank + W, ...` of a global order, from `start` on.
    pub fn shard(&self, global: &[usize]) -> Vec<usize> {
        global
            .iter()
            .skip(self.rank)
            .step_by(self.num_replicas)
            .skip(self.start)
            .copied()
            .collect()
    }

    /// This rank's indices for the current epoch (from `start` on).
    pub fn indices(&self) -> Vec<usize> {
        self.shard(&self.global_order())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_bad_config() {
        assert!(DistributedSampler::new(0, 1, 0).is_err());
        assert!(DistributedSampler::new(5, 2, 2)
            .unwrap_err()
            .to_string()
            .contains("rank"));
    }

    #[test]
    fn start_skips_samples() {
        let mut s = DistributedSampler::new(10, 2, 1).unwrap().with_seed(3);
        let all = s.indices();
        s.set_start(2);
        assert_eq!(s.indices(), all[2..].to_vec());
    }
}
