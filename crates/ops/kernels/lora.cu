// The LoRA adapter's products with its input dropout fused in (host side: src/adapter_cuda.rs).
// drop(x) is never written to memory: each kernel regenerates the keep bits of the elements it
// reads from the dropout key (dropout_keep.cuh, the bits of kernels/dropout.cu) and rounds the kept
// ones, scaled, to T exactly as the dropout kernel does.
//   lora_down:      low = drop(x)·Aᵀ          (m × r; the forward's adapter input product)
//   lora_dx_da:     one pass over x for the backward's adapter terms, the mask drawn once for both:
//                   dA = dlowᵀ·drop(x) summed over one split of the rows (fp32, r × in per split),
//                   and drop'(dlow·A) written over dx (dx may be x's memory) or added to it
//   lora_dlow_db:   one pass over the output gradient g for the backward's two products of it,
//                   dlow = g·B summed over one chunk of g's columns and dB = gᵀ·low over one split
//                   of its rows (fp32 partial sums)
//   lora_sum_splits: partial sums added in order, scaled, stored in the output's dtype (dlow; dA
//                   and dB in one launch)
//   lora_up_add:    y = r(y + scale·(low·Bᵀ))    (the forward's adapter term, in place)
//   lora_up_geglu:  the same for the MLP's gate and up, and act = geglu(gate, up) in that pass
//                   (or act alone, written over gate, for a forward that drops gate and up)
// x, A (r × in), dlow (m × r) and dx row-major in T (bf16 / f16); in % 8 == 0, r % 8 == 0, r <= 64,
// every operand 16-byte aligned (the host checks). fp32 accumulation, one rounding per output.
#include "common.cuh"
#include "dropout_keep.cuh"
#include "geglu_elem.cuh"
#include "mma.cuh"

// The keep bits of the 8 elements at flat index i (i % 8 == 0, so they are element pairs i/2 ..
// i/2 + 3): bit e for element i + e.
__device__ __forceinline__ uint32_t keep8(size_t i, uint64_t kk, uint32_t thresh) {
    uint32_t bits = 0;
#pragma unroll
    for (int p = 0; p < 4; ++p) {
        bool k0, k1;
        keep_pair(kk, i / 2 + p, thresh, k0, k1);
        bits |= (uint32_t)k0 << (2 * p) | (uint32_t)k1 << (2 * p + 1);
    }
    return bits;
}

// 8 elements with the dropout applied by their keep bits: kept ones r(v·scale), dropped ones 0.
template <typename T> __device__ __forceinline__ uint4 masked8(uint4 raw, uint32_t bits, float scale) {
    T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int k = 0; k < 8; ++k) e[k] = from_f32<T>((bits >> k) & 1 ? to_f32(e[k]) * scale : 0.f);
    return raw;
}

// 8 elements of x at flat index i (i % 8 == 0) with the dropout applied.
template <typename T>
__device__ __forceinline__ uint4 dropped8(uint4 raw, size_t i, uint64_t kk, uint32_t thresh, float scale) {
    return masked8<T>(raw, keep8(i, kk, thresh), scale);
}

__device__ __forceinline__ uint4 zero4() { return make_uint4(0, 0, 0, 0); }

