// Several fp32 tensors cast to T in one launch, into one packed output (host side and CPU
// reference: src/cast.rs). Block row y casts segment y, its blocks striding over the segment's
// elements; round to nearest even, as Candle's cast kernel.
#include "common.cuh"

constexpr int CAST_SEGMENTS = 16;

// Segment k: n[k] elements from src[k] to the output at element offset dst[k].
struct CastSegments {
    const float* src[CAST_SEGMENTS];
    unsigned long long dst[CAST_SEGMENTS];
    unsigned long long n[CAST_SEGMENTS];
};

template <typename T> __device__ void cast_segments(const CastSegments& s, T* out) {
    const int k = blockIdx.y;
    const float* src = s.src[k];
    T* dst = out + s.dst[k];
    const size_t n = s.n[k];
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = from_f32<T>(src[i]);
}

#define INST(T, S)                                                                                     \
    extern "C" __global__ void cast_segments_##S(CastSegments s, T* out) {                            \
        G4FT_KERNEL_ENTRY();                                                                           \
        cast_segments<T>(s, out);                                                                      \
    }
INST(__nv_bfloat16, bf16)
INST(__half, f16)
