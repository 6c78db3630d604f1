// Swap of axes 1 and 2 of a contiguous 4-D tensor, (b, a, c, d) -> (b, c, a, d), contiguous output
// (CPU reference: src/transpose.rs). The rows of d elements stay contiguous: each thread moves 16
// bytes when d·sizeof(T) is a multiple of 16 (the heads of Gemma 4: d = 256 / 512), else elements.
#include "common.cuh"

template <typename T>
__device__ void swap12(const T* x, T* y, int b, int a, int c, int d) {
    size_t rows = (size_t)b * a * c;
    if ((d * sizeof(T)) % 16 == 0) {
        int vec = 16 / sizeof(T), per_row = d / vec;
        const uint4* xv = reinterpret_cast<const uint4*>(x);
        uint4* yv = reinterpret_cast<uint4*>(y);
        for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < rows * per_row;
             e += (size_t)gridDim.x * blockDim.x) {
            size_t r = e / per_row, k = e % per_row;
            size_t ic = r % c, ia = (r / c) % a, ib = r / ((size_t)c * a);
            yv[((ib * c + ic) * a + ia) * per_row + k] = xv[e];
        }
        return;
    }
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < rows * d;
         e += (size_t)gridDim.x * blockDim.x) {
        size_t r = e / d, k = e % d;
        size_t ic = r % c, ia = (r / c) % a, ib = r / ((size_t)c * a);
        y[((ib * c + ic) * a + ia) * d + k] = x[e];
    }
}

#define INST(T, S)                                                                                   \
    extern "C" __global__ void swap12_##S(const T* x, T* y, int b, int a, int c, int d) {            \
        G4FT_KERNEL_ENTRY();                                                                         \
        swap12<T>(x, y, b, a, c, d);                                                                 \
    }
G4FT_FLOAT_TYPES(INST)
