// Memory-efficient attention, forward and backward (CPU reference: src/attention.rs).
// q (b, nh, t, d), k/v (b, nkv, t, d), key mask (b, t) u8, o (b, nh, t, d), lse (b, nh, t) fp32.
// Query i may attend key j iff j <= i, i - j < window (window 0 = none) and mask[b, j] != 0; GQA:
// query head h reads kv head h / (nh / nkv). Scores, softmax and accumulators in fp32; no (t, t)
// matrix is ever stored: one warp per query row (forward, dq) or key row (dk/dv) streams over the
// other side with an online softmax. A row with no allowed key outputs 0 and lse = +inf.
// Each lane keeps E = ceil(d / 32) elements of its row in registers (d <= 512 -> E <= 16).
// This is the simple, correct CUDA-core version (no tensor cores, no shared-memory tiles): see
// docs/benchmarks.md "Kernels" for its speed; a tiled tensor-core kernel is the next step.
#include "common.cuh"

#define ROWS 4  // warps (rows) per block

__device__ __forceinline__ void warp_sum2(float& a, float& b) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        a += __shfl_xor_sync(0xffffffffu, a, o);
        b += __shfl_xor_sync(0xffffffffu, b, o);
    }
}

template <typename T, int E>
__device__ __forceinline__ void load_row(const T* p, int d, float (&r)[E]) {
    int lane = threadIdx.x & 31;
#pragma unroll
    for (int e = 0; e < E; ++e) { int c = lane + 32 * e; r[e] = c < d ? to_f32(p[c]) : 0.f; }
}

template <typename T, int E>
__device__ __forceinline__ float dot_row(const float (&r)[E], const T* p, int d) {
    int lane = threadIdx.x & 31;
    float s = 0.f;
#pragma unroll
    for (int e = 0; e < E; ++e) { int c = lane + 32 * e; if (c < d) s += r[e] * to_f32(p[c]); }
    return s;
}

template <typename T, int E>
__device__ __forceinline__ void store_row(T* p, int d, const float (&r)[E], float mul) {
    int lane = threadIdx.x & 31;
#pragma unroll
    for (int e = 0; e < E; ++e) { int c = lane + 32 * e; if (c < d) p[c] = from_f32<T>(r[e] * mul); }
}

template <typename T, int E>
__device__ void attn_fwd(const T* q, const T* k, const T* v, const uint8_t* mask, T* o, float* lse,
                         int nh, int nkv, int t, int d, int window, float scale) {
    int i = blockIdx.x * ROWS + (threadIdx.x >> 5), h = blockIdx.y, b = blockIdx.z;
    if (i >= t) return;  // whole warp
    int lane = threadIdx.x & 31;
    size_t qrow = (size_t)(b * nh + h) * t + i;
    size_t kv0 = (size_t)(b * nkv + h / (nh / nkv)) * t;
    float qr[E], acc[E];
    load_row<T, E>(q + qrow * d, d, qr);
#pragma unroll
    for (int e = 0; e < E; ++e) acc[e] = 0.f;
    float m = -INFINITY, l = 0.f;
    int lo = window > 0 ? max(0, i - window + 1) : 0;
    for (int j = lo; j <= i; ++j) {
        if (!mask[(size_t)b * t + j]) continue;
        float s = warp_sum(dot_row<T, E>(qr, k + (kv0 + j) * d, d)) * scale;
        float mn = fmaxf(m, s), corr = expf(m - mn), p = expf(s - mn);
        l = l * corr + p;
        const T* vp = v + (kv0 + j) * d;
#pragma unroll
        for (int e = 0; e < E; ++e) {
            int c = lane + 32 * e;
            acc[e] = acc[e] * corr + (c < d ? p * to_f32(vp[c]) : 0.f);
        }
        m = mn;
    }
    store_row<T, E>(o + qrow * d, d, acc, l > 0.f ? 1.f / l : 0.f);
    if (lane == 0) lse[qrow] = l > 0.f ? m + logf(l) : INFINITY;
}

// dq = scale * sum_j p_ij (do_i . v_j - D_i) k_j; also writes D_i = do_i . o_i for the dk/dv kernel.
template <typename T, int E>
__device__ void attn_bwd_dq(const T* q, const T* k, const T* v, const uint8_t* mask, const T* o,
                            const T* dout, const float* lse, T* dq, float* dbuf, int nh, int nkv, int t,
                            int d, int window, float scale) {
    int i = blockIdx.x * ROWS + (threadIdx.x >> 5), h = blockIdx.y, b = blockIdx.z;
    if (i >= t) return;
    int lane = threadIdx.x & 31;
    size_t qrow = (size_t)(b * nh + h) * t + i;
    size_t kv0 = (size_t)(b * nkv + h / (nh / nkv)) * t;
    float qr[E], dor[E], acc[E];
    load_row<T, E>(q + qrow * d, d, qr);
    load_row<T, E>(dout + qrow * d, d, dor);
    float dd = warp_sum(dot_row<T, E>(dor, o + qrow * d, d));
    if (lane == 0) dbuf[qrow] = dd;
#pragma unroll
    for (int e = 0; e < E; ++e) acc[e] = 0.f;
    float L = lse[qrow];
    int lo = window > 0 ? max(0, i - window + 1) : 0;
    if (L != INFINITY) {
        for (int j = lo; j <= i; ++j) {
            if (!mask[(size_t)b * t + j]) continue;
            const T* kp = k + (kv0 + j) * d;
            float s = dot_row<T, E>(qr, kp, d), dp = dot_row<T, E>(dor, v + (kv0 + j) * d, d);
            warp_sum2(s, dp);
            float p = expf(s * scale - L), ds = p * (dp - dd);
#pragma unroll
            for (int e = 0; e < E; ++e) { int c = lane + 32 * e; if (c < d) acc[e] += ds * to_f32(kp[c]); }
        }
    }
    store_row<T, E>(dq + qrow * d, d, acc, scale);
}

