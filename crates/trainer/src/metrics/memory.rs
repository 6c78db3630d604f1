//! Peak memory for the log line and benchmarks: on CUDA the device's default memory pool (Candle
//! allocates every tensor with `cuMemAllocAsync` from it), whose used-memory high-water mark is
//! the analogue of `torch.cuda.max_memory_allocated`; on CPU the process's resident set. And the
//! `--recompute` setting resolved against the step's memory model ([`apply_recompute`]).

use anyhow::{bail, Context, Result};
use candle_core::Device;
use g4ft_gemma4::memory::GB;
use g4ft_gemma4::{Config, Gemma4Model, MemoryModel, Parked, Recompute, RecomputePlan, StepShape};

use crate::config::RecomputeKind;

/// Bytes the device could still allocate now: on CUDA the driver's free memory (`cuMemGetInfo`),
/// on the CPU the kernel's `MemAvailable` divided among the `local_world_size` ranks of this node
/// (they share the RAM).
pub fn free_memory(device: &Device, local_world_size: usize) -> Result<u64> {
    match device {
        #[cfg(feature = "cuda")]
        Device::Cuda(d) => {
            let (free, _total) = d
                .cuda_stream()
                .context()
                .mem_get_info()
                .context("cuMemGetInfo")?;
            Ok(free as u64)
        }
        _ => {
            let kb = meminfo_kb("MemAvailable:")?;
            Ok(kb * 1024 / local_world_size.max(1) as u64)
        }
    }
}

/// `--recompute auto`'s budget without `--memory-budget-gb`: the memory `free` at start less 5%
/// (the allocator pool's fragmentation and the memory model's error, measured within 0.4% on an
/// H200) and less 2 GB (what is allocated outside the pool: cuBLAS workspaces, NCCL buffers,
/// loaded kernels).
pub fn default_budget(free: u64) -> u64 {
    (free - free / 20).saturating_sub(2_000_000_000)
}

/// The `--recompute` setting as the model's policy: `auto` plans for `budget_gb` (GB), or, unset,
/// for [`default_budget`] of what `free_at_start` reports.
pub fn recompute_policy(
    kind: RecomputeKind,
    budget_gb: Option<f64>,
    free_at_start: impl FnOnce() -> Result<u64>,
) -> Result<Recompute> {
    Ok(match kind {
        RecomputeKind::All => Recompute::All,
        RecomputeKind::None => Recompute::None,
        RecomputeKind::Auto => Recompute::Auto {
            budget_bytes: match budget_gb {
                Some(gb) => (gb * GB) as u64,
                None => default_budget(
                    free_at_start().context("--recompute auto: the default memory budget")?,
                ),
            },
        },
    })
}

/// What `--recompute auto` would do instead of recomputing every layer, for a run that left
/// `--recompute` at its default on a device with `free` bytes free at start: a note naming the
/// layers it would keep and its predicted peak, or `None` when [`default_budget`] keeps none.
pub fn auto_instead_of_all(cfg: &Config, shape: StepShape, free: u64) -> Option<String> {
    let budget_bytes = default_budget(free);
    let auto = MemoryModel::new(cfg, shape).plan(Recompute::Auto { budget_bytes });
    (auto.keep.kept() > 0).then(|| {
        format!(
            "note: every layer is recomputed (--recompute all, the default, as the post's script); \
             --recompute auto would keep {} of {} layers' activations within this device's free \
             memory (predicted peak {:.3} GB, budget {:.3} GB) and skip their recompute",
            auto.keep.kept(),
            auto.keep.len(),
            auto.peak.bytes as f64 / GB,
            budget_bytes as f64 / GB
        )
    })
}

/// Sets `model`'s offloaded checkpoints on or off (`--offload-checkpoints`), resolves `policy`
/// for its training step of `micro_batch` samples of `seq` tokens (the longest the run sees) with
/// the model's adapters, and sets the model's keep mask to it. With offload on a GPU the parked
/// tensors must fit `host_room()` (bytes of RAM for this rank, read only then): each recomputed
/// layer parks the most ([`Parked::MOST`]), or the largest smaller level that fits (the step then
/// recomputes more); an error when not even the inputs fit. Returns the plan (print it: the
/// choice and the predicted peak) and, when it parks less than the most, a note that says why.
pub fn apply_recompute(
    model: &mut Gemma4Model,
    policy: Recompute,
    offload_checkpoints: bool,
    micro_batch: usize,
    seq: usize,
    host_room: impl FnOnce() -> Result<u64>,
) -> Result<(RecomputePlan, Option<String>)> {
    let asked = offload_checkpoints.then_some(Parked::MOST);
    model.set_offload_checkpoints(asked)?;
    let shape = StepShape::of_model(model, micro_batch, seq);
    let (plan, note) = plan_within_host_room(model.config(), shape, policy, host_room)?;
    // A smaller level than asked: the parking is set up again for it.
    if plan.parked.is_some_and(|parked| Some(parked) != asked) {
        model.set_offload_checkpoints(plan.parked)?;
    }
    model.set_keep_mask(plan.keep.clone())?;
    Ok((plan, note))
}

