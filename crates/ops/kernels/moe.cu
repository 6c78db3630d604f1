// Mixture-of-experts routing and expert matmuls on the device, no host round trip.
// Host side and CPU reference: src/moe.rs (launchers in src/moe_cuda.rs).
//
// - moe_topk: one warp per token row of the router probabilities; k rounds of a warp arg-max
//   (ties: lower expert index), taken experts masked in a per-lane bit set.
// - moe_group: one block per expert; each thread counts a run of consecutive slots (the
//   assignments to lower experts give the segment start, a block prefix sum of this expert's the
//   run's place in it), then places its run's slots of this expert in slot order, so the grouping
//   is stable and deterministic. Writes [order | token | slot_pos | offsets].
// - grouped_gemm_{nt,nn}: y[r] = x[r]·W[e]ᵀ (W (E, N, K)) or x[r]·W[e] (W (E, K, N)) for the rows
//   r of expert e's segment; a block owns a 128-row tile of one segment and 128 output columns,
//   8 warps of 32×64 with mma.sync m16n8k16, fp32 accumulators, a 4-stage cp.async pipeline of
//   32-deep K tiles in dynamic shared memory (three tiles in flight while one is multiplied; one
//   barrier per tile). A warp whose 32 rows are all past the segment's end skips the products (the
//   last tile of a segment is often short). 128×128 tiles read 64 FLOP per byte of shared-memory
//   fill, against 43 for 64×128: the grouped GEMM streams every expert's weights once per row tile.
//   Row tiles never straddle experts: tile → expert by a scan of the offsets (grouped_tiles.cuh).
//   Builds for Hopper run kernels/moe_wgmma.cu's wgmma version instead.
// - grouped_gemm_simple: one thread per output element (f32, and shapes the tiled kernel does not
//   take: K or N not a multiple of 8).
// - moe_combine: one block per token; its k grouped rows in ascending position, weighted, fp32 sum,
//   16-byte packs of columns where the rows allow.
// - moe_gather_scaled / moe_gather_dot: the rows of the tokens in grouped order, optionally
//   weighted (the experts' input, and the combine's backward d(rows)), and d(weights).
#include "common.cuh"
#include "grouped_tiles.cuh"
#include "mma.cuh"

using namespace mma16;

// ---------------------------------------------------------------------------------------------
// top-k

constexpr int TOPK_MAX_PER_LANE = 16;  // up to 512 experts

