//! Batched gradient accumulation into the flat fp32 buckets on CUDA: all the gradients of one
//! `grad_ready` call (e.g. one layer's LoRA parameters) go into their buckets with one kernel
//! launch per bucket touched (per [`MAX_ENTRIES`] gradients), no allocation and no zero-fill.
//!
//! The host builds small [`Table`]s of (source address, bucket offset, length, overwrite) and
//! passes each by value as a kernel parameter of `kernels/accumulate.cu`; the kernel runs on
//! candle's stream, so it is ordered after the backward kernels that produced the gradients and
//! before the bucket's all-reduce (whose comm stream waits on an event recorded after it). The
//! CPU backend keeps the narrow/add/`slice_set` path of [`crate::ddp`].

/// Gradients per launch (the kernel's `G4FT_DDP_MAX_ENTRIES`; 1 KiB of kernel parameters).
pub(crate) const MAX_ENTRIES: usize = 32;

/// One gradient to put into a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Item {
    /// Bucket index.
    pub(crate) bucket: usize,
    /// Element offset of the parameter's slice in the bucket.
    pub(crate) off: usize,
    /// Elements.
    pub(crate) len: usize,
    /// Device address of the contiguous f32 gradient.
    pub(crate) src: u64,
    /// First report in the accumulation window: `=` instead of `+=`.
    pub(crate) overwrite: bool,
}

/// Kernel-side `Entry` (same layout as in `kernels/accumulate.cu`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Entry {
    src: u64,
    off: u64,
    len: u64,
    overwrite: u64,
}

/// Kernel-side `Table`: up to [`MAX_ENTRIES`] entries for one bucket, passed by value.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Table {
    n: u64,
    e: [Entry; MAX_ENTRIES],
}

impl Table {
    /// The used entries.
    pub(crate) fn entries(&self) -> &[Entry] {
        &self.e[..self.n as usize]
    }

    /// Largest entry (sets the grid's x extent).
    pub(crate) fn max_len(&self) -> usize {
        self.entries()
            .iter()
            .map(|e| e.len as usize)
            .max()
            .unwrap_or(0)
    }

    /// One past the highest bucket element written.
    pub(crate) fn end(&self) -> usize {
        self.entries()
            .iter()
            .map(|e| (e.off + e.len) as usize)
            .max()
            .unwrap_or(0)
    }
}

/// Groups `items` by bucket (in order of first appearance, items keep their order inside a
/// bucket) and cuts each group into tables of at most [`MAX_ENTRIES`]: one launch each. Empty
/// gradients are dropped. Items must name distinct bucket ranges (entries of one launch run
/// concurrently).
pub(crate) fn tables(items: &[Item]) -> Vec<(usize, Table)> {
    let mut out: Vec<(usize, Table)> = Vec::new();
    let mut order: Vec<usize> = Vec::new();
    for it in items {
        if !order.contains(&it.bucket) {
            order.push(it.bucket);
        }
    }
    for b in order {
        let mut t = empty();
        for it in items.iter().filter(|it| it.bucket == b && it.len > 0) {
            if t.n as usize == MAX_ENTRIES {
                out.push((b, t));
                t = empty();
            }
            t.e[t.n as usize] = Entry {
                src: it.src,
                off: it.off as u64,
                len: it.len as u64,
                overwrite: u64::from(it.overwrite),
            };
            t.n += 1;
        }
        if t.n > 0 {
            out.push((b, t));
        }
    }
    out
}

fn empty() -> Table {
    Table {
        n: 0,
        e: [Entry::default(); MAX_ENTRIES],
    }
}

#[cfg(feature = "cuda")]
pub(crate) use self::cuda::{src_ptr, AccumulateInPlace};

#[cfg(feature = "cuda")]
mod cuda {
    use super::Table;
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::{
        DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg,
    };
    use candle_core::cuda_backend::CudaStorage;
    use candle_core::{bail, CpuStorage, DType, InplaceOp1, Layout, Result, Storage, Tensor};

    const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/accumulate.ptx"));
    const THREADS: u32 = 256;
    /// Blocks per entry along x at most (grid-stride beyond; 2 per SM of an H100/H200).
    const MAX_BLOCKS_X: usize = 264;

    // SAFETY: `Table` is `repr(C)`, plain integers only, and matches the kernel's `Table`.
    unsafe impl DeviceRepr for Table {}

    /// Device address of `t`, a contiguous f32 CUDA tensor. The caller keeps `t` alive until
    /// the launch reading it is enqueued (its later free is ordered on the same stream).
    pub(crate) fn src_ptr(t: &Tensor) -> Result<u64> {
        let (st, l) = t.storage_and_layout();
        let Storage::Cuda(cs) = &*st else {
            bail!(
                "gradient on {:?}, expected a CUDA device",
                t.device().location()
            )
        };
        let Some((a, b)) = l.contiguous_offsets() else {
            bail!(
                "gradient must be contiguous, got shape {:?} stride {:?}",
                l.dims(),
                l.stride()
            )
        };
        let stream = cs.device().cuda_stream();
        let view = cs.as_cuda_slice::<f32>()?.slice(a..b);
        let ptr = view.device_ptr(&stream).0;
        Ok(ptr)
    }

