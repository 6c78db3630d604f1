// Rotary embedding, half-split layout (rotate_half), forward and backward (CPU reference: src/rope.rs).
// x (b, h, t, d); cos/sin (bc, t, d) with bc = b or 1. One thread per rotated pair (k, k + d/2).
// Forward, rounding like the reference (products and sum in the activation dtype):
//   y1 = r(r(x1*c1) + r(-x2*s1)),  y2 = r(r(x2*c2) + r(x1*s2))
// Backward (the transpose of the rotation): dx1 = r(r(g1*c1) + r(g2*s2)), dx2 = r(r(g2*c2) + r(-g1*s1)).
#include "common.cuh"

template <typename T>
__device__ void rope_kernel(const T* x, const T* cos, const T* sin, T* y, int b, int h, int t, int d,
                            int cos_b, int backward) {
    int half = d / 2;
    size_t n = (size_t)b * h * t * half;
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < n;
         idx += (size_t)gridDim.x * blockDim.x) {
        int k = idx % half;
        size_t row = idx / half;  // (bi, hi, ti)
        int ti = row % t;
        int bi = row / ((size_t)t * h);
        size_t cs = ((size_t)(cos_b == 1 ? 0 : bi) * t + ti) * d;
        float c1 = to_f32(cos[cs + k]), c2 = to_f32(cos[cs + k + half]);
        float s1 = to_f32(sin[cs + k]), s2 = to_f32(sin[cs + k + half]);
        float x1 = to_f32(x[row * d + k]), x2 = to_f32(x[row * d + k + half]);
        float y1, y2;
        if (!backward) {
            y1 = round_to<T>(x1 * c1) + round_to<T>(-x2 * s1);
            y2 = round_to<T>(x2 * c2) + round_to<T>(x1 * s2);
        } else {
            y1 = round_to<T>(x1 * c1) + round_to<T>(x2 * s2);
            y2 = round_to<T>(x2 * c2) + round_to<T>(-x1 * s1);
        }
        y[row * d + k] = from_f32<T>(y1);
        y[row * d + k + half] = from_f32<T>(y2);
    }
}

#define INST(T, S)                                                                                   \
    extern "C" __global__ void rope_##S(const T* x, const T* cos, const T* sin, T* y, int b, int h,  \
                                        int t, int d, int cos_b, int backward) {                     \
        rope_kernel<T>(x, cos, sin, y, b, h, t, d, cos_b, backward);                                 \
    }
G4FT_FLOAT_TYPES(INST)