extern "C" __global__ void moe_topk(const float* probs, uint32_t* idx, int n, int e, int k) {
    G4FT_KERNEL_ENTRY();
    const int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
    if (row >= n) return;
    const float* p = probs + (size_t)row * e;
    const int per = (e + 31) / 32;
    float v[TOPK_MAX_PER_LANE];
#pragma unroll
    for (int i = 0; i < TOPK_MAX_PER_LANE; ++i) {
        const int j = lane + 32 * i;
        v[i] = (i < per && j < e) ? p[j] : -INFINITY;
    }
    uint32_t taken = 0;
    for (int r = 0; r < k; ++r) {
        float bv = -INFINITY;
        int bj = 0x7fffffff;
#pragma unroll
        for (int i = 0; i < TOPK_MAX_PER_LANE; ++i) {
            const int j = lane + 32 * i;
            if (i < per && j < e && !(taken >> i & 1u) && (v[i] > bv || bj == 0x7fffffff)) {
                bv = v[i];
                bj = j;
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oj = __shfl_xor_sync(0xffffffffu, bj, o);
            if (ov > bv || (ov == bv && oj < bj)) {
                bv = ov;
                bj = oj;
            }
        }
        if (bj % 32 == lane) taken |= 1u << (bj / 32);
        if (lane == 0) idx[(size_t)row * k + r] = (uint32_t)bj;
    }
}

// ---------------------------------------------------------------------------------------------
// grouping

// Exclusive prefix sum of `v` over the block's threads in thread order (blockDim.x a multiple of
// 32, at most 1024); the block's sum in `total`.
__device__ __forceinline__ int block_scan_int(int v, int* buf, int& total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    int incl = v;
#pragma unroll
    for (int o = 1; o < 32; o *= 2) {
        const int u = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += u;
    }
    __syncthreads();  // buf may still be read by a previous call
    if (lane == 31) buf[warp] = incl;
    __syncthreads();
    int before = 0;
    total = 0;
    for (int w = 0; w < nwarps; ++w) {
        const int c = buf[w];
        before += w < warp ? c : 0;
        total += c;
    }
    return before + incl - v;
}

// grid (E), block 256; out = [order (m) | token (m) | slot_pos (m) | offsets (E+1)]. Block e places
// expert e's slots. Each thread owns a run of ceil(m / 256) consecutive slots: it counts the run's
// slots of lower experts (their sum over the block is the segment's start) and of expert e (their
// prefix sum over the runs is the run's first position in the segment), then places the run's
// slots of e in slot order, so the grouping is stable and deterministic.
extern "C" __global__ void moe_group(const uint32_t* idx, uint32_t* out, int m, int e_count, int k) {
    G4FT_KERNEL_ENTRY();
    __shared__ int buf[32];
    const uint32_t e = blockIdx.x;
    const int per = (m + blockDim.x - 1) / blockDim.x;
    const int s0 = min(m, (int)threadIdx.x * per), s1 = min(m, s0 + per);
    int lower = 0, mine = 0;
    for (int s = s0; s < s1; ++s) {
        const uint32_t x = idx[s];
        lower += x < e;
        mine += x == e;
    }
    int base, segment;  // the segment's start and length
    block_scan_int(lower, buf, base);
    int pos = base + block_scan_int(mine, buf, segment);
    if (threadIdx.x == 0) {
        out[3 * (size_t)m + e] = base;
        if (e + 1 == (uint32_t)e_count) out[3 * (size_t)m + e_count] = m;
    }
    for (int s = s0; mine > 0; ++s) {
        if (idx[s] == e) {
            out[pos] = s;
            out[m + pos] = s / k;
            out[2 * (size_t)m + s] = pos;
            ++pos;
            --mine;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// grouped GEMM

constexpr int GBM = 128, GBN = 128, GBK = 32, GTHREADS = 256, GSTAGES = 4;
constexpr int LDA = GBK + 8;  // A tile row stride (elements): rows of K, padded
constexpr int LDB_NT = GBK + 8;
constexpr int LDB_NN = GBN + 8;

template <typename T, bool NT>
__device__ __forceinline__ void load_stage(T* sa, T* sb, const T* x, const T* w, int r0, int valid, int n0,
                                           int k0, int n, int kdim) {
    // A: GBM × GBK, 8-element chunks; rows past `valid` and columns past K are zero.
    for (int c = threadIdx.x; c < GBM * GBK / 8; c += GTHREADS) {
        const int r = c / (GBK / 8), col = (c % (GBK / 8)) * 8;
        const bool ok = r < valid && k0 + col < kdim;
        cp_async16(sa + r * LDA + col, x + (size_t)(ok ? r0 + r : 0) * kdim + (ok ? k0 + col : 0), ok);
    }
    if (NT) {  // W[e] (N, K): GBN rows of n, K contiguous
        for (int c = threadIdx.x; c < GBN * GBK / 8; c += GTHREADS) {
            const int r = c / (GBK / 8), col = (c % (GBK / 8)) * 8;
            const bool ok = n0 + r < n && k0 + col < kdim;
            cp_async16(sb + r * LDB_NT + col, w + (size_t)(ok ? n0 + r : 0) * kdim + (ok ? k0 + col : 0), ok);
        }
    } else {  // W[e] (K, N): GBK rows of k, N contiguous
        for (int c = threadIdx.x; c < GBK * GBN / 8; c += GTHREADS) {
            const int r = c / (GBN / 8), col = (c % (GBN / 8)) * 8;
            const bool ok = k0 + r < kdim && n0 + col < n;
            cp_async16(sb + r * LDB_NN + col, w + (size_t)(ok ? k0 + r : 0) * n + (ok ? n0 + col : 0), ok);
        }
    }
}

// grid (ceil(N / 128), ceil(m / 128) + E), block 256, dynamic shared memory for GSTAGES A tiles
// then GSTAGES B tiles: GSTAGES·(GBM·LDA + GBN·LDB_NT or GBK·LDB_NN)·2 bytes (81,920 NT, 75,776
// NN; `gemm_smem` in src/moe_cuda.rs). K and N multiples of 8, 16-byte aligned rows.
template <typename T, bool NT>
__device__ __forceinline__ void grouped_gemm(const T* x, const T* w, const uint32_t* offsets, T* y, int e_count,
                                             int n, int kdim) {
    constexpr int SA = GBM * LDA, SB = NT ? GBN * LDB_NT : GBK * LDB_NN;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T (*const sa)[SA] = reinterpret_cast<T (*)[SA]>(smem_raw);
    T (*const sb)[SB] = reinterpret_cast<T (*)[SB]>(smem_raw + GSTAGES * SA * sizeof(T));
    int e, r0, valid;
    if (!tile_of<GBM>(offsets, e_count, blockIdx.y, e, r0, valid)) return;  // uniform per block
    const int n0 = blockIdx.x * GBN;
    const T* we = w + (size_t)e * n * kdim;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, wm = warp / 2, wn = warp % 2;
    const bool busy = wm * 32 < valid;  // warp-uniform: this warp has rows in the segment
    float c[2][8][4];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) c[i][j][0] = c[i][j][1] = c[i][j][2] = c[i][j][3] = 0.f;

    // One commit group per K tile, empty past the last, so that before multiplying tile kt
    // exactly GSTAGES − 2 newer groups may still be in flight.
    const int ktiles = (kdim + GBK - 1) / GBK;
#pragma unroll
    for (int s = 0; s < GSTAGES - 1; ++s) {
        if (s < ktiles) load_stage<T, NT>(sa[s], sb[s], x, we, r0, valid, n0, s * GBK, n, kdim);
        cp_async_commit();
    }
    for (int kt = 0; kt < ktiles; ++kt) {
        cp_async_wait_newer<GSTAGES - 2>();  // this thread's copies of tile kt are in
        __syncthreads();      // everyone's are, and every warp is done with tile kt − 1
        const int nk = kt + GSTAGES - 1;  // into the stage tile kt − 1 used
        if (nk < ktiles)
            load_stage<T, NT>(sa[nk % GSTAGES], sb[nk % GSTAGES], x, we, r0, valid, n0, nk * GBK, n, kdim);
        cp_async_commit();
        const T* A = sa[kt % GSTAGES];
        const T* B = sb[kt % GSTAGES];
        if (!busy) continue;  // it still loads its share and meets every barrier
#pragma unroll
        for (int kk = 0; kk < GBK / 16; ++kk) {
            uint32_t a[2][4];
#pragma unroll
            for (int mi = 0; mi < 2; ++mi)
                ldsm4(a[mi], A + (wm * 32 + mi * 16 + lane % 16) * LDA + kk * 16 + (lane / 16) * 8);
#pragma unroll
            for (int np = 0; np < 4; ++np) {
                uint32_t b[4];
                if (NT)
                    ldsm4(b, B + (wn * 64 + np * 16 + (lane / 16) * 8 + lane % 8) * LDB_NT + kk * 16 +
                                 ((lane / 8) % 2) * 8);
                else
                    ldsm4_trans(b, B + (kk * 16 + ((lane / 8) % 2) * 8 + lane % 8) * LDB_NN + wn * 64 + np * 16 +
                                       (lane / 16) * 8);
#pragma unroll
                for (int mi = 0; mi < 2; ++mi) {
                    mma<T>(c[mi][2 * np], a[mi], b[0], b[1]);
                    mma<T>(c[mi][2 * np + 1], a[mi], b[2], b[3]);
                }
            }
        }
    }
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int nf = 0; nf < 8; ++nf) {
            const int col = n0 + wn * 64 + nf * 8 + 2 * (lane % 4);
            if (col >= n) continue;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = wm * 32 + mi * 16 + lane / 4 + 8 * h;
                if (r < valid)
                    *reinterpret_cast<uint32_t*>(y + (size_t)(r0 + r) * n + col) =
                        pack2<T>(c[mi][nf][2 * h], c[mi][nf][2 * h + 1]);
            }
        }
}

#define GROUPED_INST(T, S)                                                                                \
    extern "C" __global__ void __launch_bounds__(GTHREADS)                                               \
        grouped_gemm_nt_##S(const T* x, const T* w, const uint32_t* offsets, T* y, int e, int n, int k) { \
        G4FT_KERNEL_ENTRY();                                                                              \
        grouped_gemm<T, true>(x, w, offsets, y, e, n, k);                                                 \
    }                                                                                                     \
    extern "C" __global__ void __launch_bounds__(GTHREADS)                                               \
        grouped_gemm_nn_##S(const T* x, const T* w, const uint32_t* offsets, T* y, int e, int n, int k) { \
        G4FT_KERNEL_ENTRY();                                                                              \
        grouped_gemm<T, false>(x, w, offsets, y, e, n, k);                                                \
    }
