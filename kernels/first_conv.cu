// The network's first convolution (every YOLOv9 model: 3 → C channels, 3×3, stride 2, padding
// 1, folded bias, SiLU) straight from the f32 NCHW input to a channels-last output in the run's
// half type, for CUDA inference: it replaces the input's cast to padded NHWC and a cuDNN
// convolution that reads 8 channels (5 of them zero) in half precision. Arithmetic in f32 on the
// unrounded input (the f32 convolution's sums, in the order ci, ky, kx), one rounding per output;
// the SiLU by the approximate exponential and division (silu_for in elem.cuh).
// Rust side: src/cuda/first_conv.rs (launch), src/model/conv.rs (`Conv::first_nhwc`).
//
// One thread per two neighbouring output pixels of a row: the 3×3×5 inputs of their two windows
// (one column shared) held in registers, the outputs made 8 channels at a time (one 16-byte store
// per pixel). The weights and bias live in shared memory laid out (27, C), so the 8 weights of an
// input for 8 consecutive channels are two 16-byte loads that every thread of a warp shares (a
// broadcast) and that serve both pixels.

#include "elem.cuh"

#define TAPS 27

template <typename T>
__device__ void first_conv(const float* __restrict__ x, const float* __restrict__ w,
                           const float* __restrict__ b, T* __restrict__ y, long long pairs, int H,
                           int W, int Ho, int Wo, int C, int silu) {
    extern __shared__ float4 smem4[];
    float* sw = reinterpret_cast<float*>(smem4);
    for (int i = threadIdx.x; i < TAPS * C + C; i += blockDim.x)
        sw[i] = i < TAPS * C ? w[i] : b[i - TAPS * C];
    __syncthreads();
    const float* sb = sw + TAPS * C;
    const int Wp = (Wo + 1) / 2;  // pairs per output row
    const long long HW = (long long)H * W;
    for (long long q = blockIdx.x * (long long)blockDim.x + threadIdx.x; q < pairs;
         q += (long long)gridDim.x * blockDim.x) {
        const long long row = q / Wp;  // n * Ho + oy
        const int ox = (int)(q % Wp) * 2;
        const long long n = row / Ho;
        const int oy = (int)(row % Ho);
        const bool second = ox + 1 < Wo;
        // Input columns 2·ox − 1 .. 2·ox + 3: the first pixel reads 0..2, the second 2..4.
        float in[3][3][5];
#pragma unroll
        for (int ci = 0; ci < 3; ++ci) {
            const float* xp = x + (n * 3 + ci) * HW;
#pragma unroll
            for (int ky = 0; ky < 3; ++ky) {
                const int iy = 2 * oy - 1 + ky;
#pragma unroll
                for (int kx = 0; kx < 5; ++kx) {
                    const int ix = 2 * ox - 1 + kx;
                    const bool inside = iy >= 0 && iy < H && ix >= 0 && ix < W;
                    in[ci][ky][kx] = inside ? xp[(long long)iy * W + ix] : 0.0f;
                }
            }
        }
        T* y0 = y + (row * Wo + ox) * C;
        for (int c0 = 0; c0 < C; c0 += 8) {
            float a0[8], a1[8];
#pragma unroll
            for (int j = 0; j < 8; ++j) a0[j] = a1[j] = 0.0f;
#pragma unroll
            for (int ci = 0; ci < 3; ++ci) {
#pragma unroll
                for (int ky = 0; ky < 3; ++ky) {
#pragma unroll
                    for (int kx = 0; kx < 3; ++kx) {
                        const int k = ci * 9 + ky * 3 + kx;
                        const float4 wa = *reinterpret_cast<const float4*>(sw + k * C + c0);
                        const float4 wb = *reinterpret_cast<const float4*>(sw + k * C + c0 + 4);
                        const float wv[8] = {wa.x, wa.y, wa.z, wa.w, wb.x, wb.y, wb.z, wb.w};
                        const float v0 = in[ci][ky][kx], v1 = in[ci][ky][kx + 2];
#pragma unroll
                        for (int j = 0; j < 8; ++j) {
                            a0[j] = fmaf(wv[j], v0, a0[j]);
                            a1[j] = fmaf(wv[j], v1, a1[j]);
                        }
                    }
                }
            }
            Vec<T> o0, o1;
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const float z0 = a0[j] + sb[c0 + j], z1 = a1[j] + sb[c0 + j];
                st(o0.e, j, silu ? silu_for<T>(z0) : z0);
                st(o1.e, j, silu ? silu_for<T>(z1) : z1);
            }
            stv(y0 + c0, o0);
            if (second) stv(y0 + C + c0, o1);
        }
    }
}

#define FIRST_CONV(T, SUF)                                                                         \
    extern "C" __global__ void first_conv_##SUF(const float* x, const float* w, const float* b,    \
                                                T* y, long long pairs, int H, int W, int Ho,       \
                                                int Wo, int C, int silu) {                         \
        first_conv<T>(x, w, b, y, pairs, H, W, Ho, Wo, C, silu);                                   \
    }

FIRST_CONV(__half, f16)
FIRST_CONV(__nv_bfloat16, bf16)
