// GeGLU gelu_tanh(gate) * up, forward and backward (CPU reference: src/geglu.rs).
// Rounding as PyTorch/transformers: a = r(gelu_f32(gate)), y = r(a * up).
// Backward: dgate = r(r(g*up) * gelu'(gate)), dup = r(g * a), into two buffers (the halves of one
// packed (2, n) buffer, or gate and up themselves: each thread reads its element before writing it).
// geglu_halves_*: the same per element on rows that hold [gate | up] side by side.
#include "common.cuh"
#include "geglu_elem.cuh"

// Both kernels walk 16-byte packs of P = 16/sizeof(T) elements when every operand is 16-byte
// aligned, then (or otherwise) single elements from `start` on; grid-stride.

template <typename T>
__device__ void geglu_fwd(const T* gate, const T* up, T* y, size_t n) {
    constexpr int P = 16 / sizeof(T);
    const size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t start = 0;
    if (aligned16(gate) && aligned16(up) && aligned16(y)) {
        const size_t packs = n / P;
        for (size_t q = tid; q < packs; q += stride) {
            float gv[P], uv[P];
            load_n<T, P>(gate + q * P, gv);
            load_n<T, P>(up + q * P, uv);
#pragma unroll
            for (int e = 0; e < P; ++e) gv[e] = geglu_y<T>(gv[e], uv[e]);
            store_n<T, P>(y + q * P, gv);
        }
        start = packs * P;
    }
    for (size_t i = start + tid; i < n; i += stride) {
        y[i] = from_f32<T>(geglu_y<T>(to_f32(gate[i]), to_f32(up[i])));
    }
}

template <typename T>
__device__ void geglu_bwd(const T* gate, const T* up, const T* g, T* dgate, T* dup, size_t n) {
    constexpr int P = 16 / sizeof(T);
    const size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t start = 0;
    if (aligned16(gate) && aligned16(up) && aligned16(g) && aligned16(dgate) && aligned16(dup)) {
        const size_t packs = n / P;
        for (size_t q = tid; q < packs; q += stride) {
            float x[P], u[P], gv[P], dg[P], du[P];
            load_n<T, P>(gate + q * P, x);
            load_n<T, P>(up + q * P, u);
            load_n<T, P>(g + q * P, gv);
#pragma unroll
            for (int e = 0; e < P; ++e) geglu_d<T>(x[e], u[e], gv[e], dg[e], du[e]);
            store_n<T, P>(dgate + q * P, dg);
            store_n<T, P>(dup + q * P, du);
        }
        start = packs * P;
    }
    for (size_t i = start + tid; i < n; i += stride) {
        float dg, du;
        geglu_d<T>(to_f32(gate[i]), to_f32(up[i]), to_f32(g[i]), dg, du);
        dgate[i] = from_f32<T>(dg);
        dup[i] = from_f32<T>(du);
    }
}

// The row-halves forms, for a (rows, 2·cols) buffer whose rows hold [gate | up] (the MoE experts'
// gate_up product): y (rows, cols) = gelu(gate)·up, and the backward writes [d(gate) | d(up)] rows
// into a (rows, 2·cols) buffer from the gradient g (rows, cols). Packs when cols is a multiple of P
// and the buffers are 16-byte aligned, else single elements; grid-stride over (row, column).
template <typename T>
__device__ void geglu_halves_fwd(const T* gu, T* y, size_t rows, int cols) {
    constexpr int P = 16 / sizeof(T);
    const size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const int w = cols % P == 0 && aligned16(gu) && aligned16(y) ? P : 1;  // elements per step
    const int per_row = cols / w;
    for (size_t q = tid; q < rows * per_row; q += stride) {
        const size_t r = q / per_row, c = (q % per_row) * w;
        const T* gate = gu + r * 2 * cols + c;
        if (w == P) {
            float gv[P], uv[P];
            load_n<T, P>(gate, gv);
            load_n<T, P>(gate + cols, uv);
#pragma unroll
            for (int e = 0; e < P; ++e) gv[e] = geglu_y<T>(gv[e], uv[e]);
            store_n<T, P>(y + r * cols + c, gv);
        } else {
            y[r * cols + c] = from_f32<T>(geglu_y<T>(to_f32(gate[0]), to_f32(gate[cols])));
        }
    }
}

template <typename T>
__device__ void geglu_halves_bwd(const T* gu, const T* g, T* dgu, size_t rows, int cols) {
    constexpr int P = 16 / sizeof(T);
    const size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const int w = cols % P == 0 && aligned16(gu) && aligned16(g) && aligned16(dgu) ? P : 1;
    const int per_row = cols / w;
    for (size_t q = tid; q < rows * per_row; q += stride) {
        const size_t r = q / per_row, c = (q % per_row) * w;
        const T* gate = gu + r * 2 * cols + c;
        T* dgate = dgu + r * 2 * cols + c;
        if (w == P) {
            float x[P], u[P], gv[P], dg[P], du[P];
            load_n<T, P>(gate, x);
            load_n<T, P>(gate + cols, u);
            load_n<T, P>(g + r * cols + c, gv);
#pragma unroll
            for (int e = 0; e < P; ++e) geglu_d<T>(x[e], u[e], gv[e], dg[e], du[e]);
            store_n<T, P>(dgate, dg);
            store_n<T, P>(dgate + cols, du);
        } else {
            float dg, du;
            geglu_d<T>(to_f32(gate[0]), to_f32(gate[cols]), to_f32(g[r * cols + c]), dg, du);
            dgate[0] = from_f32<T>(dg);
            dgate[cols] = from_f32<T>(du);
        }
    }
}

#define INST(T, S)                                                                                   \
    extern "C" __global__ void geglu_fwd_##S(const T* gate, const T* up, T* y, size_t n) {           \
        G4FT_KERNEL_ENTRY();                                                                         \
        geglu_fwd<T>(gate, up, y, n);                                                                \
    }                                                                                                \
    extern "C" __global__ void geglu_bwd_##S(const T* gate, const T* up, const T* g, T* dgate,       \
                                             T* dup, size_t n) {                                     \
        G4FT_KERNEL_ENTRY();                                                                         \
        geglu_bwd<T>(gate, up, g, dgate, dup, n);                                                    \
    }                                                                                                \
    extern "C" __global__ void geglu_halves_fwd_##S(const T* gu, T* y, size_t rows, int cols) {      \
        G4FT_KERNEL_ENTRY();                                                                         \
        geglu_halves_fwd<T>(gu, y, rows, cols);                                                      \
    }                                                                                                \
    extern "C" __global__ void geglu_halves_bwd_##S(const T* gu, const T* g, T* dgu, size_t rows,    \
                                                    int cols) {                                      \
        G4FT_KERNEL_ENTRY();                                                                         \
        geglu_halves_bwd<T>(gu, g, dgu, rows, cols);                                                 \
    }
G4FT_FLOAT_TYPES(INST)