GROUPED_INST(__nv_bfloat16, bf16)
GROUPED_INST(__half, f16)

// One thread per output element; the expert of a row by binary search over the offsets.
template <typename T>
__device__ __forceinline__ void grouped_gemm_simple(const T* x, const T* w, const uint32_t* offsets, T* y,
                                                    int e_count, int m, int n, int kdim, bool nt) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (size_t)m * n;
         i += (size_t)gridDim.x * blockDim.x) {
        const int r = i / n, col = i % n;
        int lo = 0, hi = e_count;  // largest e with offsets[e] <= r
        while (hi - lo > 1) {
            const int mid = (lo + hi) / 2;
            if ((int)offsets[mid] <= r) lo = mid; else hi = mid;
        }
        const T* we = w + (size_t)lo * n * kdim;
        float acc = 0.f;
        for (int kk = 0; kk < kdim; ++kk)
            acc += to_f32(x[(size_t)r * kdim + kk]) * to_f32(nt ? we[(size_t)col * kdim + kk] : we[(size_t)kk * n + col]);
        y[i] = from_f32<T>(acc);
    }
}

#define SIMPLE_INST(T, S)                                                                                   \
    extern "C" __global__ void grouped_gemm_simple_##S(const T* x, const T* w, const uint32_t* offsets, T* y, \
                                                       int e, int m, int n, int k, int nt) {                  \
        G4FT_KERNEL_ENTRY();                                                                                  \
        grouped_gemm_simple<T>(x, w, offsets, y, e, m, n, k, nt != 0);                                      \
    }
