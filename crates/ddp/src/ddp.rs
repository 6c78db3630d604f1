//! DistributedDataParallel over named Candle `Var`s: broadcast at construction, reverse-order
//! fp32 buckets whose flat buffers *are* the gradient storage (`gradient_as_bucket_view`), an
//! asynchronous all-reduce launched in the backward the moment a bucket is complete, `no_sync`
//! for accumulation, unused-parameter detection and an opt-in replica checksum.
//!
//! Mirrors `torch.nn.parallel.DistributedDataParallel` and its C++ `Reducer`. Invariants:
//! gradients accumulate with `+=`; the first report of a parameter in an accumulation window
//! overwrites (so no zeroing pass is needed); buckets launch strictly in plan order (identical on
//! all ranks); the flat buffers may only be read between [`DistributedDataParallel::finish`] and
//! the next synchronised backward, when they hold the rank-average of every micro-batch's sum.

use crate::bucket::{BucketPlan, ParamSlot};
use crate::comm::{ReduceOp, Work};
use crate::error::{DdpError, RankTag, Result};
use crate::group::ProcessGroup;
use candle_core::backprop::GradStore;
use candle_core::{DType, Shape, Tensor, Var};
use g4ft_hash::Fnv1a64;
use std::collections::HashMap;
use std::panic::Location;

/// Options of [`DistributedDataParallel::new`] (PyTorch's names).
#[derive(Debug, Clone)]
pub struct DdpOptions {
    /// Bucket capacity in MiB of fp32 gradients (default 25).
    pub bucket_cap_mb: f64,
    /// Parameters without a gradient at a synchronisation are zero-filled (or keep what earlier
    /// micro-batches accumulated) instead of raising [`DdpError::UnusedParameters`]. For
    /// data-dependent usage such as MoE experts.
    pub find_unused_parameters: bool,
    /// Compare a checksum of every parameter across ranks after every N-th `finish`.
    pub check_parameters_every: Option<u64>,
}

impl Default for DdpOptions {
    fn default() -> Self {
        DdpOptions {
            bucket_cap_mb: 25.0,
            find_unused_parameters: false,
            check_parameters_every: None,
        }
    }
}

/// One bucket: a flat fp32 gradient buffer and the parameters laid out in it.
pub struct Bucket {
    /// Flat fp32 buffer, shape `(numel,)`, on the parameters' device. After `finish` it holds
    /// the averaged gradients; an optimizer or clipping may run over it directly.
    pub grad: Tensor,
    /// Parameters in layout order (reverse model order).
    pub slots: Vec<ParamSlot>,
}

struct BucketState {
    pending: usize,
    work: Option<Work>,
}

/// The DDP wrapper (see module docs). Create it after every adapter exists and every freeze is
/// applied: the parameter list is fixed here.
pub struct DistributedDataParallel<'g> {
    group: &'g ProcessGroup,
    params: Vec<(String, Var)>,
    by_name: HashMap<String, usize>,
    plan: BucketPlan,
    buckets: Vec<Bucket>,
    state: Vec<BucketState>,
    seen: Vec<bool>,
    ready: Vec<bool>,
    syncing: bool,
    next_launch: usize,
    syncs: u64,
    reductions: u64,
    opts: DdpOptions,
    site: String,
}

