// DFL expectation of the detection head (official `DFL`: softmax over the 16 bins of each box
// side, then the 1x1 convolution with weights 0..15): logits (B, 4*16, A), side-major
// (side*16 + bin), read through element strides (a narrow of the concatenated head output needs
// no copy) → distances (B, 4, A), contiguous, in grid units. Arithmetic in f32: the maximum, then
// s = sum of exp(v - max), then sum over bins of (exp(v - max) / s) * bin, the order of the
// composite it replaces (softmax, multiply, sum). One thread per (b, side, anchor); consecutive
// threads take consecutive anchors, so every bin's loads are coalesced.
// Rust side: src/cuda/dfl.rs (launch), src/model/head.rs (`dfl`, the CPU version).

#include "elem.cuh"

#define BINS 16

template <typename T>
__device__ void dfl(const T* __restrict__ x, T* __restrict__ y, long long total, int A, long long sb,
                    long long sc, long long sa) {
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        const int a = (int)(idx % A);
        const long long t = idx / A;
        const int side = (int)(t % 4);
        const long long b = t / 4;
        const T* p = x + b * sb + (long long)side * BINS * sc + (long long)a * sa;
        float v[BINS];
        float m = -INFINITY;
#pragma unroll
        for (int k = 0; k < BINS; ++k) {
            v[k] = ld(p, k * sc);
            m = fmaxf(m, v[k]);
        }
        float s = 0.0f;
#pragma unroll
        for (int k = 0; k < BINS; ++k) {
            v[k] = expf(v[k] - m);
            s += v[k];
        }
        float e = 0.0f;
#pragma unroll
        for (int k = 0; k < BINS; ++k) e += (v[k] / s) * (float)k;
        st(y, idx, e);
    }
}

#define DFL(T, SUF)                                                                                \
    extern "C" __global__ void dfl_##SUF(const T* __restrict__ x, T* __restrict__ y, long long total, \
                                         int A, long long sb, long long sc, long long sa) {         \
        dfl<T>(x, y, total, A, sb, sc, sa);                                                         \
    }

DFL(float, f32)
DFL(__half, f16)
DFL(__nv_bfloat16, bf16)
