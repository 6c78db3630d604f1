// The query rows one block of the fused attention forward or of the fused dQ kernel owns (both
// launched on grid (ceil(t·g / BR), b·nkv) by src/attention_cuda.rs): BR consecutive rows of one
// (batch, kv head) slab in the grouped order, where row R is query R / g of head kv·g + R % g.
// Blocks start in the order of their key ranges, longest first, across all slabs: the block
// launched L-th (L = blockIdx.x + gridDim.x·blockIdx.y, the order the GPU starts them in) takes
// slab L % gridDim.y and the (L / gridDim.y)-th row block from the end. A causal block's work
// grows with its rows, so the longest blocks start first on every slab and the short ones fill
// the last wave (within one slab at a time, the slabs after the first wave would start with their
// longest blocks late).
#pragma once
#include "common.cuh"

template <int BR>
struct GroupedRows {
    int slab, bi, kvh;  // slab = bi·nkv + kvh
    int rows, r0;       // rows t·g of the slab; this block's first row
    int qlo, qhi;       // the queries of its first and last row

    __device__ __forceinline__ GroupedRows(int nh, int g, int t) {
        const int launched = blockIdx.x + gridDim.x * blockIdx.y;
        slab = launched % gridDim.y;
        const int nkv = nh / g;
        bi = slab / nkv;
        kvh = slab % nkv;
        rows = t * g;
        r0 = (gridDim.x - 1 - launched / gridDim.y) * BR;
        qlo = r0 / g;
        qhi = (min(r0 + BR, rows) - 1) / g;
    }

    // Row 0 of the block's (batch, kv head) slab in a (b, nkv, t, d) tensor.
    template <typename T> __device__ __forceinline__ const T* slab_row0(const T* x, int t, int d) const {
        return x + (size_t)slab * t * d;
    }
    // The block's batch row of a (b, t) tensor (null stays null).
    template <typename T> __device__ __forceinline__ const T* batch_row(const T* x, int t) const {
        return x ? x + (size_t)bi * t : nullptr;
    }

    // The lowest key any of the block's rows sees: its first query's window start, raised to that
    // query's sequence start (`srow`: the batch row's sequence starts, null = one sequence).
    __device__ __forceinline__ int first_key(int window, const uint32_t* srow) const {
        const int lo = window > 0 ? max(0, qlo + 1 - window) : 0;
        return srow ? max(lo, (int)srow[qlo]) : lo;
    }

    // The (b, nh, t) row of grouped row R: ((b·nh + head)·t + query).
    __device__ __forceinline__ size_t head_row(int R, int nh, int g, int t) const {
        return ((size_t)bi * nh + kvh * g + R % g) * t + R / g;
    }
};
