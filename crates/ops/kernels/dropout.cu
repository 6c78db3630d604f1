// LoRA dropout with a counter-based mask (CPU reference and the full rationale: src/dropout.rs).
// The host folds the key into one word, kk = mix(k0 ^ mix(k1 ^ mix(k2))), mix = SplitMix64's
// finaliser. Elements 2j and 2j+1 share h = mix(kk + j*GAMMA) (output j of SplitMix64 seeded with
// kk): element 2j draws r = hi32(h) >> 8, element 2j+1 r = lo32(h) >> 8, and is kept iff
// r >= thresh = round(p * 2^24). One finaliser per two elements; each thread owns one pair per
// grid-stride step and advances its SplitMix64 state by stride*GAMMA (no multiply in the loop).
// No state: the same key replays the same mask (recompute, backward), and the CPU computes
// identical bits. Kept elements are scaled by 1/(1-p) (fp32, one rounding).
#include "common.cuh"
#include "dropout_keep.cuh"

// Grid-stride walk over the element pairs of an n-element tensor: body(i, keep_i, keep_i1) for the
// pair (i, i + 1), i = 2j; keep_i1 is meaningless when i + 1 == n (the caller checks i + 1 < n).
template <typename F>
__device__ __forceinline__ void for_pairs(size_t n, uint64_t kk, uint32_t thresh, F body) {
    size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const size_t pairs = (n + 1) / 2;
    uint64_t s = kk + (uint64_t)j * GAMMA;
    const uint64_t ds = (uint64_t)stride * GAMMA;
    for (; j < pairs; j += stride, s += ds) {
        bool k0, k1;
        keep_bits(mix64(s), thresh, k0, k1);
        body(2 * j, k0, k1);
    }
}

// Two adjacent elements, loaded and stored as one access when both pointers allow it.
template <typename T> struct alignas(2 * sizeof(T)) Pair { T a, b; };

template <typename T> __device__ __forceinline__ bool pair_aligned(const void* p, const void* q) {
    return (((uintptr_t)p | (uintptr_t)q) % sizeof(Pair<T>)) == 0;
}

extern "C" __global__ void dropout_mask(uint8_t* out, size_t n, uint64_t kk, uint32_t thresh) {
    G4FT_KERNEL_ENTRY();
    for_pairs(n, kk, thresh, [&](size_t i, bool k0, bool k1) {
        out[i] = k0;
        if (i + 1 < n) out[i + 1] = k1;
    });
}

// Grid-stride walk over 16-byte packs of P = 16/sizeof(T) elements (P/2 pairs, the same draws as
// for_pairs): pack(i, keep) for elements i..i+P with keep[e] for element i+e; then the elements
// after the last whole pack (fewer than P) as pairs, pair(i, keep_i, keep_i1), one per thread of
// the first threads. For 16-byte aligned operands.
template <typename T, typename F, typename G>
__device__ __forceinline__ void for_packs(size_t n, uint64_t kk, uint32_t thresh, F pack, G pair) {
    constexpr int P = 16 / sizeof(T);
    const size_t packs = n / P;
    const size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t q = tid; q < packs; q += stride) {
        bool keep[P];
        uint64_t s = kk + (uint64_t)(q * (P / 2)) * GAMMA;
#pragma unroll
        for (int p = 0; p < P / 2; ++p, s += GAMMA) keep_bits(mix64(s), thresh, keep[2 * p], keep[2 * p + 1]);
        pack(q * P, keep);
    }
    const size_t first = packs * (P / 2), pairs = (n + 1) / 2;
    if (tid < pairs - first) {
        const size_t j = first + tid;
        bool k0, k1;
        keep_pair(kk, j, thresh, k0, k1);
        pair(2 * j, k0, k1);
    }
}

