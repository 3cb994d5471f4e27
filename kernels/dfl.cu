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

// The expectation of one side's 16 bins at p (stride sc between bins), in f32.
template <typename T>
__device__ __forceinline__ float dfl_side(const T* __restrict__ p, long long sc) {
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
    return e;
}

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
        st(y, idx, dfl_side(p, sc));
    }
}

// The whole decode of one level of channels-last head outputs (official `DDetect` in eval mode):
// box logits (B, H, W, 64) and class logits (B, H, W, nc), each pixel's channels contiguous and
// pixels `bld` / `cld` elements apart → rows a_off .. a_off + H*W of out (B, 4+nc, A) f32: the
// DFL distances (l, t, r, b) of each anchor (x + 0.5, y + 0.5), then cx = (x1 + x2) * 0.5,
// cy likewise, w = x2 - x1, h = y2 - y1, each times the level's stride (`dist2bbox(xywh=True)`),
// then the class sigmoids 1 / (1 + exp(-v)) with the division in double as candle's f32 sigmoid
// has it. The same operations in the same order as the composite decode it replaces.
template <typename T>
__device__ void decode_level(const T* __restrict__ bx, long long bld, const T* __restrict__ cx,
                             long long cld, float* __restrict__ out, long long total, int HW, int W,
                             int nc, long long A, long long a_off, float stride) {
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        const long long b = idx / HW;
        const int hw = (int)(idx % HW);
        const float ax = (float)(hw % W) + 0.5f, ay = (float)(hw / W) + 0.5f;
        const T* p = bx + idx * bld;
        const float l = dfl_side(p, 1), t = dfl_side(p + BINS, 1);
        const float r = dfl_side(p + 2 * BINS, 1), bb = dfl_side(p + 3 * BINS, 1);
        const float x1 = ax - l, y1 = ay - t, x2 = ax + r, y2 = ay + bb;
        float* o = out + b * (4 + nc) * A + a_off + hw;
        o[0] = ((x1 + x2) * 0.5f) * stride;
        o[A] = ((y1 + y2) * 0.5f) * stride;
        o[2 * A] = (x2 - x1) * stride;
        o[3 * A] = (y2 - y1) * stride;
        const T* q = cx + idx * cld;
        for (int c = 0; c < nc; ++c) {
            const float v = ld(q, c);
            o[(4 + c) * A] = (float)(1.0 / (double)(1.0f + expf(-v)));
        }
    }
}

#define DECODE(T, SUF)                                                                             \
    extern "C" __global__ void decode_level_##SUF(const T* bx, long long bld, const T* cx,        \
                                                  long long cld, float* out, long long total,     \
                                                  int HW, int W, int nc, long long A,             \
                                                  long long a_off, float stride) {                \
        decode_level<T>(bx, bld, cx, cld, out, total, HW, W, nc, A, a_off, stride);               \
    }

DECODE(float, f32)
DECODE(__half, f16)
DECODE(__nv_bfloat16, bf16)

#define DFL(T, SUF)                                                                                \
    extern "C" __global__ void dfl_##SUF(const T* __restrict__ x, T* __restrict__ y, long long total, \
                                         int A, long long sb, long long sc, long long sa) {         \
        dfl<T>(x, y, total, A, sb, sc, sa);                                                         \
    }

DFL(float, f32)
DFL(__half, f16)
DFL(__nv_bfloat16, bf16)