impl<'g> DistributedDataParallel<'g> {
    /// Wraps `params` (name, trainable `Var`; model order). Collective: checks that every rank
    /// has the same names and shapes, broadcasts the values from rank 0 (so LoRA inits agree
    /// even if seeds did not), then allocates the buckets. Errors name the first mismatch.
    #[track_caller]
    pub fn new(
        group: &'g ProcessGroup,
        params: Vec<(String, Var)>,
        opts: DdpOptions,
    ) -> Result<Self> {
        let l = Location::caller();
        let site = format!("{}:{}", l.file(), l.line());
        let tag = group.tag();
        let mut by_name = HashMap::new();
        for (i, (n, v)) in params.iter().enumerate() {
            if by_name.insert(n.clone(), i).is_some() {
                return Err(tag.usage(format!("DDP parameter {n}"), "name appears twice"));
            }
            if !v.dtype().is_float() {
                return Err(tag.usage(
                    format!("DDP parameter {n}"),
                    format!("dtype {:?} is not a float", v.dtype()),
                ));
            }
        }
        let Some(device) = params.first().map(|(_, v)| v.device().clone()) else {
            return Err(tag.usage("DistributedDataParallel::new", "no trainable parameters"));
        };
        let sig: Vec<(String, Vec<usize>)> = params
            .iter()
            .map(|(n, v)| (n.clone(), v.dims().to_vec()))
            .collect();
        let all = group.all_gather_object(&sig)?;
        for (r, other) in all.iter().enumerate() {
            if let Some(diff) = first_difference(&sig, other) {
                return Err(tag.usage(
                    "DistributedDataParallel::new",
                    format!("parameters differ from rank {r}: {diff}"),
                ));
            }
        }
        for (n, v) in &params {
            group.broadcast(v.as_tensor(), 0).map_err(|e| match e {
                DdpError::Comm {
                    tag,
                    context,
                    reason,
                } => DdpError::Comm {
                    tag,
                    context: format!("broadcast of {n}: {context}"),
                    reason,
                },
                e => e,
            })?;
        }
        let shapes: Vec<(String, Shape)> = params
            .iter()
            .map(|(n, v)| (n.clone(), v.shape().clone()))
            .collect();
        let cap = (opts.bucket_cap_mb * 1024.0 * 1024.0) as usize;
        let plan = BucketPlan::new(&shapes, cap);
        let mut buckets = Vec::new();
        for (b, slots) in plan.buckets.iter().enumerate() {
            let grad = Tensor::zeros(plan.numel(b), DType::F32, &device)
                .map_err(tag.tensor(format!("allocate bucket {b}")))?;
            buckets.push(Bucket {
                grad,
                slots: slots.clone(),
            });
        }
        let state = plan
            .buckets
            .iter()
            .map(|s| BucketState {
                pending: s.len(),
                work: None,
            })
            .collect();
        let n = params.len();
        Ok(DistributedDataParallel {
            group,
            params,
            by_name,
            plan,
            buckets,
            state,
            seen: vec![false; n],
            ready: vec![false; n],
            syncing: false,
            next_launch: 0,
            syncs: 0,
            reductions: 0,
            opts,
            site,
        })
    }

