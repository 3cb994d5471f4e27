// Inference epilogue of a convolution whose BatchNorm is folded: y = act(x + b[c]) per element
// of an NCHW tensor, act = SiLU (z / (1 + exp(-z))) or identity. One pass instead of a bias add
// and a SiLU (two passes over the activation). x, b, y are f32, f16 or bf16 (suffix _f32 / _f16 /
// _bf16), contiguous; arithmetic is f32.
// Rust side: src/cuda/bias_act.rs (launch), src/model/bias_act.rs (the candle op and the CPU
// version these kernels must match).
//
// Grid: y covers the N*C rows (one bias per row, strided if there are more rows than blocks),
// x covers the HW elements of a row.

#include "elem.cuh"

template <typename T>
__device__ void bias_act(const T* __restrict__ x, const T* __restrict__ b, T* __restrict__ y,
                         int rows, int C, int HW, int silu) {
    for (int r = blockIdx.y; r < rows; r += gridDim.y) {
        const float bias = ld(b, r % C);
        const long long base = (long long)r * HW;
        for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < HW; i += gridDim.x * blockDim.x) {
            const float z = ld(x, base + i) + bias;
            st(y, base + i, silu ? z / (1.0f + expf(-z)) : z);
        }
    }
}

// The same on a channels-last (N, H, W, C) tensor: one bias per element's channel i % C.
template <typename T>
__device__ void bias_act_nhwc(const T* __restrict__ x, const T* __restrict__ b, T* __restrict__ y,
                              long long total, int C, int silu) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const float z = ld(x, i) + ld(b, (long long)(i % C));
        st(y, i, silu ? z / (1.0f + expf(-z)) : z);
    }
}

// The same, 16 bytes per thread (8 f16/bf16 or 4 f32 of one pixel's channels): for C a multiple
// of the vector width and 16-byte aligned x and y. Element arithmetic as above.
template <typename T>
__device__ void bias_act_nhwc_vec(const T* __restrict__ x, const T* __restrict__ b, T* __restrict__ y,
                                  long long nvec, int C, int silu) {
    constexpr int V = 16 / sizeof(T);
    for (long long v = blockIdx.x * (long long)blockDim.x + threadIdx.x; v < nvec;
         v += (long long)gridDim.x * blockDim.x) {
        const uint4 raw = reinterpret_cast<const uint4*>(x)[v];
        const T* e = reinterpret_cast<const T*>(&raw);
        const int c0 = (int)((v * V) % C);
        uint4 out;
        T* o = reinterpret_cast<T*>(&out);
#pragma unroll
        for (int k = 0; k < V; ++k) {
            const float z = ld(e, k) + ld(b, c0 + k);
            st(o, k, silu ? z / (1.0f + expf(-z)) : z);
        }
        reinterpret_cast<uint4*>(y)[v] = out;
    }
}

// In place on a channel slot of a channels-last tensor: C channels at the start of rows (pixels)
// `row_ld` elements apart (a part of a concatenation built in place), 16 bytes per thread. For C and
// row_ld multiples of the vector width and a 16-byte aligned y. Element arithmetic as above.
template <typename T>
__device__ void bias_act_rows_vec(T* __restrict__ y, const T* __restrict__ b, long long nvec, int C,
                                  long long row_ld, int silu) {
    constexpr int V = 16 / sizeof(T);
    const int per_row = C / V;
    for (long long v = blockIdx.x * (long long)blockDim.x + threadIdx.x; v < nvec;
         v += (long long)gridDim.x * blockDim.x) {
        const long long row = v / per_row;
        const int c0 = (int)(v % per_row) * V;
        uint4* p = reinterpret_cast<uint4*>(y + row * row_ld + c0);
        uint4 raw = *p;
        T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
        for (int k = 0; k < V; ++k) {
            const float z = ld(e, k) + ld(b, c0 + k);
            st(e, k, silu ? silu_for<T>(z) : z);
        }
        *p = raw;
    }
}

