// Fused attention forward (FlashAttention-2's scheme) for 16-bit inputs and head dims 16 / 32 /
// 64 / 128 / 256 / 512: one pass over the visible keys with an online softmax, S and P never leave
// registers.
// Host side: src/attention_cuda.rs (`flash_fwd`); CPU reference: src/attention.rs; the blocked
// cuBLAS path (attention.cu) serves f32, other head dims and the backward.
//
// A block owns (WARPS / DSPLIT)·16 query rows of one (batch, kv head) slab in the grouped order: row R is
// query qi = R / g of head kv·g + R % g (g = nh / nkv), read from and written to the (b, nh, t, d)
// tensors directly (every row is a contiguous d-vector, so no regroup copy is needed). Keys come in
// tiles of BC rows through shared memory (cp.async; the next K tile loads during P·V, the V tile
// during Q·Kᵀ); each warp computes its 16 rows with `mma.sync` m16n8k16 (fp32 accumulators):
// S = Q·Kᵀ in registers, masked and scaled to log2 units, online max / sum, P rounded to the input
// dtype straight into A fragments, O += P·V. Query qi sees key j iff seq_start[b, qi] <= j <= qi,
// qi − j < window (window 0 = none) and key_mask[b, j] != 0 (seq_start: the (b, t) first token of
// each token's packed sequence, non-decreasing along t; null = 0); a row that sees no key outputs
// zeros and lse = +inf. A block's key loop starts at its first row's lowest visible key, the lowest
// of all its rows since seq_start is non-decreasing.
// lse[b, h, qi] = max + log(sum) in natural-log units, as the blocked softmax writes it.
// DSPLIT = 2 (head dim 512, whose 16×512 fp32 O tile per warp would not fit the registers): two
// warps own the same 16 rows, each computes the whole S = Q·Kᵀ and the softmax (the same values:
// same inputs, same order) and accumulates its half of O's columns.
#include "common.cuh"
#include "flash_tile.cuh"
#include "grouped_rows.cuh"
#include "mma.cuh"

