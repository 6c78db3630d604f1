// Fused attention backward (FlashAttention-2's recurrences) for 16-bit inputs and head dims 256 /
// 512. Host side: src/attention_cuda.rs (`flash_bwd`); CPU reference: src/attention.rs
// (`bwd_cpu`); the blocked cuBLAS path (attention.cu) serves f32 and the other head dims.
//
// Launches: `attn_flash_bwd_dot` (Dᵢ = dOᵢ·Oᵢ in fp32 per query row), then two kernels that each
// recompute P = exp(S·scale − lse) from the forward's log-sum-exp, with no atomics:
// - `attn_flash_bwd_kv_d{D}`: a block owns BC keys of one (batch, kv head) slab and keeps their fp32
//   dK and dV in registers while it walks the query rows that see them, BR rows per tile, for the
//   group's query heads [m0, m0 + g / hsplit) (the block's split picks m0; hsplit > 1 only to fill the
//   GPU when there are few kv heads, and then each split stores its partial dK / dV in fp32
//   buffers of its own, which `attn_round` sums in split order: the same bits on every run).
//   Per tile: Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ (mma.sync m16n8k16, fp32), masked; Pᵀ and
//   dSᵀ = scale·Pᵀ∘(dPᵀ − D) rounded to T into shared memory (as the blocked path rounds them
//   before its GEMMs); dV += Pᵀ·dO, dK += dSᵀ·Q. Warps (BC / 16)·CSPLIT = 8; warp (kr, part) owns
//   keys kr·16.. and columns part·D / CSPLIT.. (128 columns: 128 accumulator registers).
// - `attn_flash_bwd_q_d{D}`: the forward's block shape (BR grouped query rows of one slab, row R
//   is query R / g of head kv·g + R % g; DSPLIT warps per 16 rows at head dim 512) walking the key
//   tiles its rows see: S = Q·Kᵀ, dP = dO·Vᵀ, dS = scale·P∘(dP − D) rounded to T straight into A
//   fragments, dQ += dS·K in registers, written once.
// Query qi sees key j iff seq_start[b, qi] <= j <= qi, qi − j < window (window 0 = none) and
// key_mask[b, j] != 0 (`seq_start` null = 0, else non-decreasing along t). A row that saw no key
// in the forward has lse = +inf and contributes nothing.
#include "common.cuh"
#include "flash_bwd_tile.cuh"
#include "grouped_rows.cuh"
#include "mma.cuh"

namespace flash_bwd {

using namespace mma16;
using flash_bwd_tile::KeyBlock;
using flash_bwd_tile::visible;

// Dᵢ = Σ_c dO[i, c]·O[i, c] in fp32 for the b·nh·t rows of d elements; one warp per row.
template <typename T>
__device__ void dot_rows(const T* o, const T* dout, float* dd, int d, int nrows) {
    const int r = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (r >= nrows) return;
    const T* orow = o + (size_t)r * d;
    const T* grow = dout + (size_t)r * d;
    float acc = 0.f;
    for (int c = lane * 8; c < d; c += 32 * 8) {
        const uint4 ov = *reinterpret_cast<const uint4*>(orow + c);
        const uint4 gv = *reinterpret_cast<const uint4*>(grow + c);
        const T* oe = reinterpret_cast<const T*>(&ov);
        const T* ge = reinterpret_cast<const T*>(&gv);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc += to_f32(oe[e]) * to_f32(ge[e]);
    }
    acc = warp_sum(acc);
    if (lane == 0) dd[r] = acc;
}

// c[0 .. 2·NP) (m16n8k16 accumulators) += A·Bᵀ for the 16 rows of A at `a` and the NP·16 rows
// of B at `b`, both rows of D elements in shared memory with row stride D + 8.
template <typename T, int D, int NP>
__device__ __forceinline__ void rows_times_rows(float (*c)[4], const T* a, const T* b, int lane) {
    constexpr int LD = D + 8;
#pragma unroll 4
    for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t af[4];
        ldsm4(af, a + (lane % 16) * LD + kk * 16 + (lane / 16) * 8);
#pragma unroll
        for (int np = 0; np < NP; ++np) {
            uint32_t bf[4];
            ldsm4(bf, b + (np * 16 + (lane / 16) * 8 + lane % 8) * LD + kk * 16 + ((lane / 8) % 2) * 8);
            mma<T>(c[2 * np], af, bf[0], bf[1]);
            mma<T>(c[2 * np + 1], af, bf[2], bf[3]);
        }
    }
}

