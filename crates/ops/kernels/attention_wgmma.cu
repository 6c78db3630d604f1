// Fused attention kernels on Hopper's warpgroup MMA (sm_90a) for 16-bit inputs: the forward and
// the backward's dQ kernel at head dims 256 and 512, and its dK / dV kernel at head dim 256
// (described where it is defined; head dim 512 keeps the mma.sync one: docs/benchmarks.md, "Measured
// and not kept").
//
// Forward: attention_flash.cu's scheme (one pass over the visible keys with an online softmax, the
// grouped query rows of one (batch, kv head) slab, the same masks, O and lse; the per-tile softmax
// is flash_tile.cuh, shared with it) with the two products as warpgroup-wide `wgmma`s: S = Q·Kᵀ
// reads Q and K straight from shared memory, O += P·V takes P from registers and V from shared
// memory, so no ldmatrix feeds the tensor cores (wgmma.cuh: the swizzled tile layout).
// Host side: src/attention_cuda.rs (`flash_fwd` / `flash_bwd`, `AttentionPlan::wgmma`); CPU
// reference: src/attention.rs.
//
// A block is 2 warpgroups (256 threads). Head dim 256 (DSPLIT = 1): each warpgroup owns 64 of the
// block's 128 query rows and all of O's columns. Head dim 512 (DSPLIT = 2; a 64 × 512 fp32 O would
// not fit one warpgroup's registers): both own the same 64 rows, each multiplies its half of the
// head dim for S and they add the halves through shared memory (the same fp32 sums in both), each
// runs the softmax on the whole S and accumulates its half of O's columns.
// Keys come in tiles of 64 rows through shared memory (cp.async). Head dim 256 double-buffers K
// and V and runs two tiles at once: while tile i's scores go through the softmax on the CUDA
// cores, tile i − 1's O += P·V runs on the tensor cores (FlashAttention-3's intra-warpgroup
// overlap), so K of tile i + 1 and V of tile i load during tile i. Head dim 512 has one K and one V
// buffer (the next K tile loads during P·V, the V tile during Q·Kᵀ).
//
// dQ: attention_flash_bwd.cu's dQ kernel (the forward's block shape over the key tiles its rows
// see; the dS of a tile is flash_bwd_tile.cuh, shared with it) with S = Q·Kᵀ and dP = dO·Vᵀ read
// from shared memory and dQ += dS·K taking dS from registers and K (read down its rows) from
// shared memory. Keys per tile: 64 at head dim 256, 32 at 512 (Q, dO, K and V tiles fill 192 KiB
// either way). Head dim 256 adds a second K buffer (224 KiB), so the next K tile loads during this
// one; the next V tile loads once this tile's dP is in. At head dim 512 the warpgroups split S and
// dP by halves of the head dim as the forward splits S, and each accumulates half of dQ's columns.
#include "common.cuh"
#include "flash_bwd_tile.cuh"
#include "flash_tile.cuh"
#include "grouped_rows.cuh"
#include "mma.cuh"
#include "wgmma.cuh"

