// Hopper (sm_90a) warpgroup MMA building blocks for the fused attention and the MoE grouped GEMM:
// `wgmma.mma_async` with bf16 / f16 operands and fp32 accumulators (A and B from shared memory, or
// A from registers), the shared-memory matrix descriptors, and 16-byte cp.async copies into the
// 128-byte-swizzled tile layout the descriptors describe. Compiled only for compute_90a
// (`g4ft-ptx-build`'s Hopper list).
//
// Tile layout ("sw128"): a ROWS × D tile of 16-bit elements (D a multiple of 64, ROWS of 8) is
// D / 64 atoms of ROWS × 128 bytes (64 columns each, atom a holds columns 64a..64a+63), atoms one
// after the other; in an atom, row r is 128 bytes at r·128 and its 16-byte chunk c sits at chunk
// position c ^ (r % 8) (the hardware's 128-byte swizzle: address bits 4-6 ^= bits 7-9, so the
// tile base must be 1024-byte aligned). The same bytes serve both operand orders:
// - K-major (the contraction runs along a row: Q and K in S = Q·Kᵀ): groups of 8 rows 1024 bytes
//   apart (stride byte offset), a 16-wide k step is the 32 bytes at column 16·(k % 4) of atom k / 4;
// - MN-major (the contraction runs down the rows: V in O = P·V, whose rows are keys): 8-row groups
//   1024 bytes apart along the contraction, atoms (64 output columns) `ROWS·128` bytes apart
//   (leading byte offset), a 16-row k step starts 2048 bytes further.
// Register fragments: a warpgroup's 4 warps own rows 16·(warp % 4).. of the 64-row tile; each
// warp's accumulators and A operand are laid out as mma.sync m16n8k16's (mma.cuh), n-tile after
// n-tile, so the softmax code of the mma.sync kernels applies to them unchanged.
#pragma once
#include "mma.cuh"

namespace wg {

// Element offset of 16-byte chunk `ch` (columns 8·ch..) of row r in a sw128 tile of ROWS rows.
template <int ROWS>
__device__ __forceinline__ int sw128_chunk(int r, int ch) {
    return ((ch / 8) * ROWS + r) * 64 + (((ch % 8) ^ (r % 8)) * 8);
}

// ROWS consecutive rows from `g` (row stride D) into a sw128 tile, zero-filled from row `valid` on.
template <typename T, int D, int ROWS, int THREADS>
__device__ __forceinline__ void load_tile(T* s, const T* g, int valid) {
    constexpr int CH = D / 8, STEP = THREADS / CH;
    static_assert(THREADS % CH == 0 && ROWS % STEP == 0, "tile loader shape");
    const int r0 = threadIdx.x / CH, ch = threadIdx.x % CH;
#pragma unroll
    for (int i = 0; i < ROWS / STEP; ++i) {
        const int r = r0 + i * STEP;
        const bool ok = r < valid;
        mma16::cp_async16(s + sw128_chunk<ROWS>(r, ch), g + (size_t)(ok ? r : 0) * D + ch * 8, ok);
    }
}

// ROWS rows into a sw128 tile, row r from `row_ptr(r)`, zero-filled from row `valid` on.
template <typename T, int D, int ROWS, int THREADS, typename RowPtr>
__device__ __forceinline__ void load_rows(T* s, int valid, RowPtr row_ptr) {
    constexpr int CH = D / 8;
    for (int c = threadIdx.x; c < ROWS * CH; c += THREADS) {
        const int r = c / CH, ch = c % CH;
        const bool ok = r < valid;
        mma16::cp_async16(s + sw128_chunk<ROWS>(r, ch), row_ptr(ok ? r : 0) + ch * 8, ok);
    }
}

// The descriptor of a sw128 operand starting at `p` (16-byte aligned; inside a 1024-byte aligned
// tile), 8-row groups 1024 bytes apart, `lbo` bytes between atoms (MN-major; K-major ignores it).
__device__ __forceinline__ uint64_t desc(const void* p, uint32_t lbo) {
    const uint64_t addr = (mma16::smem_addr(p) & 0x3FFFF) >> 4;
    return addr | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(1024 >> 4) << 32) | (1ull << 62);
}

// The descriptor `d` with its operand address moved on by `elems` 16-bit elements. The address
// field (the low 14 bits) is the shared-memory byte address / 16 and every operand lies in the
// block's shared memory (below 2^18 bytes), so a 32-bit add never carries out of the field. One
// descriptor per product, stepped by constants, keeps descriptor math out of the wgmma issue loop.
__device__ __forceinline__ uint64_t step(uint64_t d, int elems) {
    return (d & ~0xFFFFFFFFull) | (uint32_t)((uint32_t)d + elems * 2 / 16);
}
// Orders this thread's register writes (accumulators, A fragments) before the next wgmma.
__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
// Closes the group of wgmmas issued since the last commit.
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most N committed groups are pending (N = 0: every product is in its registers).
template <int N> __device__ __forceinline__ void wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Makes this thread's generic-proxy shared-memory writes (cp.async, st.shared) visible to the
// async proxy that wgmma reads through; then a barrier publishes them to the warpgroup.
__device__ __forceinline__ void fence_shared_for_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Pins N accumulator registers: the compiler may not move their reads or writes across this point
// (a wgmma in flight writes them behind its back).
template <int N> __device__ __forceinline__ void pin(float* d) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The accumulator operands d[i..i + 8) of a wgmma asm statement ("+f": read and written).
#define WG_D8(i)                                                                                                   \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), \
        "+f"(d[i + 7])
