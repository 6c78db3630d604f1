// Gemma RMSNorm, forward and backward (CPU reference: src/rms_norm.rs).
// One block per row of length d; fp32 math; y = x * r * w with r = 1/sqrt(mean(x^2) + eps), rounded once.
// Backward (weight frozen, no dw): u = g*w, dx = r * (u - x * r^2 * mean(u*x)).
// Optional residual `res` (nullable): the output is r(res + r(y)), the rounded norm (or dx) added to
// the residual stream in the same pass, with the two roundings of a separate add.
#include "common.cuh"

template <typename T>
__device__ __forceinline__ T plus_res(const T* res, int i, float v) {
    return res ? from_f32<T>(to_f32(res[i]) + round_to<T>(v)) : from_f32<T>(v);
}

template <typename T>
__device__ void rms_norm_fwd(const T* x, const T* w, const T* res, T* y, int d, float eps) {
    size_t row = blockIdx.x;
    x += row * d;
    y += row * d;
    if (res) res += row * d;
    float ss = 0.f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) { float v = to_f32(x[i]); ss += v * v; }
    ss = block_sum(ss);
    float r = 1.f / sqrtf(ss / (float)d + eps);
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float v = to_f32(x[i]) * r;
        if (w) v *= to_f32(w[i]);
        y[i] = plus_res<T>(res, i, v);
    }
}

template <typename T>
__device__ void rms_norm_bwd(const T* x, const T* w, const T* g, const T* res, T* dx, int d,
                             float eps) {
    size_t row = blockIdx.x;
    x += row * d;
    g += row * d;
    dx += row * d;
    if (res) res += row * d;
    float ss = 0.f, ux = 0.f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float xv = to_f32(x[i]);
        float u = to_f32(g[i]) * (w ? to_f32(w[i]) : 1.f);
        ss += xv * xv;
        ux += u * xv;
    }
    ss = block_sum(ss);
    ux = block_sum(ux);
    float r = 1.f / sqrtf(ss / (float)d + eps);
    float c = r * r * ux / (float)d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float u = to_f32(g[i]) * (w ? to_f32(w[i]) : 1.f);
        dx[i] = plus_res<T>(res, i, r * (u - to_f32(x[i]) * c));
    }
}

#define INST(T, S)                                                                                   \
    extern "C" __global__ void rms_norm_fwd_##S(const T* x, const T* w, const T* res, T* y, int d,   \
                                                float eps) {                                         \
        rms_norm_fwd<T>(x, w, res, y, d, eps);                                                       \
    }                                                                                                \
    extern "C" __global__ void rms_norm_bwd_##S(const T* x, const T* w, const T* g, const T* res,    \
                                                T* dx, int d, float eps) {                           \
        rms_norm_bwd<T>(x, w, g, res, dx, d, eps);                                                   \
    }
G4FT_FLOAT_TYPES(INST)