namespace flash_wg {

using flash_tile::BC;
using flash_tile::ST;
constexpr int THREADS = 256;

template <typename T, int D, int DSPLIT, int STAGES>
__device__ __forceinline__ void fwd(const T* q, const T* k, const T* v, const uint8_t* mask,
                                    const uint32_t* seq_start, T* o, float* lse, float scale, int nh,
                                    int g, int t, int window) {
    constexpr int ROWG = 2 / DSPLIT, BR = ROWG * 64;  // 64-row groups, query rows per block
    constexpr int DW = D / DSPLIT;                    // O columns of one warpgroup
    constexpr int NACC = DW / 2;                      // their fp32 accumulators per thread
    constexpr int TILE = BC * D;                      // elements of a K or V tile
    static_assert(DW % 128 == 0 && (STAGES == 2) == (DSPLIT == 1), "block shape");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    // The swizzled tiles need a 1024-byte aligned base (the host adds the slack).
    T* const sq = reinterpret_cast<T*>(smem_raw + ((1024 - mma16::smem_addr(smem_raw) % 1024) % 1024));
    T* const sk0 = sq + BR * D;  // stage s: K at sk0 + 2·s·TILE, V after it
    float* const xs = reinterpret_cast<float*>(sk0 + 2 * STAGES * TILE);  // DSPLIT 2: the S halves
    __shared__ uint8_t skm[BC];

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wgi = warp / 4;
    const int rowg = DSPLIT == 1 ? wgi : 0, part = DSPLIT == 1 ? 0 : wgi;
    const int rw = rowg * 4 + warp % 4;  // the warp's 16-row group in the block
    const GroupedRows<BR> gr(nh, g, t);
    const int rows = gr.rows, r0 = gr.r0, qlo = gr.qlo, qhi = gr.qhi;
    const uint32_t* srow = gr.batch_row(seq_start, t);
    auto seq_of = [&](int qi) { return srow ? (int)srow[min(qi, t - 1)] : 0; };
    const int klo = gr.first_key(window, srow);
    const T *kslab = gr.slab_row0(k, t, D), *vslab = gr.slab_row0(v, t, D);
    const uint8_t* mrow = gr.batch_row(mask, t);

    wg::load_rows<T, D, BR, THREADS>(sq, rows - r0, [&](int r) { return q + gr.head_row(r0 + r, nh, g, t) * D; });
    wg::load_tile<T, D, BC, THREADS>(sk0, kslab + (size_t)klo * D, t - klo);
    mma16::cp_async_commit();

    const int ra = r0 + rw * 16 + lane / 4, rb = ra + 8;
    const int qa = ra / g, qb = rb / g;
    const float sl2 = scale * G4FT_LOG2E;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    float acc[NACC];
#pragma unroll
    for (int i = 0; i < NACC; ++i) acc[i] = 0.f;
    // The scores of the tile at j0 once their product is in: masked unless the tile is interior.
    auto mask_scores = [&](float (*s)[4], int j0, bool no_pad) {
        if (!flash_tile::interior(no_pad, j0, qlo, qhi, window, seq_of))
            flash_tile::mask(s, j0, qa, qb, seq_of(qa), seq_of(qb), window, skm, lane);
    };
    uint32_t pa[BC / 16][4];

    if constexpr (STAGES == 2) {
        // Tile i's K and V go to stage i % 2; K of tile i + 1 and V of tile i load during tile i,
        // and O += P·V of tile i − 1 runs on the tensor cores while tile i's scores go through the
        // softmax (O's rescale, when the max moves, waits for that product).
        int it = 0;
        uint8_t mv = flash_tile::key_byte(mrow, klo, t);  // the key mask, read a tile ahead
        for (int j0 = klo; j0 <= qhi; j0 += BC, ++it) {
            T* const sk = sk0 + (it & 1) * 2 * TILE;
            const bool more = j0 + BC <= qhi;
            if (more) wg::load_tile<T, D, BC, THREADS>(sk0 + ((it + 1) & 1) * 2 * TILE, kslab + (size_t)(j0 + BC) * D, t - j0 - BC);
            wg::load_tile<T, D, BC, THREADS>(sk + TILE, vslab + (size_t)j0 * D, t - j0);
            mma16::cp_async_commit();
            bool no_pad = flash_tile::store_key_mask(skm, mv, j0, qhi);
            if (more) mv = flash_tile::key_byte(mrow, j0 + BC, t);
            mma16::cp_async_wait_newer<1>();  // this tile's K and the last tile's V are in
            wg::fence_shared_for_async();
            no_pad = __syncthreads_and(no_pad);

            float s[ST][4];
            wg::rows_times_rows<T, D, BR, BC>(&s[0][0], sq, rowg * 64, sk);
            if (it > 0) {  // the last tile's O += P·V behind this tile's S = Q·Kᵀ
                wg::accumulate_async<T, BC, BC, DW>(acc, pa, sk0 + ((it - 1) & 1) * 2 * TILE + TILE, 0);
                wg::wait<1>();
            } else {
                wg::wait<0>();
            }
            wg::pin<ST * 4>(&s[0][0]);
            mask_scores(s, j0, no_pad);
            float alpha[2];
            const bool moved = flash_tile::softmax_tile(s, m, l, alpha, sl2);
            wg::wait<0>();
            wg::pin<NACC>(acc);
            if (moved) flash_tile::rescale<NACC>(acc, alpha);
            mma16::a_fragments<T, BC>(s, pa);
            __syncthreads();  // every warp is done with this K, the last V and the key mask
        }
        // The last tile's P·V. The loop ran at least once: a block's first query sees itself, so
        // klo <= qlo <= qhi.
        mma16::cp_async_wait_all();  // the last tile's V
        wg::fence_shared_for_async();
        __syncthreads();
        wg::accumulate<T, BC, BC, DW>(acc, pa, sk0 + ((it - 1) & 1) * 2 * TILE + TILE, 0);
    } else {
        // One K and one V buffer: the next K tile loads during P·V, the V tile during Q·Kᵀ.
        for (int j0 = klo; j0 <= qhi; j0 += BC) {
            T* const sk = sk0;
            T* const sv = sk + TILE;
            bool no_pad = flash_tile::load_key_mask(skm, mrow, j0, t, qhi);
            mma16::cp_async_wait_all();
            wg::fence_shared_for_async();
            no_pad = __syncthreads_and(no_pad);  // also: this K tile is in, the last P·V is done
            wg::load_tile<T, D, BC, THREADS>(sv, vslab + (size_t)j0 * D, t - j0);
            mma16::cp_async_commit();

            // S = Q·Kᵀ: each warpgroup multiplies its half of the head dim, then they add the halves.
            float s[ST][4];
            wg::rows_times_rows<T, D / DSPLIT, BR, BC>(&s[0][0], sq, rowg * 64, sk, part * (D / DSPLIT));
            wg::wait<0>();
            wg::pin<ST * 4>(&s[0][0]);
            if constexpr (DSPLIT == 2) wg::sum_halves<ST * 4>(&s[0][0], xs, part);
            mask_scores(s, j0, no_pad);
            flash_tile::online_softmax<NACC>(s, m, l, acc, sl2);
            mma16::a_fragments<T, BC>(s, pa);

            mma16::cp_async_wait_all();
            wg::fence_shared_for_async();
            __syncthreads();  // V is in; every warp is done with this K tile
            if (j0 + BC <= qhi) wg::load_tile<T, D, BC, THREADS>(sk, kslab + (size_t)(j0 + BC) * D, t - j0 - BC);
            mma16::cp_async_commit();

            // O += P·V for the warpgroup's columns.
            wg::accumulate<T, BC, BC, DW>(acc, pa, sv, part * (DW / 64));
        }
    }

    // Normalise, stage the warp's 16 rows in shared memory (plain rows of D + 8 elements over the
    // tiles, once every warpgroup is done reading them; its own columns when split), store
    // 16-byte packs.
    __syncthreads();
    float inv[2];
    flash_tile::finish_sums(l, inv);
    constexpr int LD = D + 8;
    mma16::store_rows<T, D, DW / 8>(reinterpret_cast<const float(*)[4]>(acc), inv[0], inv[1], sq + rw * 16 * LD,
                                   part, lane, [&](int r) -> T* {
                                       const int R = r0 + rw * 16 + r;
                                       return R < rows ? o + gr.head_row(R, nh, g, t) * D : nullptr;
                                   });
    if (part == 0) flash_tile::store_lse(lse, gr, ra, m, l, nh, g, t, lane);
}

template <typename T, int D, int DSPLIT, int BC>
__device__ __forceinline__ void dq(const T* q, const T* k, const T* v, const T* dout, const float* lse,
                                   const float* dd, const uint8_t* mask, const uint32_t* seq_start, T* dqo,
                                   float scale, int nh, int g, int t, int window) {
    constexpr int ROWG = 2 / DSPLIT, BR = ROWG * 64;  // 64-row groups, query rows per block
    constexpr int DW = D / DSPLIT, NACC = DW / 2;     // dQ columns of one warpgroup, accumulators
    constexpr int NT = BC / 8;                        // S / dP n-tiles
    constexpr int TILE = BC * D;
    constexpr int KSTAGES = DSPLIT == 1 ? 2 : 1;  // K buffers (shared memory: 224 KiB at head dim 256)
    static_assert(DW % 128 == 0, "block shape");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* const sq = reinterpret_cast<T*>(smem_raw + ((1024 - mma16::smem_addr(smem_raw) % 1024) % 1024));
    T* const sdo = sq + BR * D;
    T* const sk0 = sdo + BR * D;  // K buffer s at sk0 + s·TILE
    T* const sv = sk0 + KSTAGES * TILE;
    float* const xs = reinterpret_cast<float*>(sv + TILE);  // DSPLIT 2: the S and dP halves
    __shared__ uint8_t skm[BC];

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wgi = warp / 4;
    const int rowg = DSPLIT == 1 ? wgi : 0, part = DSPLIT == 1 ? 0 : wgi;
    const int rw = rowg * 4 + warp % 4;
    const GroupedRows<BR> gr(nh, g, t);
    const int rows = gr.rows, r0 = gr.r0, qlo = gr.qlo, qhi = gr.qhi;
    const uint32_t* srow = gr.batch_row(seq_start, t);
    const int klo = gr.first_key(window, srow);
    const T *kslab = gr.slab_row0(k, t, D), *vslab = gr.slab_row0(v, t, D);
    const uint8_t* mrow = gr.batch_row(mask, t);
    auto load_k = [&](int j0, int it) {
        wg::load_tile<T, D, BC, THREADS>(sk0 + (it % KSTAGES) * TILE, kslab + (size_t)j0 * D, t - j0);
    };
    auto load_v = [&](int j0) { wg::load_tile<T, D, BC, THREADS>(sv, vslab + (size_t)j0 * D, t - j0); };
    wg::load_rows<T, D, BR, THREADS>(sq, rows - r0, [&](int r) { return q + gr.head_row(r0 + r, nh, g, t) * D; });
    wg::load_rows<T, D, BR, THREADS>(sdo, rows - r0, [&](int r) { return dout + gr.head_row(r0 + r, nh, g, t) * D; });
    if (KSTAGES == 2) {
        load_k(klo, 0);
        load_v(klo);
    }
    mma16::cp_async_commit();
    const flash_bwd_tile::RowPair rp = flash_bwd_tile::row_pair(gr, r0 + rw * 16 + lane / 4, lse, dd, srow, nh, g, t);
    float acc[NACC];
#pragma unroll
    for (int i = 0; i < NACC; ++i) acc[i] = 0.f;
    // S and dP: at head dim 512 each warpgroup multiplies its half of the head dim and they add
    // the halves.
    constexpr int DSPAN = D / DSPLIT;
    const int col0 = part * DSPAN;
    // dS of the tile at j0 from S and dP (in), then dQ += dS·K for the warpgroup's columns (K read
    // down its rows).
    auto accumulate_ds = [&](float (*s)[4], float (*dp)[4], const T* sk, int j0) {
        if constexpr (DSPLIT == 2) {
            wg::sum_halves<NT * 4>(&s[0][0], xs, part);
            wg::sum_halves<NT * 4>(&dp[0][0], xs + 2 * NT * 4 * 128, part);
        }
        uint32_t fa[BC / 16][4];
        flash_bwd_tile::ds_fragments<T, BC>(s, dp, fa, rp, j0, window, skm, scale, lane);
        wg::accumulate<T, BC, BC, DW>(acc, fa, sk, part * (DW / 64));
    };
    uint8_t mv = flash_tile::key_byte(mrow, klo, t);  // the key mask, read a tile ahead
    int it = 0;
    for (int j0 = klo; j0 <= qhi; j0 += BC, ++it) {
        const bool more = j0 + BC <= qhi;
        float s[NT][4], dp[NT][4];
        if constexpr (KSTAGES == 2) {
            // The next tile's K loads during this whole tile, its V from when this tile's dP is in.
            mma16::cp_async_wait_all();  // this tile's K and V are in
            wg::fence_shared_for_async();
            __syncthreads();  // ... for every warp, and every warp is done with the last tile
            T* const sk = sk0 + (it % 2) * TILE;
            if (more) {
                load_k(j0 + BC, it + 1);
                mma16::cp_async_commit();
            }
            flash_tile::store_key_mask(skm, mv, j0, qhi);
            if (more) mv = flash_tile::key_byte(mrow, j0 + BC, t);
            wg::rows_times_rows<T, DSPAN, BR, BC>(&s[0][0], sq, rowg * 64, sk, col0);
            wg::rows_times_rows<T, DSPAN, BR, BC>(&dp[0][0], sdo, rowg * 64, sv, col0);
            wg::wait<0>();
            wg::pin<NT * 4>(&s[0][0]);
            wg::pin<NT * 4>(&dp[0][0]);
            __syncthreads();  // every warp is done with V; the key mask is in
            if (more) {
                load_v(j0 + BC);
                mma16::cp_async_commit();
            }
            accumulate_ds(s, dp, sk, j0);
        } else {
            // One K buffer: the tile's K and V load at its start, S starts once K is in.
            __syncthreads();  // every warp is done with the last tile's K, V and key mask
            load_k(j0, 0);
            mma16::cp_async_commit();
            load_v(j0);
            mma16::cp_async_commit();
            flash_tile::store_key_mask(skm, mv, j0, qhi);
            if (more) mv = flash_tile::key_byte(mrow, j0 + BC, t);
            mma16::cp_async_wait_newer<1>();  // Q, dO and K are in
            wg::fence_shared_for_async();
            __syncthreads();
            wg::rows_times_rows<T, DSPAN, BR, BC>(&s[0][0], sq, rowg * 64, sk0, col0);
            mma16::cp_async_wait_all();
            wg::fence_shared_for_async();
            __syncthreads();  // V is in
            wg::rows_times_rows<T, DSPAN, BR, BC>(&dp[0][0], sdo, rowg * 64, sv, col0);
            wg::wait<0>();
            wg::pin<NT * 4>(&s[0][0]);
            wg::pin<NT * 4>(&dp[0][0]);
            accumulate_ds(s, dp, sk0, j0);
        }
    }

    // dQ rounded to T, staged in shared memory once every warpgroup is done reading it.
    __syncthreads();
    constexpr int LD = D + 8;
    mma16::store_rows<T, D, DW / 8>(reinterpret_cast<const float(*)[4]>(acc), 1.f, 1.f, sq + rw * 16 * LD, part,
                                   lane, [&](int r) -> T* {
                                       const int R = r0 + rw * 16 + r;
                                       return R < rows ? dqo + gr.head_row(R, nh, g, t) * D : nullptr;
                                   });
}

// dK / dV at head dim 256 (attention_flash_bwd.cu's kv kernel on wgmma): a block owns 64 keys of
// one slab and walks the query rows that see them, 64 rows per tile (Q and dO double-buffered:
// the next tile loads during this one), for the group's query heads [m0, m0 + g / hsplit). The
// two warpgroups split the work: warpgroup 0 computes Sᵀ = K·Qᵀ, turns it into Pᵀ (fp32, masked),
// hands Pᵀ to warpgroup 1 through shared memory and accumulates dV += Pᵀ·dO; warpgroup 1 computes
// dPᵀ = V·dOᵀ, forms dSᵀ = scale·Pᵀ∘(dPᵀ − D) and accumulates dK += dSᵀ·Q. Each holds one 64 × 256
// fp32 accumulator (128 registers a thread).
template <typename T, int D>
__device__ __forceinline__ void kv(const T* q, const T* k, const T* v, const T* dout, const float* lse,
                                   const float* dd, const uint8_t* mask, const uint32_t* seq_start, T* dk, T* dv,
                                   float* dk32, float* dv32, float scale, int nh, int g, int t, int window) {
    constexpr int BC = 64, BR = 64, NT = BR / 8, NACC = D / 2, TILE = 64 * D;
    static_assert(D == 256, "one 64 × D accumulator per warpgroup");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* const sk = reinterpret_cast<T*>(smem_raw + ((1024 - mma16::smem_addr(smem_raw) % 1024) % 1024));
    T* const sv = sk + TILE;
    T* const sq0 = sv + TILE;  // stage s: Q at sq0 + 2·s·TILE, dO after it
    float* const xch = reinterpret_cast<float*>(sq0 + 4 * TILE);  // Pᵀ, [NT·4][128] fp32
    float* const rowv = xch + NT * 4 * 128;  // per stage: lse, D, query index, seq start
    __shared__ uint8_t skm[BC];

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wgi = warp / 4, wt = threadIdx.x % 128;
    const flash_bwd_tile::KeyBlock kb(BC, nh, g, t, window, seq_start);
    const int slab = kb.slab, j0 = kb.j0;

    wg::load_tile<T, D, BC, THREADS>(sk, k + ((size_t)slab * t + j0) * D, t - j0);
    wg::load_tile<T, D, BC, THREADS>(sv, v + ((size_t)slab * t + j0) * D, t - j0);
    bool keys_full = kb.load_key_mask<BC>(skm, mask);
    // The Q / dO rows and row values of the tile at r0 into stage st (the caller commits).
    auto load_q = [&](int r0, int st) {
        T* const sq = sq0 + 2 * st * TILE;
        kb.load_rows<T, D, BR, THREADS>(sq, sq + TILE, q, dout, r0, [](int r, int ch) { return wg::sw128_chunk<BR>(r, ch); });
        kb.load_row_values<BR>(rowv + st * 4 * BR, lse, dd, r0);
    };
    if (kb.rbeg < kb.rend && !kb.past_seq(kb.rbeg)) load_q(kb.rbeg, 0);
    mma16::cp_async_commit();  // K, V and the first tile
    keys_full = __syncthreads_and(keys_full);

    float acc[NACC];  // warpgroup 0: dV, 1: dK (keys 16·(warp % 4) + lane / 4 (+8), columns by n-tile)
#pragma unroll
    for (int i = 0; i < NACC; ++i) acc[i] = 0.f;
    const float sl2 = scale * G4FT_LOG2E;
    const int kr = (warp % 4) * 16 + lane / 4;  // the thread's first key row in the block
    for (int r0 = kb.rbeg, it = 0; r0 < kb.rend && !kb.past_seq(r0); r0 += BR, ++it) {
        const int st = it & 1;
        const int nxt = r0 + BR;
        mma16::cp_async_wait_all();  // this tile (and K, V) is in
        wg::fence_shared_for_async();
        // Every thread's copies of this tile are in, and every warp is done with the last tile:
        // its stage takes the next tile (it loads during this one) and Pᵀ's buffer is free.
        __syncthreads();
        if (nxt < kb.rend && !kb.past_seq(nxt)) {
            load_q(nxt, st ^ 1);
            mma16::cp_async_commit();
        }
        T* const sq = sq0 + 2 * st * TILE;
        T* const sdo = sq + TILE;
        const float* const rv = rowv + st * 4 * BR;
        const int* const rqi = reinterpret_cast<const int*>(rv) + 2 * BR;
        const int* const rst = rqi + BR;
        const bool inside = kb.interior<BR>(rv, r0, keys_full, window);

        // Sᵀ (warpgroup 0) or dPᵀ (warpgroup 1): the block's 64 keys times the tile's 64 rows.
        float s[NT][4];
        wg::rows_times_rows<T, D, BC, BR>(&s[0][0], wgi == 0 ? sk : sv, 0, wgi == 0 ? sq : sdo);
        wg::wait<0>();
        wg::pin<NT * 4>(&s[0][0]);

        // Warpgroup 0: Pᵀ = exp2(Sᵀ·scale·log2(e) − lse) where visible, handed over in fp32; warpgroup
        // 1: dSᵀ = scale·Pᵀ∘(dPᵀ − D). Each rounds its operand into the A fragments of its product.
        if (wgi == 0) {
            // Interior tiles (most of them) skip the per-element visibility test.
            auto p_of = [&](bool masked) {
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int jl = kr + 8 * (e / 2), c = nt * 8 + 2 * (lane % 4) + (e & 1);
                        const bool ok = !masked || (rqi[c] >= 0 && flash_bwd_tile::visible(j0 + jl, rqi[c], rst[c],
                                                                                       window, skm[jl]));
                        s[nt][e] = ok ? ex2_ftz(fmaf(s[nt][e], sl2, -(rv[c] * G4FT_LOG2E))) : 0.f;
                        xch[(nt * 4 + e) * 128 + wt] = s[nt][e];
                    }
            };
            if (inside)
                p_of(false);
            else
                p_of(true);
        }
        // Pᵀ handed over: warpgroup 0 arrives and goes on, warpgroup 1 waits for it.
        if (wgi == 0)
            asm volatile("bar.arrive 1, 256;\n" ::: "memory");
        else
            asm volatile("bar.sync 1, 256;\n" ::: "memory");
        if (wgi == 1) {
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int c = nt * 8 + 2 * (lane % 4) + (e & 1);
                    s[nt][e] = scale * xch[(nt * 4 + e) * 128 + wt] * (s[nt][e] - rv[BR + c]);
                }
        }
        uint32_t fa[BR / 16][4];
        mma16::a_fragments<T, BR>(s, fa);

