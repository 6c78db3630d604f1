// The MoE grouped GEMM on Hopper's warpgroup MMA (sm_90a): y[r] = x[r]·W[e]ᵀ (W (E, N, K), NT) or
// x[r]·W[e] (W (E, K, N), NN) for the rows r of expert e's segment, the same products as
// kernels/moe.cu's mma.sync kernels (which other GPUs run) over the same row tiles
// (grouped_tiles.cuh). Host side: src/moe_cuda.rs; CPU reference: src/moe.rs.
//
// A block owns one 128-row tile of a segment and 256 output columns: 2 warpgroups, each 64 rows ×
// 256 columns of fp32 accumulators (128 per thread), one m64n256k16 wgmma per 16-deep step (n192 or
// n128 on a last column tile with that few columns left) with A
// and B read from shared memory (wgmma.cuh's 128-byte-swizzled tiles: A and an NT B K-major, an NN
// B MN-major). K comes in 64-deep tiles through a 4-stage cp.async ring (48 KiB a stage); the
// block loads tile k + 2 while the products of tile k are issued and those of tile k − 1 finish,
// so one stage is being filled, one waits, and two are read by products in flight. 256 columns a
// block halve the re-reads of x against 128 (each row tile is read once per column tile) and
// every expert's weights are read once per row tile: the mma.sync kernel's 128 × 128 blocks were
// bound by L2 traffic (docs/benchmarks.md §3). A warpgroup whose 64 rows are all past the
// segment's end issues no products (it still loads its share and meets every barrier). The output
// tile leaves through shared memory, a warp storing whole rows.
#include "common.cuh"
#include "grouped_tiles.cuh"
#include "mma.cuh"
#include "wgmma.cuh"

namespace grouped_wg {

constexpr int BM = 128, BN = 256, BK = 64, STAGES = 4, THREADS = 256;
constexpr int A_TILE = BM * BK, B_TILE = BN * BK;  // elements of a stage's A and B tiles

// Stage `st`'s A tile (BM rows of x from r0, K columns k0..k0 + BK: K-major, one swizzle atom) and
// B tile (NT: W[e]'s rows n0..n0 + BN over the same K columns, K-major; NN: W[e]'s rows k0..k0 + BK,
// columns n0..n0 + BN, four atoms of 64 columns, MN-major). Rows past `valid`, columns past K and
// outputs past N are zero-filled (K and N are multiples of 8, so a 16-byte chunk is in or out).
template <typename T, bool NT>
__device__ __forceinline__ void load_stage(T* sa, T* sb, const T* x, const T* w, int r0, int valid, int n0,
                                           int k0, int n, int kdim) {
#pragma unroll
    for (int i = 0; i < A_TILE / 8 / THREADS; ++i) {
        const int c = threadIdx.x + i * THREADS, r = c / (BK / 8), ch = c % (BK / 8);
        const bool ok = r < valid && k0 + ch * 8 < kdim;
        mma16::cp_async16(sa + wg::sw128_chunk<BM>(r, ch), x + (ok ? (size_t)(r0 + r) * kdim + k0 + ch * 8 : 0), ok);
    }
#pragma unroll
    for (int i = 0; i < B_TILE / 8 / THREADS; ++i) {
        const int c = threadIdx.x + i * THREADS;
        if (NT) {
            const int r = c / (BK / 8), ch = c % (BK / 8);
            const bool ok = n0 + r < n && k0 + ch * 8 < kdim;
            mma16::cp_async16(sb + wg::sw128_chunk<BN>(r, ch), w + (ok ? (size_t)(n0 + r) * kdim + k0 + ch * 8 : 0),
                              ok);
        } else {
            const int r = c / (BN / 8), ch = c % (BN / 8);
            const bool ok = k0 + r < kdim && n0 + ch * 8 < n;
            mma16::cp_async16(sb + wg::sw128_chunk<BK>(r, ch), w + (ok ? (size_t)(k0 + r) * n + n0 + ch * 8 : 0), ok);
        }
    }
}

// One BK-deep tile's products into the warpgroup's accumulators d[0..N/2): N output columns of
// the stage (K-major B: 32 bytes on in the atom per 16-deep step; MN-major: 16 rows on).
template <typename T, bool NT, int N>
__device__ __forceinline__ void tile_products(float* d, uint64_t da, uint64_t db) {
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk)
        wg::mma_ss<T, N, !NT>(d, wg::step(da, kk * 16), wg::step(db, NT ? kk * 16 : kk * 16 * 64));
}

