// Tensor-core building blocks shared by the fused attention and the MoE grouped GEMM: the
// m16n8k16 `mma.sync` for bf16 / f16 inputs with fp32 accumulators, `ldmatrix` fragment loads,
// 16-byte `cp.async` copies into padded shared-memory tiles and packing of two fp32 values into a
// 16-bit pair.
#pragma once
#include "common.cuh"
#include <type_traits>

namespace mma16 {

template <typename T> __device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
}
template <> __device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
}

// The fp32 accumulators of K / 8 m16n8 n-tiles rounded to T as the A fragments of K / 16
// m16n8k16 steps (step ks covers n-tiles 2ks and 2ks + 1): S or dS of one tile as the A operand
// of the next product.
template <typename T, int K>
__device__ __forceinline__ void a_fragments(const float (*c)[4], uint32_t (*a)[4]) {
#pragma unroll
    for (int ks = 0; ks < K / 16; ++ks) {
        a[ks][0] = pack2<T>(c[2 * ks][0], c[2 * ks][1]);
        a[ks][1] = pack2<T>(c[2 * ks][2], c[2 * ks][3]);
        a[ks][2] = pack2<T>(c[2 * ks + 1][0], c[2 * ks + 1][1]);
        a[ks][3] = pack2<T>(c[2 * ks + 1][2], c[2 * ks + 1][3]);
    }
}

// c += a·b for one m16n8k16 tile (A row-major 16×16, B 16×8 "col", fp32 C); E is the PTX type.
#define MMA16_OP(E)                                                                                 \
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." E "." E ".f32 {%0,%1,%2,%3}, "            \
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"                                          \
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                    \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1))
template <typename T> __device__ __forceinline__ void mma(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
    if constexpr (std::is_same_v<T, __nv_bfloat16>)
        MMA16_OP("bf16");
    else
        MMA16_OP("f16");
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

// Four 8×8 16-bit matrices from shared memory (lane l gives the address of row l % 8 of matrix
// l / 8); `trans` hands each thread the transposed elements (the B fragments of a row-major V).
__device__ __forceinline__ void ldsm4(uint32_t* r, const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm4_trans(uint32_t* r, const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

// 16 bytes global → shared without a register round trip; zero-filled when !valid.
__device__ __forceinline__ void cp_async16(void* s, const void* g, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(s)), "l"(g),
                 "r"(valid ? 16 : 0));
}
// 4 bytes global → shared (a per-row value beside a tile); zero-filled when !valid.
__device__ __forceinline__ void cp_async4(void* s, const void* g, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(s)), "l"(g),
                 "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N of this thread's newest commit groups are still in flight.
template <int N> __device__ __forceinline__ void cp_async_wait_newer() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }
__device__ __forceinline__ void cp_async_wait_all() { cp_async_wait_newer<0>(); }

// `rows` rows of D elements into shared memory with row stride D + 8 (the pad puts the 8 rows an
// ldmatrix reads in distinct banks); rows >= valid are zero-filled. Row r comes from `row_ptr(r)`
// (rows scattered over heads, like the grouped query rows of the fused attention).
template <typename T, int D, int THREADS, typename RowPtr>
__device__ __forceinline__ void load_rows(T* s, int rows, int valid, RowPtr row_ptr) {
    constexpr int CH = D / 8;  // 16-byte chunks per row
    for (int c = threadIdx.x; c < rows * CH; c += THREADS) {
        const int r = c / CH, x = (c % CH) * 8;
        const bool ok = r < valid;
        cp_async16(s + r * (D + 8) + x, row_ptr(ok ? r : 0) + x, ok);
    }
}

// ROWS consecutive rows from `g` (row stride D) into shared memory with row stride D + 8,
// zero-filled from row `valid` on. Each thread copies the same column chunk of every
// (THREADS / (D / 8))-th row: no per-chunk index math in a key loop.
template <typename T, int D, int ROWS, int THREADS>
__device__ __forceinline__ void load_tile(T* s, const T* g, int valid) {
    constexpr int CH = D / 8, STEP = THREADS / CH;
    static_assert(THREADS % CH == 0 && ROWS % STEP == 0, "tile loader shape");
    const int r0 = threadIdx.x / CH, x = (threadIdx.x % CH) * 8;
#pragma unroll
    for (int i = 0; i < ROWS / STEP; ++i) {
        const int r = r0 + i * STEP;
        const bool ok = r < valid;
        cp_async16(s + r * (D + 8) + x, g + (size_t)(ok ? r : 0) * D + x, ok);
    }
}

// Stores one warp's 16 rows of fp32 accumulators (DTW n-tiles of 8 columns: this warp's columns
// part·DTW·8..) scaled per row (`fa` for the thread's row lane / 4, `fb` for lane / 4 + 8) and
// rounded to T, staged through the warp's own 16 rows of `so` (row stride D + 8), in 16-byte
// packs to `row_ptr(r)` for r in 0..16 (null: no such row).
template <typename T, int D, int DTW, typename RowPtr>
__device__ __forceinline__ void store_rows(const float (*acc)[4], float fa, float fb, T* so, int part,
                                           int lane, RowPtr row_ptr) {
    constexpr int LD = D + 8;
#pragma unroll
    for (int i = 0; i < DTW; ++i) {
        const int c = (part * DTW + i) * 8 + 2 * (lane % 4);
        *reinterpret_cast<uint32_t*>(so + (lane / 4) * LD + c) = pack2<T>(acc[i][0] * fa, acc[i][1] * fa);
        *reinterpret_cast<uint32_t*>(so + (lane / 4 + 8) * LD + c) = pack2<T>(acc[i][2] * fb, acc[i][3] * fb);
    }
    __syncwarp();
    for (int c = lane; c < 16 * DTW; c += 32) {
        const int r = c / DTW, x = (part * DTW + c % DTW) * 8;
        T* dst = row_ptr(r);
        if (dst) *reinterpret_cast<uint4*>(dst + x) = *reinterpret_cast<const uint4*>(so + r * LD + x);
    }
}

}  // namespace mma16
