// One row of Gemma RMSNorm, forward and backward, for a group of threads (one warp or one block):
// the row math of kernels/rms_norm.cu, shared with kernels/heads_norm.cu so that both store the
// same bits. fp32 math; y = x * r * w with r = 1/sqrt(mean(x^2) + eps), rounded once. Backward
// (weight frozen, no dw): u = g*w, dx = r * (u - x * r^2 * mean(u*x)). Optional residual `res`
// (nullable): the output is r(res + r(y)), rounded like a separate add.
#pragma once
#include "common.cuh"

// A row is handled by a group of threads: one warp (rows of d <= 1024: several rows per block,
// warp-shuffle reductions, no block barrier) or the whole block (longer rows). Rows whose byte
// length is a multiple of 16, with 16-byte aligned operands, move in 16-byte packs; others per
// element. Reduction order differs between the layouts (fp32 sums, within rounding).

template <bool WARP> __device__ __forceinline__ float group_sum(float v) { return WARP ? warp_sum(v) : block_sum(v); }
template <bool WARP> __device__ __forceinline__ int group_rank() { return WARP ? (threadIdx.x & 31) : threadIdx.x; }
template <bool WARP> __device__ __forceinline__ int group_size() { return WARP ? 32 : blockDim.x; }

// v (fp32) as stored: rounded once, or rounded and added to the residual (rounded again).
template <typename T> __device__ __forceinline__ float with_res(bool has_res, float res, float v) {
    return has_res ? to_f32(res) + round_to<T>(v) : v;
}

template <typename T, int N, bool WARP>
__device__ void fwd_row(const T* x, const T* w, const T* res, T* y, int d, float eps) {
    const int units = d / N, gr = group_rank<WARP>(), gs = group_size<WARP>();
    float ss = 0.f;
    for (int j = gr; j < units; j += gs) {
        float v[N];
        load_n<T, N>(x + j * N, v);
#pragma unroll
        for (int k = 0; k < N; ++k) ss += v[k] * v[k];
    }
    ss = group_sum<WARP>(ss);
    const float r = 1.f / sqrtf(ss / (float)d + eps);
    for (int j = gr; j < units; j += gs) {
        float v[N], wv[N], rv[N], out[N];
        load_n<T, N>(x + j * N, v);
        if (w) load_n<T, N>(w + j * N, wv);
        if (res) load_n<T, N>(res + j * N, rv);
#pragma unroll
        for (int k = 0; k < N; ++k) {
            float t = v[k] * r;
            if (w) t *= wv[k];
            out[k] = with_res<T>(res != nullptr, res ? rv[k] : 0.f, t);
        }
        store_n<T, N>(y + j * N, out);
    }
}

// Backward (weight frozen, no dw): u = g*w, dx = r * (u - x * r^2 * mean(u*x)). dx may be x: each
// thread reads its units of x before writing them, after the row's reductions.
template <typename T, int N, bool WARP>
__device__ void bwd_row(const T* x, const T* w, const T* g, const T* res, T* dx, int d, float eps) {
    const int units = d / N, gr = group_rank<WARP>(), gs = group_size<WARP>();
    float ss = 0.f, ux = 0.f;
    for (int j = gr; j < units; j += gs) {
        float xv[N], gv[N], wv[N];
        load_n<T, N>(x + j * N, xv);
        load_n<T, N>(g + j * N, gv);
        if (w) load_n<T, N>(w + j * N, wv);
#pragma unroll
        for (int k = 0; k < N; ++k) {
            float u = gv[k] * (w ? wv[k] : 1.f);
            ss += xv[k] * xv[k];
            ux += u * xv[k];
        }
    }
    ss = group_sum<WARP>(ss);
    ux = group_sum<WARP>(ux);
    const float r = 1.f / sqrtf(ss / (float)d + eps);
    const float c = r * r * ux / (float)d;
    for (int j = gr; j < units; j += gs) {
        float xv[N], gv[N], wv[N], rv[N], out[N];
        load_n<T, N>(x + j * N, xv);
        load_n<T, N>(g + j * N, gv);
        if (w) load_n<T, N>(w + j * N, wv);
        if (res) load_n<T, N>(res + j * N, rv);
#pragma unroll
        for (int k = 0; k < N; ++k) {
            float u = gv[k] * (w ? wv[k] : 1.f);
            out[k] = with_res<T>(res != nullptr, res ? rv[k] : 0.f, r * (u - xv[k] * c));
        }
        store_n<T, N>(dx + j * N, out);
    }
}

// Whether rows of d elements of T at these (nullable) pointers move in 16-byte packs.
template <typename T>
__device__ __forceinline__ bool packed(int d, const void* a, const void* b, const void* c, const void* e) {
    return (d * sizeof(T)) % 16 == 0 && aligned16(a) && aligned16(b) && aligned16(c) && aligned16(e);
}