// low = drop(x)·Aᵀ. Block: 16 rows, WARPS warps splitting `in` into 32-column blocks (warp w
// takes blocks w, w + WARPS, ...): as many warps as the registers allow, since hashing the mask
// makes the kernel issue-bound at low occupancy. NT n-tiles of 8 ranks (r <= 8·NT). Each lane
// loads 8 consecutive columns of two rows (16 bytes each) and of its rank row of A. The k slots of
// the m16n8k16 fragments are a permutation of the columns (lane t's columns c..c+3 are the slots
// 2t, 2t+1, 2t+8, 2t+9 of the first step, c+4..c+7 those of the second), the same in both
// operands, so the products are the plain sums. The warps' partial tiles are added in warp order
// through shared memory (WARPS·16·8·NT floats).
template <typename T, int NT, int WARPS>
__device__ void lora_down(const T* x, const T* a, T* low, int m, int in, int r, uint64_t kk, uint32_t thresh,
                          float scale) {
    extern __shared__ float red[];
    constexpr int W = NT * 8;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int row0 = blockIdx.x * 16;
    const int rows[2] = {row0 + g, row0 + g + 8};
    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
    const int kblocks = (in + 31) / 32;
#pragma unroll 2
    for (int kb = warp; kb < kblocks; kb += WARPS) {
        const int c = kb * 32 + 8 * t;
        uint4 xv[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            xv[h] = zero4();
            if (c < in && rows[h] < m) {
                const size_t i = (size_t)rows[h] * in + c;
                xv[h] = dropped8<T>(*reinterpret_cast<const uint4*>(x + i), i, kk, thresh, scale);
            }
        }
        const uint32_t s0[4] = {xv[0].x, xv[1].x, xv[0].y, xv[1].y};
        const uint32_t s1[4] = {xv[0].z, xv[1].z, xv[0].w, xv[1].w};
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            const int n = nt * 8 + g;
            const uint4 b = (c < in && n < r) ? *reinterpret_cast<const uint4*>(a + (size_t)n * in + c) : zero4();
            mma16::mma<T>(acc[nt], s0, b.x, b.y);
            mma16::mma<T>(acc[nt], s1, b.z, b.w);
        }
    }
    float* mine = red + warp * 16 * W;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        const int col = nt * 8 + 2 * t;
        mine[g * W + col] = acc[nt][0];
        mine[g * W + col + 1] = acc[nt][1];
        mine[(g + 8) * W + col] = acc[nt][2];
        mine[(g + 8) * W + col + 1] = acc[nt][3];
    }
    __syncthreads();
    for (int e = threadIdx.x; e < 16 * W; e += blockDim.x) {
        float s = 0.f;
#pragma unroll 8
        for (int w = 0; w < WARPS; ++w) s += red[w * 16 * W + e];
        const int row = row0 + e / W, n = e % W;
        if (row < m && n < r) low[(size_t)row * r + n] = from_f32<T>(s);
    }
}

// Two sets of partial sums, each added in split order, scaled and rounded to O: out0[i] =
// r(scale0·Σ_s part0[s·n0 + i]) for i < n0, and the same for set 1 (n1 may be 0).
template <typename O>
__device__ void lora_sum_splits(const float* part0, O* out0, int splits0, size_t n0, float scale0, const float* part1,
                                O* out1, int splits1, size_t n1, float scale1) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n0 + n1; i += (size_t)gridDim.x * blockDim.x) {
        const bool first = i < n0;
        const float* part = first ? part0 : part1;
        const size_t n = first ? n0 : n1, j = first ? i : i - n0;
        const int splits = first ? splits0 : splits1;
        float s = 0.f;
        for (int k = 0; k < splits; ++k) s += part[k * n + j];
        (first ? out0 : out1)[j] = from_f32<O>(s * (first ? scale0 : scale1));
    }
}

// The A fragments of KS m16n8k16 steps over the ranks of rows row0..row0+16 of an (m × r)
// row-major operand (dlow or low), read straight from global memory; zeros past m and r.
template <typename T, int KS>
__device__ __forceinline__ void rank_rows_a(uint32_t (*af)[4], const T* p, int m, int r, int row0) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
    for (int ks = 0; ks < KS; ++ks)
#pragma unroll
        for (int q = 0; q < 4; ++q) { // a0..a3: (row g | g+8, ranks 2t | 2t+8 of the step)
            const int row = row0 + g + 8 * (q % 2), k = ks * 16 + 2 * t + 8 * (q / 2);
            af[ks][q] = row < m && k < r ? *reinterpret_cast<const uint32_t*>(p + (size_t)row * r + k) : 0u;
        }
}

constexpr int DX_ROWS = 64, DX_COLS = 64, DX_LD = 72, DX_STAGE_LD = DX_COLS + 4;

