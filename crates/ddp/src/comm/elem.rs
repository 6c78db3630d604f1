//! Element types the CPU backend reduces, and their wire encoding (native-endian raw bytes).
//!
//! bf16/f16 are summed in f32 and rounded once per hop, as NCCL's ring does for half types.

use bytemuck::Pod;
use half::{bf16, f16};

/// An element the CPU ring can sum and average.
pub trait Elem: Pod + Send + 'static {
    /// `a + b`.
    fn add(a: Self, b: Self) -> Self;
    /// `self / n`, or `None` for integer types (average is not defined there).
    fn div(self, n: usize) -> Option<Self>;
}

macro_rules! float_elem {
    ($t:ty) => {
        impl Elem for $t {
            fn add(a: Self, b: Self) -> Self {
                a + b
            }
            fn div(self, n: usize) -> Option<Self> {
                Some(self / n as $t)
            }
        }
    };
}
float_elem!(f32);
float_elem!(f64);

macro_rules! half_elem {
    ($t:ty) => {
        impl Elem for $t {
            fn add(a: Self, b: Self) -> Self {
                <$t>::from_f32(a.to_f32() + b.to_f32())
            }
            fn div(self, n: usize) -> Option<Self> {
                Some(<$t>::from_f32(self.to_f32() / n as f32))
            }
        }
    };
}
half_elem!(bf16);
half_elem!(f16);

macro_rules! int_elem {
    ($t:ty) => {
        impl Elem for $t {
            fn add(a: Self, b: Self) -> Self {
                a.wrapping_add(b)
            }
            fn div(self, _n: usize) -> Option<Self> {
                None
            }
        }
    };
}
int_elem!(u8);
int_elem!(u32);
int_elem!(i64);
