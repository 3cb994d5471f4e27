// DFL expectation of the detection head (official `DFL`: softmax over the 16 bins of each box
// side, then the 1x1 convolution with weights 0..15): logits (B, 4*16, A), side-major
// (side*16 + bin), read through element strides (a narrow of the concatenated head output needs
// no copy) → distances (B, 4, A), contiguous, in grid units. Arithmetic in f32: the maximum, then
// s = sum of exp(v - max), then sum over bins of (exp(v - max) / s) * bin, the order of the
// composite it replaces (softmax, multiply, sum). One thread per (b, side, anchor); consecutive
// threads take consecutive anchors, so every bin's loads are coalesced.
// Rust side: src/cuda/dfl.rs (launch), src/model/head.rs (`dfl`, the CPU version).
// The decode of channels-last levels loads each pixel's runs of logits as 16-byte vectors where
// they are aligned.

#include "elem.cuh"

#define BINS 16

// The expectation of 16 bin logits v (overwritten), in f32.
__device__ __forceinline__ float dfl_vals(float* v) {
    float m = -INFINITY;
#pragma unroll
    for (int k = 0; k < BINS; ++k) m = fmaxf(m, v[k]);
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

// The expectation of one side's 16 bins at p (stride sc between bins), in f32.
template <typename T>
__device__ __forceinline__ float dfl_side(const T* __restrict__ p, long long sc) {
    float v[BINS];
#pragma unroll
    for (int k = 0; k < BINS; ++k) v[k] = ld(p, k * sc);
    return dfl_vals(v);
}

// n contiguous values at p into v as f32: 16-byte vector loads with `vec` (p 16-byte aligned, n
// a multiple of the vector width), element loads otherwise.
template <typename T>
__device__ __forceinline__ void load_run(const T* __restrict__ p, float* v, int n, bool vec) {
    constexpr int V = VecOf<T>::N;
    if (vec) {
        for (int i = 0; i < n; i += V) {
            const Vec<T> u = ldv(p + i);
#pragma unroll
            for (int k = 0; k < V; ++k) v[i + k] = ld(u.e, k);
        }
    } else {
        for (int i = 0; i < n; ++i) v[i] = ld(p, i);
    }
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

// The whole decode of channels-last head outputs (official `DDetect` in eval mode), all levels in
// one launch: level i's box logits (B, H, W, 64) and class logits (B, H, W, nc), each pixel's
// channels contiguous and pixels `bld` / `cld` elements apart → rows a_off .. a_off + H*W of out
// (B, 4+nc, A) f32: the DFL distances (l, t, r, b) of each anchor (x + 0.5, y + 0.5), then
// cx = (x1 + x2) * 0.5, cy likewise, w = x2 - x1, h = y2 - y1, each times the level's stride
// (`dist2bbox(xywh=True)`), then the class sigmoids 1 / (1 + exp(-v)) with the division in
// double as candle's f32 sigmoid has it. The same operations in the same order as the composite
// decode it replaces. The levels travel by value (`DecodeLevels`, 4 at most); thread idx works
// on the level whose range [start, start + B*H*W) holds it.
struct DecodeLevel {
    const void* bx;
    const void* cx;
    long long bld, cld, total, a_off, start;
    int HW, W;
    float stride;
    int pad;
};
struct DecodeLevels {
    DecodeLevel l[4];
};

template <typename T>
__device__ void decode_levels(float* __restrict__ out, int nc, long long A, int nlev,
                              long long all, const DecodeLevels& p) {
    // 16-byte loads where every pixel's run starts aligned (the class run also a whole number
    // of vectors long).
    constexpr int V = VecOf<T>::N;
    for (long long g = blockIdx.x * (long long)blockDim.x + threadIdx.x; g < all;
         g += (long long)gridDim.x * blockDim.x) {
        int li = 0;
        while (li + 1 < nlev && g >= p.l[li + 1].start) ++li;
        const DecodeLevel& L = p.l[li];
        const T* bx = static_cast<const T*>(L.bx);
        const T* cx = static_cast<const T*>(L.cx);
        const bool bvec = aligned16(bx) && L.bld % V == 0;
        const bool cvec = aligned16(cx) && L.cld % V == 0 && nc % V == 0;
        const long long idx = g - L.start;
        const long long b = idx / L.HW;
        const int hw = (int)(idx % L.HW);
        const float ax = (float)(hw % L.W) + 0.5f, ay = (float)(hw / L.W) + 0.5f;
        const T* q0 = bx + idx * L.bld;
        float d[4];
#pragma unroll
        for (int side = 0; side < 4; ++side) {
            float v[BINS];
            load_run(q0 + side * BINS, v, BINS, bvec);
            d[side] = dfl_vals(v);
        }
        const float l = d[0], t = d[1], r = d[2], bb = d[3];
        const float x1 = ax - l, y1 = ay - t, x2 = ax + r, y2 = ay + bb;
        const float stride = L.stride;
        float* o = out + b * (4 + nc) * A + L.a_off + hw;
        o[0] = ((x1 + x2) * 0.5f) * stride;
        o[A] = ((y1 + y2) * 0.5f) * stride;
        o[2 * A] = (x2 - x1) * stride;
        o[3 * A] = (y2 - y1) * stride;
        const T* q = cx + idx * L.cld;
        for (int c0 = 0; c0 < nc; c0 += V) {
            const int m = nc - c0 < V ? nc - c0 : V;
            float v[V];
            load_run(q + c0, v, m, cvec);
            for (int k = 0; k < m; ++k)
                o[(4 + c0 + k) * A] = (float)(1.0 / (double)(1.0f + expf(-v[k])));
        }
    }
}

#define DECODE(T, SUF)                                                                             \
    extern "C" __global__ void decode_levels_##SUF(float* out, int nc, long long A, int nlev,     \
                                                   long long all, const DecodeLevels p) {         \
        decode_levels<T>(out, nc, A, nlev, all, p);                                                \
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