// The backward's adapter terms in one pass over x, the mask drawn once for both: dA's partial sums
// part[s][n][c] = Σ over the rows of split s of dlow[row][n]·drop(x)[row][c], and the input
// gradient's term drop'(dlow·A): where the mask keeps an element, dx = r(dx + (dlow·A)·scale) (ACC)
// or r((dlow·A)·scale) (!ACC); where it drops it, dx unchanged (ACC) or 0 (!ACC). Without ACC dx
// may be x's memory: each thread writes only the chunks of x it has read.
// Block (4 warps): 64 columns of one split, in stages of 64 rows. Per stage, thread (w, lane) loads
// the chunks of 8 elements at rows 16w + lane/8 + 4q (q < 4), columns 8·(lane % 8), and draws their
// keep bits; the dropped x goes to shared memory (row stride 72) with the stage's dlow rows (stride
// KS·16 + 8: the 8 rows an ldmatrix reads in distinct banks) for dA, where warp w multiplies dlowᵀ
// (KS m-tiles of 16 ranks, ldmatrix.trans) by its 16 columns (ldmatrix.trans of the x tile) over
// the stage's rows; warp w's 16 rows of dlow·A (A's 64 columns staged once, rank rows) go through
// its fp32 staging rows to the same chunks and keep bits.
template <typename T, int KS, bool ACC>
__device__ void lora_dx_da(const T* x, const T* dlow, const T* a, T* dx, float* part, int m, int in, int r,
                           int split_rows, uint64_t kk, uint32_t thresh, float scale) {
    __shared__ __align__(16) T as[KS * 16][DX_LD];
    __shared__ __align__(16) T xs[DX_ROWS][DX_LD];
    __shared__ __align__(16) T ds[DX_ROWS][KS * 16 + 8];
    __shared__ __align__(16) float stage[DX_ROWS][DX_STAGE_LD];
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    const int c0 = blockIdx.x * DX_COLS, cc = 8 * (lane % 8), c = c0 + cc;
    const int rb = blockIdx.y * split_rows, re = min(m, rb + split_rows);
    for (int e = tid; e < KS * 16 * 8; e += blockDim.x) {
        const int n = e / 8, ac = 8 * (e % 8);
        *reinterpret_cast<uint4*>(&as[n][ac]) =
            n < r && c0 + ac < in ? *reinterpret_cast<const uint4*>(a + (size_t)n * in + c0 + ac) : zero4();
    }
    float da[KS][2][4];
#pragma unroll
    for (int mt = 0; mt < KS; ++mt)
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) da[mt][nt][0] = da[mt][nt][1] = da[mt][nt][2] = da[mt][nt][3] = 0.f;
    float(*st)[DX_STAGE_LD] = stage + warp * 16;
    for (int r0 = rb; r0 < re; r0 += DX_ROWS) {
        const int wrow = r0 + warp * 16;
        uint4 xv[4], dv[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int row = wrow + lane / 8 + 4 * q;
            const bool ok = row < re && c < in;
            const size_t i = (size_t)row * in + c;
            xv[q] = ok ? *reinterpret_cast<const uint4*>(x + i) : zero4();
            dv[q] = ACC && ok ? *reinterpret_cast<const uint4*>(dx + i) : zero4();
        }
        uint32_t af[KS][4];
        rank_rows_a<T, KS>(af, dlow, re, r, wrow);
        for (int e = tid; e < DX_ROWS * KS * 2; e += blockDim.x) {
            const int rr = e / (KS * 2), nc = 8 * (e % (KS * 2)), row = r0 + rr;
            *reinterpret_cast<uint4*>(&ds[rr][nc]) =
                row < re && nc < r ? *reinterpret_cast<const uint4*>(dlow + (size_t)row * r + nc) : zero4();
        }
        uint32_t keep[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int rr = warp * 16 + lane / 8 + 4 * q, row = r0 + rr;
            keep[q] = row < re && c < in ? keep8((size_t)row * in + c, kk, thresh) : 0u;
            *reinterpret_cast<uint4*>(&xs[rr][cc]) = masked8<T>(xv[q], keep[q], scale);
        }
        __syncthreads();
#pragma unroll
        for (int k0 = 0; k0 < DX_ROWS; k0 += 32) {
            uint32_t b[2][4]; // per n-tile: b0, b1 of the steps at rows k0 and k0 + 16
#pragma unroll
            for (int nt = 0; nt < 2; ++nt)
                mma16::ldsm4_trans(b[nt], &xs[k0 + lane % 8 + 8 * (lane / 8)][warp * 16 + nt * 8]);
#pragma unroll
            for (int mt = 0; mt < KS; ++mt)
#pragma unroll
                for (int s = 0; s < 2; ++s) {
                    uint32_t fa[4];
                    mma16::ldsm4_trans(fa, &ds[k0 + 16 * s + lane % 8 + 8 * (lane / 16)][mt * 16 + 8 * ((lane / 8) % 2)]);
                    mma16::mma<T>(da[mt][0], fa, b[0][2 * s], b[0][2 * s + 1]);
                    mma16::mma<T>(da[mt][1], fa, b[1][2 * s], b[1][2 * s + 1]);
                }
        }
        float acc[8][4];
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
#pragma unroll
        for (int ks = 0; ks < KS; ++ks)
#pragma unroll
            for (int np = 0; np < 4; ++np) {
                uint32_t b[4];
                mma16::ldsm4_trans(b, &as[ks * 16 + lane % 8 + 8 * ((lane / 8) % 2)][np * 16 + 8 * (lane / 16)]);
                mma16::mma<T>(acc[2 * np], af[ks], b[0], b[1]);
                mma16::mma<T>(acc[2 * np + 1], af[ks], b[2], b[3]);
            }
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                *reinterpret_cast<float2*>(&st[g + 8 * h][nt * 8 + 2 * t]) =
                    make_float2(acc[nt][2 * h], acc[nt][2 * h + 1]);
        __syncwarp();
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int rr = lane / 8 + 4 * q, row = wrow + rr;
            if (row >= re || c >= in) continue;
            float v[8];
            load_n<T, 8>(reinterpret_cast<const T*>(&dv[q]), v);
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                const bool kept = (keep[q] >> e) & 1;
                if constexpr (ACC) {
                    if (kept) v[e] = fmaf(st[rr][cc + e], scale, v[e]);
                } else {
                    v[e] = kept ? st[rr][cc + e] * scale : 0.f;
                }
            }
            store_n<T, 8>(dx + (size_t)row * in + c, v);
        }
        __syncthreads();
    }
    float* out = part + (size_t)blockIdx.y * r * in;