    /// The process group.
    pub fn group(&self) -> &'g ProcessGroup {
        self.group
    }

    /// The wrapped parameters, model order.
    pub fn params(&self) -> &[(String, Var)] {
        &self.params
    }

    /// The bucket plan (launch order, offsets).
    pub fn plan(&self) -> &BucketPlan {
        &self.plan
    }

    /// Completed synchronisations (optimizer steps).
    pub fn syncs(&self) -> u64 {
        self.syncs
    }

    /// Bucket all-reduces launched so far.
    pub fn reductions(&self) -> u64 {
        self.reductions
    }

    fn tag(&self) -> RankTag {
        self.group.tag()
    }

    fn index(&self, name: &str) -> Result<usize> {
        self.by_name.get(name).copied().ok_or_else(|| {
            self.tag().usage(
                format!("grad_ready({name})"),
                "not a parameter given to DistributedDataParallel::new",
            )
        })
    }

    /// Reports that `grad` (same shape as the parameter, any float dtype) is final for this
    /// backward, on the synchronised (last) micro-batch: it is added to the bucket slice, and if
    /// that completes the next bucket(s) in plan order, their all-reduce starts now while the
    /// caller continues with the backward. Errors if the parameter was already reported in this
    /// backward (its bucket may be on the wire).
    pub fn grad_ready(&mut self, name: &str, grad: &Tensor) -> Result<()> {
        let i = self.index(name)?;
        self.report(&[(i, grad)])
    }

    /// [`DistributedDataParallel::grad_ready`] for every wrapped parameter that has a gradient in
    /// `grads` (e.g. one layer's store from a layer-wise backward), as one batch: on CUDA a
    /// single accumulation launch per bucket touched. Nothing is accumulated if one of them was
    /// already reported in this backward. Returns how many it reported.
    pub fn grads_ready_from(&mut self, grads: &GradStore) -> Result<usize> {
        self.grads_ready_with(|v| grads.get(v.as_tensor()).cloned())
    }

    /// [`DistributedDataParallel::grads_ready_from`] for gradients held elsewhere (e.g. an explicit
    /// layer backward's list): `lookup` returns a parameter's gradient or `None`.
    pub fn grads_ready_with(&mut self, lookup: impl Fn(&Var) -> Option<Tensor>) -> Result<usize> {
        let found = self.found_in(lookup);
        let items: Vec<(usize, &Tensor)> = found.iter().map(|(i, g)| (*i, g)).collect();
        self.report(&items)?;
        Ok(items.len())
    }

    /// Synchronised report of distinct parameters `items` (index, gradient).
    fn report(&mut self, items: &[(usize, &Tensor)]) -> Result<()> {
        if let Some((i, _)) = items.iter().find(|(i, _)| self.ready[*i]) {
            return Err(self.tag().usage(
                format!("grad_ready({})", self.params[*i].0),
                "reported twice in one synchronised backward",
            ));
        }
        self.accumulate_all(items)?;
        for (i, _) in items {
            self.ready[*i] = true;
            self.state[self.plan.locate[*i].0].pending -= 1;
        }
        if !items.is_empty() {
            self.syncing = true;
        }
        self.launch_ready()
    }

    /// Wrapped parameters `lookup` has a gradient for: (index, gradient), model order.
    fn found_in(&self, lookup: impl Fn(&Var) -> Option<Tensor>) -> Vec<(usize, Tensor)> {
        self.params
            .iter()
            .enumerate()
            .filter_map(|(i, (_, v))| lookup(v).map(|g| (i, g)))
            .collect()
    }

    /// Runs the non-final micro-batches of an accumulation window: inside `f`, gradients reported
    /// through [`NoSync::grad_ready`] only accumulate locally. The next synchronised backward
    /// ([`DistributedDataParallel::grad_ready`] + [`DistributedDataParallel::finish`]) reduces
    /// everything accumulated. Errors if a synchronised backward is in progress.
    pub fn no_sync<R, E: From<DdpError>>(
        &mut self,
        f: impl FnOnce(&mut NoSync<'_, 'g>) -> std::result::Result<R, E>,
    ) -> std::result::Result<R, E> {
        if self.syncing {
            return Err(self
                .tag()
                .usage(
                    "no_sync",
                    "a synchronised backward is in progress; call finish() first",
                )
                .into());
        }
        f(&mut NoSync { ddp: self })
    }

    /// Adds (or, on the first report of the window, writes) the gradients of the distinct
    /// parameters `items` into their bucket slices. Shapes are checked for all before anything
    /// is written. CUDA buckets: one kernel launch per bucket touched (see [`crate::accumulate`]);
    /// CPU: narrow/add/`slice_set` per parameter.
    fn accumulate_all(&mut self, items: &[(usize, &Tensor)]) -> Result<()> {
        for &(i, grad) in items {
            let (b, s) = self.plan.locate[i];
            let slot = &self.plan.buckets[b][s];
            if grad.shape() != &slot.shape {
                return Err(self.tag().usage(
                    self.slot_ctx(i),
                    format!("shape {:?}, expected {:?}", grad.dims(), slot.shape.dims()),
                ));
            }
        }
        #[cfg(feature = "cuda")]
        if self
            .buckets
            .first()
            .is_some_and(|b| b.grad.device().is_cuda())
        {
            return self.accumulate_cuda(items);
        }
        for &(i, grad) in items {
            self.accumulate(i, grad)?;
        }
        Ok(())
    }

    /// "gradient of NAME into bucket B at offset O" (error context).
    fn slot_ctx(&self, i: usize) -> String {
        let (b, s) = self.plan.locate[i];
        let slot = &self.plan.buckets[b][s];
        format!(
            "gradient of {} into bucket {b} at offset {}",
            slot.name, slot.offset
        )
    }

    /// CPU path of [`Self::accumulate_all`] for one parameter (shape already checked).
    fn accumulate(&mut self, i: usize, grad: &Tensor) -> Result<()> {
        let (b, s) = self.plan.locate[i];
        let slot = &self.plan.buckets[b][s];
        let tag = self.tag();
        let run = || -> candle_core::Result<()> {
            let g = grad.to_dtype(DType::F32)?.flatten_all()?.contiguous()?;
            let flat = &self.buckets[b].grad;
            let v = if self.seen[i] {
                (flat.narrow(0, slot.offset, slot.numel)? + g)?
            } else {
                g
            };
            flat.slice_set(&v, 0, slot.offset)
        };
        run().map_err(tag.tensor(self.slot_ctx(i)))?;
        self.seen[i] = true;
        Ok(())
    }

    /// CUDA path of [`Self::accumulate_all`]: f32 contiguous gradients are read in place (other
    /// dtypes or layouts are converted first, allocating as before); one `ddp_accumulate_f32`
    /// launch per bucket touched and [`crate::accumulate::MAX_ENTRIES`] gradients, on candle's
    /// stream.
    #[cfg(feature = "cuda")]
    fn accumulate_cuda(&mut self, items: &[(usize, &Tensor)]) -> Result<()> {
        use crate::accumulate::{src_ptr, tables, AccumulateInPlace, Item};
        let tag = self.tag();
        // Converted gradients stay alive until their launch is enqueued (frees are stream-ordered).
        let mut keep = Vec::with_capacity(items.len());
        let mut batch = Vec::with_capacity(items.len());
        for &(i, grad) in items {
            let (b, s) = self.plan.locate[i];
            let slot = &self.plan.buckets[b][s];
            if !grad.device().same_device(self.buckets[b].grad.device()) {
                return Err(tag.usage(
                    self.slot_ctx(i),
                    format!(
                        "gradient on {:?}, bucket on {:?}",
                        grad.device().location(),
                        self.buckets[b].grad.device().location()
                    ),
                ));
            }
            let g = grad
                .to_dtype(DType::F32)
                .and_then(|g| g.contiguous())
                .map_err(tag.tensor(self.slot_ctx(i)))?;
            let src = src_ptr(&g).map_err(tag.tensor(self.slot_ctx(i)))?;
            batch.push(Item {
                bucket: b,
                off: slot.offset,
                len: slot.numel,
                src,
                overwrite: !self.seen[i],
            });
            keep.push(g);
        }
        for (b, table) in tables(&batch) {
            self.buckets[b]
                .grad
                .inplace_op1(&AccumulateInPlace { table })
                .map_err(tag.tensor(format!(
                    "accumulate {} gradient(s) into bucket {b}",
                    table.entries().len()
                )))?;
        }
        drop(keep);
        for (i, _) in items {
            self.seen[*i] = true;
        }
        Ok(())
    }

    /// Launch point of the overlap: starts the all-reduce of every complete bucket, in plan order.
    /// CPU: the ring thread reduces it while the caller continues. CUDA: the comm stream waits
    /// on an event recorded on the compute stream after the slice copies, then runs NCCL.
    fn launch_ready(&mut self) -> Result<()> {
        let n = self.buckets.len();
        while self.next_launch < n && self.state[self.next_launch].pending == 0 {
            let b = self.next_launch;
            let label = format!("ddp bucket {}/{n} of DDP created at {}", b + 1, self.site);
            let work =
                self.group
                    .all_reduce_labeled(&self.buckets[b].grad, ReduceOp::Avg, label)?;
            self.state[b].work = Some(work);
            self.next_launch += 1;
            self.reductions += 1;
        }
        Ok(())
    }

    /// Ends the synchronised backward: handles parameters that got no gradient (error naming
    /// them, or zero-fill with `find_unused_parameters`), launches what is left, waits for every
    /// bucket and leaves the rank-averaged gradients in the flat buffers. With
    /// `check_parameters_every = Some(n)` compares parameter checksums every n-th call.
    pub fn finish(&mut self) -> Result<()> {
        let unready: Vec<usize> = (0..self.params.len()).filter(|i| !self.ready[*i]).collect();
        let mut first_err = None;
        if !unready.is_empty() && !self.opts.find_unused_parameters {
            first_err = Some(DdpError::UnusedParameters {
                tag: self.tag(),
                sync: self.syncs + 1,
                count: unready.len(),
                names: unready.iter().map(|i| self.params[*i].0.clone()).collect(),
            });
        } else {
            for i in unready {
                let (b, s) = self.plan.locate[i];
                if !self.seen[i] {
                    let slot = &self.plan.buckets[b][s];
                    let zeros =
                        Tensor::zeros(slot.numel, DType::F32, self.buckets[b].grad.device());
                    zeros
                        .and_then(|z| self.buckets[b].grad.slice_set(&z, 0, slot.offset))
                        .map_err(self.tag().tensor(format!("zero-fill unused {}", slot.name)))?;
                }
                self.ready[i] = true;
                self.state[b].pending -= 1;
            }
            if let Err(e) = self.launch_ready() {
                first_err = Some(e);
            }
        }
        for st in &mut self.state {
            if let Some(w) = st.work.take() {
                if let Err(e) = w.wait() {
                    first_err.get_or_insert(e);
                }
            }
        }
        for (st, slots) in self.state.iter_mut().zip(&self.plan.buckets) {
            st.pending = slots.len();
        }
        self.seen.iter_mut().for_each(|s| *s = false);
        self.ready.iter_mut().for_each(|s| *s = false);
        self.next_launch = 0;
        self.syncing = false;
        self.syncs += 1;
        if let Some(e) = first_err {
            return Err(e);
        }
        match self.opts.check_parameters_every {
            Some(n) if n > 0 && self.syncs.is_multiple_of(n) => self.check_parameters().map(drop),
            _ => Ok(()),
        }
    }

    /// The buckets (flat averaged gradients + layout). Errors during a synchronised backward,
    /// when buffers are being reduced.
    pub fn buckets(&self) -> Result<&[Bucket]> {
        if self.syncing {
            return Err(self.tag().usage(
                "buckets()",
                "a synchronised backward is in progress; call finish() first",
            ));
        }
        Ok(&self.buckets)
    }

    /// The averaged gradient of `name`, a view into its bucket with the parameter's shape.
    pub fn grad(&self, name: &str) -> Result<Tensor> {
        let i = self.index(name)?;
        let (b, s) = self.plan.locate[i];
        let slot = &self.plan.buckets[b][s];
        self.buckets()?[b]
            .grad
            .narrow(0, slot.offset, slot.numel)
            .and_then(|g| g.reshape(slot.shape.clone()))
            .map_err(self.tag().tensor(format!("view of the gradient of {name}")))
    }

    /// Compares a checksum of every parameter across ranks; [`DdpError::ParameterDrift`] names
    /// the first differing parameters and ranks. Returns the checksum of all parameters
    /// (bitwise, the same on every rank when it returns `Ok`). Collective.
    pub fn check_parameters(&self) -> Result<u64> {
        let tag = self.tag();
        let mut mine = Vec::with_capacity(self.params.len());
        for (n, v) in &self.params {
            let vals = v
                .as_tensor()
                .flatten_all()
                .and_then(|t| t.to_dtype(DType::F32))
                .and_then(|t| t.to_vec1::<f32>())
                .map_err(tag.tensor(format!("checksum of {n}")))?;
            mine.push(fnv1a(&vals));
        }
        let all = self.group.all_gather_object(&mine)?;
        let mut diffs = Vec::new();
        for (r, theirs) in all.iter().enumerate() {
            for (i, (a, b)) in mine.iter().zip(theirs).enumerate() {
                if a != b && diffs.len() < 5 {
                    diffs.push(format!(
                        "{} differs on rank {r} ({b:#018x} vs {a:#018x} here)",
                        self.params[i].0
                    ));
                }
            }
        }
        if diffs.is_empty() {
            let mut all = Fnv1a64::default();
            mine.iter().for_each(|x| all.update(&x.to_le_bytes()));
            Ok(all.finish())
        } else {
            Err(DdpError::ParameterDrift {
                tag,
                step: self.syncs,
                detail: diffs.join("; "),
            })
        }
    }
}

