// Train-mode BatchNorm2d fused with SiLU: statistics, forward, and the two backward passes.
// Activations (x, y, dy, dx) are f32 or bf16 (suffix _f32 / _bf16; bf16 for mixed-precision
// training) in NCHW layout (contiguous); all arithmetic is f32, per-channel sums are accumulated in
// f64, and the parameter blocks p/q and the statistics are always f32.
// Rust side: src/cuda/bn_act.rs (launch code), src/model/bn_act.rs (the candle ops and the
// CPU version these kernels must match).
//
// Parameter block p (row-major, C columns):
//   rows 0..4: gamma, beta, mean, biased var  (forward and gradient sums)
//   rows 4..6: sum(g), sum(g * xhat)          (input gradient only; bn_sums_final writes all six)
// with z = (x - mean) * (inv * gamma) + beta, inv = 1 / sqrt(var + eps),
// y = silu ? z / (1 + exp(-z)) : z, and g = dL/dz.
//
// Reductions run as grid (C, S): block (c, s) reduces elements [s*chunk, (s+1)*chunk) of the
// channel's N*HW values (element j = n*HW + i) and writes its two partial sums to
// part[(2*s + k) * C + c]; a second kernel adds the S partials of each channel in order, so the
// result does not depend on scheduling.

#define BLOCK 256

#include "elem.cuh"

// Vector path of the kernels below: 16-byte loads and stores (8 bf16 or 4 f32 per access) when
// every pointer is 16-byte aligned, H*W (and a reduction's chunk) is a multiple of the vector
// width and the vector count fits in 32 bits (one 32-bit division per vector, not a 64-bit one
// per element); the scalar loops otherwise. Both paths compute the same per-element values.

__device__ __forceinline__ double block_sum(double v, double* shared) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = (threadIdx.x < (BLOCK / 32)) ? shared[threadIdx.x] : 0.0;
    if (warp == 0) {
        for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
    }
    __syncthreads();
    return v;
}

struct Chan {
    float mean, inv, scale, beta;
};

__device__ __forceinline__ Chan chan(const float* p, int C, int c, float eps) {
    Chan k;
    const float g = p[c], b = p[C + c], m = p[2 * C + c], v = p[3 * C + c];
    k.mean = m;
    k.inv = 1.0f / sqrtf(v + eps);
    k.scale = k.inv * g;
    k.beta = b;
    return k;
}

__device__ __forceinline__ float silu_grad(float z) {
    const float s = 1.0f / (1.0f + expf(-z));
    return s * (1.0f + z * (1.0f - s));
}

// part (2*S, C): sum(x), sum(x*x).
template <typename T>
__device__ void stats_partial(const T* __restrict__ x, double* __restrict__ part, int N, int C, int HW,
                              long long chunk) {
    __shared__ double sh[BLOCK / 32];
    constexpr int V = VecOf<T>::N;
    const int c = blockIdx.x, s = blockIdx.y;
    const long long total = (long long)N * HW;
    const long long start = (long long)s * chunk;
    const long long end = min(start + chunk, total);
    double a = 0.0, b = 0.0;
    if (HW % V == 0 && chunk % V == 0 && aligned16(x) && total / V <= 0xffffffffLL) {
        const unsigned hwv = HW / V, ev = (unsigned)(end / V);
        for (unsigned jv = (unsigned)(start / V) + threadIdx.x; jv < ev; jv += BLOCK) {
            const unsigned n = jv / hwv, i = jv - n * hwv;
            const Vec<T> u = ldv(x + ((long long)n * C + c) * HW + (long long)i * V);
#pragma unroll
            for (int k = 0; k < V; ++k) {
                const double v = (double)ld(u.e, k);
                a += v;
                b += v * v;
            }
        }
    } else {
        for (long long j = start + threadIdx.x; j < end; j += BLOCK) {
            const long long n = j / HW, i = j - n * HW;
            const double v = (double)ld(x, (n * C + c) * HW + i);
            a += v;
            b += v * v;
        }
    }
    a = block_sum(a, sh);
    b = block_sum(b, sh);
    if (threadIdx.x == 0) {
        part[(2 * (long long)s) * C + c] = a;
        part[(2 * (long long)s + 1) * C + c] = b;
    }
}