template <typename T, int D, int BC, int BR, int CSPLIT>
__device__ __forceinline__ void kv(const T* q, const T* k, const T* v, const T* dout,
                                   const float* lse, const float* dd, const uint8_t* mask,
                                   const uint32_t* seq_start, T* dk, T* dv, float* dk32,
                                   float* dv32, float scale, int nh, int g, int t, int window) {
    constexpr int KRW = BC / 16, WARPS = KRW * CSPLIT, THREADS = WARPS * 32;
    constexpr int LD = D + 8, LP = BR + 8;
    constexpr int QW = BR / CSPLIT;  // query columns of Sᵀ per warp
    constexpr int NQ = QW / 8;       // their n-tiles
    constexpr int DW = D / CSPLIT;   // dK / dV columns per warp
    constexpr int NTW = DW / 8;      // their n-tiles
    static_assert(WARPS == 8 && NQ % 2 == 0 && NTW % 2 == 0, "block shape");

    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* const sk = reinterpret_cast<T*>(smem_raw);
    T* const sv = sk + BC * LD;
    T* const sq = sv + BC * LD;
    T* const sdo = sq + BR * LD;
    T* const sp = sdo + BR * LD;   // Pᵀ (BC × BR), row stride LP
    T* const sds = sp + BC * LP;   // dSᵀ
    float* const slse = reinterpret_cast<float*>(sds + BC * LP);  // lse per tile row
    float* const sdd = slse + BR;                                  // D per tile row
    int* const sqi = reinterpret_cast<int*>(sdd + BR);             // query index, −1 = no row
    int* const sst = sqi + BR;                                     // seq_start of the row's query
    __shared__ uint8_t skm[BC];

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int kr = warp % KRW, part = warp / KRW;
    const KeyBlock kb(BC, nh, g, t, window, seq_start);
    const int slab = kb.slab, j0 = kb.j0;
    const T* kslab = k + (size_t)slab * t * D;
    const T* vslab = v + (size_t)slab * t * D;

    load_tile<T, D, BC, THREADS>(sk, kslab + (size_t)j0 * D, t - j0);
    load_tile<T, D, BC, THREADS>(sv, vslab + (size_t)j0 * D, t - j0);
    cp_async_commit();
    bool keys_full = kb.load_key_mask<BC>(skm, mask);
    keys_full = __syncthreads_and(keys_full);
    // The Q / dO rows and row values of the tile at r0.
    auto load_q = [&](int r0) {
        kb.load_rows<T, D, BR, THREADS>(sq, sdo, q, dout, r0, [](int r, int ch) { return r * LD + ch * 8; });
        kb.load_row_values<BR>(slse, lse, dd, r0);
        cp_async_commit();
    };

    float dka[NTW][4], dva[NTW][4];
#pragma unroll
    for (int i = 0; i < NTW; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) dka[i][e] = dva[i][e] = 0.f;

    const float sl2 = scale * G4FT_LOG2E;
    if (kb.rbeg < kb.rend && !kb.past_seq(kb.rbeg)) load_q(kb.rbeg);
    for (int r0 = kb.rbeg; r0 < kb.rend && !kb.past_seq(r0); r0 += BR) {
        cp_async_wait_all();
        __syncthreads();  // Q, dO, K, V and the row values are in

        // This warp's 16 keys × QW query columns of Sᵀ and dPᵀ.
        float s[NQ][4], dp[NQ][4];
#pragma unroll
        for (int i = 0; i < NQ; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[i][e] = dp[i][e] = 0.f;
#pragma unroll 4
        for (int kk = 0; kk < D / 16; ++kk) {
            uint32_t ak[4], av[4];
            ldsm4(ak, sk + (kr * 16 + lane % 16) * LD + kk * 16 + (lane / 16) * 8);
            ldsm4(av, sv + (kr * 16 + lane % 16) * LD + kk * 16 + (lane / 16) * 8);
#pragma unroll
            for (int np = 0; np < NQ / 2; ++np) {
                const int c = part * QW + np * 16 + (lane / 16) * 8 + lane % 8;
                uint32_t bq[4], bo[4];
                ldsm4(bq, sq + c * LD + kk * 16 + ((lane / 8) % 2) * 8);
                ldsm4(bo, sdo + c * LD + kk * 16 + ((lane / 8) % 2) * 8);
                mma<T>(s[2 * np], ak, bq[0], bq[1]);
                mma<T>(s[2 * np + 1], ak, bq[2], bq[3]);
                mma<T>(dp[2 * np], av, bo[0], bo[1]);
                mma<T>(dp[2 * np + 1], av, bo[2], bo[3]);
            }
        }
        // Pᵀ and dSᵀ into shared memory; interior tiles (most of them) skip the per-element
        // visibility test.
        auto p_ds = [&](bool masked) {
#pragma unroll
            for (int nt = 0; nt < NQ; ++nt)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int jl = kr * 16 + lane / 4 + 8 * h, j = j0 + jl;
                    float pv[2], dsv[2];
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int c = part * QW + nt * 8 + 2 * (lane % 4) + e;
                        const bool ok = !masked || (sqi[c] >= 0 && visible(j, sqi[c], sst[c], window, skm[jl]));
                        const float p = ok ? ex2_ftz(fmaf(s[nt][2 * h + e], sl2, -(slse[c] * G4FT_LOG2E))) : 0.f;
                        pv[e] = p;
                        dsv[e] = scale * p * (dp[nt][2 * h + e] - sdd[c]);
                    }
                    const int off = jl * LP + part * QW + nt * 8 + 2 * (lane % 4);
                    *reinterpret_cast<uint32_t*>(sp + off) = pack2<T>(pv[0], pv[1]);
                    *reinterpret_cast<uint32_t*>(sds + off) = pack2<T>(dsv[0], dsv[1]);
                }
        };
        if (kb.interior<BR>(slse, r0, keys_full, window))
            p_ds(false);
        else
            p_ds(true);
        __syncthreads();  // Pᵀ and dSᵀ of the tile are complete

        // dV += Pᵀ·dO and dK += dSᵀ·Q over the tile's BR query rows.
#pragma unroll
        for (int ks = 0; ks < BR / 16; ++ks) {
            uint32_t ap[4], ads[4];
            ldsm4(ap, sp + (kr * 16 + lane % 16) * LP + ks * 16 + (lane / 16) * 8);
            ldsm4(ads, sds + (kr * 16 + lane % 16) * LP + ks * 16 + (lane / 16) * 8);
#pragma unroll
            for (int dw = 0; dw < NTW / 2; ++dw) {
                const int r = ks * 16 + ((lane / 8) % 2) * 8 + lane % 8;
                const int c = part * DW + dw * 16 + (lane / 16) * 8;
                uint32_t bo[4], bq[4];
                ldsm4_trans(bo, sdo + r * LD + c);
                ldsm4_trans(bq, sq + r * LD + c);
                mma<T>(dva[2 * dw], ap, bo[0], bo[1]);
                mma<T>(dva[2 * dw + 1], ap, bo[2], bo[3]);
                mma<T>(dka[2 * dw], ads, bq[0], bq[1]);
                mma<T>(dka[2 * dw + 1], ads, bq[2], bq[3]);
            }
        }
        __syncthreads();  // every warp is done with Q, dO, Pᵀ, dSᵀ and the row values
        const int nxt = r0 + BR;
        if (nxt < kb.rend && !kb.past_seq(nxt)) load_q(nxt);
    }

    // dK and dV of the block's keys: rounded to T, or stored in this split's fp32 partials.
    const size_t split = (size_t)kb.split * gridDim.y * t * D;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int j = j0 + kr * 16 + lane / 4 + 8 * h;
        if (j >= t) continue;
        const size_t row = ((size_t)slab * t + j) * D;