// The wgmma instructions in use, E the PTX type of both operands ("bf16" or "f16"); scale-d is 1
// (d accumulates). SS: A and B from shared memory (descriptors da, db, both K-major). RS: A from
// the registers a[0..4), B from shared memory read MN-major (imm-trans-b 1).
#define WG_SS_N32(E)                                                                                                    \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"                                                           \
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32." E "." E " {"                                             \
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"                                 \
                 "}, %16, %17, p, 1, 1, 0, 0;\n}\n"                                                                     \
                 : WG_D8(0), WG_D8(8)                                                                                   \
                 : "l"(da), "l"(db), "r"(1))
#define WG_SS_N64(E)                                                                                                       \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                                              \
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32." E "." E " {"                                                \
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                  \
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"                          \
                 "}, %32, %33, p, 1, 1, 0, 0;\n}\n"                                                                        \
                 : WG_D8(0), WG_D8(8), WG_D8(16), WG_D8(24)                                                                  \
                 : "l"(da), "l"(db), "r"(1))
#define WG_RS_N128(E)                                                                                                      \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                                              \
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32." E "." E " {"                                               \
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                  \
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                        \
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "                        \
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"                          \
                 "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"                                                          \
                 : WG_D8(0), WG_D8(8), WG_D8(16), WG_D8(24), WG_D8(32), WG_D8(40), WG_D8(48), WG_D8(56)                      \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1))

// SS at n256 (the grouped GEMM's 64 × 256 warpgroup tile); TB: imm-trans-b, 0 for a K-major B
// (its rows are the output columns), 1 for an MN-major B (its rows run along the contraction).
#define WG_SS_N256T(E, TB)                                                                                         \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"                                                     \
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32." E "." E " {"                                       \
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                          \
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                \
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "                \
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "                \
                 "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "                \
                 "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "                \
                 "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "    \
                 "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"  \
                 "}, %128, %129, p, 1, 1, 0, " TB ";\n}\n"                                                         \
                 : WG_D8(0), WG_D8(8), WG_D8(16), WG_D8(24), WG_D8(32), WG_D8(40), WG_D8(48), WG_D8(56),           \
                   WG_D8(64), WG_D8(72), WG_D8(80), WG_D8(88), WG_D8(96), WG_D8(104), WG_D8(112), WG_D8(120)       \
                 : "l"(da), "l"(db), "r"(1))

// SS at n128 and n192 (the grouped GEMM's last column tile when fewer columns are left), TB as above.
#define WG_SS_N128T(E, TB)                                                                                            \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                                         \
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32." E "." E " {"                                          \
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                             \
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                   \
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "                   \
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"                     \
                 "}, %64, %65, p, 1, 1, 0, " TB ";\n}\n"                                                              \
                 : WG_D8(0), WG_D8(8), WG_D8(16), WG_D8(24), WG_D8(32), WG_D8(40), WG_D8(48), WG_D8(56)               \
                 : "l"(da), "l"(db), "r"(1))
#define WG_SS_N192T(E, TB)                                                                                            \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %98, 0;\n"                                                         \
                 "wgmma.mma_async.sync.aligned.m64n192k16.f32." E "." E " {"                                          \
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                             \
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                   \
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "                   \
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "                   \
                 "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "                   \
                 "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"                     \
                 "}, %96, %97, p, 1, 1, 0, " TB ";\n}\n"                                                              \
                 : WG_D8(0), WG_D8(8), WG_D8(16), WG_D8(24), WG_D8(32), WG_D8(40), WG_D8(48), WG_D8(56),              \
                   WG_D8(64), WG_D8(72), WG_D8(80), WG_D8(88)                                                         \
                 : "l"(da), "l"(db), "r"(1))

