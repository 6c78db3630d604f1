// The row tiles of a grouped GEMM (kernels/moe.cu, kernels/moe_wgmma.cu): the rows of each
// expert's segment (offsets[e] .. offsets[e + 1]) in tiles of BM rows, segment after segment, so
// that no tile straddles two experts. Both kernels run on grid (column tiles, ceil(m / BM) + E):
// at most that many tiles, and the blocks past the last one return.
#pragma once
#include <cstdint>

// The expert of row tile `tile` and its first row / valid rows; false past the last tile. Each
// warp scans the offsets 32 experts at a time (a lane per expert, a prefix sum of their tile
// counts by shuffles), so every lane of the warp must call it with the same arguments.
template <int BM>
__device__ __forceinline__ bool tile_of(const uint32_t* offsets, int e_count, int tile, int& e, int& r0,
                                        int& valid) {
    const int lane = threadIdx.x % 32;
    int before = 0;  // the tiles of the experts before this chunk of 32
    for (int x0 = 0; x0 < e_count; x0 += 32) {
        const int x = x0 + lane;
        const int lo = x < e_count ? (int)offsets[x] : 0, hi = x < e_count ? (int)offsets[x + 1] : 0;
        const int nt = (hi - lo + BM - 1) / BM;
        int upto = nt;  // the tiles of this chunk's experts up to this lane's, inclusive
#pragma unroll
        for (int o = 1; o < 32; o *= 2) {
            const int v = __shfl_up_sync(0xffffffffu, upto, o);
            if (lane >= o) upto += v;
        }
        if (tile < before + __shfl_sync(0xffffffffu, upto, 31)) {
            // The first lane whose experts reach past the tile holds it (its count is not 0).
            const int l = __ffs(__ballot_sync(0xffffffffu, tile < before + upto)) - 1;
            const int first = before + __shfl_sync(0xffffffffu, upto - nt, l);
            e = x0 + l;
            r0 = __shfl_sync(0xffffffffu, lo, l) + (tile - first) * BM;
            valid = min(BM, __shfl_sync(0xffffffffu, hi, l) - r0);
            return true;
        }
        before += __shfl_sync(0xffffffffu, upto, 31);
    }
    return false;
}