/// Handle given to the closure of [`DistributedDataParallel::no_sync`]: it can only accumulate.
pub struct NoSync<'a, 'g> {
    ddp: &'a mut DistributedDataParallel<'g>,
}

impl NoSync<'_, '_> {
    /// Adds `grad` into the parameter's bucket slice; nothing goes on the wire.
    pub fn grad_ready(&mut self, name: &str, grad: &Tensor) -> Result<()> {
        let i = self.ddp.index(name)?;
        self.ddp.accumulate_all(&[(i, grad)])
    }

    /// [`NoSync::grad_ready`] for every wrapped parameter present in `grads`, as one batch (on
    /// CUDA a single accumulation launch per bucket touched).
    pub fn grads_ready_from(&mut self, grads: &GradStore) -> Result<usize> {
        self.grads_ready_with(|v| grads.get(v.as_tensor()).cloned())
    }

    /// [`NoSync::grads_ready_from`] with a `lookup` (see
    /// [`DistributedDataParallel::grads_ready_with`]).
    pub fn grads_ready_with(&mut self, lookup: impl Fn(&Var) -> Option<Tensor>) -> Result<usize> {
        let found = self.ddp.found_in(lookup);
        let items: Vec<(usize, &Tensor)> = found.iter().map(|(i, g)| (*i, g)).collect();
        self.ddp.accumulate_all(&items)?;
        Ok(items.len())
    }
}