    /// Candle in-place op on a bucket's flat buffer: one launch of `ddp_accumulate_f32` for
    /// one [`Table`].
    pub(crate) struct AccumulateInPlace {
        pub(crate) table: Table,
    }

    impl InplaceOp1 for AccumulateInPlace {
        fn name(&self) -> &'static str {
            "g4ft-ddp-accumulate"
        }

        fn cpu_fwd(&self, _s: &mut CpuStorage, _l: &Layout) -> Result<()> {
            bail!("batched DDP accumulation runs on CUDA buckets only (CPU uses narrow/add/slice_set)")
        }

        fn cuda_fwd(&self, s: &mut CudaStorage, l: &Layout) -> Result<()> {
            if s.dtype() != DType::F32 {
                bail!("DDP bucket dtype {:?}, expected F32", s.dtype())
            }
            let Some((a, b)) = l.contiguous_offsets() else {
                bail!("DDP bucket is not contiguous (stride {:?})", l.stride())
            };
            if self.table.end() > b - a {
                bail!(
                    "accumulation table writes up to element {}, bucket has {}",
                    self.table.end(),
                    b - a
                )
            }
            let n = self.table.entries().len();
            if n == 0 {
                return Ok(());
            }
            let dev = s.device().clone();
            let f = dev
                .get_or_load_custom_func("ddp_accumulate_f32", "g4ft_ddp_accumulate", PTX)?
                .into_cuda_function();
            let stream = dev.cuda_stream();
            let bx = self
                .table
                .max_len()
                .div_ceil(THREADS as usize)
                .clamp(1, MAX_BLOCKS_X);
            let cfg = LaunchConfig {
                grid_dim: (bx as u32, n as u32, 1),
                block_dim: (THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            let slice = s.as_cuda_slice_mut::<f32>()?;
            let mut bucket = slice.slice_mut(a..b);
            let mut lb = stream.launch_builder(&f);
            lb.arg(&mut bucket).arg(&self.table);
            // SAFETY: every entry's source holds `len` f32 (checked by the caller: shape equals
            // the slot's), every destination range lies inside the bucket (checked above) and
            // the ranges are disjoint (distinct parameters' slots).
            unsafe { lb.launch(cfg) }.map_err(|e| {
                candle_core::Error::Msg(format!("ddp_accumulate_f32 launch: {e:?}"))
            })?;
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(bucket: usize, off: usize, len: usize, src: u64, overwrite: bool) -> Item {
        Item {
            bucket,
            off,
            len,
            src,
            overwrite,
        }
    }

    #[test]
    fn groups_by_bucket_in_first_appearance_order() {
        let items = [
            item(2, 0, 10, 0x100, true),
            item(1, 5, 3, 0x200, false),
            item(2, 10, 4, 0x300, false),
            item(1, 0, 0, 0x400, true), // empty: dropped
        ];
        let t = tables(&items);
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].0, 2);
        assert_eq!(
            t[0].1.entries(),
            &[
                Entry {
                    src: 0x100,
                    off: 0,
                    len: 10,
                    overwrite: 1
                },
                Entry {
                    src: 0x300,
                    off: 10,
                    len: 4,
                    overwrite: 0
                }
            ]
        );
        assert_eq!((t[0].1.max_len(), t[0].1.end()), (10, 14));
        assert_eq!(t[1].0, 1);
        assert_eq!(t[1].1.entries().len(), 1);
        assert_eq!(t[1].1.end(), 8);
    }

    #[test]
    fn splits_more_than_max_entries_into_several_launches() {
        let items: Vec<Item> = (0..MAX_ENTRIES * 2 + 3)
            .map(|k| item(0, k * 2, 2, k as u64, k % 2 == 0))
            .collect();
        let t = tables(&items);
        let sizes: Vec<usize> = t.iter().map(|(_, t)| t.entries().len()).collect();
        assert_eq!(sizes, [MAX_ENTRIES, MAX_ENTRIES, 3]);
        let srcs: Vec<u64> = t
            .iter()
            .flat_map(|(_, t)| t.entries().iter().map(|e| e.src))
            .collect();
        assert_eq!(srcs, (0..items.len() as u64).collect::<Vec<_>>());
        assert!(t.iter().all(|(b, _)| *b == 0));
    }

    #[test]
    fn table_layout_matches_the_kernel() {
        // 8-byte count + 32 entries of four u64: the kernel reads the same offsets.
        assert_eq!(std::mem::size_of::<Entry>(), 32);
        assert_eq!(std::mem::size_of::<Table>(), 8 + 32 * MAX_ENTRIES);
        assert_eq!(std::mem::align_of::<Table>(), 8);
    }
}