// out (2, C): mean, biased variance.
extern "C" __global__ void bn_stats_final(const double* __restrict__ part, int S, int C, double m,
                                          float* __restrict__ out) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    double a = 0.0, b = 0.0;
    for (int s = 0; s < S; ++s) {
        a += part[(2 * (long long)s) * C + c];
        b += part[(2 * (long long)s + 1) * C + c];
    }
    const double mean = a / m;
    const double var = b / m - mean * mean;
    out[c] = (float)mean;
    out[C + c] = (float)(var > 0.0 ? var : 0.0);
}

__device__ __forceinline__ float bn_fwd1(float xv, const Chan& k, int silu) {
    const float z = (xv - k.mean) * k.scale + k.beta;
    return silu ? z / (1.0f + expf(-z)) : z;
}

template <typename T>
__device__ void act_fwd(const T* __restrict__ x, const float* __restrict__ p, T* __restrict__ y,
                        long long total, int C, int HW, float eps, int silu) {
    constexpr int V = VecOf<T>::N;
    const long long stride = (long long)gridDim.x * blockDim.x;
    if (HW % V == 0 && aligned16(x) && aligned16(y) && total / V <= 0xffffffffLL) {
        const unsigned hwv = HW / V;
        const long long nv = total / V;
        for (long long v = blockIdx.x * (long long)blockDim.x + threadIdx.x; v < nv; v += stride) {
            const int c = (int)(((unsigned)v / hwv) % (unsigned)C);
            const Chan k = chan(p, C, c, eps);
            const Vec<T> u = ldv(x + v * V);
            Vec<T> o;
#pragma unroll
            for (int e = 0; e < V; ++e) st(o.e, e, bn_fwd1(ld(u.e, e), k, silu));
            stv(y + v * V, o);
        }
        return;
    }
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < total; idx += stride) {
        const int c = (int)((idx / HW) % C);
        const Chan k = chan(p, C, c, eps);
        st(y, idx, bn_fwd1(ld(x, idx), k, silu));
    }
}

// part (2*S, C): sum(g), sum(g * xhat).
template <typename T>
__device__ void grad_partial(const T* __restrict__ x, const T* __restrict__ dy,
                             const float* __restrict__ p, double* __restrict__ part, int N, int C,
                             int HW, long long chunk, float eps, int silu) {
    __shared__ double sh[BLOCK / 32];
    constexpr int V = VecOf<T>::N;
    const int c = blockIdx.x, s = blockIdx.y;
    const Chan k = chan(p, C, c, eps);
    const long long total = (long long)N * HW;
    const long long start = (long long)s * chunk;
    const long long end = min(start + chunk, total);
    double a = 0.0, b = 0.0;
    if (HW % V == 0 && chunk % V == 0 && aligned16(x) && aligned16(dy) && total / V <= 0xffffffffLL) {
        const unsigned hwv = HW / V, ev = (unsigned)(end / V);
        for (unsigned jv = (unsigned)(start / V) + threadIdx.x; jv < ev; jv += BLOCK) {
            const unsigned n = jv / hwv, i = jv - n * hwv;
            const long long e = ((long long)n * C + c) * HW + (long long)i * V;
            const Vec<T> ux = ldv(x + e), ug = ldv(dy + e);
#pragma unroll
            for (int q = 0; q < V; ++q) {
                const float xv = ld(ux.e, q);
                float g = ld(ug.e, q);
                if (silu) g *= silu_grad((xv - k.mean) * k.scale + k.beta);
                const float xhat = (xv - k.mean) * k.inv;
                a += (double)g;
                b += (double)g * (double)xhat;
            }
        }
    } else {
        for (long long j = start + threadIdx.x; j < end; j += BLOCK) {
            const long long n = j / HW, i = j - n * HW;
            const long long e = (n * C + c) * HW + i;
            const float xv = ld(x, e);
            float g = ld(dy, e);
            if (silu) g *= silu_grad((xv - k.mean) * k.scale + k.beta);
            const float xhat = (xv - k.mean) * k.inv;
            a += (double)g;
            b += (double)g * (double)xhat;
        }
    }
    a = block_sum(a, sh);
    b = block_sum(b, sh);
    if (threadIdx.x == 0) {
        part[(2 * (long long)s) * C + c] = a;
        part[(2 * (long long)s + 1) * C + c] = b;
    }
}

