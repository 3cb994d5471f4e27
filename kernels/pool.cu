// Max pooling of SPPELAN: MaxPool2d(k, stride 1, padding k/2) on NCHW planes (P = N*C planes of
// H x W), forward and backward. Padded cells never win (PyTorch pads with -inf); the window's
// argmax is its first maximum in row-major order, as PyTorch's max_pool2d.
// Rust side: src/cuda/pool.rs (launches), src/model/pool.rs (the candle ops and the CPU version
// these kernels must match).

#include <cuda_bf16.h>

__device__ __forceinline__ float ld(const float* p, long long i) { return p[i]; }
__device__ __forceinline__ float ld(const __nv_bfloat16* p, long long i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void st(float* p, long long i, float v) { p[i] = v; }
__device__ __forceinline__ void st(__nv_bfloat16* p, long long i, float v) { p[i] = __float2bfloat16(v); }

// Offset (dr * k + dc) of the first maximum of the window of output (i, j) in plane `x`.
template <typename T>
__device__ __forceinline__ int argmax_at(const T* __restrict__ x, int H, int W, int k, int i, int j) {
    const int r = k / 2;
    float best = 0.0f;
    int arg = -1;
    for (int dr = 0; dr < k; ++dr) {
        const int a = i + dr - r;
        if (a < 0 || a >= H) continue;
        for (int dc = 0; dc < k; ++dc) {
            const int b = j + dc - r;
            if (b < 0 || b >= W) continue;
            const float v = ld(x, (long long)a * W + b);
            if (arg < 0 || v > best) {
                best = v;
                arg = dr * k + dc;
            }
        }
    }
    return arg;
}

// y[p, i, j] = max of the k x k window around (i, j).
template <typename T>
__device__ void pool_fwd(const T* __restrict__ x, T* __restrict__ y, long long planes, int H, int W, int k) {
    const long long total = planes * H * W;
    const int r = k / 2;
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        const long long plane = idx / ((long long)H * W);
        const int rem = (int)(idx - plane * H * W);
        const int i = rem / W, j = rem - (rem / W) * W;
        const T* xp = x + plane * H * W;
        const int arg = argmax_at(xp, H, W, k, i, j);
        const int a = i + arg / k - r, b = j + arg % k - r;
        y[idx] = xp[(long long)a * W + b];
    }
}

// arg[p, i, j] = argmax offset of the window around (i, j), as a byte (k*k <= 255).
template <typename T>
__device__ void pool_arg(const T* __restrict__ x, unsigned char* __restrict__ arg, long long planes, int H,
                         int W, int k) {
    const long long total = planes * H * W;
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        const long long plane = idx / ((long long)H * W);
        const int rem = (int)(idx - plane * H * W);
        const int i = rem / W, j = rem - (rem / W) * W;
        arg[idx] = (unsigned char)argmax_at(x + plane * H * W, H, W, k, i, j);
    }
}

// dx[p, a, b] = sum of dy[p, i, j] over the outputs whose argmax is (a, b), in row-major order of
// (i, j): deterministic, no atomics.
template <typename T>
__device__ void pool_bwd(const unsigned char* __restrict__ arg, const T* __restrict__ dy, T* __restrict__ dx,
                         long long planes, int H, int W, int k) {
    const long long total = planes * H * W;
    const int r = k / 2;
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        const long long plane = idx / ((long long)H * W);
        const int rem = (int)(idx - plane * H * W);
        const int a = rem / W, b = rem - (rem / W) * W;
        const long long base = plane * H * W;
        float acc = 0.0f;
        for (int i = a - r; i <= a + r; ++i) {
            if (i < 0 || i >= H) continue;
            for (int j = b - r; j <= b + r; ++j) {
                if (j < 0 || j >= W) continue;
                const int want = (a - i + r) * k + (b - j + r);
                const long long o = base + (long long)i * W + j;
                if ((int)arg[o] == want) acc += ld(dy, o);
            }
        }
        st(dx, idx, acc);
    }
}

#define POOL_KERNELS(T, SUF)                                                                      \
    extern "C" __global__ void maxpool_same_fwd_##SUF(const T* x, T* y, long long planes, int H,  \
                                                      int W, int k) {                            \
        pool_fwd<T>(x, y, planes, H, W, k);                                                       \
    }                                                                                             \
    extern "C" __global__ void maxpool_same_arg_##SUF(const T* x, unsigned char* arg,            \
                                                      long long planes, int H, int W, int k) {   \
        pool_arg<T>(x, arg, planes, H, W, k);                                                     \
    }                                                                                             \
    extern "C" __global__ void maxpool_same_bwd_##SUF(const unsigned char* arg, const T* dy,     \
                                                      T* dx, long long planes, int H, int W,      \
                                                      int k) {                                    \
        pool_bwd<T>(arg, dy, dx, planes, H, W, k);                                                \
    }

POOL_KERNELS(float, f32)
POOL_KERNELS(__nv_bfloat16, bf16)
