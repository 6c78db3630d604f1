//! CUDA plumbing (feature `cuda`): the PTX modules `build.rs` compiles from `kernels/*.cu`, typed
//! contiguous views of candle storages, launch shapes, and [`launch_args`], the one way a g4ft-ops
//! kernel is launched. Every kernel runs on candle's own stream, so ordering against candle's
//! kernels needs no events.

use candle_core::cuda_backend::cudarc::driver::sys::{self, CUdeviceptr};
use candle_core::cuda_backend::cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut,
    DriverError, LaunchConfig, SyncOnDrop,
};
use candle_core::cuda_backend::{CudaDType, CudaDevice, CudaStorage, DeviceId};
use candle_core::{bail, Layout, Result};
use std::cell::RefCell;
use std::collections::HashMap;

/// One PTX module (one `kernels/<op>.cu`), loaded once per device under `name`.
pub(crate) struct Module {
    pub(crate) name: &'static str,
    pub(crate) ptx: &'static str,
}

/// `cuda_module!("rms_norm")` embeds `$OUT_DIR/rms_norm.ptx`.
macro_rules! cuda_module {
    ($name:literal) => {
        $crate::cuda::Module {
            name: concat!("g4ft_ops_", $name),
            ptx: include_str!(concat!(env!("OUT_DIR"), "/", $name, ".ptx")),
        }
    };
}
pub(crate) use cuda_module;

/// Loaded kernels by name, per (device, module), with the dynamic shared memory each is allowed
/// (bytes; 0 until [`func_smem`] raises it).
type FuncCache = HashMap<(DeviceId, &'static str), HashMap<String, (CudaFunction, usize)>>;

thread_local! {
    /// Kernels already looked up: candle caches the module, but its lookup takes a lock and calls
    /// `cuModuleGetFunction` on every launch, and the training step is close to launch-bound.
    /// (A dropped device's entries stay; they are a few handles.)
    static FUNCS: RefCell<FuncCache> = RefCell::new(HashMap::new());
}

/// Kernel `name` of module `m` (the module loaded by candle on first use, the handle cached per
/// thread). Launch it on candle's stream: `launch_args(&dev.cuda_stream(), &f)`.
pub(crate) fn func(dev: &CudaDevice, m: &Module, name: &str) -> Result<CudaFunction> {
    func_smem(dev, m, name, 0)
}

/// [`func`], allowed at least `smem` bytes of dynamic shared memory (above the default 48 KiB the
/// driver needs `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`; it is set once per kernel and
/// size, not per launch).
pub(crate) fn func_smem(
    dev: &CudaDevice,
    m: &Module,
    name: &str,
    smem: usize,
) -> Result<CudaFunction> {
    use candle_core::cuda_backend::cudarc::driver::sys::CUfunction_attribute;
    use candle_core::cuda_backend::WrapErr;
    FUNCS.with(|cache| {
        let mut cache = cache.borrow_mut();
        let funcs = cache.entry((dev.id(), m.name)).or_default();
        let entry = match funcs.get_mut(name) {
            Some(e) => e,
            None => {
                let f = dev
                    .get_or_load_custom_func(name, m.name, m.ptx)?
                    .into_cuda_function();
                funcs.entry(name.to_string()).or_insert((f, 0))
            }
        };
        if smem > entry.1 {
            entry
                .0
                .set_attribute(
                    CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    smem as i32,
                )
                .w()?;
            entry.1 = smem;
        }
        Ok(entry.0.clone())
    })
}

/// The parameters of one kernel launch, built argument by argument ([`LaunchArgs::arg`]) in the
/// kernel's parameter order, then [`LaunchArgs::launch`]ed on `stream`.
///
/// Launches go through `cuLaunchKernelEx`. On Hopper builds (`cfg(g4ft_hopper)`) each launch
/// allows programmatic stream serialization: the kernel's blocks may be scheduled while the
/// kernel before it on the stream is still finishing. Every g4ft-ops kernel opens with
/// `G4FT_KERNEL_ENTRY()` (`kernels/common.cuh`), which waits for the previous kernel to complete
/// and its writes to be visible before touching memory, so the order and the results are those
/// of a plain launch; only the launch gap shrinks. After a kernel that does not signal (cuBLAS,
/// candle's), the launch waits as a plain one does.
pub(crate) struct LaunchArgs<'a> {
    stream: &'a CudaStream,
    func: &'a CudaFunction,
    /// The arguments' bytes, each starting on an 8-byte word.
    words: Vec<u64>,
    /// The first word of each argument.
    starts: Vec<usize>,
    /// cudarc's read/write records of the buffers passed, made when they drop after the launch.
    guards: Vec<SyncOnDrop<'a>>,
}

/// A launch of `func` on `stream`, its arguments to be added.
pub(crate) fn launch_args<'a>(stream: &'a CudaStream, func: &'a CudaFunction) -> LaunchArgs<'a> {
    LaunchArgs {
        stream,
        func,
        words: Vec::with_capacity(16),
        starts: Vec::with_capacity(16),
        guards: Vec::new(),
    }
}