#pragma unroll
    for (int mt = 0; mt < KS; ++mt)
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int n = mt * 16 + g + 8 * h, col = c0 + warp * 16 + nt * 8 + 2 * t;
                if (col < in && n < r)
                    *reinterpret_cast<float2*>(out + (size_t)n * in + col) =
                        make_float2(da[mt][nt][2 * h], da[mt][nt][2 * h + 1]);
            }
}
// The adapter's up product scale·(low·Bᵀ) added to a projection output y (m × n) in place, with
// one fp32 fma onto the rounded output and one rounding: r(y + scale·(low·Bᵀ)), low (m × r) and
// B (n × r) row-major. lora_up_add does only that (the projection's own output); lora_up_geglu does
// it for the MLP's gate and up and writes act = geglu(gate, up) in the same pass (without the two
// extra passes over gate and up of adding first). Block (4 warps): 64 rows × 64 columns, warp w
// rows 16w..16w+16 and the 8 n-tiles; KS k-steps of 16 ranks. The A fragments are low's rows and
// the B fragments B's rows (each holds the k-pairs of one column), both read straight from global
// memory; each warp stages its 16 × 64 products in shared memory, so that every thread then
// updates whole 16-byte chunks of rows.

// Warp `warp`'s 16 × 64 tile of low·Bᵀ at (row0, c0) into its rows of `st` (fp32).
template <typename T, int KS>
__device__ __forceinline__ void lora_up_tile(float (*st)[DX_STAGE_LD], const T* low, const T* b, int m, int n, int r,
                                             int row0, int c0) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    uint32_t af[KS][4];
    rank_rows_a<T, KS>(af, low, m, r, row0);
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        const int col = c0 + nt * 8 + g;
        const T* brow = b + (size_t)col * r;
