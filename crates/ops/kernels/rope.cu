// Rotary embedding, half-split layout (rotate_half), forward and backward (CPU reference: src/rope.rs).
// x (b, h, t, d); cos/sin (bc, t, d) with bc = b or 1. One thread per unit of N rotated pairs
// (k..k+N, k+d/2..k+d/2+N): N = 16 bytes of T when the half rows are 16-byte aligned, else 1.
// The rotation and its rounding: rope_rotate.cuh.
// Index math in I = 32-bit unsigned when every index fits (the host checks), else 64-bit.
#include "rope_rotate.cuh"

template <typename T, int N, typename I>
__device__ void rope_units(const T* x, const T* cos, const T* sin, T* y, I b, I h, I t, I d,
                           bool per_batch, int backward) {
    const I half = d / 2, units = half / N;
    const I n = b * h * t * units;
    for (I idx = blockIdx.x * (I)blockDim.x + threadIdx.x; idx < n; idx += (I)gridDim.x * blockDim.x) {
        const I k = (idx % units) * N;
        const I row = idx / units;  // (bi, hi, ti)
        const I ti = row % t;
        const I cs = ((per_batch ? row / (t * h) : 0) * t + ti) * d;
        rope_unit<T, N>(x + row * d + k, cos + cs + k, sin + cs + k, y + row * d + k, half, backward);
    }
}

template <typename T>
__device__ void rope_kernel(const T* x, const T* cos, const T* sin, T* y, int b, int h, int t, int d,
                            int cos_b, int backward, int small) {
    constexpr int P = 16 / sizeof(T);
    const bool packed = ((d / 2) * sizeof(T)) % 16 == 0 && aligned16(x) && aligned16(cos) &&
                        aligned16(sin) && aligned16(y);
    const bool per_batch = cos_b != 1;
    if (small) {
        if (packed) rope_units<T, P, unsigned>(x, cos, sin, y, b, h, t, d, per_batch, backward);
        else rope_units<T, 1, unsigned>(x, cos, sin, y, b, h, t, d, per_batch, backward);
    } else {
        if (packed) rope_units<T, P, size_t>(x, cos, sin, y, b, h, t, d, per_batch, backward);
        else rope_units<T, 1, size_t>(x, cos, sin, y, b, h, t, d, per_batch, backward);
    }
}

#define INST(T, S)                                                                                   \
    extern "C" __global__ void rope_##S(const T* x, const T* cos, const T* sin, T* y, int b, int h,  \
                                        int t, int d, int cos_b, int backward, int small) {          \
        G4FT_KERNEL_ENTRY();                                                                         \
        rope_kernel<T>(x, cos, sin, y, b, h, t, d, cos_b, backward, small);                          \
    }
G4FT_FLOAT_TYPES(INST)