/// Something passed to a kernel as one parameter: a plain value (its bytes, see [`value_args`])
/// or a device buffer (its address).
pub(crate) trait KernelArg<'a> {
    /// Appends the parameter to `args`.
    fn push_to(self, args: &mut LaunchArgs<'a>);
}

/// `value_args!(T, ...)`: each `T` is passed to kernels by value, as its bytes.
///
/// Only for `Copy` types laid out exactly as the kernel's parameter (primitives, `repr(C)`
/// structs).
macro_rules! value_args {
    ($($t:ty),* $(,)?) => {
        $(impl<'a> $crate::cuda::KernelArg<'a> for &$t {
            fn push_to(self, args: &mut $crate::cuda::LaunchArgs<'a>) {
                args.push_value(self);
            }
        })*
    };
}
pub(crate) use value_args;

value_args!(i32, u32, u64, usize, f32);

impl<'a, T> KernelArg<'a> for &'a CudaSlice<T> {
    fn push_to(self, args: &mut LaunchArgs<'a>) {
        let (ptr, guard) = self.device_ptr(args.stream);
        args.push_buffer(ptr, guard);
    }
}

impl<'a, T> KernelArg<'a> for &'a mut CudaSlice<T> {
    fn push_to(self, args: &mut LaunchArgs<'a>) {
        let (ptr, guard) = self.device_ptr_mut(args.stream);
        args.push_buffer(ptr, guard);
    }
}

impl<'a, 'b: 'a, T> KernelArg<'a> for &'a CudaView<'b, T> {
    fn push_to(self, args: &mut LaunchArgs<'a>) {
        let (ptr, guard) = self.device_ptr(args.stream);
        args.push_buffer(ptr, guard);
    }
}

impl<'a, 'b: 'a, T> KernelArg<'a> for &'a mut CudaViewMut<'b, T> {
    fn push_to(self, args: &mut LaunchArgs<'a>) {
        let (ptr, guard) = self.device_ptr_mut(args.stream);
        args.push_buffer(ptr, guard);
    }
}

impl<'a> LaunchArgs<'a> {
    /// Appends the next parameter.
    pub(crate) fn arg(&mut self, arg: impl KernelArg<'a>) -> &mut Self {
        arg.push_to(self);
        self
    }

    /// Appends `v`'s bytes as the next parameter (see [`value_args`]).
    pub(crate) fn push_value<T: Copy>(&mut self, v: &T) {
        let bytes = std::mem::size_of::<T>();
        let start = self.words.len();
        self.words.resize(start + bytes.div_ceil(8), 0);
        // SAFETY: the words from `start` on hold at least `bytes` bytes, and `v` is `bytes` long.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (v as *const T).cast::<u8>(),
                self.words[start..].as_mut_ptr().cast::<u8>(),
                bytes,
            )
        };
        self.starts.push(start);
    }

    fn push_buffer(&mut self, ptr: CUdeviceptr, guard: SyncOnDrop<'a>) {
        self.push_value(&ptr);
        self.guards.push(guard);
    }

    /// Queues the kernel on the stream with grid `cfg` (the buffers' records are made as the
    /// arguments drop, after the launch).
    ///
    /// # Safety
    /// The arguments must match the kernel's parameters in number, order and type, and the
    /// kernel must stay within the buffers they describe for that grid.
    pub(crate) unsafe fn launch(
        mut self,
        cfg: LaunchConfig,
    ) -> std::result::Result<(), DriverError> {
        self.stream.context().bind_to_thread()?;
        let base = self.words.as_mut_ptr();
        // The parameter pointers take the starts' place (same size: the allocation is reused).
        // SAFETY: every start is an index into `words`.
        let mut params: Vec<*mut std::ffi::c_void> = std::mem::take(&mut self.starts)
            .into_iter()
            .map(|s| unsafe { base.add(s) }.cast())
            .collect();
        let mut attr = serialization_attribute();
        let config = sys::CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: self.stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: u32::from(PROGRAMMATIC_SERIALIZATION),
        };
        // SAFETY: `config` and `params` outlive the call (the driver copies the parameters
        // before it returns); the kernel's own contract is the caller's.
        unsafe {
            sys::cuLaunchKernelEx(
                &config,
                self.func.cu_function(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()
    }
}

/// Whether launches allow programmatic stream serialization (see [`LaunchArgs`]): Hopper builds,
/// whose kernels are compiled for compute capability 90 and open with `griddepcontrol.wait`.
const PROGRAMMATIC_SERIALIZATION: bool = cfg!(g4ft_hopper);

/// The launch attribute that allows programmatic stream serialization.
fn serialization_attribute() -> sys::CUlaunchAttribute {
    // SAFETY: an all-zero attribute is a valid value of the plain C struct.
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    attr
}

/// `root_f32` / `root_bf16` / `root_f16` for element type `T`.
pub(crate) fn kname<T: candle_core::WithDType>(root: &str) -> String {
    candle_core::cuda_backend::kernel_name::<T>(root)
}

/// `root_f32` / `root_bf16` / `root_f16` for a dtype known at run time (raw-pointer launchers);
/// an error naming `root` for any other dtype.
pub(crate) fn kname_of(root: &str, dtype: candle_core::DType) -> Result<String> {
    use candle_core::DType;
    match dtype {
        DType::F32 | DType::BF16 | DType::F16 => Ok(format!("{root}_{}", dtype.as_str())),
        other => bail!("{root}: unsupported dtype {other:?} (expected f32, bf16 or f16)"),
    }
}

/// The contiguous view of `s` that `l` describes, or an error naming `op` and `what`.
pub(crate) fn view<'a, T: CudaDType>(
    s: &'a CudaStorage,
    l: &Layout,
    op: &str,
    what: &str,
) -> Result<CudaView<'a, T>> {
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(s.as_cuda_slice::<T>()?.slice(a..b)),
        None => bail!(
            "{op}: {what} must be contiguous, got shape {:?} stride {:?}",
            l.dims(),
            l.stride()
        ),
    }
}