#pragma unroll
        for (int ks = 0; ks < KS; ++ks) { // b0, b1: (ranks 2t | 2t+8 of the step, column g)
            const int k = ks * 16 + 2 * t;
            const uint32_t b0 = col < n && k < r ? *reinterpret_cast<const uint32_t*>(brow + k) : 0u;
            const uint32_t b1 = col < n && k + 8 < r ? *reinterpret_cast<const uint32_t*>(brow + k + 8) : 0u;
            mma16::mma<T>(acc, af[ks], b0, b1);
        }
#pragma unroll
        for (int h = 0; h < 2; ++h)
            *reinterpret_cast<float2*>(&st[g + 8 * h][nt * 8 + 2 * t]) = make_float2(acc[2 * h], acc[2 * h + 1]);
    }
}

// Lane's q-th 8-element chunk of its warp's 16 × 64 tile: tile row rr, column cc.
__device__ __forceinline__ void up_chunk(int q, int& rr, int& cc) {
    const int lane = threadIdx.x % 32;
    rr = lane / 8 + 4 * q;
    cc = 8 * (lane % 8);
}

// P = 1: y0 += term0 (lora_up_add). P = 2: y0 += term0, y1 += term1 and act = geglu(y0, y1)
// (lora_up_geglu, y0 the gate, y1 the up output); without store_sums the sums are not written
// back and act may be y0 (each thread reads its chunks before it writes them).
template <typename T, int KS, int P>
__device__ void lora_up(T* y0, T* y1, T* act, const T* low0, const T* b0, const T* low1, const T* b1, int m, int n,
                        int r, float s0, float s1, bool store_sums) {
    __shared__ __align__(16) float stage[P][DX_ROWS][DX_STAGE_LD];
    const int warp = threadIdx.x / 32;
    const int c0 = blockIdx.x * DX_COLS, row0 = blockIdx.y * DX_ROWS + warp * 16;
    T* ys[2] = {y0, y1};
    const T* lows[2] = {low0, low1};
    const T* bs[2] = {b0, b1};
    const float scales[2] = {s0, s1};
    // The outputs' chunks are loaded first, so that their latency overlaps the products.
    uint4 raw[P][4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        int rr, cc;
        up_chunk(q, rr, cc);
        const int row = row0 + rr, c = c0 + cc;
#pragma unroll
        for (int p = 0; p < P; ++p)
            raw[p][q] = row < m && c < n ? *reinterpret_cast<const uint4*>(ys[p] + (size_t)row * n + c) : zero4();
    }
#pragma unroll
    for (int p = 0; p < P; ++p) lora_up_tile<T, KS>(stage[p] + warp * 16, lows[p], bs[p], m, n, r, row0, c0);
    __syncwarp();
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        int rr, cc;
        up_chunk(q, rr, cc);
        const int row = row0 + rr, c = c0 + cc;
        if (row >= m || c >= n) continue;
        const size_t i = (size_t)row * n + c;
        float v[P][8];
#pragma unroll
        for (int p = 0; p < P; ++p) {
            const float* st = &stage[p][warp * 16 + rr][cc];
            load_n<T, 8>(reinterpret_cast<const T*>(&raw[p][q]), v[p]);
#pragma unroll
            for (int e = 0; e < 8; ++e) v[p][e] = round_to<T>(fmaf(st[e], scales[p], v[p][e]));
            if (store_sums) store_n<T, 8>(ys[p] + i, v[p]);
        }
        if constexpr (P == 2) {
#pragma unroll
            for (int e = 0; e < 8; ++e) v[0][e] = geglu_y<T>(v[0][e], v[1][e]);
            store_n<T, 8>(act + i, v[0]);
        }
    }
}