// y = keep ? r(x * scale) : 0.
template <typename T>
__device__ void dropout_apply(const T* x, T* y, size_t n, uint64_t kk, uint32_t thresh, float scale) {
    auto f = [&](T v, bool k) { return from_f32<T>(k ? to_f32(v) * scale : 0.f); };
    auto scalar = [&](size_t i, bool k0, bool k1) {
        y[i] = f(x[i], k0);
        if (i + 1 < n) y[i + 1] = f(x[i + 1], k1);
    };
    if (aligned16(x) && aligned16(y)) {
        constexpr int P = 16 / sizeof(T);
        auto pack = [&](size_t i, const bool* keep) {
            float v[P];
            load_n<T, P>(x + i, v);
#pragma unroll
            for (int e = 0; e < P; ++e) v[e] = keep[e] ? v[e] * scale : 0.f;
            store_n<T, P>(y + i, v);
        };
        for_packs<T>(n, kk, thresh, pack, scalar);
        return;
    }
    const bool vec = pair_aligned<T>(x, y);
    for_pairs(n, kk, thresh, [&](size_t i, bool k0, bool k1) {
        if (vec && i + 1 < n) {
            const Pair<T> v = *reinterpret_cast<const Pair<T>*>(x + i);
            *reinterpret_cast<Pair<T>*>(y + i) = Pair<T>{f(v.a, k0), f(v.b, k1)};
        } else {
            scalar(i, k0, k1);
        }
    });
}

// dx = keep ? r(dx + t * scale) : dx, one fp32 fma and one rounding; dropped elements keep their
// value (a bf16/f16/f32 value survives the round trip through fp32 exactly).
template <typename T>
__device__ void dropout_acc(const T* t, T* dx, size_t n, uint64_t kk, uint32_t thresh, float scale) {
    auto f = [&](T d, T v, bool k) { return k ? from_f32<T>(fmaf(to_f32(v), scale, to_f32(d))) : d; };
    auto scalar = [&](size_t i, bool k0, bool k1) {
        if (k0) dx[i] = f(dx[i], t[i], true);
        if (k1 && i + 1 < n) dx[i + 1] = f(dx[i + 1], t[i + 1], true);
    };
    if (aligned16(t) && aligned16(dx)) {
        constexpr int P = 16 / sizeof(T);
        auto pack = [&](size_t i, const bool* keep) {
            float tv[P], dv[P];
            load_n<T, P>(t + i, tv);
            load_n<T, P>(dx + i, dv);
#pragma unroll
            for (int e = 0; e < P; ++e) dv[e] = keep[e] ? fmaf(tv[e], scale, dv[e]) : dv[e];
            store_n<T, P>(dx + i, dv);
        };
        for_packs<T>(n, kk, thresh, pack, scalar);
        return;
    }
    const bool vec = pair_aligned<T>(t, dx);
    for_pairs(n, kk, thresh, [&](size_t i, bool k0, bool k1) {
        if (!k0 && !k1) return;
        if (vec && i + 1 < n) {
            const Pair<T> v = *reinterpret_cast<const Pair<T>*>(t + i);
            Pair<T>* p = reinterpret_cast<Pair<T>*>(dx + i);
            const Pair<T> d = *p;
            *p = Pair<T>{f(d.a, v.a, k0), f(d.b, v.b, k1)};
        } else {
            scalar(i, k0, k1);
        }
    });
}

#define INST(T, S)                                                                                   \
    extern "C" __global__ void dropout_##S(const T* x, T* y, size_t n, uint64_t kk, uint32_t thresh, \
                                           float scale) {                                            \
        G4FT_KERNEL_ENTRY();                                                                         \
        dropout_apply<T>(x, y, n, kk, thresh, scale);                                                \
    }                                                                                                \
    extern "C" __global__ void dropout_acc_##S(const T* t, T* dx, size_t n, uint64_t kk,             \
                                               uint32_t thresh, float scale) {                       \
        G4FT_KERNEL_ENTRY();                                                                         \
        dropout_acc<T>(t, dx, n, kk, thresh, scale);                                                 \
    }
G4FT_FLOAT_TYPES(INST)
