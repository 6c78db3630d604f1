// Softmax over the last axis in fp32, forward and backward (CPU reference: src/softmax.rs).
// One block per row. Backward from the (rounded) output y: dx = y * (g - sum(g*y)).
#include "common.cuh"

template <typename T>
__device__ void softmax_fwd(const T* x, T* y, int d) {
    size_t row = blockIdx.x;
    x += row * d;
    y += row * d;
    float m = -INFINITY;
    for (int i = threadIdx.x; i < d; i += blockDim.x) m = fmaxf(m, to_f32(x[i]));
    m = block_max(m);
    float s = 0.f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) s += expf(to_f32(x[i]) - m);
    s = block_sum(s);
    for (int i = threadIdx.x; i < d; i += blockDim.x) y[i] = from_f32<T>(expf(to_f32(x[i]) - m) / s);
}

template <typename T>
__device__ void softmax_bwd(const T* y, const T* g, T* dx, int d) {
    size_t row = blockIdx.x;
    y += row * d;
    g += row * d;
    dx += row * d;
    float dot = 0.f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) dot += to_f32(g[i]) * to_f32(y[i]);
    dot = block_sum(dot);
    for (int i = threadIdx.x; i < d; i += blockDim.x)
        dx[i] = from_f32<T>(to_f32(y[i]) * (to_f32(g[i]) - dot));
}

#define INST(T, S)                                                                                   \
    extern "C" __global__ void softmax_fwd_##S(const T* x, T* y, int d) {                            \
        G4FT_KERNEL_ENTRY();                                                                         \
        softmax_fwd<T>(x, y, d);                                                                     \
    }                                                                                                \
    extern "C" __global__ void softmax_bwd_##S(const T* y, const T* g, T* dx, int d) {               \
        G4FT_KERNEL_ENTRY();                                                                         \
        softmax_bwd<T>(y, g, dx, d);                                                                 \
    }
G4FT_FLOAT_TYPES(INST)