// The backward's two products of the output gradient g (m × out) in one pass over it, with
// B (out × r) and low (m × r): dlow = g·B and dB = gᵀ·low as fp32 partial sums that
// lora_sum_splits adds in order, scales and rounds. Block (4 warps): the 256 columns of chunk
// blockIdx.x of g and one split of its rows, in stages of 64 rows loaded through cp.async into two
// buffers (the next stage loads while this one is multiplied), beside B's rows of the chunk
// (loaded once) and the stage's rows of low, ranks zero-padded to 16·NP. Per stage, warp w
// multiplies its 16 rows of the tile by B's chunk (16 k-steps) and stores them as the chunk's
// partial dlow rows, pdlow[chunk][row][n]; and it accumulates its 64 columns of the tile,
// transposed (ldmatrix.trans), times the stage's rows of low: dB's partial sums over the split,
// stored at the end as pdb[split][col][n]. B's fragments are the same at every stage: kept in
// registers where they fit (one pair of n-tiles).
constexpr int GD_ROWS = 64, GD_COLS = 256, GD_LD = GD_COLS + 8;

template <typename T, int NP>
__device__ void lora_dlow_db(const T* g, const T* b, const T* low, float* pdlow, float* pdb, int m, int out, int r,
                             int split_rows) {
    constexpr int RP = 16 * NP, RLD = RP + 8, THREADS = 128;
    extern __shared__ __align__(16) unsigned char gd_smem[];
    T* gs = reinterpret_cast<T*>(gd_smem); // [2][GD_ROWS][GD_LD]
    T* bs = gs + 2 * GD_ROWS * GD_LD;       // [GD_COLS][RLD]
    T* ls = bs + GD_COLS * RLD;             // [2][GD_ROWS][RLD]
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, gq = lane / 4, t = lane % 4;
    const int c0 = blockIdx.x * GD_COLS;
    const int rb = blockIdx.y * split_rows, re = min(m, rb + split_rows);
    // `rows` rows of r ranks from src (row stride r) at row stride RLD; zeros past r and `valid`.
    auto load_ranks = [&](T* dst, const T* src, int rows, int valid) {
        constexpr int CH = RP / 8;
        for (int e = tid; e < rows * CH; e += THREADS) {
            const int row = e / CH, k = 8 * (e % CH);
            const bool ok = row < valid && k < r;
            mma16::cp_async16(dst + row * RLD + k, src + (ok ? (size_t)row * r + k : 0), ok);
        }
    };
    // Stage rows r0.. of the chunk into buffer `buf`, with their rows of low.
    auto load_stage = [&](int buf, int r0) {
        constexpr int CH = GD_COLS / 8, STEP = THREADS / CH;
        T* dst = gs + buf * GD_ROWS * GD_LD;
        const int valid = re - r0, x = 8 * (tid % CH);
        const bool col_ok = c0 + x < out;
#pragma unroll
        for (int i = 0; i < GD_ROWS / STEP; ++i) {
            const int row = tid / CH + i * STEP;
            const bool ok = row < valid && col_ok;
            mma16::cp_async16(dst + row * GD_LD + x, g + (ok ? (size_t)(r0 + row) * out + c0 + x : 0), ok);
        }
        load_ranks(ls + buf * GD_ROWS * RLD, low + (size_t)r0 * r, GD_ROWS, valid);
    };
    float db[4][2 * NP][4];
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
        for (int nt = 0; nt < 2 * NP; ++nt) db[mt][nt][0] = db[mt][nt][1] = db[mt][nt][2] = db[mt][nt][3] = 0.f;
    load_ranks(bs, b + (size_t)c0 * r, GD_COLS, out - c0);
    load_stage(0, rb);
    mma16::cp_async_commit();
    // B's fragments of the chunk's 16 k-steps: read from shared memory once and kept for one pair
    // of n-tiles (64 registers), read at every stage for two.
    auto b_frag = [&](uint32_t* f, int ks, int np) {
        mma16::ldsm4_trans(f, bs + (ks * 16 + lane % 8 + 8 * ((lane / 8) % 2)) * RLD + np * 16 + 8 * (lane / 16));
    };
    constexpr bool B_IN_REGS = NP == 1;
    uint32_t bkept[B_IN_REGS ? GD_COLS / 16 : 1][4];
    int buf = 0;
    for (int r0 = rb; r0 < re; r0 += GD_ROWS, buf ^= 1) {
        if (r0 + GD_ROWS < re) load_stage(buf ^ 1, r0 + GD_ROWS);
        mma16::cp_async_commit();
        mma16::cp_async_wait_newer<1>();
        __syncthreads();
        if constexpr (B_IN_REGS)
            if (r0 == rb)
#pragma unroll
                for (int ks = 0; ks < GD_COLS / 16; ++ks) b_frag(bkept[ks], ks, 0);
        const T* gt = gs + buf * GD_ROWS * GD_LD;
        const T* lt = ls + buf * GD_ROWS * RLD;
        float dl[2 * NP][4];
#pragma unroll
        for (int nt = 0; nt < 2 * NP; ++nt) dl[nt][0] = dl[nt][1] = dl[nt][2] = dl[nt][3] = 0.f;
#pragma unroll
        for (int ks = 0; ks < GD_COLS / 16; ++ks) {
            uint32_t a[4];
            mma16::ldsm4(a, gt + (warp * 16 + lane % 8 + 8 * ((lane / 8) % 2)) * GD_LD + ks * 16 + 8 * (lane / 16));
#pragma unroll
            for (int np = 0; np < NP; ++np) {
                uint32_t loaded[4];
                const uint32_t* bf = loaded;
                if constexpr (B_IN_REGS)
                    bf = bkept[ks];
                else
                    b_frag(loaded, ks, np);
                mma16::mma<T>(dl[2 * np], a, bf[0], bf[1]);
                mma16::mma<T>(dl[2 * np + 1], a, bf[2], bf[3]);
            }
        }
        float* pd = pdlow + (size_t)blockIdx.x * m * r;
#pragma unroll
        for (int nt = 0; nt < 2 * NP; ++nt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = r0 + warp * 16 + gq + 8 * h, n = nt * 8 + 2 * t;
                if (row < re && n < r)
                    *reinterpret_cast<float2*>(pd + (size_t)row * r + n) = make_float2(dl[nt][2 * h], dl[nt][2 * h + 1]);
            }
#pragma unroll
        for (int ks = 0; ks < GD_ROWS / 16; ++ks) {
            uint32_t lf[NP][4];
#pragma unroll
            for (int np = 0; np < NP; ++np)
                mma16::ldsm4_trans(lf[np], lt + (ks * 16 + lane % 8 + 8 * ((lane / 8) % 2)) * RLD + np * 16 + 8 * (lane / 16));
#pragma unroll
            for (int mt = 0; mt < 4; ++mt) {
                uint32_t a[4];
                mma16::ldsm4_trans(a, gt + (ks * 16 + lane % 8 + 8 * (lane / 16)) * GD_LD + warp * 64 + mt * 16 + 8 * ((lane / 8) % 2));
#pragma unroll
                for (int np = 0; np < NP; ++np) {
                    mma16::mma<T>(db[mt][2 * np], a, lf[np][0], lf[np][1]);
                    mma16::mma<T>(db[mt][2 * np + 1], a, lf[np][2], lf[np][3]);
                }
            }
        }
        __syncthreads();
    }
    float* pb = pdb + (size_t)blockIdx.y * out * r;
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
        for (int nt = 0; nt < 2 * NP; ++nt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int col = c0 + warp * 64 + mt * 16 + gq + 8 * h, n = nt * 8 + 2 * t;
                if (col < out && n < r)
                    *reinterpret_cast<float2*>(pb + (size_t)col * r + n) = make_float2(db[mt][nt][2 * h], db[mt][nt][2 * h + 1]);
            }
}

