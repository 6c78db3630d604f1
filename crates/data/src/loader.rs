//! `DataLoader`: the epoch's batch plan for this rank, collated on a background thread.
//!
//! Mirrors the post's `DataLoader(dataset, batch_size, sampler=DistributedSampler(...),
//! collate_fn=PadCollate(pad_id), drop_last=...)`. The plan (which samples form each batch) is a
//! pure function of (seed, epoch, rank, lengths), so `len()` is the same on every rank; a
//! background thread reads and collates up to `prefetch` batches ahead through a bounded
//! channel. Dropping the iterator stops the thread.

use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{bounded, Receiver};

use crate::batching::{self, Batching};
use crate::collate::{Batch, PadCollate};
use crate::dataset::TokenDataset;
use crate::error::{DataError, Result};
use crate::sampler::DistributedSampler;

/// Loader settings; `rank`/`world_size` come from the process group (torchrun's RANK and
/// WORLD_SIZE).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoaderConfig {
    /// Rows per batch (the post's `MICRO_BATCH`).
    pub batch_size: usize,
    /// This rank.
    pub rank: usize,
    /// Number of ranks.
    pub world_size: usize,
    /// Shuffle every epoch.
    pub shuffle: bool,
    /// Seed shared by every rank.
    pub seed: u64,
    /// Sampler `drop_last`: trim the global order instead of wrap-padding it.
    pub drop_last: bool,
    /// DataLoader `drop_last`: drop this rank's last partial batch.
    pub drop_last_batch: bool,
    /// Plain, length-grouped or packed rows.
    pub batching: Batching,
    /// Batches collated ahead on the background thread (at least 1).
    pub prefetch: usize,
}

impl Default for LoaderConfig {
    fn default() -> Self {
        LoaderConfig {
            batch_size: 1,
            rank: 0,
            world_size: 1,
            shuffle: true,
            seed: 0,
            drop_last: false,
            drop_last_batch: false,
            batching: Batching::Plain,
            prefetch: 4,
        }
    }
}

/// Produces this rank's batches, epoch by epoch.
#[derive(Debug)]
pub struct DataLoader {
    dataset: Arc<TokenDataset>,
    cfg: LoaderConfig,
    /// Samples of each unit the sampler shards: one per sample, or one pack.
    units: Vec<Vec<usize>>,
    unit_lengths: Vec<usize>,
    sampler: DistributedSampler,
    collate: PadCollate,
}

impl DataLoader {
    /// Plans units (samples or packs) and the sampler. Errors on a zero batch size or pack
    /// length, a sample longer than `pack_len`, or a bad rank.
    pub fn new(dataset: Arc<TokenDataset>, cfg: LoaderConfig) -> Result<Self> {
        if cfg.batch_size == 0 {
            return Err(DataError::Config {
                field: "batch_size",
                msg: "expected >= 1, got 0".into(),
            });
        }
        let lengths = dataset.lengths();
        let units: Vec<Vec<usize>> = match cfg.batching {
            Batching::Packed { pack_len } => {
                if let Some(i) = (0..lengths.len()).find(|&i| lengths[i] > pack_len) {
                    return Err(DataError::Config {
                        field: "pack_len",
                        msg: format!(
                            "sample {i} ({}:{}) has {} tokens, more than pack_len {pack_len}; \
                             set pack_len >= max_len",
                            dataset.file_of(i).display(),
                            dataset.line_of(i),
                            lengths[i]
                        ),
                    });
                }
                batching::pack(&lengths, pack_len, cfg.seed)
            }
            _ => (0..lengths.len()).map(|i| vec![i]).collect(),
        };
        let unit_lengths = units
            .iter()
            .map(|u| u.iter().map(|&i| lengths[i]).sum())
            .collect();
        let sampler = DistributedSampler::new(units.len(), cfg.world_size, cfg.rank)?
            .with_shuffle(cfg.shuffle)
            .with_seed(cfg.seed)
            .with_drop_last(cfg.drop_last);
        let collate = PadCollate {
            pad_id: dataset.pad_id(),
        };
        Ok(DataLoader {
            dataset,
            cfg,
            units,
            unit_lengths,
            sampler,
            collate,
        })
    }