// As bias_act_rows_vec, with a low-resolution term added before the activation:
// y[p, c] = act(y[p, c] + b[c] + low[up(p), c]) for the pixels p = (n, Y, X) of (N, H, W), where
// up(p) = (n, Y/2, X/2) is the pixel of low (N, H/2, W/2, C), contiguous, that a nearest 2×
// upsampling would copy to p: the head's upsampled part of a concatenation whose 1×1 product was
// taken before the upsampling (it commutes with it). Arithmetic in f32, one rounding.
template <typename T>
__device__ void bias_act_rows_up_vec(T* __restrict__ y, const T* __restrict__ b,
                                     const T* __restrict__ low, long long nvec, int C,
                                     long long row_ld, int H, int W, int silu) {
    constexpr int V = 16 / sizeof(T);
    const int per_row = C / V;
    const long long HW = (long long)H * W;
    for (long long v = blockIdx.x * (long long)blockDim.x + threadIdx.x; v < nvec;
         v += (long long)gridDim.x * blockDim.x) {
        const long long row = v / per_row;
        const int c0 = (int)(v % per_row) * V;
        const long long n = row / HW;
        const long long rem = row % HW;
        const int Y = (int)(rem / W), X = (int)(rem % W);
        const long long low_row = (n * (H / 2) + Y / 2) * (W / 2) + X / 2;
        uint4* p = reinterpret_cast<uint4*>(y + row * row_ld + c0);
        uint4 raw = *p;
        const uint4 lraw = *reinterpret_cast<const uint4*>(low + low_row * C + c0);
        T* e = reinterpret_cast<T*>(&raw);
        const T* le = reinterpret_cast<const T*>(&lraw);
#pragma unroll
        for (int k = 0; k < V; ++k) {
            const float z = ld(e, k) + ld(b, c0 + k) + ld(le, k);
            st(e, k, silu ? silu_for<T>(z) : z);
        }
        *p = raw;
    }
}

#define BIAS_ACT(T, SUF)                                                                           \
    extern "C" __global__ void bias_act_##SUF(const T* __restrict__ x, const T* __restrict__ b,    \
                                              T* __restrict__ y, int rows, int C, int HW,          \
                                              int silu) {                                          \
        bias_act<T>(x, b, y, rows, C, HW, silu);                                                   \
    }                                                                                              \
    extern "C" __global__ void bias_act_nhwc_##SUF(const T* __restrict__ x, const T* __restrict__ b,\
                                                   T* __restrict__ y, long long total, int C,      \
                                                   int silu) {                                     \
        bias_act_nhwc<T>(x, b, y, total, C, silu);                                                 \
    }                                                                                              \
    extern "C" __global__ void bias_act_nhwc_vec_##SUF(const T* __restrict__ x,                    \
                                                       const T* __restrict__ b, T* __restrict__ y, \
                                                       long long nvec, int C, int silu) {          \
        bias_act_nhwc_vec<T>(x, b, y, nvec, C, silu);                                              \
    }                                                                                              \
    extern "C" __global__ void bias_act_rows_vec_##SUF(T* __restrict__ y, const T* __restrict__ b, \
                                                       long long nvec, int C, long long row_ld,    \
                                                       int silu) {                                 \
        bias_act_rows_vec<T>(y, b, nvec, C, row_ld, silu);                                         \
    }                                                                                              \
    extern "C" __global__ void bias_act_rows_up_vec_##SUF(                                         \
        T* __restrict__ y, const T* __restrict__ b, const T* __restrict__ low, long long nvec,     \
        int C, long long row_ld, int H, int W, int silu) {                                         \
        bias_act_rows_up_vec<T>(y, b, low, nvec, C, row_ld, H, W, silu);                           \
    }

BIAS_ACT(float, f32)
BIAS_ACT(__half, f16)
BIAS_ACT(__nv_bfloat16, bf16)
