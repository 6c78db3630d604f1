//! `PadCollate` and `Batch`: rows of samples to row-major (batch, seq_len) arrays.
//!
//! Mirrors the post's `PadCollate`: right padding to the longest row with the pad id,
//! `attention_mask` 1 on tokens and 0 on padding, labels -100 on padding (labels are not
//! shifted: the model shifts, as transformers does). Packed rows concatenate samples (see
//! [`Batch`] for their representation); the first label of every sample is -100 (as
//! transformers' `DataCollatorWithFlattening`), so no sample learns from the previous one.

use crate::dataset::Sample;
use crate::labels::IGNORE;

/// A collated batch, row-major `(batch, seq_len)`.
///
/// **Packed batches** (`position_ids` is `Some`): a row holds whole samples back to back, then
/// its padding. Each sample, and the padding tail, is a *segment*; `position_ids` restart at 0
/// at the first token of every segment and count up within it, so column `c` of a row belongs to
/// the segment that starts at column `c - position_ids[c]`. A token attends to the columns
/// `c - position_ids[c] ..= c` of its row (on sliding layers also at most `window` back): never
/// to another sample. RoPE uses the same positions, so every sample sees positions `0..len`, as
/// it would alone (transformers' packed path: `position_ids` and no attention mask). The model
/// gets these positions and **no attention mask** (a mask would make it ignore the
/// segments); [`Batch::cu_seqlens`] gives the same boundaries as flash-attention's varlen
/// offsets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// Token ids, pad id on padding.
    pub input_ids: Vec<u32>,
    /// 1 on tokens, 0 on padding (for packed batches: informational, not passed to the model).
    pub attention_mask: Vec<u32>,
    /// Unshifted labels, -100 where ignored.
    pub labels: Vec<i64>,
    /// Packed batches: the positions that restart at every segment; `None`: unpacked, positions
    /// `0..seq_len` in every row.
    pub position_ids: Option<Vec<u32>>,
    /// Rows.
    pub batch: usize,
    /// Columns (longest row).
    pub seq_len: usize,
    /// Non-padding tokens (the post logs these per second).
    pub n_tokens: usize,
    /// Targets of the shifted loss: labels at column >= 1 that are not -100.
    pub n_label_tokens: usize,
    /// Dataset indices of the samples, row by row.
    pub samples: Vec<usize>,
}

impl Batch {
    /// `b` unpadded rows of `t` tokens whose labels are the inputs (every position after the
    /// first is a target): the synthetic batches of benchmarks and tests.
    pub fn full_rows(input_ids: Vec<u32>, b: usize, t: usize) -> Self {
        assert_eq!(input_ids.len(), b * t, "Batch::full_rows: b·t token ids");
        Batch {
            labels: input_ids.iter().map(|&x| x as i64).collect(),
            attention_mask: vec![1; b * t],
            input_ids,
            position_ids: None,
            batch: b,
            seq_len: t,
            n_tokens: b * t,
            n_label_tokens: b * (t - 1),
            samples: Vec::new(),
        }
    }

    /// Whether rows hold several samples (see the type's doc).
    pub fn is_packed(&self) -> bool {
        self.position_ids.is_some()
    }

    /// Segment boundaries of a packed batch as offsets into the flattened `batch * seq_len`
    /// tokens (flash-attention's `cu_seqlens`: every segment start, then the total); `None` for an
    /// unpacked batch.
    pub fn cu_seqlens(&self) -> Option<Vec<u32>> {
        let pos = self.position_ids.as_ref()?;
        let mut cu: Vec<u32> = (0..pos.len())
            .filter(|&i| pos[i] == 0 || i % self.seq_len == 0)
            .map(|i| i as u32)
            .collect();
        cu.push(pos.len() as u32);
        Some(cu)
    }
}

/// Right-pads rows with `pad_id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PadCollate {
    /// Pad token id (Gemma 4: 0).
    pub pad_id: u32,
}

impl PadCollate {
    /// One sample per row (the post's collate). `samples` pairs dataset index and sample.
    pub fn collate(&self, samples: &[(usize, Sample)]) -> Batch {
        let rows: Vec<Vec<(usize, Sample)>> = samples.iter().map(|s| vec![s.clone()]).collect();
        self.build(&rows, false)
    }

    /// Several samples per row (packing), with restarting `position_ids`.
    pub fn collate_packed(&self, rows: &[Vec<(usize, Sample)>]) -> Batch {
        self.build(rows, true)
    }

