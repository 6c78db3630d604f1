// LoRA dropout with a counter-based mask (CPU reference: src/dropout.rs): element i of a tensor is
// kept iff (mix(k0 ^ mix(k1 ^ mix(k2 ^ mix(i)))) >> 40) >= thresh, mix = SplitMix64's finaliser,
// thresh = round(p * 2^24). No state: the same key replays the same mask (recompute, backward), and
// the CPU computes identical bits. Kept elements are scaled by 1/(1-p) (fp32, one rounding).
#include "common.cuh"

__device__ __forceinline__ uint64_t mix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

__device__ __forceinline__ bool keep(uint64_t k0, uint64_t k1, uint64_t k2, uint64_t i, uint32_t thresh) {
    return (uint32_t)(mix64(k0 ^ mix64(k1 ^ mix64(k2 ^ mix64(i)))) >> 40) >= thresh;
}

extern "C" __global__ void dropout_mask(uint8_t* out, size_t n, uint64_t k0, uint64_t k1, uint64_t k2,
                                        uint32_t thresh) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = keep(k0, k1, k2, i, thresh) ? 1 : 0;
}

template <typename T>
__device__ void dropout_apply(const T* x, T* y, size_t n, uint64_t k0, uint64_t k1, uint64_t k2,
                              uint32_t thresh, float scale) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = from_f32<T>(keep(k0, k1, k2, i, thresh) ? to_f32(x[i]) * scale : 0.f);
}

#define INST(T, S)                                                                                   \
    extern "C" __global__ void dropout_##S(const T* x, T* y, size_t n, uint64_t k0, uint64_t k1,     \
                                           uint64_t k2, uint32_t thresh, float scale) {              \
        dropout_apply<T>(x, y, n, k0, k1, k2, thresh, scale);                                        \
    }
G4FT_FLOAT_TYPES(INST)