    /// Batches per epoch on this rank — identical on every rank.
    pub fn len(&self) -> usize {
        let n = self.sampler.num_samples();
        if self.cfg.drop_last_batch {
            n / self.cfg.batch_size
        } else {
            n.div_ceil(self.cfg.batch_size)
        }
    }

    /// Whether an epoch has no batch (e.g. fewer samples per rank than `batch_size` with
    /// `drop_last_batch`).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The sampler over units (samples, or packs when packing).
    pub fn sampler(&self) -> &DistributedSampler {
        &self.sampler
    }

    /// The dataset.
    pub fn dataset(&self) -> &Arc<TokenDataset> {
        &self.dataset
    }

    /// Dataset indices of every row of every batch of `epoch` on this rank, from `start_batch`.
    pub fn plan(&self, epoch: u64, start_batch: usize) -> Vec<Vec<Vec<usize>>> {
        let mut sampler = self.sampler.clone();
        sampler.set_epoch(epoch);
        let mut global = sampler.global_order();
        if let Batching::GroupByLength { mega_batch_mult } = self.cfg.batching {
            let window = self.cfg.world_size * self.cfg.batch_size * mega_batch_mult.max(1);
            batching::group_by_length(&mut global, &self.unit_lengths, window);
        }
        let local = sampler.shard(&global);
        local
            .chunks(self.cfg.batch_size)
            .take(self.len())
            .skip(start_batch)
            .map(|batch| batch.iter().map(|&u| self.units[u].clone()).collect())
            .collect()
    }

    /// Iterates `epoch`'s batches from `start_batch` (0, or the resume point), collated on a
    /// background thread.
    pub fn epoch(&self, epoch: u64, start_batch: usize) -> Batches {
        let plan = self.plan(epoch, start_batch);
        let (tx, rx) = bounded(self.cfg.prefetch.max(1));
        let dataset = Arc::clone(&self.dataset);
        let collate = self.collate;
        let packed = matches!(self.cfg.batching, Batching::Packed { .. });
        let handle = std::thread::Builder::new()
            .name(format!("g4ft-loader-r{}", self.cfg.rank))
            .spawn(move || {
                for rows in plan {
                    let batch = read_rows(&dataset, &rows).map(|rows| {
                        if packed {
                            collate.collate_packed(&rows)
                        } else {
                            let flat: Vec<_> = rows.into_iter().flatten().collect();
                            collate.collate(&flat)
                        }
                    });
                    let failed = batch.is_err();
                    if tx.send(batch).is_err() || failed {
                        return; // receiver dropped, or the error was delivered
                    }
                }
            })
            .expect("spawning the loader thread");
        Batches {
            rx: Some(rx),
            handle: Some(handle),
        }
    }
}

type Rows = Vec<Vec<(usize, crate::dataset::Sample)>>;

fn read_rows(dataset: &TokenDataset, rows: &[Vec<usize>]) -> Result<Rows> {
    rows.iter()
        .map(|row| row.iter().map(|&i| Ok((i, dataset.sample(i)?))).collect())
        .collect()
}

/// Iterator over one epoch's batches; stops the background thread when dropped.
pub struct Batches {
    rx: Option<Receiver<Result<Batch>>>,
    handle: Option<JoinHandle<()>>,
}

impl Iterator for Batches {
    type Item = Result<Batch>;
    fn next(&mut self) -> Option<Self::Item> {
        self.rx.as_ref()?.recv().ok()
    }
}

impl Drop for Batches {
    fn drop(&mut self) {
        self.rx = None; // disconnects the channel: a blocked send returns an error
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}