SIMPLE_INST(float, f32)
SIMPLE_INST(__nv_bfloat16, bf16)
SIMPLE_INST(__half, f16)

// ---------------------------------------------------------------------------------------------
// combine and its backward

constexpr int COMBINE_MAX_K = 32;

// grid (n), block 256: out[t] = Σ_p w[p]·y[p] over token t's grouped positions, ascending, in
// fp32; each thread sums V consecutive columns at a time (V = 16 bytes of T when `packed`: h a
// multiple of it and y, out 16-byte aligned; else 1).
template <typename T, int V>
__device__ __forceinline__ void combine_cols(const T* y, const int* pos, const float* w, T* out, int h, int k) {
    const int t = blockIdx.x;
    for (int col = threadIdx.x * V; col < h; col += blockDim.x * V) {
        float acc[V] = {};
        for (int j = 0; j < k; ++j) {
            const int p = pos[j];
            const float wp = w ? w[p] : 1.f;
            float v[V];
            load_n<T, V>(y + (size_t)p * h + col, v);
#pragma unroll
            for (int c = 0; c < V; ++c) acc[c] += v[c] * wp;
        }
        store_n<T, V>(out + (size_t)t * h + col, acc);
    }
}

template <typename T>
__device__ __forceinline__ void combine(const T* y, const uint32_t* slot_pos, const float* w, T* out, int h, int k,
                                        bool packed) {
    __shared__ int pos[COMBINE_MAX_K];
    const int t = blockIdx.x;
    if (threadIdx.x == 0) {
        for (int j = 0; j < k; ++j) {  // insertion sort of k positions
            int p = slot_pos[(size_t)t * k + j], i = j;
            while (i > 0 && pos[i - 1] > p) { pos[i] = pos[i - 1]; --i; }
            pos[i] = p;
        }
    }
    __syncthreads();
    if (packed)
        combine_cols<T, 16 / sizeof(T)>(y, pos, w, out, h, k);
    else
        combine_cols<T, 1>(y, pos, w, out, h, k);
}