/// `policy`'s plan for `cfg`'s step of `shape`, whose parked tensors (if it parks any) fit
/// `host_room()` bytes: see [`apply_recompute`].
pub fn plan_within_host_room(
    cfg: &Config,
    shape: StepShape,
    policy: Recompute,
    host_room: impl FnOnce() -> Result<u64>,
) -> Result<(RecomputePlan, Option<String>)> {
    let wanted = MemoryModel::new(cfg, shape).plan(policy);
    let Some(asked) = wanted.parked else {
        return Ok((wanted, None));
    };
    let available = host_room().context("--offload-checkpoints: the host memory available")?;
    if wanted.host_parked <= available {
        return Ok((wanted, None));
    }
    let gb = |bytes: u64| bytes as f64 / GB;
    // The largest smaller level that fits.
    let smaller = asked.smaller().and_then(|parked| {
        let shape = StepShape {
            parked: Some(parked),
            ..shape
        };
        MemoryModel::plan_within_host(cfg, shape, policy, available)
    });
    let Some(plan) = smaller else {
        let least = StepShape {
            parked: Some(Parked::Inputs),
            ..shape
        };
        bail!(
            "--offload-checkpoints: the recomputed layers' inputs alone need {:.3} GB of host memory per rank, and {:.3} GB is available (MemAvailable shared by the ranks of this node); drop --offload-checkpoints, or lower --micro-batch or the sequence length",
            gb(MemoryModel::new(cfg, least).plan(policy).host_parked),
            gb(available)
        )
    };
    let note = format!(
        "note: --offload-checkpoints parks the recomputed layers' {} alone: their {} would take {:.3} GB of host memory per rank, and {:.3} GB is available",
        plan.parked.map_or("", Parked::describe),
        asked.describe(),
        gb(wanted.host_parked),
        gb(available)
    );
    Ok((plan, Some(note)))
}

/// The RAM this node has available (`MemAvailable`) shared by its `local_world_size` ranks: the
/// room for one rank's parked tensors (see [`apply_recompute`]).
pub fn host_room(local_world_size: usize) -> Result<u64> {
    free_memory(&Device::Cpu, local_world_size)
}

/// Peak-memory probe: the CUDA pool's high-water mark or the process's peak RSS.
pub enum MemProbe {
    /// The CUDA device's default memory pool.
    #[cfg(feature = "cuda")]
    Pool(cuda_pool::Pool),
    /// Host process memory (CPU training).
    Rss,
}

impl MemProbe {
    /// Probe for `device`; on CUDA also raises the pool's release threshold to `u64::MAX`.
    pub fn new(device: &Device) -> Result<Self> {
        match device {
            #[cfg(feature = "cuda")]
            Device::Cuda(d) => Ok(MemProbe::Pool(cuda_pool::Pool::new(d)?)),
            _ => Ok(MemProbe::Rss),
        }
    }

    /// Memory in use now (pool) / resident now (RSS), bytes.
    pub fn current(&self) -> Result<u64> {
        match self {
            #[cfg(feature = "cuda")]
            MemProbe::Pool(p) => p.used_current(),
            MemProbe::Rss => proc_status_kb("VmRSS:").map(|kb| kb * 1024),
        }
    }

    /// High-water mark since the last reset (pool) / since process start (RSS), bytes.
    pub fn peak(&self) -> Result<u64> {
        match self {
            #[cfg(feature = "cuda")]
            MemProbe::Pool(p) => p.used_high(),
            MemProbe::Rss => proc_status_kb("VmHWM:").map(|kb| kb * 1024),
        }
    }

