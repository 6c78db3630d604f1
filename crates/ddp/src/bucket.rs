//! Bucket plan: trainable parameters in reverse model order, packed into flat fp32 buckets of at
//! most `bucket_cap_mb` each (PyTorch DDP's `_compute_bucket_assignment_by_size`, without its
//! smaller first bucket).
//!
//! Invariant: the plan depends only on the parameter list and the cap, so it is identical on
//! every rank; buckets are launched in plan order. A parameter larger than the cap gets a bucket
//! of its own.

use candle_core::Shape;

/// Where one parameter's gradient lives inside its bucket's flat buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamSlot {
    /// Index in model order (the order given to DDP).
    pub index: usize,
    /// Parameter name.
    pub name: String,
    /// Offset in elements inside the bucket.
    pub offset: usize,
    /// Number of elements.
    pub numel: usize,
    /// The parameter's shape.
    pub shape: Shape,
}

/// The assignment of parameters to buckets (see module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketPlan {
    /// Buckets in launch order; each lists its slots in layout order.
    pub buckets: Vec<Vec<ParamSlot>>,
    /// `(bucket, slot)` of each parameter, indexed by model order.
    pub locate: Vec<(usize, usize)>,
}

impl BucketPlan {
    /// Plans buckets for `params` (name, shape; model order) with a cap of `cap_bytes` of fp32.
    pub fn new(params: &[(String, Shape)], cap_bytes: usize) -> Self {
        let cap = (cap_bytes / 4).max(1);
        let mut buckets: Vec<Vec<ParamSlot>> = Vec::new();
        let mut fill = 0usize;
        for (index, (name, shape)) in params.iter().enumerate().rev() {
            let numel = shape.elem_count();
            let start_new = match buckets.last() {
                None => true,
                Some(b) => !b.is_empty() && fill + numel > cap,
            };
            if start_new {
                buckets.push(Vec::new());
                fill = 0;
            }
            let b = buckets.last_mut().expect("a bucket was just ensured");
            b.push(ParamSlot {
                index,
                name: name.clone(),
                offset: fill,
                numel,
                shape: shape.clone(),
            });
            fill += numel;
        }
        let mut locate = vec![(0, 0); params.len()];
        for (bi, b) in buckets.iter().enumerate() {
            for (si, s) in b.iter().enumerate() {
                locate[s.index] = (bi, si);
            }
        }
        BucketPlan { buckets, locate }
    }

    /// Elements of bucket `b`.
    pub fn numel(&self, b: usize) -> usize {
        self.buckets[b].iter().map(|s| s.numel).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(sizes: &[usize]) -> Vec<(String, Shape)> {
        sizes
            .iter()
            .enumerate()
            .map(|(i, n)| (format!("p{i}"), Shape::from(*n)))
            .collect()
    }

    #[test]
    fn reverse_order_and_cap() {
        // cap 40 bytes = 10 floats; params 0..5 with sizes 4,4,4,12,3,3
        let plan = BucketPlan::new(&params(&[4, 4, 4, 12, 3, 3]), 40);
        let names: Vec<Vec<&str>> = plan
            .buckets
            .iter()
            .map(|b| b.iter().map(|s| s.name.as_str()).collect())
            .collect();
        assert_eq!(
            names,
            vec![vec!["p5", "p4"], vec!["p3"], vec!["p2", "p1"], vec!["p0"]]
        );
        let offsets: Vec<usize> = plan.buckets[0].iter().map(|s| s.offset).collect();
        assert_eq!(offsets, vec![0, 3]);
        assert_eq!(plan.locate[1], (2, 1));
        assert_eq!(plan.numel(1), 12);
    }

    #[test]
    fn one_bucket_when_all_fit() {
        let plan = BucketPlan::new(&params(&[2, 3, 4]), 25 << 20);
        assert_eq!(plan.buckets.len(), 1);
        let offs: Vec<(usize, usize)> = plan.buckets[0]
            .iter()
            .map(|s| (s.index, s.offset))
            .collect();
        assert_eq!(offs, vec![(2, 0), (1, 4), (0, 7)]);
    }
}