// out[p] = r(f32(x[token[p]]) · w[p]) (w null: 1, a copy), grid-stride over m·h elements, or over
// its 16-byte packs when `packed` (h a multiple of a pack, x 16-byte aligned; out is).
template <typename T>
__device__ __forceinline__ void gather_scaled(const T* x, const float* w, const uint32_t* token, T* out, int m, int h,
                                              bool packed) {
    constexpr int V = 16 / sizeof(T);
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    if (packed) {
        const int hv = h / V;
        for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (size_t)m * hv; i += stride) {
            const size_t p = i / hv, col = (i % hv) * V;
            uint4 v = *reinterpret_cast<const uint4*>(x + (size_t)token[p] * h + col);
            if (w) {
                T* e = reinterpret_cast<T*>(&v);
                const float wp = w[p];
#pragma unroll
                for (int j = 0; j < V; ++j) e[j] = from_f32<T>(to_f32(e[j]) * wp);
            }
            *reinterpret_cast<uint4*>(out + p * h + col) = v;
        }
        return;
    }
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (size_t)m * h; i += stride) {
        const size_t p = i / h, col = i % h;
        out[i] = from_f32<T>(to_f32(x[(size_t)token[p] * h + col]) * (w ? w[p] : 1.f));
    }
}

// dw[p] = Σ_h f32(y[p]) · f32(g[token[p]]), one warp per row.
template <typename T>
__device__ __forceinline__ void gather_dot(const T* y, const T* g, const uint32_t* token, float* dw, int m, int h) {
    const int p = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
    if (p >= m) return;
    const T* yr = y + (size_t)p * h;
    const T* gr = g + (size_t)token[p] * h;
    float acc = 0.f;
    for (int col = lane; col < h; col += 32) acc += to_f32(yr[col]) * to_f32(gr[col]);
    acc = warp_sum(acc);
    if (lane == 0) dw[p] = acc;
}

#define COMBINE_INST(T, S)                                                                                   \
    extern "C" __global__ void moe_combine_##S(const T* y, const uint32_t* slot_pos, const float* w, T* out,  \
                                               int h, int k, int packed) {                                    \
        G4FT_KERNEL_ENTRY();                                                                                  \
        combine<T>(y, slot_pos, w, out, h, k, packed != 0);                                                  \
    }                                                                                                        \
    extern "C" __global__ void moe_gather_scaled_##S(const T* x, const float* w, const uint32_t* token, T* out, \
                                                     int m, int h, int packed) {                               \
        G4FT_KERNEL_ENTRY();                                                                                   \
        gather_scaled<T>(x, w, token, out, m, h, packed != 0);                                                \
    }                                                                                                         \
    extern "C" __global__ void moe_gather_dot_##S(const T* y, const T* g, const uint32_t* token, float* dw,    \
                                                  int m, int h) {                                             \
        G4FT_KERNEL_ENTRY();                                                                                  \
        gather_dot<T>(y, g, token, dw, m, h);                                                                \
    }
COMBINE_INST(float, f32)
COMBINE_INST(__nv_bfloat16, bf16)
COMBINE_INST(__half, f16)