        // dV += Pᵀ·dO (warpgroup 0) or dK += dSᵀ·Q (warpgroup 1), dO / Q read down their rows.
        wg::accumulate<T, BR, BR, D>(acc, fa, wgi == 0 ? sdo : sq, 0);
    }

    // dV (warpgroup 0) or dK (warpgroup 1) of the block's keys: rounded to T, or stored in this
    // split's fp32 partials.
    T* const out = wgi == 0 ? dv : dk;
    float* const out32 = wgi == 0 ? dv32 : dk32;
    const size_t split = (size_t)kb.split * gridDim.y * t * D;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int j = j0 + kr + 8 * h;
        if (j >= t) continue;
        const size_t row = ((size_t)slab * t + j) * D;
#pragma unroll
        for (int nt = 0; nt < D / 8; ++nt) {
            const int c = nt * 8 + 2 * (lane % 4);
            const float x = acc[nt * 4 + 2 * h], y = acc[nt * 4 + 2 * h + 1];
            if (out32)
                *reinterpret_cast<float2*>(out32 + split + row + c) = make_float2(x, y);
            else
                *reinterpret_cast<uint32_t*>(out + row + c) = mma16::pack2<T>(x, y);
        }
    }
}

}  // namespace flash_wg

// Entry points attn_wgmma_fwd_d{D}_{bf16,f16}: 256 threads, grid (ceil(t·g / ROWS), b·nkv) with
// ROWS = 128 query rows per block at head dim 256 and 64 at 512, dynamic shared memory
// (ROWS·D + 2·STAGES·64·D)·2 + 1024 bytes (STAGES = 2 at 256, 1 at 512: 197,632 bytes either way;
// the 1024 align the tiles), and at 512 32,768 more for the S halves. The host mirrors this in
// `flash_fwd`.
#define WGMMA_FWD(T, S, D, DSPLIT, STAGES)                                                           \
    extern "C" __global__ void __launch_bounds__(256, 1)                                             \
        attn_wgmma_fwd_d##D##_##S(const T* q, const T* k, const T* v, const uint8_t* mask,           \
                                  const uint32_t* seq_start, T* o, float* lse, float scale, int nh,  \
                                  int g, int t, int window) {                                        \
        G4FT_KERNEL_ENTRY();                                                                         \
        flash_wg::fwd<T, D, DSPLIT, STAGES>(q, k, v, mask, seq_start, o, lse, scale, nh, g, t,       \
                                            window);                                                 \
    }
