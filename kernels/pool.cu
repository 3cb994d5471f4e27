// Max pooling of SPPELAN: MaxPool2d(k, stride 1, padding k/2) on NCHW planes (P = N*C planes of
// H x W), forward and backward. Padded cells never win (PyTorch pads with -inf); the window's
// argmax is its first maximum in row-major order, as PyTorch's max_pool2d.
// Inference forms (no backward): the same max pool on channels-last (N, H, W, C) tensors, and
// ADown's avg_pool2d(2, stride 1) on NCHW planes and on NHWC tensors (the four cells summed in
// f32 in the order (i,j), (i,j+1), (i+1,j), (i+1,j+1), then times 1/4, as PyTorch's kernel).
// Rust side: src/cuda/pool.rs (launches), src/model/pool.rs (the candle ops and the CPU version
// these kernels must match).

#include "elem.cuh"

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
// (plane, i, j) of element `idx` of contiguous planes of H x W (NCHW: plane = n * C + c).
__device__ __forceinline__ void nchw_at(long long idx, int H, int W, long long& plane, int& i, int& j) {
    plane = idx / ((long long)H * W);
    const int rem = (int)(idx - plane * H * W);
    i = rem / W;
    j = rem - (rem / W) * W;
}

template <typename T>
__device__ void pool_fwd(const T* __restrict__ x, T* __restrict__ y, long long planes, int H, int W, int k) {
    const long long total = planes * H * W;
    const int r = k / 2;
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        long long plane;
        int i, j;
        nchw_at(idx, H, W, plane, i, j);
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
        long long plane;
        int i, j;
        nchw_at(idx, H, W, plane, i, j);
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
        long long plane;
        int a, b;
        nchw_at(idx, H, W, plane, a, b);
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

// (n, i, j, c) of element `idx` of a contiguous (N, H, W, C) tensor.
__device__ __forceinline__ void nhwc_at(long long idx, int H, int W, int C, long long& n, int& i, int& j,
                                        int& c) {
    c = (int)(idx % C);
    const long long pix = idx / C;
    j = (int)(pix % W);
    const long long ni = pix / W;
    i = (int)(ni % H);
    n = ni / H;
}

// y[n, i, j, c] = max of the k x k window around (i, j) of channel c (channels-last); the
// value of the first maximum (any maximum has that value).
template <typename T>
__device__ void pool_fwd_nhwc(const T* __restrict__ x, T* __restrict__ y, long long total, int H, int W,
                              int C, int k) {
    const int r = k / 2;
    constexpr int V = VecOf<T>::N;
    if (aligned16(x) && aligned16(y) && C % V == 0) {
        // 16-byte vectors of V channels, each lane as the scalar path (the first maximum).
        for (long long v = blockIdx.x * (long long)blockDim.x + threadIdx.x; v < total / V;
             v += (long long)gridDim.x * blockDim.x) {
            long long n;
            int i, j, c;
            nhwc_at(v * V, H, W, C, n, i, j, c);
            const T* xn = x + n * H * W * (long long)C + c;
            float best[V];
            bool any = false;
            for (int a = max(i - r, 0); a <= min(i + r, H - 1); ++a) {
                for (int b = max(j - r, 0); b <= min(j + r, W - 1); ++b) {
                    const Vec<T> w = ldv(xn + ((long long)a * W + b) * C);
#pragma unroll
                    for (int l = 0; l < V; ++l) {
                        const float f = ld(w.e, l);
                        if (!any || f > best[l]) best[l] = f;
                    }
                    any = true;
                }
            }
            Vec<T> out;
#pragma unroll
            for (int l = 0; l < V; ++l) st(out.e, l, best[l]);
            stv(y + v * V, out);
        }
        return;
    }
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        long long n;
        int i, j, c;
        nhwc_at(idx, H, W, C, n, i, j, c);
        const T* xn = x + n * H * W * (long long)C + c;
        float best = 0.0f;
        long long at = -1;
        for (int a = i - r; a <= i + r; ++a) {
            if (a < 0 || a >= H) continue;
            for (int b = j - r; b <= j + r; ++b) {
                if (b < 0 || b >= W) continue;
                const long long o = ((long long)a * W + b) * C;
                const float v = ld(xn, o);
                if (at < 0 || v > best) {
                    best = v;
                    at = o;
                }
            }
        }
        y[idx] = xn[at];
    }
}

// y[p, i, j] = (x[i,j] + x[i,j+1] + x[i+1,j] + x[i+1,j+1]) / 4 on planes of H x W; y is
// (H-1) x (W-1) per plane.
template <typename T>
__device__ void avg2_nchw(const T* __restrict__ x, T* __restrict__ y, long long planes, int H, int W) {
    const int Ho = H - 1, Wo = W - 1;
    const long long total = planes * Ho * Wo;
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        long long plane;
        int i, j;
        nchw_at(idx, Ho, Wo, plane, i, j);
        const long long o = plane * H * W + (long long)i * W + j;
        float s = ld(x, o) + ld(x, o + 1);
        s += ld(x, o + W);
        s += ld(x, o + W + 1);
        st(y, idx, s * 0.25f);
    }
}