namespace flash {

using namespace mma16;
using flash_tile::BC;

// STAGES = 1: one K and one V buffer (the next K tile loads during P·V, the V tile during Q·Kᵀ;
// two blocks per SM hide the waits). STAGES = 2: both double-buffered, the next tile's K and V load
// during this whole tile (for the one-block-per-SM 8-warp shape).
template <typename T, int D, int WARPS, int STAGES, int DSPLIT>
__device__ __forceinline__ void fwd(const T* q, const T* k, const T* v, const uint8_t* mask,
                                    const uint32_t* seq_start, T* o, float* lse, float scale, int nh,
                                    int g, int t, int window) {
    constexpr int ROWW = WARPS / DSPLIT, BR = ROWW * 16, LD = D + 8, THREADS = WARPS * 32;
    constexpr int DT = D / 8, DTW = DT / DSPLIT, ST = flash_tile::ST;  // DTW: O column tiles of one warp
    static_assert(STAGES == 1 || STAGES == 2, "one or two K/V stages");
    static_assert(WARPS % DSPLIT == 0 && DTW % 2 == 0, "column split shape");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* sq = reinterpret_cast<T*>(smem_raw);
    T* const sk0 = sq + BR * LD;           // K stage 0; stage 1 follows V stage 0
    T* const sv0 = sk0 + BC * LD;
    __shared__ uint8_t skm[BC];

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int rw = warp % ROWW, part = warp / ROWW;  // row group, column part
    const GroupedRows<BR> gr(nh, g, t);
    const int rows = gr.rows, r0 = gr.r0, qlo = gr.qlo, qhi = gr.qhi;
    // The first token of query qi's packed sequence (0 without segments; qi clamped for the rows
    // past the end of the slab), read where it is needed: the two rows' bounds kept in registers
    // across the key loop took up to 4 more registers at head dims 128-512 and 19 at 64 (ptxas).
    const uint32_t* srow = gr.batch_row(seq_start, t);
    auto seq_of = [&](int qi) { return srow ? (int)srow[min(qi, t - 1)] : 0; };
    const int klo = gr.first_key(window, srow);
    const T *kslab = gr.slab_row0(k, t, D), *vslab = gr.slab_row0(v, t, D);
    const uint8_t* mrow = gr.batch_row(mask, t);

    load_rows<T, D, THREADS>(sq, BR, rows - r0, [&](int r) { return q + gr.head_row(r0 + r, nh, g, t) * D; });
    load_tile<T, D, BC, THREADS>(sk0, kslab + (size_t)klo * D, t - klo);
    if (STAGES == 2) load_tile<T, D, BC, THREADS>(sv0, vslab + (size_t)klo * D, t - klo);
    cp_async_commit();

    // This thread's two rows (the C-fragment rows lane/4 and lane/4 + 8 of its warp).
    const int ra = r0 + rw * 16 + lane / 4, rb = ra + 8;
    const int qa = ra / g, qb = rb / g;
    const float sl2 = scale * G4FT_LOG2E;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    float acc[DTW][4];
#pragma unroll
    for (int i = 0; i < DTW; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;

    for (int j0 = klo, it = 0; j0 <= qhi; j0 += BC, ++it) {
        const int stage = STAGES == 2 ? it & 1 : 0;
        T* const sk = sk0 + stage * 2 * BC * LD;
        T* const sv = sk + BC * LD;
        if (STAGES == 2) {  // the other stage was released by the barrier that ended the last tile
            if (j0 + BC <= qhi) {
                T* const nk = sk0 + (stage ^ 1) * 2 * BC * LD;
                load_tile<T, D, BC, THREADS>(nk, kslab + (size_t)(j0 + BC) * D, t - j0 - BC);
                load_tile<T, D, BC, THREADS>(nk + BC * LD, vslab + (size_t)(j0 + BC) * D, t - j0 - BC);
            }
            cp_async_commit();
        }
        bool no_pad = flash_tile::load_key_mask(skm, mrow, j0, t, qhi);
        if (STAGES == 2)
            cp_async_wait_newer<1>();  // all but the prefetch just issued: this tile is in
        else
            cp_async_wait_all();
        no_pad = __syncthreads_and(no_pad);  // also: this K tile is in, the last P·V is done
        if (STAGES == 1) {
            load_tile<T, D, BC, THREADS>(sv, vslab + (size_t)j0 * D, t - j0);
            cp_async_commit();
        }

        float s[ST][4];
#pragma unroll
        for (int i = 0; i < ST; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            uint32_t a[4];
            ldsm4(a, sq + (rw * 16 + lane % 16) * LD + kk * 16 + (lane / 16) * 8);
#pragma unroll
            for (int np = 0; np < BC / 16; ++np) {
                uint32_t b[4];
                ldsm4(b, sk + (np * 16 + (lane / 16) * 8 + lane % 8) * LD + kk * 16 + ((lane / 8) % 2) * 8);
                mma<T>(s[2 * np], a, b[0], b[1]);
                mma<T>(s[2 * np + 1], a, b[2], b[3]);
            }
        }

        // Mask unless every key of the tile is visible to every row (scores stay unscaled here).
        if (!flash_tile::interior(no_pad, j0, qlo, qhi, window, seq_of))
            flash_tile::mask(s, j0, qa, qb, seq_of(qa), seq_of(qb), window, skm, lane);
        flash_tile::online_softmax<DTW * 4>(s, m, l, &acc[0][0], sl2);
        uint32_t pa[BC / 16][4];
        mma16::a_fragments<T, BC>(s, pa);

        if (STAGES == 1) {
            cp_async_wait_all();
            __syncthreads();  // V is in; every warp is done with this K tile
            if (j0 + BC <= qhi) load_tile<T, D, BC, THREADS>(sk, kslab + (size_t)(j0 + BC) * D, t - j0 - BC);
            cp_async_commit();
        }

#pragma unroll
        for (int ks = 0; ks < BC / 16; ++ks)
#pragma unroll
            for (int dw = 0; dw < DTW / 2; ++dw) {
                const int dp = part * (DTW / 2) + dw;
                uint32_t b[4];
                ldsm4_trans(b, sv + (ks * 16 + ((lane / 8) % 2) * 8 + lane % 8) * LD + dp * 16 + (lane / 16) * 8);
                mma<T>(acc[2 * dw], pa[ks], b[0], b[1]);
                mma<T>(acc[2 * dw + 1], pa[ks], b[2], b[3]);
            }
        if (STAGES == 2) __syncthreads();  // every warp is done with this stage and the key mask
    }

    // Normalise, stage the warp's 16 rows in its own Q rows of shared memory (its own columns of
    // them when split, once the other part's warp is done reading Q), store 16-byte packs.
    if (DSPLIT > 1) __syncthreads();
    float inv[2];
    flash_tile::finish_sums(l, inv);
    store_rows<T, D, DTW>(acc, inv[0], inv[1], sq + rw * 16 * LD, part, lane, [&](int r) -> T* {
        const int R = r0 + rw * 16 + r;
        return R < rows ? o + gr.head_row(R, nh, g, t) * D : nullptr;
    });
    if (part == 0) flash_tile::store_lse(lse, gr, ra, m, l, nh, g, t, lane);
}

}  // namespace flash

// Entry points attn_flash_fwd_d{D}_w{WARPS}_{bf16,f16}: WARPS·32 threads, grid
// (ceil(t·g / ROWS), b·nkv) with ROWS = (WARPS / DSPLIT)·16 query rows per block, dynamic shared
// memory (ROWS + 2·64·STAGES)·(D + 8)·2 bytes. Head dims up to 256: DSPLIT = 1, STAGES = 2 for 8
// warps, else 1; head dim 512: 8 warps, DSPLIT = 2, STAGES = 1 (~195 KiB). The host mirrors this
// in `flash_fwd`.
#define FLASH_KERNEL(T, S, D, W, STAGES, DSPLIT)                                                    \
    extern "C" __global__ void __launch_bounds__(W * 32)                                             \
        attn_flash_fwd_d##D##_w##W##_##S(const T* q, const T* k, const T* v, const uint8_t* mask,    \
                                         const uint32_t* seq_start, T* o, float* lse, float scale,   \
                                         int nh, int g, int t, int window) {                         \
        G4FT_KERNEL_ENTRY();                                                                         \
        flash::fwd<T, D, W, STAGES, DSPLIT>(q, k, v, mask, seq_start, o, lse, scale, nh, g, t,      \
                                            window);                                                 \
    }
#define FLASH_INST(T, S, D, W) FLASH_KERNEL(T, S, D, W, W == 8 ? 2 : 1, 1)
#define FLASH_DIMS(T, S) \
    FLASH_INST(T, S, 16, 4) FLASH_INST(T, S, 32, 4) FLASH_INST(T, S, 64, 4) FLASH_INST(T, S, 128, 4) \
    FLASH_INST(T, S, 256, 4) FLASH_INST(T, S, 256, 8) FLASH_KERNEL(T, S, 512, 8, 1, 2)
FLASH_DIMS(__nv_bfloat16, bf16)
FLASH_DIMS(__half, f16)
