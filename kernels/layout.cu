// Layout changes of channels-last inference (Rust side: src/cuda/layout.rs, src/model/layout.rs).
//
// nchw_to_nhwc_f32_SUF: the network's f32 input (N, C, H, W) → (N, H, W, Cp) in the run's type,
//   rounded once (round to nearest even): what `to_dtype` then a channels-last copy give, with
//   channels C .. Cp zero (the first convolution's kernel gets as many zero channels).
// nhwc_to_nchw_SUF_f32: a head output (N, H, W, C) → (N, C, H, W) f32 (exact), through a 32×32
//   shared-memory tile so that reads run along C and writes along H·W.
// images_u8_to_nchw_f32: uploaded letterboxed images (N, H, W, C) u8 → (N, C, H, W) f32 / 255.
// upsample2_nhwc_bN: nearest 2× upsampling of (N, H, W, C) → (N, 2H, 2W, C), copying units of N
//   bytes (16 when a pixel's channels are a multiple of 16 bytes, else the element's size).

#include "elem.cuh"

// One thread per pixel: the C reads of neighbouring threads are neighbours in each channel
// plane (coalesced), and a pixel of Cp elements of 16 bytes (8 f16/bf16, 4 f32) is one vector
// store.
template <typename T>
__device__ void nchw_to_nhwc(const float* __restrict__ x, T* __restrict__ y, long long pixels, int C,
                             int Cp, long long HW) {
    constexpr int V = VecOf<T>::N;
    const bool vec = Cp == V && aligned16(y);
    for (long long p = blockIdx.x * (long long)blockDim.x + threadIdx.x; p < pixels;
         p += (long long)gridDim.x * blockDim.x) {
        const long long n = p / HW, hw = p % HW;
        const float* xp = x + n * C * HW + hw;
        T* yp = y + p * Cp;
        if (vec) {
            Vec<T> v;
#pragma unroll
            for (int c = 0; c < V; ++c) st(v.e, c, c < C ? xp[c * HW] : 0.0f);
            stv(yp, v);
        } else {
            for (int c = 0; c < Cp; ++c) st(yp, c, c < C ? xp[c * HW] : 0.0f);
        }
    }
}

template <typename T>
__device__ void nhwc_to_nchw(const T* __restrict__ x, float* __restrict__ y, int C, long long HW) {
    __shared__ float tile[32][33];
    const long long n = blockIdx.z;
    const long long hw0 = (long long)blockIdx.x * 32;
    const int c0 = blockIdx.y * 32;
    const T* xn = x + n * HW * C;
    float* yn = y + n * HW * C;
    for (int j = threadIdx.y; j < 32; j += blockDim.y) {
        const long long hw = hw0 + j;
        const int c = c0 + threadIdx.x;
        if (hw < HW && c < C) tile[j][threadIdx.x] = ld(xn, hw * C + c);
    }
    __syncthreads();
    for (int j = threadIdx.y; j < 32; j += blockDim.y) {
        const int c = c0 + j;
        const long long hw = hw0 + threadIdx.x;
        if (hw < HW && c < C) yn[(long long)c * HW + hw] = tile[threadIdx.x][j];
    }
}

template <typename U>
__device__ void upsample2(const U* __restrict__ x, U* __restrict__ y, long long total, int H, int W,
                          int CU) {
    const int W2 = 2 * W, H2 = 2 * H;
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        const int cu = (int)(idx % CU);
        long long t = idx / CU;
        const int j = (int)(t % W2);
        t /= W2;
        const int i = (int)(t % H2);
        const long long n = t / H2;
        y[idx] = x[((n * H + i / 2) * W + j / 2) * CU + cu];
    }
}

#define LAYOUT_KERNELS(T, SUF)                                                                     \
    extern "C" __global__ void nchw_to_nhwc_f32_##SUF(const float* x, T* y, long long pixels,     \
                                                       int C, int Cp, long long HW) {             \
        nchw_to_nhwc<T>(x, y, pixels, C, Cp, HW);                                                  \
    }                                                                                              \
    extern "C" __global__ void nhwc_to_nchw_##SUF##_f32(const T* x, float* y, int C,              \
                                                         long long HW) {                          \
        nhwc_to_nchw<T>(x, y, C, HW);                                                              \
    }

LAYOUT_KERNELS(float, f32)
LAYOUT_KERNELS(__half, f16)
LAYOUT_KERNELS(__nv_bfloat16, bf16)

extern "C" __global__ void upsample2_nhwc_b16(const uint4* x, uint4* y, long long total, int H,
                                              int W, int CU) {
    upsample2<uint4>(x, y, total, H, W, CU);
}
extern "C" __global__ void upsample2_nhwc_b4(const unsigned int* x, unsigned int* y,
                                             long long total, int H, int W, int CU) {
    upsample2<unsigned int>(x, y, total, H, W, CU);
}
extern "C" __global__ void upsample2_nhwc_b2(const unsigned short* x, unsigned short* y,
                                             long long total, int H, int W, int CU) {
    upsample2<unsigned short>(x, y, total, H, W, CU);
}

// images_u8_to_nchw_f32: letterboxed images (N, H, W, C) u8 → the network's input (N, C, H, W)
// f32 in 0..1, each value v / 255 (IEEE division, as candle's f32 division of the composite it
// replaces: cast, divide, transpose). One thread per pixel; the writes of neighbouring threads
// are neighbours in each channel plane.
extern "C" __global__ void images_u8_to_nchw_f32(const unsigned char* __restrict__ x,
                                                 float* __restrict__ y, long long pixels, int C,
                                                 long long HW) {
    for (long long p = blockIdx.x * (long long)blockDim.x + threadIdx.x; p < pixels;
         p += (long long)gridDim.x * blockDim.x) {
        const long long n = p / HW, hw = p % HW;
        for (int c = 0; c < C; ++c) y[(n * C + c) * HW + hw] = (float)x[p * C + c] / 255.0f;
    }
}
