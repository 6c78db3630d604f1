// Fused softcap + cross-entropy over one chunk of logits (CPU reference: src/cross_entropy.rs).
// Softcap rounds like the reference in the logits dtype T: z = r(r(tanh(r(l*inv_cap))) * cap),
// dz/dl = 1 - tanh^2 (cap <= 0: no softcap, z = l). One block per row of v logits.
//   ce_stats: stats[row] = {loss_row, lse}; loss_row = lse - z[target], 0 for ignored targets
//             (u32::MAX; targets >= v are treated as ignored too: no host check on the GPU).
//   ce_grad:  logits[row, j] <- r((softmax(z)_j - [j == target]) * dz_j), 0 for ignored rows (in place).
// 16-bit logits with v % 8 == 0 take a packed path (16-byte loads / stores of 8 logits, exp as one
// fma + ex2, tanh from the SFU): its approximations (relative error < 2^-10) are below the
// rounding of z to T that follows; fp32 logits keep tanhf / expf, the parity reference's numerics.
#include "common.cuh"

__device__ __forceinline__ float ce_tanh(float x) {
    float y;
    asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// Whether a T-typed [rows, v] tensor at `p` takes the packed path (every row 16-byte aligned).
template <typename T> __device__ __forceinline__ bool ce_packed(const T* p, int v) {
    return sizeof(T) == 2 && v % 8 == 0 && aligned16(p);
}

// z and dz/dl of one logit; FAST (the packed path) takes tanh from the SFU, same roundings.
template <typename T, bool FAST = false>
__device__ __forceinline__ float cap_z(float l, float cap, float inv_cap, float* dz) {
    if (cap <= 0.f) { *dz = 1.f; return l; }
    const float x = round_to<T>(l * inv_cap);
    const float th = FAST ? ce_tanh(x) : tanhf(x);
    *dz = 1.f - th * th;
    return round_to<T>(round_to<T>(th) * cap);
}

template <typename T>
__device__ void ce_stats(const T* logits, const uint32_t* targets, float* stats, int v, float cap,
                         float inv_cap) {
    size_t row = blockIdx.x;
    const T* l = logits + row * v;
    float m = -INFINITY, s = 0.f, dz;
    if (ce_packed<T>(logits, v)) {
        // Per pack of 8: its max, one rescale of the running sum when the max grows, 8 exponentials.
        for (int j = threadIdx.x * 8; j < v; j += blockDim.x * 8) {
            float z[8];
            load_n<T, 8>(l + j, z);
            float pm = -INFINITY;
#pragma unroll
            for (int k = 0; k < 8; ++k) {
                z[k] = cap_z<T, true>(z[k], cap, inv_cap, &dz);
                pm = fmaxf(pm, z[k]);
            }
            if (pm > m) {
                s = m == -INFINITY ? 0.f : s * ex2_ftz((m - pm) * G4FT_LOG2E);
                m = pm;
            }
            const float ml2 = m * G4FT_LOG2E;
#pragma unroll
            for (int k = 0; k < 8; ++k) s += ex2_ftz(fmaf(z[k], G4FT_LOG2E, -ml2));
        }
    } else {
        for (int j = threadIdx.x; j < v; j += blockDim.x) {
            float z = cap_z<T>(to_f32(l[j]), cap, inv_cap, &dz);
            if (z > m) { s = s * expf(m - z) + 1.f; m = z; }
            else s += expf(z - m);
        }
    }
    float gm = block_max(m);
    s = (m == -INFINITY) ? 0.f : s * expf(m - gm);
    s = block_sum(s);
    if (threadIdx.x == 0) {
        float lse = gm + logf(s);
        uint32_t t = targets[row];
        float loss = 0.f;
        if (t < (uint32_t)v) {
            const float lt = to_f32(l[t]);  // z[target] exactly as the sum above saw it
            loss = lse - (ce_packed<T>(logits, v) ? cap_z<T, true>(lt, cap, inv_cap, &dz)
                                                  : cap_z<T>(lt, cap, inv_cap, &dz));
        }
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
    if (ce_packed<T>(logits, v)) {
        const float ll2 = lse * G4FT_LOG2E;
        for (int j = threadIdx.x * 8; j < v; j += blockDim.x * 8) {
            float x[8];
            load_n<T, 8>(l + j, x);
#pragma unroll
            for (int k = 0; k < 8; ++k) {
                float z = cap_z<T, true>(x[k], cap, inv_cap, &dz);
                x[k] = valid ? (ex2_ftz(fmaf(z, G4FT_LOG2E, -ll2)) - (j + k == (int)t ? 1.f : 0.f)) * dz : 0.f;
            }
            store_n<T, 8>(l + j, x);
        }
        return;
    }
    for (int j = threadIdx.x; j < v; j += blockDim.x) {
        float z = cap_z<T>(to_f32(l[j]), cap, inv_cap, &dz);
        float d = valid ? (expf(z - lse) - (j == (int)t ? 1.f : 0.f)) * dz : 0.f;
        l[j] = from_f32<T>(d);
    }
}

#define INST(T, S)                                                                                   \
    extern "C" __global__ void ce_stats_##S(const T* logits, const uint32_t* targets, float* stats,  \
                                            int v, float cap, float inv_cap) {                       \
        G4FT_KERNEL_ENTRY();                                                                         \
        ce_stats<T>(logits, targets, stats, v, cap, inv_cap);                                        \
    }                                                                                                \
    extern "C" __global__ void ce_grad_##S(T* logits, const uint32_t* targets, const float* stats,   \
                                           int v, float cap, float inv_cap) {                        \
        G4FT_KERNEL_ENTRY();                                                                         \
        ce_grad<T>(logits, targets, stats, v, cap, inv_cap);                                         \
    }
G4FT_FLOAT_TYPES(INST)
