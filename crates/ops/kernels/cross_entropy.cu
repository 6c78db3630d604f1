// Fused softcap + cross-entropy over one chunk of logits (CPU reference: src/cross_entropy.rs).
// Softcap rounds like the reference in the logits dtype T: z = r(r(tanh(r(l*inv_cap))) * cap),
// dz/dl = 1 - tanh^2 (cap <= 0: no softcap, z = l). One block per row of v logits.
//   ce_stats: stats[row] = {loss_row, lse}; loss_row = lse - z[target], 0 for ignored targets
//             (u32::MAX; targets >= v are treated as ignored too: no host check on the GPU).
//   ce_grad:  logits[row, j] <- r((softmax(z)_j - [j == target]) * dz_j), 0 for ignored rows (in place).
#include "common.cuh"

template <typename T>
__device__ __forceinline__ float cap_z(float l, float cap, float inv_cap, float* dz) {
    if (cap <= 0.f) { *dz = 1.f; return l; }
    float th = tanhf(round_to<T>(l * inv_cap));
    *dz = 1.f - th * th;
    return round_to<T>(round_to<T>(th) * cap);
}

template <typename T>
__device__ void ce_stats(const T* logits, const uint32_t* targets, float* stats, int v, float cap,
                         float inv_cap) {
    size_t row = blockIdx.x;
    const T* l = logits + row * v;
    float m = -INFINITY, s = 0.f, dz;
    for (int j = threadIdx.x; j < v; j += blockDim.x) {
        float z = cap_z<T>(to_f32(l[j]), cap, inv_cap, &dz);
        if (z > m) { s = s * expf(m - z) + 1.f; m = z; }
        else s += expf(z - m);
    }
    float gm = block_max(m);
    s = (m == -INFINITY) ? 0.f : s * expf(m - gm);
    s = block_sum(s);
    if (threadIdx.x == 0) {
        float lse = gm + logf(s);
        uint32_t t = targets[row];
        float loss = 0.f;
        if (t < (uint32_t)v) loss = lse - cap_z<T>(to_f32(l[t]), cap, inv_cap, &dz);
        stats[2 * row] = loss;
        stats[2 * row + 1] = lse;
    }
}

template <typename T>
__device__ void ce_grad(T* logits, const uint32_t* targets, const float* stats, int v, float cap,
                        float inv_cap) {
    size_t row = blockIdx.x;
    T* l = logits + row * v;
    uint32_t t = targets[row];
    bool valid = t < (uint32_t)v;
    float lse = stats[2 * row + 1], dz;
    for (int j = threadIdx.x; j < v; j += blockDim.x) {
        float z = cap_z<T>(to_f32(l[j]), cap, inv_cap, &dz);
        float d = valid ? (expf(z - lse) - (j == (int)t ? 1.f : 0.f)) * dz : 0.f;
        l[j] = from_f32<T>(d);
    }
}

#define INST(T, S)                                                                                   \
    extern "C" __global__ void ce_stats_##S(const T* logits, const uint32_t* targets, float* stats,  \
                                            int v, float cap, float inv_cap) {                       \
        ce_stats<T>(logits, targets, stats, v, cap, inv_cap);                                        \
    }                                                                                                \
    extern "C" __global__ void ce_grad_##S(T* logits, const uint32_t* targets, const float* stats,   \
                                           int v, float cap, float inv_cap) {                        \
        ce_grad<T>(logits, targets, stats, v, cap, inv_cap);                                         \
    }
G4FT_FLOAT_TYPES(INST)
