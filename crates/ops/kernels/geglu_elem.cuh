// GeGLU's per-element math (CPU reference: src/geglu.rs), shared by the GeGLU kernels
// (kernels/geglu.cu) and the adapter kernel that applies the MLP's gate / up adapter terms before
// it (kernels/lora.cu). Rounding as PyTorch/transformers: a = r(gelu_f32(gate)), y = r(a * up).
#pragma once
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

// One element: y from (gate x, up u); d(gate), d(up) from (x, u) and the output gradient g.
template <typename T>
__device__ __forceinline__ float geglu_y(float x, float u) {
    return round_to<T>(gelu_tanh(x)) * u;
}
template <typename T>
__device__ __forceinline__ void geglu_d(float x, float u, float g, float& dg, float& du) {
    dg = round_to<T>(g * u) * gelu_tanh_grad(x);
    du = g * round_to<T>(gelu_tanh(x));
}

