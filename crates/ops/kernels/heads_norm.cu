// Attention's per-head input transform, one warp per head row (host side: src/heads_norm.rs).
// Forward: head row (bi, ti, hi) of a raw projection x (b, t, n, d) is RMSNormed (optional frozen
// weight w) by rms_norm_row.cuh's fwd_row into the warp's shared-memory row, as rms_norm stores it,
// then rotated by rope_rotate.cuh into row (bi, hi, ti) of y (b, n, t, d) with cos / sin (bc, t, d),
// bc = b or 1; without cos the normed row is written to y directly.
// Backward: row (bi, hi, ti) of dy (b, n, t, d) goes through the rotation's transpose into shared
// memory, as rope's backward stores it (without cos: dy itself), then bwd_row against the raw row,
// with the optional extra gradient `res` of x added, writes dx (b, t, n, d).
// The same bits as rms_norm (warp kernels) + swap12 + rope: the same row arithmetic in the same
// order, the same packs (16 bytes where the row bytes and every operand allow) and roundings.
// bf16 / f16, d even, d <= 1024; 8 warps per block, 8·d elements of T of dynamic shared memory.
#include "rms_norm_row.cuh"
#include "rope_rotate.cuh"

// Element offsets of one head row: in x / dx (b, t, n, d), in y / dy (b, n, t, d), in cos / sin.
struct HeadRow {
    size_t flat, heads, table;
};

__device__ __forceinline__ HeadRow head_row(long long row, int t, int n, int d, int cos_b) {
    const long long bi = row / ((long long)t * n), ti = (row / n) % t, hi = row % n;
    return {(size_t)row * d, (size_t)((bi * n + hi) * t + ti) * d, (size_t)((cos_b == 1 ? 0 : bi) * t + ti) * d};
}

// The rotation (or its transpose) of the d-element row src into dst, the warp's lanes over units
// of N pairs.
template <typename T, int N>
__device__ void rotate_row(const T* src, const T* cos, const T* sin, T* dst, int d, bool backward) {
    const int half = d / 2;
    for (int k = (threadIdx.x & 31) * N; k < half; k += 32 * N)
        rope_unit<T, N>(src + k, cos + k, sin + k, dst + k, half, backward);
}

// rotate_row in 16-byte packs when the half rows and all four rows allow it (rope's rule).
template <typename T>
__device__ __forceinline__ void rotate(const T* src, const T* cos, const T* sin, T* dst, int d, bool backward) {
    constexpr int P = 16 / sizeof(T);
    if (((d / 2) * sizeof(T)) % 16 == 0 && aligned16(src) && aligned16(cos) && aligned16(sin) && aligned16(dst))
        rotate_row<T, P>(src, cos, sin, dst, d, backward);
    else
        rotate_row<T, 1>(src, cos, sin, dst, d, backward);
}

// This warp's head row, or -1 past the end; its shared-memory row of d elements.
template <typename T> __device__ __forceinline__ long long warp_row(int rows, int d, T** scratch) {
    extern __shared__ __align__(16) unsigned char heads_smem[];
    const int warp = threadIdx.x >> 5;
    *scratch = reinterpret_cast<T*>(heads_smem) + (size_t)warp * d;
    const long long row = (long long)blockIdx.x * (blockDim.x >> 5) + warp;
    return row < rows ? row : -1;
}

template <typename T>
__device__ void heads_norm_rope_fwd(const T* x, const T* w, const T* cos, const T* sin, T* y, int rows, int t, int n,
                                    int d, int cos_b, float eps) {
    T* scratch;
    const long long row = warp_row<T>(rows, d, &scratch);
    if (row < 0) return;
    const HeadRow at = head_row(row, t, n, d, cos_b);
    const T* xr = x + at.flat;
    T* normed = cos ? scratch : y + at.heads;
    constexpr int P = 16 / sizeof(T);
    if (packed<T>(d, xr, w, nullptr, normed)) fwd_row<T, P, true>(xr, w, nullptr, normed, d, eps);
    else fwd_row<T, 1, true>(xr, w, nullptr, normed, d, eps);
    if (!cos) return;
    __syncwarp();
    rotate<T>(normed, cos + at.table, sin + at.table, y + at.heads, d, false);
}

template <typename T>
__device__ void heads_norm_rope_bwd(const T* x, const T* w, const T* cos, const T* sin, const T* dy, const T* res,
                                    T* dx, int rows, int t, int n, int d, int cos_b, float eps) {
    T* scratch;
    const long long row = warp_row<T>(rows, d, &scratch);
    if (row < 0) return;
    const HeadRow at = head_row(row, t, n, d, cos_b);
    const T* g = dy + at.heads;
    if (cos) {
        rotate<T>(g, cos + at.table, sin + at.table, scratch, d, true);
        __syncwarp();
        g = scratch;
    }
    const T* xr = x + at.flat;
    const T* rr = res ? res + at.flat : nullptr;
    T* dxr = dx + at.flat;
    constexpr int P = 16 / sizeof(T);
    if (packed<T>(d, xr, w, g, dxr) && aligned16(rr)) bwd_row<T, P, true>(xr, w, g, rr, dxr, d, eps);
    else bwd_row<T, 1, true>(xr, w, g, rr, dxr, d, eps);
}

#define INST(T, S)                                                                                          \
    extern "C" __global__ void __launch_bounds__(256)                                                       \
        heads_norm_rope_fwd_##S(const T* x, const T* w, const T* cos, const T* sin, T* y, int rows, int t,  \
                                int n, int d, int cos_b, float eps) {                                       \
        G4FT_KERNEL_ENTRY();                                                                                \
        heads_norm_rope_fwd<T>(x, w, cos, sin, y, rows, t, n, d, cos_b, eps);                               \
    }                                                                                                       \
    extern "C" __global__ void __launch_bounds__(256)                                                       \
        heads_norm_rope_bwd_##S(const T* x, const T* w, const T* cos, const T* sin, const T* dy,            \
                                const T* res, T* dx, int rows, int t, int n, int d, int cos_b, float eps) { \
        G4FT_KERNEL_ENTRY();                                                                                \
        heads_norm_rope_bwd<T>(x, w, cos, sin, dy, res, dx, rows, t, n, d, cos_b, eps);                     \
    }
// bf16 / f16 only: in f32 the compiler's fma contraction may differ from the separate kernels'
// by an ulp, and f32 runs the composite.
INST(__nv_bfloat16, bf16)
INST(__half, f16)
