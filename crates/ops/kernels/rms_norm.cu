// Gemma RMSNorm kernels, forward and backward, one warp or one block per row (the row math:
// rms_norm_row.cuh; CPU reference: src/rms_norm.rs).
#include "rms_norm_row.cuh"

// The row of this thread's group (rows of a warp-per-row block are consecutive), or -1 past the end.
template <bool WARP> __device__ __forceinline__ long long group_row(int rows) {
    long long row = WARP ? (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5) : blockIdx.x;
    return row < rows ? row : -1;
}

template <typename T, bool WARP>
__device__ void rms_norm_fwd(const T* x, const T* w, const T* res, T* y, int rows, int d, float eps) {
    long long row = group_row<WARP>(rows);
    if (row < 0) return;  // a whole warp (warp layout) or block (block layout): no barrier skipped
    x += row * d;
    y += row * d;
    if (res) res += row * d;
    constexpr int P = 16 / sizeof(T);
    if (packed<T>(d, x, w, res, y)) fwd_row<T, P, WARP>(x, w, res, y, d, eps);
    else fwd_row<T, 1, WARP>(x, w, res, y, d, eps);
}

template <typename T, bool WARP>
__device__ void rms_norm_bwd(const T* x, const T* w, const T* g, const T* res, T* dx, int rows, int d,
                             float eps) {
    long long row = group_row<WARP>(rows);
    if (row < 0) return;
    x += row * d;
    g += row * d;
    dx += row * d;
    if (res) res += row * d;
    constexpr int P = 16 / sizeof(T);
    if (packed<T>(d, x, w, g, dx) && aligned16(res)) bwd_row<T, P, WARP>(x, w, g, res, dx, d, eps);
    else bwd_row<T, 1, WARP>(x, w, g, res, dx, d, eps);
}

#define INST_LAYOUT(T, S, L, WARP)                                                                   \
    extern "C" __global__ void rms_norm_fwd_##L##S(const T* x, const T* w, const T* res, T* y,       \
                                                   int rows, int d, float eps) {                     \
        G4FT_KERNEL_ENTRY();                                                                         \
        rms_norm_fwd<T, WARP>(x, w, res, y, rows, d, eps);                                           \
    }                                                                                                \
    extern "C" __global__ void rms_norm_bwd_##L##S(const T* x, const T* w, const T* g, const T* res, \
                                                   T* dx, int rows, int d, float eps) {              \
        G4FT_KERNEL_ENTRY();                                                                         \
        rms_norm_bwd<T, WARP>(x, w, g, res, dx, rows, d, eps);                                       \
    }
// rms_norm_{fwd,bwd}_warp_<T>: one warp per row; rms_norm_{fwd,bwd}_<T>: one block per row.
#define INST(T, S) INST_LAYOUT(T, S, warp_, true) INST_LAYOUT(T, S, , false)
G4FT_FLOAT_TYPES(INST)
