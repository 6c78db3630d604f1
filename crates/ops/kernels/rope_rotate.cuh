// The RoPE rotation of N pairs (x1 at k, x2 at k + d/2), half-split (rotate_half) layout, rounding
// like the reference (products and sum in the activation dtype T), shared by kernels/rope.cu and
// kernels/heads_norm.cu:
//   forward:  y1 = r(r(x1*c1) + r(-x2*s1)),  y2 = r(r(x2*c2) + r(x1*s2))
//   backward (the transpose): y1 = r(r(x1*c1) + r(x2*s2)),  y2 = r(r(x2*c2) + r(-x1*s1))
// y1 / y2 are left in fp32 for the caller's one store (the last rounding).
#pragma once
#include "common.cuh"

template <typename T, int N>
__device__ __forceinline__ void rope_rotate(const float* x1, const float* x2, const float* c1, const float* c2,
                                            const float* s1, const float* s2, bool backward, float* y1, float* y2) {
#pragma unroll
    for (int j = 0; j < N; ++j) {
        if (!backward) {
            y1[j] = round_to<T>(x1[j] * c1[j]) + round_to<T>(-x2[j] * s1[j]);
            y2[j] = round_to<T>(x2[j] * c2[j]) + round_to<T>(x1[j] * s2[j]);
        } else {
            y1[j] = round_to<T>(x1[j] * c1[j]) + round_to<T>(x2[j] * s2[j]);
            y2[j] = round_to<T>(x2[j] * c2[j]) + round_to<T>(-x1[j] * s1[j]);
        }
    }
}

// One unit: the N pairs at src / src + half rotated into dst / dst + half, with the cos / sin at
// the same offsets of their row (each pointer already at element k of its row).
template <typename T, int N, typename I>
__device__ __forceinline__ void rope_unit(const T* src, const T* cos, const T* sin, T* dst, I half, bool backward) {
    float c1[N], c2[N], s1[N], s2[N], x1[N], x2[N], y1[N], y2[N];
    load_n<T, N>(cos, c1);
    load_n<T, N>(cos + half, c2);
    load_n<T, N>(sin, s1);
    load_n<T, N>(sin + half, s2);
    load_n<T, N>(src, x1);
    load_n<T, N>(src + half, x2);
    rope_rotate<T, N>(x1, x2, c1, c2, s1, s2, backward, y1, y2);
    store_n<T, N>(dst, y1);
    store_n<T, N>(dst + half, y2);
}
