// The query rows one block of the fused attention forward or of the fused dQ kernel owns (both
// launched on grid (ceil(t·g / BR), b·nkv) by src/attention_cuda.rs): BR consecutive rows of one
// (batch, kv head) slab in the grouped order, where row R is query R / g of head kv·g + R % g.
// The last block takes the first rows, so blocks start in the order of their key ranges, longest
// first.
#pragma once
#include "common.cuh"

template <int BR>
struct GroupedRows {
    int slab, bi, kvh;  // slab = blockIdx.y = bi·nkv + kvh
    int rows, r0;       // rows t·g of the slab; this block's first row
    int qlo, qhi;       // the queries of its first and last row

    __device__ __forceinline__ GroupedRows(int nh, int g, int t) {
        slab = blockIdx.y;
        const int nkv = nh / g;
        bi = slab / nkv;
        kvh = slab % nkv;
        rows = t * g;
        r0 = (gridDim.x - 1 - blockIdx.x) * BR;
        qlo = r0 / g;
        qhi = (min(r0 + BR, rows) - 1) / g;
    }

    // The (b, nh, t) row of grouped row R: ((b·nh + head)·t + query).
    __device__ __forceinline__ size_t head_row(int R, int nh, int g, int t) const {
        return ((size_t)bi * nh + kvh * g + R % g) * t + R / g;
    }
};
