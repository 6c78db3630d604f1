// The LoRA dropout's keep bits (definition and rationale: src/dropout.rs), shared by the dropout
// kernels and the adapter kernels that apply the mask while they read their input
// (kernels/lora.cu). Element pair j (elements 2j, 2j + 1) of the masked tensor draws
// h = mix64(kk + j·GAMMA), SplitMix64's output j for the folded key kk.
#pragma once
#include <cstdint>

#define GAMMA 0x9E3779B97F4A7C15ull

__device__ __forceinline__ uint64_t mix64(uint64_t z) {
    z += GAMMA;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Whether the two elements of the pair that drew h are kept: hi32(h) >> 8 and lo32(h) >> 8
// against thresh.
__device__ __forceinline__ void keep_bits(uint64_t h, uint32_t thresh, bool& k0, bool& k1) {
    k0 = ((uint32_t)(h >> 32) >> 8) >= thresh;
    k1 = ((uint32_t)h >> 8) >= thresh;
}

// Whether elements 2j and 2j + 1 are kept.
__device__ __forceinline__ void keep_pair(uint64_t kk, uint64_t j, uint32_t thresh, bool& k0, bool& k1) {
    keep_bits(mix64(kk + j * GAMMA), thresh, k0, k1);
}