#define DOWN_INST(T, S, NT, WARPS)                                                                        \
    extern "C" __global__ void __launch_bounds__(WARPS * 32)                                              \
        lora_down_nt##NT##_##S(const T* x, const T* a, T* low, int m, int in, int r, uint64_t kk,         \
                               uint32_t thresh, float scale) {                                            \
        G4FT_KERNEL_ENTRY();                                                                              \
        lora_down<T, NT, WARPS>(x, a, low, m, in, r, kk, thresh, scale);                                  \
    }
#define DXDA_INST(T, S, KS, ACC, NAME)                                                                    \
    extern "C" __global__ void __launch_bounds__(128)                                                     \
        lora_dx_da_ks##KS##_##NAME##_##S(const T* x, const T* dlow, const T* a, T* dx, float* part, int m,    \
                                         int in, int r, int split_rows, uint64_t kk, uint32_t thresh,     \
                                         float scale) {                                                   \
        G4FT_KERNEL_ENTRY();                                                                              \
        lora_dx_da<T, KS, ACC>(x, dlow, a, dx, part, m, in, r, split_rows, kk, thresh, scale);            \
    }
#define DXDA_BOTH(T, S, KS) DXDA_INST(T, S, KS, false, set) DXDA_INST(T, S, KS, true, add)
#define DLOW_DB_INST(T, S, NP)                                                                            \
    extern "C" __global__ void __launch_bounds__(128)                                                     \
        lora_dlow_db_np##NP##_##S(const T* g, const T* b, const T* low, float* pdlow, float* pdb, int m,  \
                                  int out, int r, int split_rows) {                                       \
        G4FT_KERNEL_ENTRY();                                                                              \
        lora_dlow_db<T, NP>(g, b, low, pdlow, pdb, m, out, r, split_rows);                                \
    }