    fn build(&self, rows: &[Vec<(usize, Sample)>], packed: bool) -> Batch {
        let b = rows.len();
        let row_len =
            |r: &Vec<(usize, Sample)>| r.iter().map(|(_, s)| s.input_ids.len()).sum::<usize>();
        let t = rows.iter().map(row_len).max().unwrap_or(0);
        let mut input_ids = vec![self.pad_id; b * t];
        let mut attention_mask = vec![0u32; b * t];
        let mut labels = vec![i64::from(IGNORE); b * t];
        let mut position_ids = packed.then(|| vec![0u32; b * t]);
        let mut samples = Vec::new();
        let mut n_tokens = 0;
        for (r, row) in rows.iter().enumerate() {
            let mut col = r * t;
            for (idx, s) in row {
                samples.push(*idx);
                for (k, (&id, &label)) in s.input_ids.iter().zip(&s.labels).enumerate() {
                    input_ids[col] = id;
                    attention_mask[col] = 1;
                    labels[col] = if packed && k == 0 {
                        i64::from(IGNORE)
                    } else {
                        i64::from(label)
                    };
                    if let Some(p) = position_ids.as_mut() {
                        p[col] = k as u32;
                    }
                    col += 1;
                }
                n_tokens += s.input_ids.len();
            }
            if let Some(p) = position_ids.as_mut() {
                for (k, c) in (col..(r + 1) * t).enumerate() {
                    p[c] = k as u32;
                }
            }
        }
        let n_label_tokens = (0..b)
            .map(|r| {
                labels[r * t..(r + 1) * t]
                    .iter()
                    .skip(1)
                    .filter(|&&l| l != i64::from(IGNORE))
                    .count()
            })
            .sum();
        Batch {
            input_ids,
            attention_mask,
            labels,
            position_ids,
            batch: b,
            seq_len: t,
            n_tokens,
            n_label_tokens,
            samples,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(ids: &[u32], labels: &[i32]) -> Sample {
        Sample {
            input_ids: ids.to_vec(),
            labels: labels.to_vec(),
        }
    }

    #[test]
    fn pads_right_and_masks_padding() {
        let c = PadCollate { pad_id: 0 };
        let b = c.collate(&[(4, s(&[2, 5, 6], &[2, 5, 6])), (1, s(&[2, 7], &[-100, 7]))]);
        assert_eq!((b.batch, b.seq_len), (2, 3));
        assert_eq!(b.input_ids, vec![2, 5, 6, 2, 7, 0]);
        assert_eq!(b.attention_mask, vec![1, 1, 1, 1, 1, 0]);
        assert_eq!(b.labels, vec![2, 5, 6, -100, 7, -100]);
        assert_eq!(b.position_ids, None);
        assert_eq!((b.n_tokens, b.n_label_tokens), (5, 3));
        assert_eq!(b.samples, vec![4, 1]);
    }

    #[test]
    fn packed_rows_restart_positions() {
        let c = PadCollate { pad_id: 9 };
        let b = c.collate_packed(&[
            vec![(0, s(&[2, 5], &[2, 5])), (1, s(&[2, 6, 7], &[2, 6, 7]))],
            vec![(2, s(&[2, 8], &[-100, 8]))],
        ]);
        assert_eq!(b.seq_len, 5);
        assert_eq!(b.input_ids, vec![2, 5, 2, 6, 7, 2, 8, 9, 9, 9]);
        assert_eq!(b.position_ids, Some(vec![0, 1, 0, 1, 2, 0, 1, 0, 1, 2]));
        assert_eq!(
            b.labels,
            vec![-100, 5, -100, 6, 7, -100, 8, -100, -100, -100]
        );
        assert_eq!(b.attention_mask, vec![1, 1, 1, 1, 1, 1, 1, 0, 0, 0]);
        assert_eq!((b.n_tokens, b.n_label_tokens), (7, 4));
        assert!(b.is_packed());
        // segments: [0,2) [2,5) in row 0; [5,7) and the padding [7,10) in row 1
        assert_eq!(b.cu_seqlens(), Some(vec![0, 2, 5, 7, 10]));
        assert_eq!(
            PadCollate { pad_id: 0 }
                .collate(&[(0, s(&[2, 5], &[2, 5]))])
                .cu_seqlens(),
            None
        );
    }
}
