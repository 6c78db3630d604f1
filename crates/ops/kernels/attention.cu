// Row kernels of the blocked attention (host side and the cuBLAS GEMMs: src/attention_cuda.rs;
// CPU reference: src/attention.rs). The GEMMs produce, per block of `bq` query rows, the fp32
// scores S = scale·Q·Kᵀ over the block's key range [k0, k0 + lk); these kernels apply the
// causal / sliding-window / key-padding mask and the softmax (forward) or the softmax backward.
//
// The queries are in the grouped layout (b, kv head, t, g, d) (g = nh / nkv query heads per kv
// head), so score row r of a block is kv slab bk = r / (rows·g), query i and group member j in
// (i, j) order within the slab: head h = (bk % nkv)·g + j, query qi = q0 + i. A row holds lk
// scores and starts at r·ld (ld >= lk, padded for aligned tensor-core GEMMs). Query qi sees key
// kj iff seq_start[b, qi] <= kj <= qi, qi − kj < window (window 0 = none) and key_mask[b, kj] != 0
// (seq_start: the (b, t) first token of each token's packed sequence; null = 0). One warp per row.
#include "common.cuh"

// Score row r's (b·nh + h, qi) and the range [lo, hi) of its scores that can be allowed (the
// causal / window band within the query's sequence; the padding mask is checked per key).
struct AttnRow {
    int bh, qi, lo, hi;
};

__device__ __forceinline__ AttnRow attn_row(int r, const uint32_t* seq_start, int nh, int g, int t,
                                            int rows, int lk, int q0, int k0, int window) {
    int slab = rows * g, bk = r / slab, rem = r % slab, nkv = nh / g;
    AttnRow a;
    a.bh = (bk / nkv) * nh + (bk % nkv) * g + rem % g;
    a.qi = q0 + rem / g;
    int first = window > 0 ? a.qi + 1 - window : 0;
    if (seq_start) first = max(first, (int)seq_start[(size_t)(a.bh / nh) * t + a.qi]);
    a.lo = max(0, first - k0);
    a.hi = min(lk, a.qi + 1 - k0);
    return a;
}

// exp(x − m) as exp2(x·log2(e) − m·log2(e)): one fma and one MUFU ex2 per element (`ml2` is
// m·log2(e), computed once per row).
__device__ __forceinline__ float attn_exp(float x, float ml2) { return exp2f(fmaf(x, G4FT_LOG2E, -ml2)); }

// P = softmax of the allowed scores of each row (0 elsewhere), written in T for the P·V GEMM;
// lse[b, h, qi] = max + log(sum) in fp32, +inf for a row with no allowed key (its P row is 0).
// Three passes over the row's band (the 2nd and 3rd from L1): the max, the sum of exponentials,
// then the normalised write of the whole row.
template <typename T>
__device__ void attn_softmax_rows(const float* s, T* p, float* lse, const uint8_t* mask,
                                  const uint32_t* seq_start, int nh, int g, int t, int rows, int lk,
                                  int ld, int q0, int k0, int window, int nrows) {
    int r = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (r >= nrows) return;
    AttnRow a = attn_row(r, seq_start, nh, g, t, rows, lk, q0, k0, window);
    const float* srow = s + (size_t)r * ld;
    T* prow = p + (size_t)r * ld;
    const uint8_t* mb = mask + (size_t)(a.bh / nh) * t + k0;
    float m = -INFINITY;
    for (int j = a.lo + lane; j < a.hi; j += 32)
        if (mb[j]) m = fmaxf(m, srow[j]);
    m = warp_max(m);
    const float ml2 = m * G4FT_LOG2E;
    float l = 0.f;
    if (m > -INFINITY)
        for (int j = a.lo + lane; j < a.hi; j += 32)
            if (mb[j]) l += attn_exp(srow[j], ml2);
    l = warp_sum(l);
    const float inv = m > -INFINITY ? 1.f / l : 0.f;
    for (int j = lane; j < lk; j += 32) {
        const bool ok = inv != 0.f && j >= a.lo && j < a.hi && mb[j] != 0;
        prow[j] = from_f32<T>(ok ? attn_exp(srow[j], ml2) * inv : 0.f);
    }
    if (lane == 0) lse[(size_t)a.bh * t + a.qi] = m > -INFINITY ? m + logf(l) : INFINITY;
}

