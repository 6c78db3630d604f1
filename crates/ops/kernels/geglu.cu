// GeGLU gelu_tanh(gate) * up, forward and backward (CPU reference: src/geglu.rs).
// Rounding as PyTorch/transformers: a = r(gelu_f32(gate)), y = r(a * up).
// Backward: dgate = r(r(g*up) * gelu'(gate)), dup = r(g * a), into two buffers (the halves of one
// packed (2, n) buffer, or gate and up themselves: each thread reads its element before writing it).
#include "common.cuh"

#define SQRT_2_OVER_PI 0.7978845608028654f
#define GELU_C 0.044715f

__device__ __forceinline__ float gelu_tanh(float x) {
    return 0.5f * x * (1.f + tanhf(SQRT_2_OVER_PI * x * (1.f + GELU_C * x * x)));
}

__device__ __forceinline__ float gelu_tanh_grad(float x) {
    float t = tanhf(SQRT_2_OVER_PI * x * (1.f + GELU_C * x * x));
    return 0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * SQRT_2_OVER_PI * (1.f + 3.f * GELU_C * x * x);
}

// Both kernels walk 16-byte packs of P = 16/sizeof(T) elements when every operand is 16-byte
// aligned, then (or otherwise) single elements from `start` on; grid-stride.

template <typename T>
__device__ void geglu_fwd(const T* gate, const T* up, T* y, size_t n) {
    constexpr int P = 16 / sizeof(T);
    const size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t start = 0;
    if (aligned16(gate) && aligned16(up) && aligned16(y)) {
        const size_t packs = n / P;
        for (size_t q = tid; q < packs; q += stride) {
            float gv[P], uv[P];
            load_n<T, P>(gate + q * P, gv);
            load_n<T, P>(up + q * P, uv);
#pragma unroll
            for (int e = 0; e < P; ++e) gv[e] = round_to<T>(gelu_tanh(gv[e])) * uv[e];
            store_n<T, P>(y + q * P, gv);
        }
        start = packs * P;
    }
    for (size_t i = start + tid; i < n; i += stride) {
        float a = round_to<T>(gelu_tanh(to_f32(gate[i])));
        y[i] = from_f32<T>(a * to_f32(up[i]));
    }
}

template <typename T>
__device__ void geglu_bwd(const T* gate, const T* up, const T* g, T* dgate, T* dup, size_t n) {
    constexpr int P = 16 / sizeof(T);
    const size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t start = 0;
    if (aligned16(gate) && aligned16(up) && aligned16(g) && aligned16(dgate) && aligned16(dup)) {
        const size_t packs = n / P;
        for (size_t q = tid; q < packs; q += stride) {
            float x[P], u[P], gv[P], dg[P], du[P];
            load_n<T, P>(gate + q * P, x);
            load_n<T, P>(up + q * P, u);
            load_n<T, P>(g + q * P, gv);
#pragma unroll
            for (int e = 0; e < P; ++e) {
                dg[e] = round_to<T>(gv[e] * u[e]) * gelu_tanh_grad(x[e]);
                du[e] = gv[e] * round_to<T>(gelu_tanh(x[e]));
            }
            store_n<T, P>(dgate + q * P, dg);
            store_n<T, P>(dup + q * P, du);
        }
        start = packs * P;
    }
    for (size_t i = start + tid; i < n; i += stride) {
        float x = to_f32(gate[i]), u = to_f32(up[i]), gv = to_f32(g[i]);
        float a = round_to<T>(gelu_tanh(x));
        dgate[i] = from_f32<T>(round_to<T>(gv * u) * gelu_tanh_grad(x));
        dup[i] = from_f32<T>(gv * a);
    }
}

#define INST(T, S)                                                                                   \
    extern "C" __global__ void geglu_fwd_##S(const T* gate, const T* up, T* y, size_t n) {           \
        geglu_fwd<T>(gate, up, y, n);                                                                \
    }                                                                                                \
    extern "C" __global__ void geglu_bwd_##S(const T* gate, const T* up, const T* g, T* dgate,       \
                                             T* dup, size_t n) {                                     \
        geglu_bwd<T>(gate, up, g, dgate, dup, n);                                                    \
    }
G4FT_FLOAT_TYPES(INST)
