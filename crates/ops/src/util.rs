//! Plumbing shared by the op modules on the CPU side: the element types the references compute with
//! (f32 math, one rounding per stored value), contiguous-slice access, dtype dispatch, stash cells.

use candle_core::{bail, CpuStorage, Layout, Result, Storage, Tensor};
use half::{bf16, f16};
use std::sync::Mutex;

/// An element type a CPU storage can hold: typed slice access and wrapping.
pub(crate) trait Storable: Copy + Send + Sync + 'static {
    /// The typed slice of a storage of this dtype, or a dtype error naming `op` and `what`.
    fn slice<'a>(s: &'a CpuStorage, op: &str, what: &str) -> Result<&'a [Self]>;
    /// Wrap a vector as a storage.
    fn storage(v: Vec<Self>) -> CpuStorage;
    /// The typed mutable slice of a storage of this dtype (in-place ops), or a dtype error.
    fn slice_mut<'a>(s: &'a mut CpuStorage, op: &str, what: &str) -> Result<&'a mut [Self]>;
}

/// A float element the CPU references read as f32 and store with one round-to-nearest-even.
pub(crate) trait Elem: Storable {
    /// Widen to f32 (exact for bf16/f16).
    fn to_f32(self) -> f32;
    /// Round an f32 to this type (round to nearest even, as CUDA's `__float2bfloat16_rn`).
    fn from_f32(v: f32) -> Self;
}

macro_rules! impl_storable {
    ($t:ty, $variant:ident) => {
        impl Storable for $t {
            fn slice<'a>(s: &'a CpuStorage, op: &str, what: &str) -> Result<&'a [Self]> {
                match s {
                    CpuStorage::$variant(v) => Ok(v),
                    other => bail!(
                        "{op}: {what} has dtype {:?}, expected {:?}",
                        candle_core::backend::BackendStorage::dtype(other),
                        candle_core::DType::$variant
                    ),
                }
            }
            fn storage(v: Vec<Self>) -> CpuStorage {
                CpuStorage::$variant(v)
            }
            fn slice_mut<'a>(
                s: &'a mut CpuStorage,
                op: &str,
                what: &str,
            ) -> Result<&'a mut [Self]> {
                match s {
                    CpuStorage::$variant(v) => Ok(v),
                    other => bail!(
                        "{op}: {what} has dtype {:?}, expected {:?}",
                        candle_core::backend::BackendStorage::dtype(other),
                        candle_core::DType::$variant
                    ),
                }
            }
        }
    };
}

impl_storable!(f32, F32);
impl_storable!(bf16, BF16);
impl_storable!(f16, F16);
impl_storable!(u32, U32);
impl_storable!(u8, U8);

macro_rules! impl_elem {
    ($t:ty, $to:expr, $from:expr) => {
        impl Elem for $t {
            #[inline]
            fn to_f32(self) -> f32 {
                $to(self)
            }
            #[inline]
            fn from_f32(v: f32) -> Self {
                $from(v)
            }
        }
    };
}

impl_elem!(f32, |v: f32| v, |v: f32| v);
impl_elem!(bf16, bf16::to_f32, bf16::from_f32);
impl_elem!(f16, f16::to_f32, f16::from_f32);

/// `v` rounded to `T` and widened again: emulates one rounding of the reference to the activation
/// dtype (identity for f32).
#[inline]
pub(crate) fn round<T: Elem>(v: f32) -> f32 {
    T::from_f32(v).to_f32()
}

/// The contiguous part of `s` that `l` describes, or an error naming `op` and `what`.
pub(crate) fn contiguous<'a, T>(s: &'a [T], l: &Layout, op: &str, what: &str) -> Result<&'a [T]> {
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&s[a..b]),
        None => bail!(
            "{op}: {what} must be contiguous, got shape {:?} stride {:?}",
            l.dims(),
            l.stride()
        ),
    }
}

/// Typed contiguous slice of a CPU storage: [`Storable::slice`] + [`contiguous`].
pub(crate) fn cpu_slice<'a, T: Storable>(
    s: &'a CpuStorage,
    l: &Layout,
    op: &str,
    what: &str,
) -> Result<&'a [T]> {
    contiguous(T::slice(s, op, what)?, l, op, what)
}

/// Run `$body` with `$T` bound to the element type of the float CPU storage `$s`
/// (f32, bf16 or f16); other dtypes are an error naming `$op`.
macro_rules! with_float_type {
    ($s:expr, $op:expr, $T:ident => $body:expr) => {
        match $s {
            candle_core::CpuStorage::F32(_) => {
                type $T = f32;
                $body
            }
            candle_core::CpuStorage::BF16(_) => {
                type $T = half::bf16;
                $body
            }
            candle_core::CpuStorage::F16(_) => {
                type $T = half::f16;
                $body
            }
            other => candle_core::bail!(
                "{}: unsupported dtype {:?} (expected f32, bf16 or f16)",
                $op,
                candle_core::backend::BackendStorage::dtype(other)
            ),
        }
    };
}
pub(crate) use with_float_type;

/// A tensor a forward pass leaves for its backward (e.g. attention's log-sum-exp), set once inside
/// `cpu_fwd`/`cuda_fwd`, which only see storages.
#[derive(Default)]
pub(crate) struct Stash(Mutex<Option<Tensor>>);

impl Stash {
    /// Keep `t` for the backward.
    pub(crate) fn put(&self, t: Tensor) {
        *self
            .0
            .lock()
            .expect("stash lock is never poisoned: no panics while held") = Some(t);
    }

    /// The kept tensor, or an error naming `op` if the forward did not run.
    pub(crate) fn get(&self, op: &str) -> Result<Tensor> {
        match &*self
            .0
            .lock()
            .expect("stash lock is never poisoned: no panics while held")
        {
            Some(t) => Ok(t.clone()),
            None => bail!("{op}: backward called before the forward stored its saved tensor"),
        }
    }
}

/// A tensor from a storage the op produced (contiguous, no graph).
#[cfg(feature = "cuda")]
pub(crate) fn tensor_from_storage(s: Storage, shape: &[usize]) -> Tensor {
    Tensor::from_storage(s, shape, candle_core::op::BackpropOp::none(), false)
}

/// The CPU storage behind `t` (contiguous view), or an error naming `op` and `what`.
pub(crate) fn with_cpu_storage<R>(
    t: &Tensor,
    op: &str,
    what: &str,
    f: impl FnOnce(&CpuStorage, &Layout) -> Result<R>,
) -> Result<R> {
    let (s, l) = t.storage_and_layout();
    match &*s {
        Storage::Cpu(cs) => f(cs, l),
        _ => bail!("{op}: {what} is not on the CPU like the op's inputs"),
    }
}