// Input gradient of avg2_nchw: dx[p, i, j] = (dy[i-1,j-1] + dy[i-1,j] + dy[i,j-1] + dy[i,j]) / 4
// over the terms inside dy's (H-1) x (W-1) plane, added in that order (the order of the
// composite backward it replaces: the gradient padded by one zero on every side, the four
// shifted views added), for dx planes of H x W.
template <typename T>
__device__ void avg2_bwd_nchw(const T* __restrict__ dy, T* __restrict__ dx, long long planes, int H,
                              int W) {
    const int Ho = H - 1, Wo = W - 1;
    const long long total = planes * H * W;
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        long long plane;
        int i, j;
        nchw_at(idx, H, W, plane, i, j);
        const T* g = dy + plane * Ho * Wo;
        const bool up = i > 0, down = i < Ho, left = j > 0, right = j < Wo;
        float s = (up && left) ? ld(g, (long long)(i - 1) * Wo + j - 1) : 0.0f;
        s += (up && right) ? ld(g, (long long)(i - 1) * Wo + j) : 0.0f;
        s += (down && left) ? ld(g, (long long)i * Wo + j - 1) : 0.0f;
        s += (down && right) ? ld(g, (long long)i * Wo + j) : 0.0f;
        st(dx, idx, s * 0.25f);
    }
}

// The same on channels-last (N, H, W, C) → (N, H-1, W-1, C).
template <typename T>
__device__ void avg2_nhwc(const T* __restrict__ x, T* __restrict__ y, long long total, int H, int W, int C) {
    const int Wo = W - 1, Ho = H - 1;
    constexpr int V = VecOf<T>::N;
    if (aligned16(x) && aligned16(y) && C % V == 0) {
        // 16-byte vectors of V channels; each element summed in the scalar path's order.
        const long long row = (long long)W * C;
        for (long long v = blockIdx.x * (long long)blockDim.x + threadIdx.x; v < total / V;
             v += (long long)gridDim.x * blockDim.x) {
            long long n;
            int i, j, c;
            nhwc_at(v * V, Ho, Wo, C, n, i, j, c);
            const long long o = ((n * H + i) * W + j) * C + c;
            const Vec<T> a = ldv(x + o), b = ldv(x + o + C), d = ldv(x + o + row), e = ldv(x + o + row + C);
            Vec<T> out;
#pragma unroll
            for (int k = 0; k < V; ++k) {
                float s = ld(a.e, k) + ld(b.e, k);
                s += ld(d.e, k);
                s += ld(e.e, k);
                st(out.e, k, s * 0.25f);
            }
            stv(y + v * V, out);
        }
        return;
    }
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        long long n;
        int i, j, c;
        nhwc_at(idx, Ho, Wo, C, n, i, j, c);
        const long long o = ((n * H + i) * W + j) * C + c;
        const long long row = (long long)W * C;
        float s = ld(x, o) + ld(x, o + C);
        s += ld(x, o + row);
        s += ld(x, o + row + C);
        st(y, idx, s * 0.25f);
    }
}

#define INFER_POOL_KERNELS(T, SUF)                                                                \
    extern "C" __global__ void maxpool_same_nhwc_fwd_##SUF(const T* x, T* y, long long total,    \
                                                           int H, int W, int C, int k) {          \
        pool_fwd_nhwc<T>(x, y, total, H, W, C, k);                                                \
    }                                                                                             \
    extern "C" __global__ void avgpool2_nchw_##SUF(const T* x, T* y, long long planes, int H,    \
                                                   int W) {                                       \
        avg2_nchw<T>(x, y, planes, H, W);                                                         \
    }                                                                                             \
    extern "C" __global__ void avgpool2_nhwc_##SUF(const T* x, T* y, long long total, int H,     \
                                                   int W, int C) {                                \
        avg2_nhwc<T>(x, y, total, H, W, C);                                                       \
    }                                                                                             \
    extern "C" __global__ void avgpool2_bwd_nchw_##SUF(const T* dy, T* dx, long long planes,     \
                                                       int H, int W) {                            \
        avg2_bwd_nchw<T>(dy, dx, planes, H, W);                                                   \
    }

extern "C" __global__ void maxpool_same_fwd_f16(const __half* x, __half* y, long long planes, int H, int W,
                                                int k) {
    pool_fwd<__half>(x, y, planes, H, W, k);
}
INFER_POOL_KERNELS(float, f32)
INFER_POOL_KERNELS(__half, f16)
INFER_POOL_KERNELS(__nv_bfloat16, bf16)
