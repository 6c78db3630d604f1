// Fused AdamW over flat fp32 buffers and the L2 norm of clip_grad_norm_ (CPU: src/optim.rs).
// torch.optim.AdamW (single-tensor, no amsgrad) with the clip coefficient read from device
// memory (no host sync): g = grad * clip; p *= 1 - lr*wd; m = lerp(m, g, 1 - beta1);
// v = v*beta2 + (1 - beta2)*g*g; p += -step_size * (m / (sqrt(v) / bc2_sqrt + eps)) (torch's CUDA
// addcdiv order; the CPU divides -step_size*m instead, as torch's CPU addcdiv does).
// Explicit _rn intrinsics stop nvcc from contracting into FMAs, so the moments are bit-identical to
// the CPU's (sqrt and division are IEEE in both) and the parameters an ulp apart at most.
#include "common.cuh"

extern "C" __global__ void adamw_f32(float* p, const float* g, float* m, float* v, const float* clip,
                                     size_t n, float decay, float w1, float beta2, float one_m_beta2,
                                     float eps, float step_size, float bc2_sqrt) {
    G4FT_KERNEL_ENTRY();
    float c = *clip;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float gi = __fmul_rn(g[i], c);
        float pi = __fmul_rn(p[i], decay);
        float mi = m[i];
        mi = w1 < 0.5f ? __fadd_rn(mi, __fmul_rn(w1, __fsub_rn(gi, mi)))
                       : __fsub_rn(gi, __fmul_rn(__fsub_rn(gi, mi), __fsub_rn(1.f, w1)));
        float vi = __fadd_rn(__fmul_rn(v[i], beta2), __fmul_rn(__fmul_rn(one_m_beta2, gi), gi));
        float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), bc2_sqrt), eps);
        p[i] = __fadd_rn(pi, __fmul_rn(-step_size, __fdiv_rn(mi, denom)));
        m[i] = mi;
        v[i] = vi;
    }
}

// The norm of clip_grad_norm_ without a host sync: per-block partial sums of g^2 (grid-stride), then
// one block sums the partials in a fixed order (deterministic) and writes out[0] = the norm.
extern "C" __global__ void sumsq_partial_f32(const float* g, float* partial, size_t n) {
    G4FT_KERNEL_ENTRY();
    float s = 0.f;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float x = g[i];
        s += x * x;
    }
    s = block_sum(s);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

extern "C" __global__ void norm_finish_f32(const float* partial, int nparts, float* out) {
    G4FT_KERNEL_ENTRY();
    float s = 0.f;
    for (int i = threadIdx.x; i < nparts; i += blockDim.x) s += partial[i];
    s = block_sum(s);
    if (threadIdx.x == 0) out[0] = sqrtf(s);
}
