// One key tile of the fused attention forward, per warp, shared by the mma.sync kernel
// (attention_flash.cu) and the wgmma one (attention_wgmma.cu): both hold a warp's 16 query rows ×
// BC keys of S in mma.sync's m16n8 C-fragment layout (n-tile nt, element e: row lane / 4 + 8·(e / 2),
// key nt·8 + 2·(lane % 4) + e % 2) and its O accumulators as n-tiles of the same layout, so the
// key mask, the masking and the online softmax below are the one definition of both.
#pragma once
#include "common.cuh"
#include "grouped_rows.cuh"
#include "mma.cuh"

namespace flash_tile {

constexpr int BC = 64;  // keys per tile
constexpr int ST = BC / 8;  // S n-tiles per warp
constexpr float LN2 = 0.6931471805599453f;

// The running max only moves when a row's new max exceeds it by more than this (log2 units): P
// then stays below 2^8 before normalisation (exact in fp32 / the 16-bit P's relative precision is
// unchanged) and most tiles skip the rescale of O (FlashAttention-3's trick).
constexpr float RESCALE_SLACK = 8.f;

// The key mask byte of key j0 + threadIdx.x for threads below BC (0 past t or at other threads):
// a global read the caller issues ahead of its use.
__device__ __forceinline__ uint8_t key_byte(const uint8_t* mrow, int j0, int t) {
    const int j = j0 + threadIdx.x;
    return threadIdx.x < BC && j < t ? mrow[j] : 0;
}

// key_byte's `mv` of the tile at j0 into skm (threads below BC) and whether this thread's key is
// unpadded or past the block's last query qhi (the caller's barrier ANDs it).
__device__ __forceinline__ bool store_key_mask(uint8_t* skm, uint8_t mv, int j0, int qhi) {
    if (threadIdx.x >= BC) return true;
    skm[threadIdx.x] = mv;
    return mv != 0 || j0 + (int)threadIdx.x > qhi;
}

// The tile's key mask into skm (threads below BC; keys past t are padded) and whether this
// thread's key is unpadded or past the block's last query qhi (the caller's barrier ANDs it).
__device__ __forceinline__ bool load_key_mask(uint8_t* skm, const uint8_t* mrow, int j0, int t, int qhi) {
    return store_key_mask(skm, key_byte(mrow, j0, t), j0, qhi);
}

// Whether every key of the tile at j0 is visible to every query in [qlo, qhi] (no padded key in
// it: `no_pad`), so the scores need no mask.
template <typename SeqOf>
__device__ __forceinline__ bool interior(bool no_pad, int j0, int qlo, int qhi, int window, SeqOf seq_of) {
    return no_pad && j0 + BC - 1 <= qlo && (window == 0 || qhi - j0 < window) && seq_of(qhi) <= j0;
}

// −inf for the scores of keys the thread's two queries qa / qb (sequence starts sa / sb) do not
// see: after the query, out of the window, before the sequence, or padded (skm: the tile's mask).
__device__ __forceinline__ void mask(float (*s)[4], int j0, int qa, int qb, int sa, int sb, int window,
                                     const uint8_t* skm, int lane) {
#pragma unroll
    for (int nt = 0; nt < ST; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int jj = nt * 8 + 2 * (lane % 4) + (e & 1), j = j0 + jj, qi = e < 2 ? qa : qb;
            const bool ok = j <= qi && (window == 0 || qi - j < window) && j >= (e < 2 ? sa : sb) && skm[jj] != 0;
            s[nt][e] = ok ? s[nt][e] : -INFINITY;
        }
}

// Online softmax of one tile in log2 units (a row's BC scores are spread over the 4 lanes of a
// quad), all but the rescale of O: the row max m moves only by more than RESCALE_SLACK, and then
// the sums l are rescaled and alpha holds the two rows' factors; s becomes exp2(s·sl2 − m), l gains
// its row sums. Returns whether the warp's O accumulators must be multiplied by alpha (the same
// on every lane), which `rescale` does; the caller may do it later (once a product in flight
// that adds to O is done), as long as it is before the next tile's P·V.
__device__ __forceinline__ bool softmax_tile(float (*s)[4], float* m, float* l, float* alpha, float sl2) {
    float mx[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float part[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};  // 4 chains, not 1
#pragma unroll
        for (int nt = 0; nt < ST; ++nt) part[nt % 4] = fmaxf(part[nt % 4], fmaxf(s[nt][2 * h], s[nt][2 * h + 1]));
        float v = fmaxf(fmaxf(part[0], part[1]), fmaxf(part[2], part[3]));
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
        mx[h] = v * sl2;
    }
    const bool move0 = mx[0] > m[0] + RESCALE_SLACK, move1 = mx[1] > m[1] + RESCALE_SLACK;
    const bool moved = __any_sync(0xffffffffu, move0 || move1);
    if (moved) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const float mn = (h ? move1 : move0) ? mx[h] : m[h];
            alpha[h] = mn == -INFINITY ? 1.f : ex2_ftz(m[h] - mn);
            m[h] = mn;
            l[h] *= alpha[h];
        }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const float mu = m[h] == -INFINITY ? 0.f : m[h];
        float rs[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int nt = 0; nt < ST; ++nt) {
            const float p0 = ex2_ftz(fmaf(s[nt][2 * h], sl2, -mu));
            const float p1 = ex2_ftz(fmaf(s[nt][2 * h + 1], sl2, -mu));
            s[nt][2 * h] = p0;
            s[nt][2 * h + 1] = p1;
            rs[nt % 4] += p0 + p1;
        }
        l[h] += (rs[0] + rs[1]) + (rs[2] + rs[3]);
    }
    return moved;
}

// The warp's NACC O accumulators (n-tiles of the C-fragment layout: rows lane / 4 and + 8) times
// the two rows' factors alpha.
template <int NACC>
__device__ __forceinline__ void rescale(float* acc, const float* alpha) {
#pragma unroll
    for (int i = 0; i < NACC; i += 4) {
        acc[i] *= alpha[0];
        acc[i + 1] *= alpha[0];
        acc[i + 2] *= alpha[1];
        acc[i + 3] *= alpha[1];
    }
}

// softmax_tile with O's rescale done at once.
template <int NACC>
__device__ __forceinline__ void online_softmax(float (*s)[4], float* m, float* l, float* acc, float sl2) {
    float alpha[2];
    if (softmax_tile(s, m, l, alpha, sl2)) rescale<NACC>(acc, alpha);
}

// The two rows' sums over their quads and their inverses (0 for a row that saw no key).
__device__ __forceinline__ void finish_sums(float* l, float* inv) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
        inv[h] = l[h] > 0.f ? 1.f / l[h] : 0.f;
    }
}

// lse = max + log(sum) in natural-log units (+inf for a row that saw no key), as the blocked
// softmax writes it.
__device__ __forceinline__ float lse_of(float m, float l) { return l > 0.f ? m * LN2 + logf(l) : INFINITY; }

// Writes the lse of the thread's two rows ra and ra + 8 of the block `gr` from the quad's first lane.
template <int BR>
__device__ __forceinline__ void store_lse(float* lse, const GroupedRows<BR>& gr, int ra, const float* m, const float* l,
                                          int nh, int g, int t, int lane) {
    if (lane % 4 != 0) return;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int R = ra + 8 * h;
        if (R < gr.rows) lse[gr.head_row(R, nh, g, t)] = lse_of(m[h], l[h]);
    }
}

}  // namespace flash_tile