    /// Restarts the high-water mark (pool only; RSS peak cannot be reset).
    pub fn reset_peak(&self) -> Result<()> {
        match self {
            #[cfg(feature = "cuda")]
            MemProbe::Pool(p) => p.reset_high(),
            MemProbe::Rss => Ok(()),
        }
    }

    /// What [`MemProbe::peak`] measures, for logs.
    pub fn what(&self) -> &'static str {
        match self {
            #[cfg(feature = "cuda")]
            MemProbe::Pool(_) => "cuda mem-pool used high-water mark",
            MemProbe::Rss => "process peak RSS (VmHWM)",
        }
    }
}

/// A `kB` field of `/proc/self/status`.
fn proc_status_kb(field: &str) -> Result<u64> {
    kb_field("/proc/self/status", field)
}

/// A `kB` field of `/proc/meminfo`.
fn meminfo_kb(field: &str) -> Result<u64> {
    kb_field("/proc/meminfo", field)
}

/// The `kB` value of the line starting with `field` in the `/proc` file `path`.
fn kb_field(path: &str, field: &str) -> Result<u64> {
    let s = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    let line = s
        .lines()
        .find(|l| l.starts_with(field))
        .with_context(|| format!("{path} has no {field}"))?;
    line[field.len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .with_context(|| format!("parsing {line:?}"))
}

#[cfg(feature = "cuda")]
mod cuda_pool {
    //! The device's default memory pool (candle allocates with `cuMemAllocAsync` from it).
    use anyhow::{Context, Result};
    use candle_core::cuda_backend::cudarc::driver::{result, sys};
    use candle_core::cuda_backend::CudaDevice;

    /// The default pool of one device.
    pub struct Pool(sys::CUmemoryPool);

    impl Pool {
        /// Looks the pool up and raises its release threshold to `u64::MAX` so freed blocks stay
        /// mapped across synchronisations (`docs/design.md`, "Candle facts").
        pub fn new(dev: &CudaDevice) -> Result<Self> {
            let stream = dev.cuda_stream();
            let ctx = stream.context();
            ctx.bind_to_thread().context("binding the CUDA context")?;
            // SAFETY: the device handle comes from a live context.
            let pool = unsafe { result::device::get_default_mem_pool(ctx.cu_device()) }
                .context("cuDeviceGetDefaultMemPool")?;
            let p = Pool(pool);
            p.set(
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                u64::MAX,
            )?;
            Ok(p)
        }

        fn get(&self, attr: sys::CUmemPool_attribute) -> Result<u64> {
            let mut v: u64 = 0;
            // SAFETY: the attributes used here are all 64-bit values.
            unsafe { result::mem_pool::get_attribute(self.0, attr, (&mut v as *mut u64).cast()) }
                .with_context(|| format!("cuMemPoolGetAttribute {attr:?}"))?;
            Ok(v)
        }

        fn set(&self, attr: sys::CUmemPool_attribute, mut v: u64) -> Result<()> {
            // SAFETY: as in `get`.
            unsafe { result::mem_pool::set_attribute(self.0, attr, (&mut v as *mut u64).cast()) }
                .with_context(|| format!("cuMemPoolSetAttribute {attr:?}"))
        }

        /// Bytes in use now.
        pub fn used_current(&self) -> Result<u64> {
            self.get(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)
        }

        /// High-water mark of bytes in use.
        pub fn used_high(&self) -> Result<u64> {
            self.get(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH)
        }

        /// Restarts the high-water mark.
        pub fn reset_high(&self) -> Result<()> {
            self.set(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH, 0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::bail;

    #[test]
    fn cpu_probe_reports_resident_memory() {
        let p = MemProbe::new(&Device::Cpu).unwrap();
        // A buffer written in full stays resident while both reads run. The other test threads
        // allocate and free meanwhile, so the two reads are not compared with each other: the
        // kernel refreshes the high-water mark lazily, and a later `VmHWM` can be below an
        // earlier `VmRSS`. Each read covers the buffer, in bytes.
        let size = 64 << 20;
        let resident = std::hint::black_box(vec![1u8; size]);
        assert!(p.current().unwrap() >= size as u64);
        assert!(p.peak().unwrap() >= size as u64);
        assert_eq!(resident[size - 1], 1);
        assert_eq!(p.what(), "process peak RSS (VmHWM)");
    }

    /// The 12B's config, and its step of one sequence of `seq` tokens (LoRA r16 on the seven
    /// projections, bf16) parking `parked`.
    fn twelve_b() -> (Config, impl Fn(usize, Option<Parked>) -> StepShape) {
        let cfg = Config::from_file(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../gemma4/tests/configs/gemma-4-12B-it.json"),
        )
        .unwrap();
        let shape = |seq, parked| StepShape {
            micro_batch: 1,
            seq,
            lora_r: 16,
            trainable: 65_568_768,
            dtype: candle_core::DType::BF16,
            parked,
        };
        (cfg, shape)
    }

    #[test]
    fn offloaded_checkpoints_park_what_fits_the_hosts_memory() {
        let (cfg, shape) = twelve_b();
        let offload = Some(Parked::InputsAndOutputs);
        let room = |gb: f64| move || Ok((gb * GB) as u64);
        let plan = |seq, parked, gb| {
            plan_within_host_room(&cfg, shape(seq, parked), Recompute::All, room(gb))
        };
        // 48 · 3 tensors of 2,048 tokens: 2.265 GB.
        let (fits, note) = plan(2048, offload, 100.0).unwrap();
        assert_eq!((fits.parked, note), (offload, None));
        // Nothing parked without offload: the host's memory is not even read.
        let no_room = || -> Result<u64> { bail!("not read") };
        let (plain, note) =
            plan_within_host_room(&cfg, shape(1 << 26, None), Recompute::All, no_room).unwrap();
        assert_eq!((plain.parked, plain.host_parked, note), (None, 0, None));
        // 131,072 tokens: 144.955 GB with the outputs, 48.318 GB for the inputs alone.
        let (inputs, note) = plan(131_072, offload, 100.0).unwrap();
        assert_eq!(inputs.parked, Some(Parked::Inputs));
        assert_eq!(
            note.unwrap(),
            "note: --offload-checkpoints parks the recomputed layers' inputs alone: their inputs and outputs would take 144.955 GB of host memory per rank, and 100.000 GB is available"
        );
        let err = plan(131_072, offload, 40.0).unwrap_err();
        let msg = format!("{err:#}");
        assert!(
            msg.starts_with("--offload-checkpoints: the recomputed layers' inputs alone need 48.318 GB of host memory per rank, and 40.000 GB is available"),
            "{msg}"
        );
    }

    #[test]
    fn the_default_recompute_names_what_auto_would_keep() {
        let (cfg, shape) = twelve_b();
        let shape = shape(2048, None);
        // An H200's free memory: every layer fits (40.57 GB predicted without recompute).
        let note = auto_instead_of_all(&cfg, shape, 140_000_000_000).expect("a note");
        assert!(
            note.contains("would keep 48 of 48 layers'") && note.contains("budget 131.000 GB"),
            "{note}"
        );
        // 32 GB free: a few layers; 26 GB: not even every layer recomputed fits, no note.
        let some = auto_instead_of_all(&cfg, shape, 32_000_000_000).expect("a note");
        assert!(!some.contains("keep 48 of 48"), "{some}");
        assert_eq!(auto_instead_of_all(&cfg, shape, 26_000_000_000), None);
    }

    #[test]
    fn cpu_free_memory_is_shared_by_the_nodes_ranks() {
        let one = free_memory(&Device::Cpu, 1).unwrap();
        assert!(one > 0);
        // MemAvailable moves between the two reads, by far less than this factor.
        let shared = free_memory(&Device::Cpu, 1 << 20).unwrap();
        assert!(shared < one / 1000, "{shared} vs {one}");
    }

    #[test]
    fn policy_of_the_setting() {
        let no_device = || -> Result<u64> { bail!("no device") };
        assert_eq!(
            recompute_policy(RecomputeKind::All, None, no_device).unwrap(),
            Recompute::All
        );
        assert_eq!(
            recompute_policy(RecomputeKind::Auto, Some(80.5), no_device).unwrap(),
            Recompute::Auto {
                budget_bytes: 80_500_000_000
            }
        );
        // 100 GB free: less 5 GB and 2 GB.
        let free = || Ok(100_000_000_000);
        assert_eq!(
            recompute_policy(RecomputeKind::Auto, None, free).unwrap(),
            Recompute::Auto {
                budget_bytes: 93_000_000_000
            }
        );
        let err = recompute_policy(RecomputeKind::Auto, None, no_device).unwrap_err();
        assert!(format!("{err:#}").contains("no device"), "{err:#}");
        assert_eq!(default_budget(1_000_000_000), 0);
    }
}
