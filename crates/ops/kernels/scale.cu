// Products with PyTorch's roundings (host side and CPU reference: src/scale.rs): x·c for a
// Python float c (fp32 math, one rounding to T), and the chained x·v·c or x·c·v with a vector v
// over the last axis, each product rounded to T as two PyTorch multiplies are. One grid-stride
// pass, 16-byte packs when the rows allow.
#include "common.cuh"

// order 0: x·c; 1: round(x·v)·c; 2: round(x·c)·v (the caller rounds the result).
template <typename T> __device__ __forceinline__ float scale_one(float x, float v, float c, int order) {
    if (order == 0) return x * c;
    if (order == 1) return round_to<T>(x * v) * c;
    return round_to<T>(x * c) * v;
}

// x, y: n elements in rows of d; v: d elements (unread for order 0).
template <typename T> __device__ void scale(const T* x, const T* v, T* y, float c, size_t n, int d, int order) {
    constexpr int P = 16 / sizeof(T);
    const size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const bool packs = d % P == 0 && aligned16(x) && aligned16(y) && (order == 0 || aligned16(v));
    const int w = packs ? P : 1;
    for (size_t q = tid; q < n / w; q += stride) {
        const size_t i = q * w;
        const int j = (int)(i % d);
        if (packs) {
            float xs[P], vs[P];
            load_n<T, P>(x + i, xs);
            if (order != 0) load_n<T, P>(v + j, vs);
#pragma unroll
            for (int e = 0; e < P; ++e) xs[e] = scale_one<T>(xs[e], order != 0 ? vs[e] : 0.f, c, order);
            store_n<T, P>(y + i, xs);
        } else {
            y[i] = from_f32<T>(scale_one<T>(to_f32(x[i]), order != 0 ? to_f32(v[j]) : 0.f, c, order));
        }
    }
}

#define INST(T, S)                                                                                   \
    extern "C" __global__ void scale_##S(const T* x, const T* v, T* y, float c, size_t n, int d,    \
                                         int order) {                                               \
        G4FT_KERNEL_ENTRY();                                                                        \
        scale<T>(x, v, y, c, n, d, order);                                                           \
    }
G4FT_FLOAT_TYPES(INST)
