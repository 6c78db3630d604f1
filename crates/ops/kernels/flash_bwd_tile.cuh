// Pieces of the fused attention backward shared by the mma.sync kernels (attention_flash_bwd.cu)
// and the wgmma ones (attention_wgmma.cu): key visibility; one key tile's dS for a warp's 16
// query rows in mma.sync's m16n8 C-fragment layout (n-tile nt, element e: row lane / 4 +
// 8·(e / 2), key nt·8 + 2·(lane % 4) + e % 2), rounded into the A fragments of dS·K (the dQ
// kernels); and the query rows a dK / dV block walks, with their loaders (`KeyBlock`).
#pragma once
#include "common.cuh"
#include "grouped_rows.cuh"
#include "mma.cuh"

namespace flash_bwd_tile {

// Whether key j is visible to query qi (st = seq_start of qi's sequence, km = the key's mask).
__device__ __forceinline__ bool visible(int j, int qi, int st, int window, uint8_t km) {
    return j <= qi && (window == 0 || qi - j < window) && km != 0 && j >= st;
}

// The thread's two query rows (a: lane / 4, b: lane / 4 + 8 of its warp): query index, sequence
// start, lse·log2(e) and D = dO·O.
struct RowPair {
    int qa, qb, sa, sb;
    float la, lb, da, db;
};

// The row values of grouped rows ra and ra + 8 of the block `gr` (rows past the slab's end see no
// key: lse +inf, D 0).
template <int BR>
__device__ __forceinline__ RowPair row_pair(const GroupedRows<BR>& gr, int ra, const float* lse, const float* dd,
                                            const uint32_t* srow, int nh, int g, int t) {
    const int rb = ra + 8;
    const bool oka = ra < gr.rows, okb = rb < gr.rows;
    const size_t ha = gr.head_row(oka ? ra : gr.r0, nh, g, t), hb = gr.head_row(okb ? rb : gr.r0, nh, g, t);
    RowPair rp;
    rp.qa = ra / g;
    rp.qb = rb / g;
    rp.la = oka ? lse[ha] * G4FT_LOG2E : INFINITY;
    rp.lb = okb ? lse[hb] * G4FT_LOG2E : INFINITY;
    rp.da = oka ? dd[ha] : 0.f;
    rp.db = okb ? dd[hb] : 0.f;
    rp.sa = oka && srow ? (int)srow[rp.qa] : 0;
    rp.sb = okb && srow ? (int)srow[rp.qb] : 0;
    return rp;
}

// dS = scale·P∘(dP − D) with P = exp2(S·scale·log2(e) − lse·log2(e)) (0 where the key is not
// visible) for the BC keys of the tile at j0 (skm: their mask), rounded to T as the A fragments
// of dS·K (key step ks covers the n-tiles 2ks and 2ks + 1).
template <typename T, int BC>
__device__ __forceinline__ void ds_fragments(const float (*s)[4], const float (*dp)[4], uint32_t (*fa)[4],
                                             const RowPair& rp, int j0, int window, const uint8_t* skm,
                                             float scale, int lane) {
    const float sl2 = scale * G4FT_LOG2E;
    float ds[BC / 8][4];
#pragma unroll
    for (int nt = 0; nt < BC / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int jj = nt * 8 + 2 * (lane % 4) + (e & 1), j = j0 + jj;
            const bool top = e < 2;
            const bool ok = visible(j, top ? rp.qa : rp.qb, top ? rp.sa : rp.sb, window, skm[jj]);
            const float p = ok ? ex2_ftz(fmaf(s[nt][e], sl2, -(top ? rp.la : rp.lb))) : 0.f;
            ds[nt][e] = scale * p * (dp[nt][e] - (top ? rp.da : rp.db));
        }
    mma16::a_fragments<T, BC>(ds, fa);
}

// The query rows a block of the dK / dV kernels walks (grid (ceil(t / BC), b·nkv, hsplit),
// src/attention_cuda.rs): a block owns keys [j0, j0 + BC) of one slab and the mc = g / hsplit
// query heads m0 = split·mc .. m0 + mc − 1 of its group; its row v is query v / mc of head m0 + v % mc,
// and rows [rbeg, rend) hold the queries j0 .. qend − 1 that can see one of its keys. Tiles of rows
// come in by cp.async with one row address per row (a shift when mc is a power of two), so the
// loads stay off the issue slots of the tile loop. Within a split, blocks start longest first
// across all slabs: the block launched L-th (L = x + X·(y + Y·z), the order the GPU starts them in)
// takes split z, key block (x + X·y) / Y (earlier keys are seen by more queries) and slab
// (x + X·y) % Y. The splits stay one after the other, so the blocks running at once read the
// query rows of the same heads (at long sequences these rows outgrow the L2 cache).
struct KeyBlock {
    int slab, split, bi, j0, jlast, rbeg, rend;
    int mc, mshift;  // heads per block; log2(mc) when a power of two, else −1
    int t;
    size_t head0;          // (b·nh + kv·g + m0)·t: the (b, nh, t) row of row 0
    const uint32_t* srow;  // the batch row's sequence starts (null: one sequence)

