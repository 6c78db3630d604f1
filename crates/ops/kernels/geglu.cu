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

template <typename T>
__device__ void geglu_fwd(const T* gate, const T* up, T* y, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float a = round_to<T>(gelu_tanh(to_f32(gate[i])));
        y[i] = from_f32<T>(a * to_f32(up[i]));
    }
}

template <typename T>
__device__ void geglu_bwd(const T* gate, const T* up, const T* g, T* dgate, T* dup, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
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
