// Row kernels of the blocked attention (host side and the cuBLAS GEMMs: src/attention_cuda.rs;
// CPU reference: src/attention.rs). The GEMMs produce, per block of `bq` query rows, the fp32
// scores S = scale·Q·Kᵀ over the block's key range [k0, k0 + lk); these kernels apply the
// causal / sliding-window / key-padding mask and the softmax (forward) or the softmax backward.
//
// Score rows are ordered (b, h, i) with i < rows, row r = (b·nh + h)·rows + i, query qi = q0 + i;
// a row holds lk scores and starts at r·ld (ld >= lk, padded for aligned tensor-core GEMMs).
// Query qi sees key kj iff kj <= qi, qi − kj < window (window 0 = none) and key_mask[b, kj] != 0.
#include "common.cuh"

__device__ __forceinline__ bool attn_allowed(int qi, int kj, int window, const uint8_t* mask_b) {
    return kj <= qi && (window == 0 || qi - kj < window) && mask_b[kj] != 0;
}

// P = softmax of the allowed scores of each row (0 elsewhere), written in T for the P·V GEMM;
// lse[b, h, qi] = max + log(sum) in fp32, +inf for a row with no allowed key (its P row is 0).
// Two passes over the fp32 scores: an online (max, sum) per thread, merged over the block, then
// the normalised write.
template <typename T>
__device__ void attn_softmax_rows(const float* s, T* p, float* lse, const uint8_t* mask, int nh,
                                  int t, int rows, int lk, int ld, int q0, int k0, int window) {
    int r = blockIdx.x, bh = r / rows, qi = q0 + r % rows;
    const float* srow = s + (size_t)r * ld;
    T* prow = p + (size_t)r * ld;
    const uint8_t* mb = mask + (size_t)(bh / nh) * t;
    float m = -INFINITY, l = 0.f;
    for (int j = threadIdx.x; j < lk; j += blockDim.x) {
        if (!attn_allowed(qi, k0 + j, window, mb)) continue;
        float v = srow[j];
        if (v > m) {
            l = l * expf(m - v) + 1.f;
            m = v;
        } else {
            l += expf(v - m);
        }
    }
    float mt = block_max(m);
    l = block_sum(m > -INFINITY ? l * expf(m - mt) : 0.f);
    for (int j = threadIdx.x; j < lk; j += blockDim.x) {
        bool ok = mt > -INFINITY && attn_allowed(qi, k0 + j, window, mb);
        prow[j] = from_f32<T>(ok ? expf(srow[j] - mt) / l : 0.f);
    }
    if (threadIdx.x == 0) lse[(size_t)bh * t + qi] = mt > -INFINITY ? mt + logf(l) : INFINITY;
}

// Softmax backward of one row: p = exp(s − lse), ds = scale·p·(dp − D) with D = dout·o (the rounded
// output), written in T for the dQ / dK GEMMs; p in T for the dV GEMM.
template <typename T>
__device__ void attn_ds_rows(const float* s, const float* dp, const T* o, const T* dout,
                             const float* lse, const uint8_t* mask, T* ds, T* p, int nh, int t,
                             int d, int rows, int lk, int ld, int q0, int k0, int window, float scale) {
    int r = blockIdx.x, bh = r / rows, qi = q0 + r % rows;
    size_t qrow = ((size_t)bh * t + qi) * d;
    float dd = 0.f;
    for (int c = threadIdx.x; c < d; c += blockDim.x) dd += to_f32(dout[qrow + c]) * to_f32(o[qrow + c]);
    dd = block_sum(dd);
    float L = lse[(size_t)bh * t + qi];
    const uint8_t* mb = mask + (size_t)(bh / nh) * t;
    size_t off = (size_t)r * ld;
    for (int j = threadIdx.x; j < lk; j += blockDim.x) {
        float pv = 0.f, dsv = 0.f;
        if (L != INFINITY && attn_allowed(qi, k0 + j, window, mb)) {
            pv = expf(s[off + j] - L);
            dsv = scale * pv * (dp[off + j] - dd);
        }
        ds[off + j] = from_f32<T>(dsv);
        p[off + j] = from_f32<T>(pv);
    }
}

// dst[(bh·dst_t + dst_off + i)·d + c] = src[(bh·src_t + src_off + i)·d + c] for bh < n_bh, i < rows:
// gathers a block of query rows into a compact buffer (and scatters it back). Rows are moved in
// 16-byte chunks when d·sizeof(T) allows it (head dims 256 / 512), element-wise otherwise.
template <typename T>
__device__ void attn_copy_rows(const T* src, T* dst, int n_bh, int rows, int d, int src_t,
                               int src_off, int dst_t, int dst_off) {
    size_t nrows = (size_t)n_bh * rows;
    bool vec = (d * sizeof(T)) % 16 == 0;
    int w = vec ? (int)(d * sizeof(T) / 16) : d;  // units per row
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < nrows * w;
         e += (size_t)gridDim.x * blockDim.x) {
        size_t u = e % w, row = e / w, i = row % rows, bh = row / rows;
        size_t si = (bh * src_t + src_off + i) * w + u, di = (bh * dst_t + dst_off + i) * w + u;
        if (vec)
            reinterpret_cast<uint4*>(dst)[di] = reinterpret_cast<const uint4*>(src)[si];
        else
            dst[di] = src[si];
    }
}

// The fp32 dK / dV accumulators rounded to T.
template <typename T>
__device__ void attn_round(const float* x, T* y, size_t n) {
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x)
        y[e] = from_f32<T>(x[e]);
}

#define INST(T, S)                                                                                   \
    extern "C" __global__ void attn_softmax_rows_##S(const float* s, T* p, float* lse,               \
                                                     const uint8_t* mask, int nh, int t, int rows,   \
                                                     int lk, int ld, int q0, int k0, int window) {   \
        attn_softmax_rows<T>(s, p, lse, mask, nh, t, rows, lk, ld, q0, k0, window);                      \
    }                                                                                                \
    extern "C" __global__ void attn_ds_rows_##S(const float* s, const float* dp, const T* o,         \
                                                const T* dout, const float* lse,                     \
                                                const uint8_t* mask, T* ds, T* p, int nh, int t,     \
                                                int d, int rows, int lk, int ld, int q0, int k0,    \
                                                int window, float scale) {                           \
        attn_ds_rows<T>(s, dp, o, dout, lse, mask, ds, p, nh, t, d, rows, lk, ld, q0, k0, window,    \
                        scale);                                                                      \
    }                                                                                                \
    extern "C" __global__ void attn_copy_rows_##S(const T* src, T* dst, int n_bh, int rows, int d,   \
                                                  int src_t, int src_off, int dst_t, int dst_off) {  \
        attn_copy_rows<T>(src, dst, n_bh, rows, d, src_t, src_off, dst_t, dst_off);                  \
    }                                                                                                \
    extern "C" __global__ void attn_round_##S(const float* x, T* y, size_t n) { attn_round<T>(x, y, n); }
G4FT_FLOAT_TYPES(INST)