// Per query head h (kv head h / rep), key row j: dv_j^h = sum_i p_ij do_i, dk_j^h = scale * sum_i
// p_ij (do_i . v_j - D_i) q_i, as fp32 partials part[2][b][nh][t][d]; attn_reduce_heads sums the rep
// heads of each kv head into dk/dv. One warp per (b, h, j): nh-fold more parallel than one warp per
// kv row, which matters for the 12B's full layers (1 kv head for 16 query heads).
template <typename T, int E>
__device__ void attn_bwd_dkdv(const T* q, const T* k, const T* v, const uint8_t* mask, const T* dout,
                              const float* lse, const float* dbuf, float* part, int nh, int nkv, int t,
                              int d, int window, float scale) {
    int j = blockIdx.x * ROWS + (threadIdx.x >> 5), h = blockIdx.y, b = blockIdx.z;
    if (j >= t) return;
    int lane = threadIdx.x & 31;
    size_t krow = (size_t)(b * nkv + h / (nh / nkv)) * t + j;
    size_t q0 = (size_t)(b * nh + h) * t;
    float kr[E], vr[E], dk[E], dv[E];
    load_row<T, E>(k + krow * d, d, kr);
    load_row<T, E>(v + krow * d, d, vr);
#pragma unroll
    for (int e = 0; e < E; ++e) { dk[e] = 0.f; dv[e] = 0.f; }
    if (mask[(size_t)b * t + j]) {
        int hi = window > 0 ? min(t, j + window) : t;
        for (int i = j; i < hi; ++i) {
            float L = lse[q0 + i];
            if (L == INFINITY) continue;
            const T* qp = q + (q0 + i) * d;
            const T* dp_ = dout + (q0 + i) * d;
            float s = dot_row<T, E>(kr, qp, d), dp = dot_row<T, E>(vr, dp_, d);
            warp_sum2(s, dp);
            float p = expf(s * scale - L), ds = p * (dp - dbuf[q0 + i]);
#pragma unroll
            for (int e = 0; e < E; ++e) {
                int c = lane + 32 * e;
                if (c < d) { dv[e] += p * to_f32(dp_[c]); dk[e] += ds * to_f32(qp[c]); }
            }
        }
    }
    size_t nq = (size_t)gridDim.z * nh * t * d;
    float* pk = part + (q0 + j) * d;
#pragma unroll
    for (int e = 0; e < E; ++e) {
        int c = lane + 32 * e;
        if (c < d) { pk[c] = dk[e] * scale; pk[nq + c] = dv[e]; }
    }
}

// dkv[2][b][nkv][t][d] = sum over the rep query heads of part[2][b][nh][t][d] (fixed order).
template <typename T>
__device__ void attn_reduce_heads(const float* part, T* dkv, int b, int nh, int nkv, int t, int d) {
    int rep = nh / nkv;
    size_t n = (size_t)2 * b * nkv * t * d, per = (size_t)t * d;
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < n; idx += (size_t)gridDim.x * blockDim.x) {
        size_t within = idx % per, row = idx / per;  // row = (which, bi, g)
        int g = row % nkv;
        size_t wb = row / nkv;  // which * b + bi
        const float* src = part + ((wb * nh + (size_t)g * rep) * per) + within;
        float s = 0.f;
        for (int r = 0; r < rep; ++r) s += src[r * per];
        dkv[idx] = from_f32<T>(s);
    }
}

#define INST_E(T, S, E)                                                                              \
    extern "C" __global__ void __launch_bounds__(ROWS * 32) attn_fwd_e##E##_##S(                     \
        const T* q, const T* k, const T* v, const uint8_t* mask, T* o, float* lse, int nh, int nkv,  \
        int t, int d, int window, float scale) {                                                     \
        attn_fwd<T, E>(q, k, v, mask, o, lse, nh, nkv, t, d, window, scale);                         \
    }                                                                                                \
    extern "C" __global__ void __launch_bounds__(ROWS * 32) attn_bwd_dq_e##E##_##S(                  \
        const T* q, const T* k, const T* v, const uint8_t* mask, const T* o, const T* dout,          \
        const float* lse, T* dq, float* dbuf, int nh, int nkv, int t, int d, int window,             \
        float scale) {                                                                               \
        attn_bwd_dq<T, E>(q, k, v, mask, o, dout, lse, dq, dbuf, nh, nkv, t, d, window, scale);      \
    }                                                                                                \
    extern "C" __global__ void __launch_bounds__(ROWS * 32) attn_bwd_dkdv_e##E##_##S(                \
        const T* q, const T* k, const T* v, const uint8_t* mask, const T* dout, const float* lse,    \
        const float* dbuf, float* part, int nh, int nkv, int t, int d, int window, float scale) {    \
        attn_bwd_dkdv<T, E>(q, k, v, mask, dout, lse, dbuf, part, nh, nkv, t, d, window, scale);     \
    }
#define INST(T, S)                                                                                   \
    extern "C" __global__ void attn_reduce_heads_##S(const float* part, T* dkv, int b, int nh,       \
                                                     int nkv, int t, int d) {                        \
        attn_reduce_heads<T>(part, dkv, b, nh, nkv, t, d);                                           \
    }                                                                                                \
    INST_E(T, S, 1) INST_E(T, S, 2) INST_E(T, S, 4) INST_E(T, S, 8) INST_E(T, S, 16)
G4FT_FLOAT_TYPES(INST)