fn first_difference(a: &[(String, Vec<usize>)], b: &[(String, Vec<usize>)]) -> Option<String> {
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        if x != y {
            return Some(format!(
                "parameter {i} is {} {:?} here, {} {:?} there",
                x.0, x.1, y.0, y.1
            ));
        }
    }
    (a.len() != b.len()).then(|| format!("{} parameters here, {} there", a.len(), b.len()))
}

/// FNV-1a over the f32 bit patterns (bitwise replica comparison).
fn fnv1a(v: &[f32]) -> u64 {
    let mut h = Fnv1a64::default();
    v.iter().for_each(|x| h.update(&x.to_bits().to_le_bytes()));
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::DistEnv;
    use crate::group::GroupOptions;
    use candle_core::Device;

    fn group() -> ProcessGroup {
        let opts = GroupOptions {
            force_nccl: Some(false),
            ..Default::default()
        };
        ProcessGroup::new(DistEnv::single(), &Device::Cpu, opts).expect("world-1 CPU group")
    }

    /// Three parameters over two buckets (cap 8 floats: [3x2] alone, then [2] + [4]).
    fn params() -> Vec<(String, Var)> {
        [vec![4usize], vec![2], vec![3, 2]]
            .into_iter()
            .enumerate()
            .map(|(p, s)| {
                let t = Tensor::zeros(s, DType::F32, &Device::Cpu).expect("zeros");
                (format!("p{p}"), Var::from_tensor(&t).expect("var"))
            })
            .collect()
    }

    /// Gradient of parameter `p` in micro-batch `m`.
    fn grad_vals(p: usize, n: usize, m: usize) -> Vec<f32> {
        (0..n)
            .map(|i| (i * 3 + p * 5 + m * 7) as f32 * 0.25)
            .collect()
    }

    /// A store with the gradients of micro-batch `m` for the parameters `which`.
    fn store(ps: &[(String, Var)], which: &[usize], m: usize) -> GradStore {
        let mut loss = Tensor::zeros((), DType::F32, &Device::Cpu).expect("zero");
        for &p in which {
            let v = &ps[p].1;
            let c = Tensor::from_vec(grad_vals(p, v.elem_count(), m), v.shape(), &Device::Cpu)
                .expect("coefficients");
            loss = (loss + (v.as_tensor() * c).expect("mul").sum_all().expect("sum")).expect("add");
        }
        loss.backward().expect("backward")
    }

    #[test]
    fn batched_reports_accumulate_across_no_sync_and_buckets() {
        let pg = group();
        let ps = params();
        let opts = DdpOptions {
            bucket_cap_mb: 8.0 * 4.0 / (1024.0 * 1024.0),
            ..Default::default()
        };
        let mut ddp = DistributedDataParallel::new(&pg, ps.clone(), opts).expect("ddp");
        assert_eq!(ddp.plan().buckets.len(), 2);
        for _step in 0..2 {
            let n = ddp
                .no_sync(|ns| ns.grads_ready_from(&store(&ps, &[0, 1, 2], 0)))
                .expect("no_sync");
            assert_eq!(n, 3);
            let n = ddp
                .grads_ready_from(&store(&ps, &[0, 1, 2], 1))
                .expect("sync report");
            assert_eq!(n, 3);
            assert_eq!(ddp.reductions() % 2, 0, "both buckets launched");
            ddp.finish().expect("finish");
            for (p, (name, v)) in ps.iter().enumerate() {
                let n = v.elem_count();
                let want: Vec<f32> = grad_vals(p, n, 0)
                    .iter()
                    .zip(grad_vals(p, n, 1))
                    .map(|(a, b)| a + b)
                    .collect();
                let got: Vec<f32> = ddp
                    .grad(name)
                    .and_then(|g| g.flatten_all().map_err(pg.tag().tensor("flatten")))
                    .and_then(|g| g.to_vec1().map_err(pg.tag().tensor("to_vec1")))
                    .expect("grad");
                assert_eq!(got, want, "{name}");
            }
        }
    }

    #[test]
    fn batched_report_with_a_repeat_accumulates_nothing() {
        let pg = group();
        let ps = params();
        let mut ddp =
            DistributedDataParallel::new(&pg, ps.clone(), DdpOptions::default()).expect("ddp");
        let g0 = Tensor::from_vec(grad_vals(0, 4, 1), 4, &Device::Cpu).expect("g0");
        ddp.grad_ready("p0", &g0).expect("p0");
        let err = ddp
            .grads_ready_from(&store(&ps, &[0, 1], 2))
            .expect_err("p0 reported twice");
        assert!(err.to_string().contains("p0"), "{err}");
        // p1 was not taken by the failed batch: it can still be reported, once.
        let g1 = Tensor::from_vec(grad_vals(1, 2, 1), 2, &Device::Cpu).expect("g1");
        ddp.grad_ready("p1", &g1).expect("p1");
        let g2 = Tensor::from_vec(grad_vals(2, 6, 1), (3, 2), &Device::Cpu).expect("g2");
        ddp.grad_ready("p2", &g2).expect("p2");
        ddp.finish().expect("finish");
        let got: Vec<f32> = ddp
            .grad("p0")
            .and_then(|g| g.to_vec1().map_err(pg.tag().tensor("to_vec1")))
            .expect("grad");
        assert_eq!(got, grad_vals(0, 4, 1));
    }
}