// out (6, C): rows 0..4 copied from p (4, C), rows 4..6 the partial sums added in order, as
// f32 (the block q of bn_act_dx, built without a separate concatenation).
extern "C" __global__ void bn_sums_final(const double* __restrict__ part, int S, int C,
                                         const float* __restrict__ p, float* __restrict__ out) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    double a = 0.0, b = 0.0;
    for (int s = 0; s < S; ++s) {
        a += part[(2 * (long long)s) * C + c];
        b += part[(2 * (long long)s + 1) * C + c];
    }
    for (int r = 0; r < 4; ++r) out[r * C + c] = p[r * C + c];
    out[4 * C + c] = (float)a;
    out[5 * C + c] = (float)b;
}

// out (4, C): gamma, beta, mean, biased variance: the parameter block p of the forward, from the
// partial sums of bn_stats_partial and the parameters (same arithmetic as bn_stats_final).
// With `update`, also the running statistics in place (PyTorch `momentum = mom`):
//   running_mean = (1 - mom) * running_mean + mom * mean
//   running_var  = (1 - mom) * running_var  + mom * (var * unbiased)
// on the f32 mean and variance written to out, rounded op by op (no FMA contraction) as the
// candle ops of the CPU path (`BatchNorm2d::fused_block`).
extern "C" __global__ void bn_block_final(const double* __restrict__ part, int S, int C, double m,
                                          const float* __restrict__ gamma,
                                          const float* __restrict__ beta,
                                          float* __restrict__ out, int update, float* rm, float* rv,
                                          float one_minus_mom, float mom, float unbiased) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    double a = 0.0, b = 0.0;
    for (int s = 0; s < S; ++s) {
        a += part[(2 * (long long)s) * C + c];
        b += part[(2 * (long long)s + 1) * C + c];
    }
    const double mean = a / m;
    const double var = b / m - mean * mean;
    const float mean_f = (float)mean, var_f = (float)(var > 0.0 ? var : 0.0);
    out[c] = gamma[c];
    out[C + c] = beta[c];
    out[2 * C + c] = mean_f;
    out[3 * C + c] = var_f;
    if (update) {
        const float vu = __fmul_rn(var_f, unbiased);
        rm[c] = __fadd_rn(__fmul_rn(rm[c], one_minus_mom), __fmul_rn(mean_f, mom));
        rv[c] = __fadd_rn(__fmul_rn(rv[c], one_minus_mom), __fmul_rn(vu, mom));
    }
}

__device__ __forceinline__ float bn_dx1(float xv, float g, const Chan& k, float mg, float mgx,
                                        int silu) {
    if (silu) g *= silu_grad((xv - k.mean) * k.scale + k.beta);
    const float xhat = (xv - k.mean) * k.inv;
    return (g - mg - xhat * mgx) * k.scale;
}

