// Multi-tensor optimizer kernels (one launch for every parameter tensor of the model), launched by
// src/cuda/optim.rs for train/optimizer.rs (SGD Nesterov, gradient-norm clip) and train/ema.rs.
//
// Every kernel walks a chunk table: block c handles elements [start_c, min(start_c + chunk, n_t))
// of tensor t_c, where tensor t's data is at the device address ptrs[t] (f32, contiguous).
// The arithmetic uses explicitly rounded operations (__fmul_rn, __fadd_rn) so that nvcc does not
// contract them into FMAs: every update is rounded exactly as the element-wise candle ops of the
// CPU path (train/optimizer.rs, train/ema.rs), which the GPU parity tests compare against.

#define BLOCK 256

typedef unsigned long long u64;
typedef long long i64;

// The elements [start, end) of tensor t that this block handles.
struct Span {
    i64 t, start, end;
};

__device__ Span span(const i64 *sizes, const i64 *chunk_t, const i64 *chunk_s, i64 chunk) {
    const i64 c = blockIdx.x;
    const i64 t = chunk_t[c];
    const i64 s = chunk_s[c];
    const i64 n = sizes[t];
    return Span{t, s, s + chunk < n ? s + chunk : n};
}

// Sum of squares per chunk, in f64, deterministic (fixed tree order, no atomics); the host adds
// the per-chunk partials in order.
extern "C" __global__ void mt_sumsq_f32(const u64 *ptrs, const i64 *sizes, const i64 *chunk_t,
                                        const i64 *chunk_s, i64 chunk, double *partials) {
    __shared__ double sh[BLOCK];
    const Span sp = span(sizes, chunk_t, chunk_s, chunk);
    const i64 t = sp.t, s = sp.start, e = sp.end;
    const float *g = (const float *)ptrs[t];
    double acc = 0.0;
    for (i64 i = s + threadIdx.x; i < e; i += BLOCK) {
        const double v = (double)g[i];
        acc += v * v;
    }
    sh[threadIdx.x] = acc;
    __syncthreads();
    for (int o = BLOCK / 2; o > 0; o >>= 1) {
        if (threadIdx.x < o) sh[threadIdx.x] += sh[threadIdx.x + o];
        __syncthreads();
    }
    if (threadIdx.x == 0) partials[blockIdx.x] = sh[0];
}

// In-place x *= scale for every tensor (the gradient-norm clip).
extern "C" __global__ void mt_scale_f32(const u64 *ptrs, const i64 *sizes, const i64 *chunk_t,
                                        const i64 *chunk_s, i64 chunk, float scale) {
    const Span sp = span(sizes, chunk_t, chunk_s, chunk);
    const i64 t = sp.t, s = sp.start, e = sp.end;
    float *x = (float *)ptrs[t];
    for (i64 i = s + threadIdx.x; i < e; i += BLOCK) x[i] = __fmul_rn(x[i], scale);
}

// SGD with Nesterov momentum and per-tensor weight decay / LR (PyTorch `SGD(nesterov=True)`):
//   g' = g + wd * w;  b = momentum * b + g';  w = w - lr * (g' + momentum * b).
// b starts at zero, which makes the first step's b equal to g' exactly (PyTorch: b = g').
extern "C" __global__ void mt_sgd_f32(const u64 *w_ptrs, const u64 *b_ptrs, const u64 *g_ptrs,
                                      const i64 *sizes, const float *lr, const float *wd,
                                      const i64 *chunk_t, const i64 *chunk_s, i64 chunk,
                                      float momentum) {
    const Span sp = span(sizes, chunk_t, chunk_s, chunk);
    const i64 t = sp.t, s = sp.start, e = sp.end;
    float *w = (float *)w_ptrs[t];
    float *b = (float *)b_ptrs[t];
    const float *g = (const float *)g_ptrs[t];
    const float lrt = lr[t];
    const float wdt = wd[t];
    for (i64 i = s + threadIdx.x; i < e; i += BLOCK) {
        const float wi = w[i];
        float gi = g[i];
        if (wdt != 0.0f) gi = __fadd_rn(gi, __fmul_rn(wi, wdt));
        const float bi = __fadd_rn(__fmul_rn(b[i], momentum), gi);
        b[i] = bi;
        const float u = __fadd_rn(gi, __fmul_rn(bi, momentum));
        w[i] = __fsub_rn(wi, __fmul_rn(u, lrt));
    }
}

// EMA: e = d * e + (1 - d) * m, with d and 1 - d given (both rounded to f32 by the host).
extern "C" __global__ void mt_ema_f32(const u64 *e_ptrs, const u64 *m_ptrs, const i64 *sizes,
                                      const i64 *chunk_t, const i64 *chunk_s, i64 chunk, float d,
                                      float one_minus_d) {
    const Span sp = span(sizes, chunk_t, chunk_s, chunk);
    const i64 t = sp.t, s = sp.start, e = sp.end;
    float *ev = (float *)e_ptrs[t];
    const float *m = (const float *)m_ptrs[t];
    for (i64 i = s + threadIdx.x; i < e; i += BLOCK)
        ev[i] = __fadd_rn(__fmul_rn(ev[i], d), __fmul_rn(m[i], one_minus_d));
}

// Gradient accumulation: out[t] = a[t] + b[t], or out[t] = b[t] where a_ptrs is null (a copy). out
// may be a (in place); the sum is rounded as candle's element-wise add.
extern "C" __global__ void mt_add_f32(const u64 *out_ptrs, const u64 *a_ptrs, const u64 *b_ptrs,
                                      const i64 *sizes, const i64 *chunk_t, const i64 *chunk_s,
                                      i64 chunk) {
    const Span sp = span(sizes, chunk_t, chunk_s, chunk);
    const i64 t = sp.t, s = sp.start, e = sp.end;
    float *o = (float *)out_ptrs[t];
    const float *b = (const float *)b_ptrs[t];
    if (a_ptrs == nullptr) {
        for (i64 i = s + threadIdx.x; i < e; i += BLOCK) o[i] = b[i];
    } else {
        const float *a = (const float *)a_ptrs[t];
        for (i64 i = s + threadIdx.x; i < e; i += BLOCK) o[i] = __fadd_rn(a[i], b[i]);
    }
}