    __device__ __forceinline__ KeyBlock(int bc, int nh, int g, int t_, int window, const uint32_t* seq_start) {
        t = t_;
        const int launched = blockIdx.x + gridDim.x * blockIdx.y;  // within the split
        split = blockIdx.z;
        slab = launched % gridDim.y;
        const int nkv = nh / g, kvh = slab % nkv;
        bi = slab / nkv;
        mc = g / gridDim.z;
        mshift = (mc & (mc - 1)) == 0 ? __ffs(mc) - 1 : -1;
        j0 = launched / gridDim.y * bc;
        jlast = min(j0 + bc, t) - 1;
        const int qend = window > 0 ? min(t, jlast + window) : t;
        rbeg = j0 * mc;
        rend = qend * mc;
        head0 = ((size_t)bi * nh + kvh * g + split * mc) * t;
        srow = seq_start ? seq_start + (size_t)bi * t : nullptr;
    }

    // The query of row v.
    __device__ __forceinline__ int query(int v) const { return mshift >= 0 ? v >> mshift : v / mc; }
    // The (b, nh, t) row of row v, whose query is qi.
    __device__ __forceinline__ size_t head_row(int v, int qi) const { return head0 + (size_t)(v - qi * mc) * t + qi; }
    __device__ __forceinline__ size_t head_row(int v) const { return head_row(v, query(v)); }
    // Packed sequences: no query from row r0 on sees this block's keys once its sequence starts
    // after them (seq_start is non-decreasing).
    __device__ __forceinline__ bool past_seq(int r0) const { return srow && (int)srow[query(r0)] > jlast; }

    // Rows [r0, r0 + ROWS) of q and dout (rows of D elements) into the tiles sq and sdo, zero-filled
    // from rend on; `at(r, ch)` is the element offset of row r's 16-byte chunk ch in a tile. Each
    // thread copies one chunk column of every (THREADS / (D / 8))-th row, both tensors per address.
    template <typename T, int D, int ROWS, int THREADS, typename At>
    __device__ __forceinline__ void load_rows(T* sq, T* sdo, const T* q, const T* dout, int r0, At at) const {
        constexpr int CH = D / 8, STEP = THREADS / CH;
        static_assert(THREADS % CH == 0 && ROWS % STEP == 0, "row loader shape");
        const int ch = threadIdx.x % CH;
        auto rows = [&](auto query_of) {
#pragma unroll
            for (int i = 0; i < ROWS / STEP; ++i) {
                const int r = threadIdx.x / CH + i * STEP, v = r0 + r < rend ? r0 + r : r0;
                const size_t src = head_row(v, query_of(v)) * D + ch * 8;
                const int dst = at(r, ch);
                mma16::cp_async16(sq + dst, q + src, r0 + r < rend);
                mma16::cp_async16(sdo + dst, dout + src, r0 + r < rend);
            }
        };
        // One branch per tile, not per row.
        if (mshift >= 0)
            rows([&](int v) { return v >> mshift; });
        else
            rows([&](int v) { return v / mc; });
    }

    // The values of rows [r0, r0 + ROWS) into rv, four arrays of ROWS words: lse, D = dO·O, the
    // query (−1 past rend) and its sequence start; lse, D and the start by cp.async (0 past rend).
    // Threads < ROWS.
    template <int ROWS>
    __device__ __forceinline__ void load_row_values(float* rv, const float* lse, const float* dd, int r0) const {
        if (threadIdx.x >= ROWS) return;
        const int v = r0 + threadIdx.x;
        const bool ok = v < rend;
        const size_t hr = head_row(ok ? v : r0);
        mma16::cp_async4(rv + threadIdx.x, lse + hr, ok);
        mma16::cp_async4(rv + ROWS + threadIdx.x, dd + hr, ok);
        int* const ri = reinterpret_cast<int*>(rv + 2 * ROWS);
        ri[threadIdx.x] = ok ? query(v) : -1;
        if (srow)
            mma16::cp_async4(ri + ROWS + threadIdx.x, srow + query(ok ? v : r0), ok);
        else
            ri[ROWS + threadIdx.x] = 0;
    }

    // The block's BC keys' mask into skm (threads below BC; keys past t count as masked) and
    // whether this thread's key is unmasked: ANDed over the block by the caller's barrier, the
    // `keys_full` of interior().
    template <int BC>
    __device__ __forceinline__ bool load_key_mask(uint8_t* skm, const uint8_t* mask) const {
        if (threadIdx.x >= BC) return true;
        const int j = j0 + threadIdx.x;
        skm[threadIdx.x] = j < t ? mask[(size_t)bi * t + j] : 0;
        return skm[threadIdx.x] != 0;
    }

    // Whether every key of the block is visible to every row of the tile whose row values are rv
    // (keys_full: the block's keys are all < t and unmasked): no per-element masking needed.
    template <int ROWS>
    __device__ __forceinline__ bool interior(const float* rv, int r0, bool keys_full, int window) const {
        const int* const ri = reinterpret_cast<const int*>(rv + 2 * ROWS);
        return keys_full && r0 + ROWS <= rend && jlast <= ri[0] && (window == 0 || ri[ROWS - 1] - j0 < window) &&
               ri[2 * ROWS - 1] <= j0;
    }
};

}  // namespace flash_bwd_tile