// d[0..N/2) += A·B for a 64 × 16 A (K-major descriptor `da`) and a 16 × N B, N = 32, 64, 128, 192
// or 256. B is K-major (`db`'s rows are the N output columns: one 16-wide step of S = Q·Kᵀ and its
// kin) unless TRANS_B (n128 to n256: the grouped GEMM's NN layout), then MN-major (rows along the
// contraction).
template <typename T, int N, bool TRANS_B = false>
__device__ __forceinline__ void mma_ss(float* d, uint64_t da, uint64_t db) {
    static_assert(N == 32 || N == 64 || N == 128 || N == 192 || N == 256, "wgmma shapes in use");
    static_assert(!TRANS_B || N >= 128, "MN-major B is instantiated from n128 on");
    constexpr bool bf16 = std::is_same_v<T, __nv_bfloat16>;
#define WG_SS_TYPES(M)                                     \
    if constexpr (bf16 && TRANS_B) M("bf16", "1");         \
    else if constexpr (bf16) M("bf16", "0");               \
    else if constexpr (TRANS_B) M("f16", "1");             \
    else M("f16", "0");
    if constexpr (N == 256) {
        WG_SS_TYPES(WG_SS_N256T)
    } else if constexpr (N == 192) {
        WG_SS_TYPES(WG_SS_N192T)
    } else if constexpr (N == 128) {
        WG_SS_TYPES(WG_SS_N128T)
    } else if constexpr (N == 64) {
        if constexpr (bf16) WG_SS_N64("bf16"); else WG_SS_N64("f16");
    } else {
        if constexpr (bf16) WG_SS_N32("bf16"); else WG_SS_N32("f16");
    }
#undef WG_SS_TYPES
}

// d[0..64) += A·B for the warp's A fragment `a` (16 rows × 16 of the contraction, mma.sync's
// layout) and a 16 × 128 B read MN-major (`db`, rows along the contraction): one 16-row step of
// O += P·V and its kin, 128 columns.
template <typename T> __device__ __forceinline__ void mma_m64n128_rs(float* d, const uint32_t* a, uint64_t db) {
    if constexpr (std::is_same_v<T, __nv_bfloat16>) WG_RS_N128("bf16"); else WG_RS_N128("f16");
}

// c[0..N/2) = A·Bᵀ over the head-dim columns [col0, col0 + DSPAN) (col0 a multiple of 64) for the
// 64 rows of the sw128 tile `a` (AROWS rows) from row a0 and the N rows of the sw128 tile `b`:
// issued and committed, not waited for (wait<0>, then pin c).
template <typename T, int DSPAN, int AROWS, int N>
__device__ __forceinline__ void rows_times_rows(float* c, const T* a, int a0, const T* b, int col0 = 0) {
#pragma unroll
    for (int i = 0; i < N / 2; ++i) c[i] = 0.f;
    pin<N / 2>(c);
    fence();
    const uint64_t da = desc(a + (col0 / 64) * AROWS * 64 + a0 * 64, 16), db = desc(b + (col0 / 64) * N * 64, 16);
#pragma unroll
    for (int kk = 0; kk < DSPAN / 16; ++kk) {
        const int atom = kk / 4, col = (kk % 4) * 16;  // the step's 32 bytes within its atom
        mma_ss<T, N>(c, step(da, atom * AROWS * 64 + col), step(db, atom * N * 64 + col));
    }
    commit();
}

// Completes the partial sums c[0..N) that the two warpgroups of the block computed over their
// halves of the contraction: each thread hands its partials to its twin in the other warpgroup
// through `xs` (2·N·128 floats) and adds the twin's, both in the order (warpgroup 0) + (warpgroup
// 1), so the two hold the same values. Barrier 1 of 256 threads; the caller separates uses of
// `xs` by a block barrier.
template <int N>
__device__ __forceinline__ void sum_halves(float* c, float* xs, int wgi) {
    const int wt = threadIdx.x % 128;
#pragma unroll
    for (int i = 0; i < N; ++i) xs[(wgi * N + i) * 128 + wt] = c[i];
    asm volatile("bar.sync 1, 256;\n" ::: "memory");
#pragma unroll
    for (int i = 0; i < N; ++i) c[i] = xs[i * 128 + wt] + xs[(N + i) * 128 + wt];
}

// acc[0..NC/2) += A·B for the warp's A fragments `a` (64 rows × K, K / 16 steps) and the K rows of
// the sw128 tile `b` (BROWS rows, read down its rows), columns 64·atom0 .. 64·atom0 + NC: issued and
// committed, not waited for (until a wait covers it, neither acc nor a may be touched).
template <typename T, int K, int BROWS, int NC>
__device__ __forceinline__ void accumulate_async(float* acc, const uint32_t (*a)[4], const T* b, int atom0) {
    static_assert(NC % 128 == 0, "128 columns a product");
    pin<NC / 2>(acc);
    fence();
    const uint64_t db = desc(b + atom0 * BROWS * 64, BROWS * 128);
#pragma unroll
    for (int ks = 0; ks < K / 16; ++ks)
#pragma unroll
        for (int h = 0; h < NC / 128; ++h)
            mma_m64n128_rs<T>(acc + 64 * h, a[ks], step(db, 2 * h * BROWS * 64 + ks * 16 * 64));
    commit();
}

// accumulate_async, waited for.
template <typename T, int K, int BROWS, int NC>
__device__ __forceinline__ void accumulate(float* acc, const uint32_t (*a)[4], const T* b, int atom0) {
    accumulate_async<T, K, BROWS, NC>(acc, a, b, atom0);
    wait<0>();
    pin<NC / 2>(acc);
}

}  // namespace wg