template <typename T>
__device__ void act_dx(const T* __restrict__ x, const T* __restrict__ dy, const float* __restrict__ q,
                       T* __restrict__ dx, long long total, int C, int HW, float m, float eps,
                       int silu) {
    constexpr int V = VecOf<T>::N;
    const long long stride = (long long)gridDim.x * blockDim.x;
    if (HW % V == 0 && aligned16(x) && aligned16(dy) && aligned16(dx) && total / V <= 0xffffffffLL) {
        const unsigned hwv = HW / V;
        const long long nv = total / V;
        for (long long v = blockIdx.x * (long long)blockDim.x + threadIdx.x; v < nv; v += stride) {
            const int c = (int)(((unsigned)v / hwv) % (unsigned)C);
            const Chan k = chan(q, C, c, eps);
            const float mg = q[4 * C + c] / m, mgx = q[5 * C + c] / m;
            const Vec<T> ux = ldv(x + v * V), ug = ldv(dy + v * V);
            Vec<T> o;
#pragma unroll
            for (int e = 0; e < V; ++e) st(o.e, e, bn_dx1(ld(ux.e, e), ld(ug.e, e), k, mg, mgx, silu));
            stv(dx + v * V, o);
        }
        return;
    }
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < total; idx += stride) {
        const int c = (int)((idx / HW) % C);
        const Chan k = chan(q, C, c, eps);
        const float mg = q[4 * C + c] / m, mgx = q[5 * C + c] / m;
        st(dx, idx, bn_dx1(ld(x, idx), ld(dy, idx), k, mg, mgx, silu));
    }
}

#define BN_ACT_KERNELS(T, SUF)                                                                     \
    extern "C" __global__ void bn_stats_partial_##SUF(const T* __restrict__ x, double* part,      \
                                                      int N, int C, int HW, long long chunk) {    \
        stats_partial<T>(x, part, N, C, HW, chunk);                                                \
    }                                                                                              \
    extern "C" __global__ void bn_act_fwd_##SUF(const T* __restrict__ x, const float* p, T* y,    \
                                                long long total, int C, int HW, float eps,         \
                                                int silu) {                                        \
        act_fwd<T>(x, p, y, total, C, HW, eps, silu);                                              \
    }                                                                                              \
    extern "C" __global__ void bn_grad_partial_##SUF(const T* __restrict__ x,                     \
                                                     const T* __restrict__ dy, const float* p,    \
                                                     double* part, int N, int C, int HW,          \
                                                     long long chunk, float eps, int silu) {      \
        grad_partial<T>(x, dy, p, part, N, C, HW, chunk, eps, silu);                               \
    }                                                                                              \
    extern "C" __global__ void bn_act_dx_##SUF(const T* __restrict__ x, const T* __restrict__ dy, \
                                               const float* q, T* dx, long long total, int C,     \
                                               int HW, float m, float eps, int silu) {             \
        act_dx<T>(x, dy, q, dx, total, C, HW, m, eps, silu);                                       \
    }

// dx = dy * silu'(x) for a standalone SiLU (the RepConvN activation after its branch sum).
template <typename T>
__device__ void silu_bwd(const T* __restrict__ x, const T* __restrict__ dy, T* __restrict__ dx,
                         long long total) {
    constexpr int V = VecOf<T>::N;
    const long long stride = (long long)gridDim.x * blockDim.x;
    long long done = 0;
    if (aligned16(x) && aligned16(dy) && aligned16(dx)) {
        const long long nv = total / V;
        for (long long v = blockIdx.x * (long long)blockDim.x + threadIdx.x; v < nv; v += stride) {
            const Vec<T> ux = ldv(x + v * V), ug = ldv(dy + v * V);
            Vec<T> o;
#pragma unroll
            for (int e = 0; e < V; ++e) st(o.e, e, ld(ug.e, e) * silu_grad(ld(ux.e, e)));
            stv(dx + v * V, o);
        }
        done = nv * V;
    }
    for (long long idx = done + blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < total;
         idx += stride) {
        st(dx, idx, ld(dy, idx) * silu_grad(ld(x, idx)));
    }
}
extern "C" __global__ void silu_bwd_f32(const float* x, const float* dy, float* dx, long long total) {
    silu_bwd<float>(x, dy, dx, total);
}
extern "C" __global__ void silu_bwd_bf16(const __nv_bfloat16* x, const __nv_bfloat16* dy,
                                         __nv_bfloat16* dx, long long total) {
    silu_bwd<__nv_bfloat16>(x, dy, dx, total);
}

BN_ACT_KERNELS(float, f32)
BN_ACT_KERNELS(__nv_bfloat16, bf16)