// Softmax backward of one row: p = exp(s − lse), ds = scale·p·(dp − D) with D = dout·o (the rounded
// output, both in the (b, nh, t, d) layout), written in T for the dQ / dK GEMMs; p in T for the dV
// GEMM. One warp per row.
template <typename T>
__device__ void attn_ds_rows(const float* s, const float* dp, const T* o, const T* dout,
                             const float* lse, const uint8_t* mask, const uint32_t* seq_start, T* ds,
                             T* p, float scale, int nh, int g, int t, int d, int rows, int lk,
                             int ld, int q0, int k0, int window, int nrows) {
    int r = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (r >= nrows) return;
    AttnRow a = attn_row(r, seq_start, nh, g, t, rows, lk, q0, k0, window);
    size_t qrow = ((size_t)a.bh * t + a.qi) * d;
    float dd = 0.f;
    for (int c = lane; c < d; c += 32) dd += to_f32(dout[qrow + c]) * to_f32(o[qrow + c]);
    dd = warp_sum(dd);
    const float L = lse[(size_t)a.bh * t + a.qi], ll2 = L * G4FT_LOG2E;
    const uint8_t* mb = mask + (size_t)(a.bh / nh) * t + k0;
    const size_t off = (size_t)r * ld;
    for (int j = lane; j < lk; j += 32) {
        float pv = 0.f, dsv = 0.f;
        if (L != INFINITY && j >= a.lo && j < a.hi && mb[j] != 0) {
            pv = attn_exp(s[off + j], ll2);
            dsv = scale * pv * (dp[off + j] - dd);
        }
        ds[off + j] = from_f32<T>(dsv);
        p[off + j] = from_f32<T>(pv);
    }
}

// The fp32 dK / dV accumulators rounded to T: the sum of `parts` partials of n floats each, added
// in order (the same bits on every run).
template <typename T>
__device__ void attn_round(const float* x, T* y, size_t n, int parts) {
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        float s = x[e];
        for (int p = 1; p < parts; ++p) s += x[p * n + e];
        y[e] = from_f32<T>(s);
    }
}

#define INST(T, S)                                                                                   \
    extern "C" __global__ void attn_softmax_rows_##S(const float* s, T* p, float* lse,               \
                                                     const uint8_t* mask, const uint32_t* seq_start, \
                                                     int nh, int g, int t, int rows, int lk, int ld, \
                                                     int q0, int k0, int window, int nrows) {        \
        G4FT_KERNEL_ENTRY();                                                                         \
        attn_softmax_rows<T>(s, p, lse, mask, seq_start, nh, g, t, rows, lk, ld, q0, k0, window,     \
                             nrows);                                                                 \
    }                                                                                                \
    extern "C" __global__ void attn_ds_rows_##S(const float* s, const float* dp, const T* o,         \
                                                const T* dout, const float* lse,                     \
                                                const uint8_t* mask, const uint32_t* seq_start,      \
                                                T* ds, T* p, float scale, int nh, int g, int t,      \
                                                int d, int rows, int lk, int ld, int q0, int k0,     \
                                                int window, int nrows) {                             \
        G4FT_KERNEL_ENTRY();                                                                         \
        attn_ds_rows<T>(s, dp, o, dout, lse, mask, seq_start, ds, p, scale, nh, g, t, d, rows, lk,   \
                        ld, q0, k0, window, nrows);                                                  \
    }                                                                                                \
    extern "C" __global__ void attn_round_##S(const float* x, T* y, size_t n, int parts) {            \
        G4FT_KERNEL_ENTRY();                                                                          \
        attn_round<T>(x, y, n, parts);                                                               \
    }
G4FT_FLOAT_TYPES(INST)
