// The row tiles of a grouped GEMM (kernels/moe.cu, kernels/moe_wgmma.cu): the rows of each
// expert's segment (offsets[e] .. offsets[e + 1]) in tiles of BM rows, segment after segment, so
// that no tile straddles two experts. Both kernels run on grid (column tiles, ceil(m / BM) + E):
// at most that many tiles, and the blocks past the last one return.
#pragma once
#include <cstdint>

// The expert of row tile `tile` and its first row / valid rows; false past the last tile.
template <int BM>
__device__ __forceinline__ bool tile_of(const uint32_t* offsets, int e_count, int tile, int& e, int& r0,
                                        int& valid) {
    int acc = 0;
    for (int x = 0; x < e_count; ++x) {
        const int lo = offsets[x], hi = offsets[x + 1], nt = (hi - lo + BM - 1) / BM;
        if (tile < acc + nt) {
            e = x;
            r0 = lo + (tile - acc) * BM;
            valid = min(BM, hi - r0);
            return true;
        }
        acc += nt;
    }
    return false;
}