// The block's tile with products W columns wide (W/2 accumulators a thread): the K loop and the
// staged stores. `busy`: this warpgroup has rows in the segment.
template <typename T, bool NT, int W>
__device__ __forceinline__ void tile(T* sa, T* sb, const T* x, const T* we, T* y, int r0, int valid, int n0, int n,
                                     int kdim, int wgi, bool busy) {
    float d[W / 2];
#pragma unroll
    for (int i = 0; i < W / 2; ++i) d[i] = 0.f;

    // One commit group per K tile (empty past the last): before the products of tile kt, the
    // groups of tiles kt + 1 .. kt + STAGES − 3 may still be in flight.
    const int ktiles = (kdim + BK - 1) / BK;
#pragma unroll
    for (int s = 0; s < STAGES - 2; ++s) {
        if (s < ktiles) load_stage<T, NT>(sa + s * A_TILE, sb + s * B_TILE, x, we, r0, valid, n0, s * BK, n, kdim);
        mma16::cp_async_commit();
    }
    for (int kt = 0; kt < ktiles; ++kt) {
        mma16::cp_async_wait_newer<STAGES - 3>();  // this thread's copies of tile kt are in
        wg::fence_shared_for_async();
        // Everyone's copies of tile kt are in, and both warpgroups have waited for the products
        // of tile kt − 2, so its stage can be refilled.
        __syncthreads();
        const int nk = kt + STAGES - 2;
        if (nk < ktiles) {
            const int st = nk % STAGES;
            load_stage<T, NT>(sa + st * A_TILE, sb + st * B_TILE, x, we, r0, valid, n0, nk * BK, n, kdim);
        }
        mma16::cp_async_commit();
        if (!busy) continue;  // it still loads its share and meets every barrier
        const int st = kt % STAGES;
        const uint64_t da = wg::desc(sa + st * A_TILE + wgi * 64 * 64, 16);
        const uint64_t db = wg::desc(sb + st * B_TILE, NT ? 16 : BK * 128);
        wg::pin<W / 2>(d);
        wg::fence();
        tile_products<T, NT, W>(d, da, db);
        wg::commit();
        wg::wait<1>();  // the products of tile kt − 1 are done
        wg::pin<W / 2>(d);
    }
    wg::wait<0>();
    wg::pin<W / 2>(d);
    // The stores go through shared memory, so that each warp writes whole rows (512 contiguous
    // bytes) instead of 16-byte pieces of 8 rows: each warpgroup stages its 64 × 256 tile, rows
    // OUT_LD elements apart (the pad spreads a warp's 8 rows over all banks), once both are done
    // reading the stages.
    __syncthreads();
    if (!busy) return;
    constexpr int OUT_LD = BN + 8;
    T* const so = sa + wgi * 64 * OUT_LD;
    {
        // Accumulator i of a thread: columns 8·(i / 4) + 2·(lane % 4) + (i % 2) of row
        // 16·(warp % 4) + lane / 4 + 8·((i / 2) % 2) of its warpgroup's 64 (mma.sync's fragments).
        const int lane = threadIdx.x % 32, row = ((threadIdx.x / 32) % 4) * 16 + lane / 4;
#pragma unroll
        for (int j = 0; j < W / 8; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                *reinterpret_cast<uint32_t*>(so + (row + 8 * h) * OUT_LD + j * 8 + 2 * (lane % 4)) =
                    mma16::pack2<T>(d[4 * j + 2 * h], d[4 * j + 2 * h + 1]);
    }
    if (wgi == 0)  // this warpgroup's tile is staged
        asm volatile("bar.sync 1, 128;\n" ::: "memory");
    else
        asm volatile("bar.sync 2, 128;\n" ::: "memory");
    const int wt = threadIdx.x % 128;
#pragma unroll
    for (int i = 0; i < 64 * BN / 8 / 128; ++i) {
        const int c = wt + i * 128, r = c / (BN / 8), col = n0 + (c % (BN / 8)) * 8;
        if (wgi * 64 + r < valid && col < n)
            *reinterpret_cast<uint4*>(y + (size_t)(r0 + wgi * 64 + r) * n + col) =
                *reinterpret_cast<const uint4*>(so + r * OUT_LD + (c % (BN / 8)) * 8);
    }
}

// grid (ceil(N / BN), ceil(m / BM) + E), block 256, dynamic shared memory STAGES·(A_TILE +
// B_TILE)·2 bytes plus 1024 to align the swizzled tiles (197,632; `WGMMA_GEMM_SMEM` in
// src/moe_cuda.rs). K and N multiples of 8, 16-byte aligned rows.
template <typename T, bool NT>
__device__ __forceinline__ void gemm(const T* x, const T* w, const uint32_t* offsets, T* y, int e_count, int n,
                                     int kdim) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* const sa = reinterpret_cast<T*>(smem_raw + ((1024 - mma16::smem_addr(smem_raw) % 1024) % 1024));
    T* const sb = sa + STAGES * A_TILE;  // stage s: A at sa + s·A_TILE, B at sb + s·B_TILE
    int e, r0, valid;
    if (!tile_of<BM>(offsets, e_count, blockIdx.y, e, r0, valid)) return;  // uniform per block
    const int n0 = blockIdx.x * BN;
    const T* we = w + (size_t)e * n * kdim;
    const int wgi = threadIdx.x / 128;
    const bool busy = wgi * 64 < valid;  // warpgroup-uniform: it has rows in the segment
    // The products' width: the columns left from n0, in steps of 64 from 128 on (the last column
    // tile of an N that is not a multiple of BN multiplies no more zero columns than that). Each
    // width is a whole tile of its own, so no accumulator is shared across products of two shapes.
    const int width = max(128, min(BN, (n - n0 + 63) / 64 * 64));
    if (width == BN)
        tile<T, NT, BN>(sa, sb, x, we, y, r0, valid, n0, n, kdim, wgi, busy);
    else if (width == 192)
        tile<T, NT, 192>(sa, sb, x, we, y, r0, valid, n0, n, kdim, wgi, busy);
    else
        tile<T, NT, 128>(sa, sb, x, we, y, r0, valid, n0, n, kdim, wgi, busy);
}
}  // namespace grouped_wg

#define GROUPED_WGMMA_INST(T, S)                                                                          \
    extern "C" __global__ void __launch_bounds__(256, 1)                                                  \
        grouped_wgmma_nt_##S(const T* x, const T* w, const uint32_t* offsets, T* y, int e, int n, int k) { \
        G4FT_KERNEL_ENTRY();                                                                              \
        grouped_wg::gemm<T, true>(x, w, offsets, y, e, n, k);                                             \
    }                                                                                                     \
    extern "C" __global__ void __launch_bounds__(256, 1)                                                  \
        grouped_wgmma_nn_##S(const T* x, const T* w, const uint32_t* offsets, T* y, int e, int n, int k) { \
        G4FT_KERNEL_ENTRY();                                                                              \
        grouped_wg::gemm<T, false>(x, w, offsets, y, e, n, k);                                            \
    }
GROUPED_WGMMA_INST(__nv_bfloat16, bf16)
GROUPED_WGMMA_INST(__half, f16)