#define UP_ADD_INST(T, S, KS)                                                                             \
    extern "C" __global__ void __launch_bounds__(128)                                                     \
        lora_up_add_ks##KS##_##S(T* y, const T* low, const T* b, int m, int n, int r, float scale) {      \
        G4FT_KERNEL_ENTRY();                                                                              \
        lora_up<T, KS, 1>(y, nullptr, nullptr, low, b, nullptr, nullptr, m, n, r, scale, 0.f, true);      \
    }
#define UP_GEGLU_INST(T, S, KS)                                                                           \
    extern "C" __global__ void __launch_bounds__(128)                                                     \
        lora_up_geglu_ks##KS##_##S(T* gate, T* up, T* act, const T* low_g, const T* b_g, const T* low_u,  \
                                   const T* b_u, int m, int n, int r, float s_g, float s_u,               \
                                   int store_sums) {                                                      \
        G4FT_KERNEL_ENTRY();                                                                              \
        lora_up<T, KS, 2>(gate, up, act, low_g, b_g, low_u, b_u, m, n, r, s_g, s_u, store_sums != 0);     \
    }
// Warps per lora_down block: 32 / 32 / 16 / 8 for NT = 1 / 2 / 4 / 8 (64 / 64 / 80 / 138 registers).
#define LORA_INST(T, S)                                                                                   \
    DOWN_INST(T, S, 1, 32) DOWN_INST(T, S, 2, 32) DOWN_INST(T, S, 4, 16) DOWN_INST(T, S, 8, 8)            \
    DXDA_BOTH(T, S, 1) DXDA_BOTH(T, S, 2) DXDA_BOTH(T, S, 3) DXDA_BOTH(T, S, 4)                            \
    DLOW_DB_INST(T, S, 1) DLOW_DB_INST(T, S, 2)                                                           \
    UP_ADD_INST(T, S, 1) UP_ADD_INST(T, S, 2) UP_ADD_INST(T, S, 3) UP_ADD_INST(T, S, 4)                    \
    UP_GEGLU_INST(T, S, 1) UP_GEGLU_INST(T, S, 2) UP_GEGLU_INST(T, S, 3) UP_GEGLU_INST(T, S, 4)
LORA_INST(__nv_bfloat16, bf16)
LORA_INST(__half, f16)

#define FINISH_INST(O, S)                                                                                 \
    extern "C" __global__ void lora_sum_splits_##S(const float* part0, O* out0, int splits0, size_t n0,        \
                                                   float scale0, const float* part1, O* out1, int splits1,     \
                                                   size_t n1, float scale1) {                                  \
        G4FT_KERNEL_ENTRY();                                                                                   \
        lora_sum_splits<O>(part0, out0, splits0, n0, scale0, part1, out1, splits1, n1, scale1);                \
    }
G4FT_FLOAT_TYPES(FINISH_INST)
