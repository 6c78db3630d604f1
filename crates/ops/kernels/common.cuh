// Shared device helpers for the g4ft-ops kernels: dtype conversion (all math in fp32, one rounding
// per stored value), roundings that emulate the reference's intermediate dtype, warp/block sums.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }

// x rounded to T and widened again (identity for float): one rounding of the reference.
template <typename T> __device__ __forceinline__ float round_to(float x) { return to_f32(from_f32<T>(x)); }

// The first statement of every g4ft-ops kernel. The host launches kernels with programmatic
// stream serialization on Hopper (src/cuda.rs, `LaunchArgs`), so a kernel's blocks may start
// before the kernel ahead of it on the stream has finished: `griddepcontrol.wait` holds them until
// that kernel has completed and its writes are visible, before any memory is touched. Then
// `griddepcontrol.launch_dependents` lets the next kernel's blocks be scheduled as soon as every
// block of this one has started. Both are no-ops for a plain launch; before compute capability 9.0
// the macro is empty.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define G4FT_KERNEL_ENTRY()                                                                        \
    asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory")
#else
#define G4FT_KERNEL_ENTRY() ((void)0)
#endif

// log2(e): exponentials as exp2(x·log2(e)), one fma + one SFU ex2.
#define G4FT_LOG2E 1.4426950408889634f

// 2^x on the SFU without exp2f's denormal fix-ups (results below 2^-126 flush to 0).
__device__ __forceinline__ float ex2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float buf[32];
    __syncthreads();  // buf may still be read by a previous call
    v = warp_sum(v);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    if (lane == 0) buf[warp] = v;
    __syncthreads();
    v = lane < nwarps ? buf[lane] : 0.f;
    return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v) {
    __shared__ float buf[32];
    __syncthreads();
    v = warp_max(v);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    if (lane == 0) buf[warp] = v;
    __syncthreads();
    v = lane < nwarps ? buf[lane] : -INFINITY;
    return warp_max(v);
}

// N consecutive elements at p (N = 1, or a 16-byte pack) to/from fp32.
template <typename T, int N> __device__ __forceinline__ void load_n(const T* p, float* out) {
    if (N == 1) {
        out[0] = to_f32(p[0]);
    } else {
        uint4 raw = *reinterpret_cast<const uint4*>(p);
        const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
        for (int k = 0; k < N; ++k) out[k] = to_f32(e[k]);
    }
}
template <typename T, int N> __device__ __forceinline__ void store_n(T* p, const float* in) {
    if (N == 1) {
        p[0] = from_f32<T>(in[0]);
    } else {
        uint4 raw;
        T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
        for (int k = 0; k < N; ++k) e[k] = from_f32<T>(in[k]);
        *reinterpret_cast<uint4*>(p) = raw;
    }
}

__device__ __forceinline__ bool aligned16(const void* p) { return ((uintptr_t)p & 15) == 0; }

// Instantiate `extern "C"` entry points NAME_f32 / NAME_bf16 / NAME_f16 from a template NAME<T>.
#define G4FT_FLOAT_TYPES(INST) INST(float, f32) INST(__nv_bfloat16, bf16) INST(__half, f16)