#pragma unroll
        for (int nt = 0; nt < NTW; ++nt) {
            const int c = part * DW + nt * 8 + 2 * (lane % 4);
            if (dk32) {
                *reinterpret_cast<float2*>(dk32 + split + row + c) = make_float2(dka[nt][2 * h], dka[nt][2 * h + 1]);
                *reinterpret_cast<float2*>(dv32 + split + row + c) = make_float2(dva[nt][2 * h], dva[nt][2 * h + 1]);
            } else {
                *reinterpret_cast<uint32_t*>(dk + row + c) = pack2<T>(dka[nt][2 * h], dka[nt][2 * h + 1]);
                *reinterpret_cast<uint32_t*>(dv + row + c) = pack2<T>(dva[nt][2 * h], dva[nt][2 * h + 1]);
            }
        }
    }
}

template <typename T, int D, int BC, int WARPS, int DSPLIT>
__device__ __forceinline__ void dq(const T* q, const T* k, const T* v, const T* dout,
                                   const float* lse, const float* dd, const uint8_t* mask,
                                   const uint32_t* seq_start, T* dq, float scale, int nh, int g,
                                   int t, int window) {
    constexpr int ROWW = WARPS / DSPLIT, BR = ROWW * 16, LD = D + 8, THREADS = WARPS * 32;
    constexpr int DTW = D / 8 / DSPLIT, ST = BC / 8;  // DTW: dQ column tiles of one warp
    static_assert(WARPS % DSPLIT == 0 && DTW % 2 == 0, "column split shape");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* const sq = reinterpret_cast<T*>(smem_raw);
    T* const sdo = sq + BR * LD;
    T* const sk = sdo + BR * LD;
    T* const sv = sk + BC * LD;
    __shared__ uint8_t skm[BC];

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int rw = warp % ROWW, part = warp / ROWW;  // row group, column part
    const GroupedRows<BR> gr(nh, g, t);
    const int rows = gr.rows, r0 = gr.r0, qlo = gr.qlo, qhi = gr.qhi;
    const uint32_t* srow = gr.batch_row(seq_start, t);
    const int klo = gr.first_key(window, srow);
    const T *kslab = gr.slab_row0(k, t, D), *vslab = gr.slab_row0(v, t, D);
    const uint8_t* mrow = gr.batch_row(mask, t);

    load_rows<T, D, THREADS>(sq, BR, rows - r0, [&](int r) { return q + gr.head_row(r0 + r, nh, g, t) * D; });
    load_rows<T, D, THREADS>(sdo, BR, rows - r0, [&](int r) { return dout + gr.head_row(r0 + r, nh, g, t) * D; });
    cp_async_commit();

    // This thread's two rows (the C-fragment rows lane/4 and lane/4 + 8 of its warp).
    const flash_bwd_tile::RowPair rp = flash_bwd_tile::row_pair(gr, r0 + rw * 16 + lane / 4, lse, dd, srow, nh, g, t);
    float acc[DTW][4];
#pragma unroll
    for (int i = 0; i < DTW; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;

    for (int j0 = klo; j0 <= qhi; j0 += BC) {
        __syncthreads();  // every warp is done with the last tile's K, V and key mask
        load_tile<T, D, BC, THREADS>(sk, kslab + (size_t)j0 * D, t - j0);
        cp_async_commit();
        load_tile<T, D, BC, THREADS>(sv, vslab + (size_t)j0 * D, t - j0);
        cp_async_commit();
        if (threadIdx.x < BC) {
            const int j = j0 + threadIdx.x;
            skm[threadIdx.x] = j < t ? mrow[j] : 0;
        }
        cp_async_wait_newer<1>();  // Q, dO and K are in
        __syncthreads();

        float s[ST][4], dp[ST][4];
#pragma unroll
        for (int i = 0; i < ST; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[i][e] = dp[i][e] = 0.f;
        rows_times_rows<T, D, BC / 16>(s, sq + rw * 16 * LD, sk, lane);
        cp_async_wait_all();
        __syncthreads();  // V is in
        rows_times_rows<T, D, BC / 16>(dp, sdo + rw * 16 * LD, sv, lane);
        uint32_t fa[BC / 16][4];
        flash_bwd_tile::ds_fragments<T, BC>(s, dp, fa, rp, j0, window, skm, scale, lane);
#pragma unroll
        for (int ks = 0; ks < BC / 16; ++ks)
#pragma unroll
            for (int dw = 0; dw < DTW / 2; ++dw) {
                const int c = (part * (DTW / 2) + dw) * 16;
                uint32_t b[4];
                ldsm4_trans(b, sk + (ks * 16 + ((lane / 8) % 2) * 8 + lane % 8) * LD + c + (lane / 16) * 8);
                mma<T>(acc[2 * dw], fa[ks], b[0], b[1]);
                mma<T>(acc[2 * dw + 1], fa[ks], b[2], b[3]);
            }
    }

    // dQ rounded to T, staged in the warp's own rows (its own columns when split) of the Q tile
    // once every warp is done reading it, stored in 16-byte packs.
    __syncthreads();
    store_rows<T, D, DTW>(acc, 1.f, 1.f, sq + rw * 16 * LD, part, lane, [&](int r) -> T* {
        const int R = r0 + rw * 16 + r;
        return R < rows ? dq + gr.head_row(R, nh, g, t) * D : nullptr;
    });
}

}  // namespace flash_bwd

// Entry points (the host mirrors the shapes in `flash_bwd`):
// - attn_flash_bwd_dot_{bf16,f16}: one warp per (b, nh, t) row (d a multiple of 8, 16-byte rows);
// - attn_flash_bwd_kv_d{D}_{bf16,f16}: 256 threads, grid (ceil(t / BC), b·nkv, hsplit), dynamic
//   shared memory (2·BC + 2·BR)·(D + 8)·2 + 2·BC·(BR + 8)·2 + 16·BR bytes with (BC, BR, CSPLIT) =
//   (64, 64, 2) at head dim 256 and (32, 64, 4) at 512; dk32 / dv32 zeroed fp32 buffers of hsplit
//   partials (hsplit·b·nkv·t·D floats) when hsplit > 1, else null;
// - attn_flash_bwd_q_d{D}_{bf16,f16}: 256 threads, grid (ceil(t·g / BR), b·nkv), dynamic shared
//   memory (2·BR + 2·BC)·(D + 8)·2 bytes with (BC, BR, DSPLIT) = (64, 128, 1) at head dim 256 and
//   (32, 64, 2) at 512.
#define FLASH_BWD_KERNELS(T, S, D, BC, BR, CSPLIT, QBC, DSPLIT)                                       \
    extern "C" __global__ void __launch_bounds__(256, 1) attn_flash_bwd_kv_d##D##_##S(                \
        const T* q, const T* k, const T* v, const T* dout, const float* lse, const float* dd,        \
        const uint8_t* mask, const uint32_t* seq_start, T* dk, T* dv, float* dk32, float* dv32,      \
        float scale, int nh, int g, int t, int window) {                                             \
        G4FT_KERNEL_ENTRY();                                                                         \
        flash_bwd::kv<T, D, BC, BR, CSPLIT>(q, k, v, dout, lse, dd, mask, seq_start, dk, dv, dk32,   \
                                            dv32, scale, nh, g, t, window);                          \
    }                                                                                                \
    extern "C" __global__ void __launch_bounds__(256, 1) attn_flash_bwd_q_d##D##_##S(                 \
        const T* q, const T* k, const T* v, const T* dout, const float* lse, const float* dd,        \
        const uint8_t* mask, const uint32_t* seq_start, T* dq, float scale, int nh, int g, int t,    \
        int window) {                                                                                \
        G4FT_KERNEL_ENTRY();                                                                         \
        flash_bwd::dq<T, D, QBC, 8, DSPLIT>(q, k, v, dout, lse, dd, mask, seq_start, dq, scale, nh,  \
                                            g, t, window);                                           \
    }
#define FLASH_BWD_INST(T, S)                                                                        \
    extern "C" __global__ void attn_flash_bwd_dot_##S(const T* o, const T* dout, float* dd, int d,  \
                                                      int nrows) {                                  \
        G4FT_KERNEL_ENTRY();                                                                        \
        flash_bwd::dot_rows<T>(o, dout, dd, d, nrows);                                              \
    }                                                                                               \
    FLASH_BWD_KERNELS(T, S, 256, 64, 64, 2, 64, 1) FLASH_BWD_KERNELS(T, S, 512, 32, 64, 4, 32, 2)
FLASH_BWD_INST(__nv_bfloat16, bf16)
FLASH_BWD_INST(__half, f16)