/// The device address of the contiguous tensor `t` of element type `T` on its device's stream, or
/// an error naming `op` and `what`.
pub(crate) fn addr<T: CudaDType>(t: &candle_core::Tensor, op: &str, what: &str) -> Result<u64> {
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::DevicePtr;
    let (s, l) = t.storage_and_layout();
    let cs = cuda_of(&s, op, what)?;
    let stream = cs.device().cuda_stream();
    let ptr = view::<T>(cs, l, op, what)?.device_ptr(&stream).0;
    Ok(ptr)
}

/// [`addr`] for an element type known at run time (f32, bf16 or f16; raw-pointer launchers), or an
/// error naming `op` and `what` for any other dtype.
pub(crate) fn addr_of(t: &candle_core::Tensor, op: &str, what: &str) -> Result<u64> {
    use candle_core::DType;
    match t.dtype() {
        DType::F32 => addr::<f32>(t, op, what),
        DType::BF16 => addr::<half::bf16>(t, op, what),
        DType::F16 => addr::<half::f16>(t, op, what),
        other => bail!("{op}: {what} is {other:?} (expected f32, bf16 or f16)"),
    }
}

/// Wrap a freshly written slice as a storage of the device.
pub(crate) fn wrap<T: CudaDType>(slice: CudaSlice<T>, dev: &CudaDevice) -> CudaStorage {
    CudaStorage::wrap_cuda_slice(slice, dev.clone())
}

/// One block of `threads` per row.
pub(crate) fn per_row(rows: usize, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// One warp per row, 8 rows (256 threads) per block (the `_warp` / attention row kernels).
pub(crate) fn warp_per_row(rows: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows.div_ceil(8).max(1) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// A grid-stride launch over `n` elements (kernels loop, so the grid is capped).
pub(crate) fn elementwise(n: usize) -> LaunchConfig {
    let threads = 256u32;
    let blocks = n.div_ceil(threads as usize).clamp(1, 132 * 32) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Threads per row for a row kernel over rows of length `d`: a multiple of 32, at most 1024.
pub(crate) fn row_threads(d: usize) -> u32 {
    (d.div_ceil(32) * 32).clamp(32, 1024) as u32
}

/// Run `$body` with `$T` bound to the element type of the float CUDA storage `$s`
/// (f32, bf16 or f16); other dtypes are an error naming `$op`.
macro_rules! with_cuda_float_type {
    ($s:expr, $op:expr, $T:ident => $body:expr) => {
        match $s.dtype() {
            candle_core::DType::F32 => {
                type $T = f32;
                $body
            }
            candle_core::DType::BF16 => {
                type $T = half::bf16;
                $body
            }
            candle_core::DType::F16 => {
                type $T = half::f16;
                $body
            }
            other => candle_core::bail!(
                "{}: unsupported dtype {:?} (expected f32, bf16 or f16)",
                $op,
                other
            ),
        }
    };
}
pub(crate) use with_cuda_float_type;

/// The CUDA storage behind `t`, or an error naming `op` and `what`.
pub(crate) fn with_cuda_storage<R>(
    t: &candle_core::Tensor,
    op: &str,
    what: &str,
    f: impl FnOnce(&CudaStorage, &Layout) -> Result<R>,
) -> Result<R> {
    let (s, l) = t.storage_and_layout();
    match &*s {
        candle_core::Storage::Cuda(cs) => f(cs, l),
        _ => bail!("{op}: {what} is not on the GPU like the op's inputs"),
    }
}

/// The CUDA storage inside a locked `Storage`, or an error naming `op` and `what`.
pub(crate) fn cuda_of<'a>(
    s: &'a candle_core::Storage,
    op: &str,
    what: &str,
) -> Result<&'a CudaStorage> {
    match s {
        candle_core::Storage::Cuda(cs) => Ok(cs),
        _ => bail!("{op}: {what} is not on the GPU like the op's inputs"),
    }
}
