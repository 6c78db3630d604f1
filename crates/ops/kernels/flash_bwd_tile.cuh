// Pieces of the fused attention backward shared by the mma.sync kernels (attention_flash_bwd.cu)
// and the wgmma dQ kernel (attention_wgmma.cu): key visibility, and one key tile's dS for a
// warp's 16 query rows in mma.sync's m16n8 C-fragment layout (n-tile nt, element e: row
// lane / 4 + 8·(e / 2), key nt·8 + 2·(lane % 4) + e % 2), rounded into the A fragments of dS·K.
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

}  // namespace flash_bwd_tile