// attn_wgmma_bwd_q_d{D}_{bf16,f16}: 256 threads, grid (ceil(t·g / ROWS), b·nkv) (ROWS as the
// forward's), dynamic shared memory (2·ROWS·D + (KSTAGES + 1)·BC·D)·2 + 1024 bytes with BC = 64 and
// KSTAGES = 2 at head dim 256 (230,400 bytes), BC = 32 and KSTAGES = 1 at 512 (197,632 bytes, and
// 32,768 more for the S and dP halves).
#define WGMMA_BWD_Q(T, S, D, DSPLIT, BC)                                                             \
    extern "C" __global__ void __launch_bounds__(256, 1) attn_wgmma_bwd_q_d##D##_##S(                \
        const T* q, const T* k, const T* v, const T* dout, const float* lse, const float* dd,        \
        const uint8_t* mask, const uint32_t* seq_start, T* dq, float scale, int nh, int g, int t,    \
        int window) {                                                                                \
        G4FT_KERNEL_ENTRY();                                                                         \
        flash_wg::dq<T, D, DSPLIT, BC>(q, k, v, dout, lse, dd, mask, seq_start, dq, scale, nh, g, t, \
                                       window);                                                      \
    }
// attn_wgmma_bwd_kv_d256_{bf16,f16}: 256 threads, grid (ceil(t / 64), b·nkv, hsplit) as the mma.sync
// kernel's, dynamic shared memory 6·64·256·2 (K, V, two Q / dO stages) + 32·128·4 (the Pᵀ
// hand-over) + 2·4·64·4 (row values) + 1024 = 216,064 bytes; dk32 / dv32 as the mma.sync kernel's.
#define WGMMA_BWD_KV(T, S)                                                                            \
    extern "C" __global__ void __launch_bounds__(256, 1) attn_wgmma_bwd_kv_d256_##S(                 \
        const T* q, const T* k, const T* v, const T* dout, const float* lse, const float* dd,        \
        const uint8_t* mask, const uint32_t* seq_start, T* dk, T* dv, float* dk32, float* dv32,      \
        float scale, int nh, int g, int t, int window) {                                             \
        G4FT_KERNEL_ENTRY();                                                                         \
        flash_wg::kv<T, 256>(q, k, v, dout, lse, dd, mask, seq_start, dk, dv, dk32, dv32, scale, nh, \
                             g, t, window);                                                          \
    }
#define WGMMA_KERNELS(T, S)                                                                          \
    WGMMA_FWD(T, S, 256, 1, 2) WGMMA_FWD(T, S, 512, 2, 1) WGMMA_BWD_Q(T, S, 256, 1, 64)              \
    WGMMA_BWD_Q(T, S, 512, 2, 32) WGMMA_BWD_KV(T, S)
WGMMA_KERNELS(__nv_bfloat16, bf16)
WGMMA_KERNELS(__half, f16)
