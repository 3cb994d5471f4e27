// The three loss terms of one branch (CIoU box, DFL, BCE class) per anchor, forward and backward,
// for src/loss/terms.rs (which documents the math and holds the CPU version these kernels
// follow op for op). Launched by src/cuda/tal.rs.
//
// flat (B, C, A) f32 head output, C = 64 + nc (16 DFL bins per side l, t, r, b, then the class
// logits); planes (10, B, A) f32: weight, label, target box xyxy, DFL distances; anc (A, 2) grid
// units. One thread per anchor (b, a).

#define REG_MAX 16
#define BLOCK 256

__device__ __forceinline__ float dmin_(float a, float b) { return a < b ? 1.0f : (a == b ? 0.5f : 0.0f); }
__device__ __forceinline__ float dmax_(float a, float b) { return dmin_(b, a); }

struct Anchor {
    float w, label, tb[4], t[4], ax, ay;
};

__device__ __forceinline__ Anchor load_anchor(const float* planes, const float* anc, long long BA, long long i,
                                              int a) {
    Anchor r;
    r.w = planes[i];
    r.label = planes[BA + i];
    for (int k = 0; k < 4; ++k) {
        r.tb[k] = planes[(2 + k) * BA + i];
        r.t[k] = planes[(6 + k) * BA + i];
    }
    r.ax = anc[2 * a];
    r.ay = anc[2 * a + 1];
    return r;
}

// Softmax of one side's bins (in registers) and its expected distance; l is overwritten with
// logp, p receives the probabilities.
__device__ __forceinline__ float side(float* l, float* p) {
    float m = l[0];
    for (int k = 1; k < REG_MAX; ++k) m = fmaxf(m, l[k]);
    float s = 0.0f;
    for (int k = 0; k < REG_MAX; ++k) s = __fadd_rn(s, expf(__fsub_rn(l[k], m)));
    const float lse = logf(s);
    float dist = 0.0f;
    for (int k = 0; k < REG_MAX; ++k) {
        l[k] = __fsub_rn(__fsub_rn(l[k], m), lse);
        p[k] = expf(l[k]);
        dist = __fadd_rn(dist, __fmul_rn(p[k], (float)k));
    }
    return dist;
}

__device__ __forceinline__ float dfl_w(int k, float t) {
    return fmaxf(__fadd_rn(__fmul_rn(fabsf(__fsub_rn((float)k, t)), -1.0f), 1.0f), 0.0f);
}

// CIoU of b1 (pred) and b2 (target) and its gradient with respect to b1 (alpha constant).
__device__ float ciou_grad(const float* b1, const float* b2, float* g) {
    const float eps = 1e-7f;
    const float FOUR_OVER_PI2 = 0.40528473456935109f;
    const float x1 = b1[0], y1 = b1[1], x2 = b1[2], y2 = b1[3];
    const float bx1 = b2[0], by1 = b2[1], bx2 = b2[2], by2 = b2[3];
    const float w1 = __fsub_rn(x2, x1), h1 = __fadd_rn(__fsub_rn(y2, y1), eps);
    const float w2 = __fsub_rn(bx2, bx1), h2 = __fadd_rn(__fsub_rn(by2, by1), eps);
    const float ix = __fsub_rn(fminf(x2, bx2), fmaxf(x1, bx1));
    const float iy = __fsub_rn(fminf(y2, by2), fmaxf(y1, by1));
    const float iw = fmaxf(ix, 0.0f), ih = fmaxf(iy, 0.0f);
    const float inter = __fmul_rn(iw, ih);
    const float uni = __fadd_rn(__fsub_rn(__fadd_rn(__fmul_rn(w1, h1), __fmul_rn(w2, h2)), inter), eps);
    const float iou = __fdiv_rn(inter, uni);
    const float cw = __fsub_rn(fmaxf(x2, bx2), fminf(x1, bx1));
    const float ch = __fsub_rn(fmaxf(y2, by2), fminf(y1, by1));
    const float c2 = __fadd_rn(__fadd_rn(__fmul_rn(cw, cw), __fmul_rn(ch, ch)), eps);
    const float dx = __fsub_rn(__fsub_rn(__fadd_rn(bx1, bx2), x1), x2);
    const float dy = __fsub_rn(__fsub_rn(__fadd_rn(by1, by2), y1), y2);
    const float rho2 = __fmul_rn(__fadd_rn(__fmul_rn(dx, dx), __fmul_rn(dy, dy)), 0.25f);
    const float r1 = __fdiv_rn(w1, h1);
    const float a1 = (float)atan((double)r1);
    const float a2 = (float)atan((double)__fdiv_rn(w2, h2));
    const float d = __fsub_rn(a2, a1);
    const float v = __fmul_rn(__fmul_rn(d, d), FOUR_OVER_PI2);
    const float alpha = __fdiv_rn(v, __fadd_rn(__fsub_rn(v, iou), 1.0f + eps));
    const float ciou = __fsub_rn(iou, __fadd_rn(__fdiv_rn(rho2, c2), __fmul_rn(v, alpha)));
    if (g) {
        const float rx = ix >= 0.0f ? 1.0f : 0.0f, ry = iy >= 0.0f ? 1.0f : 0.0f;
        const float diw[4] = {-rx * dmax_(x1, bx1), 0.0f, rx * dmin_(x2, bx2), 0.0f};
        const float dih[4] = {0.0f, -ry * dmax_(y1, by1), 0.0f, ry * dmin_(y2, by2)};
        const float dwh1[4] = {-h1, -w1, h1, w1};
        const float dcw[4] = {-dmin_(x1, bx1), 0.0f, dmax_(x2, bx2), 0.0f};
        const float dch[4] = {0.0f, -dmin_(y1, by1), 0.0f, dmax_(y2, by2)};
        const float drho[4] = {-dx / 2.0f, -dy / 2.0f, -dx / 2.0f, -dy / 2.0f};
        const float dr1[4] = {-1.0f / h1, w1 / (h1 * h1), 1.0f / h1, -w1 / (h1 * h1)};
        const float datan = 1.0f / (1.0f + r1 * r1);
        for (int q = 0; q < 4; ++q) {
            const float di = ih * diw[q] + iw * dih[q];
            const float du = dwh1[q] - di;
            const float diou = (di * uni - inter * du) / (uni * uni);
            const float dc2 = 2.0f * cw * dcw[q] + 2.0f * ch * dch[q];
            const float drc = (drho[q] * c2 - rho2 * dc2) / (c2 * c2);
            const float dv = FOUR_OVER_PI2 * 2.0f * d * (-datan * dr1[q]);
            g[q] = diou - drc - alpha * dv;
        }
    }
    return ciou;
}

__device__ __forceinline__ float log1p_exp_neg_abs(float x) {
    const float e = expf(-fabsf(x));
    const float u = __fadd_rn(e, 1.0f);
    return __fadd_rn(logf(u), __fdiv_rn(__fsub_rn(e, __fsub_rn(u, 1.0f)), u));
}

// part (3, B*A) f64: per-anchor box, class and DFL terms.
extern "C" __global__ void tal_terms_fwd(const float* __restrict__ flat, const float* __restrict__ planes,
                                         const float* __restrict__ anc, double* __restrict__ part, int B, int C,
                                         int A) {
    const long long BA = (long long)B * A;
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= BA) return;
    const int b = (int)(i / A), a = (int)(i % A);
    const float* f = flat + (long long)b * C * A + a;
    const Anchor an = load_anchor(planes, anc, BA, i, a);
    float dist[4], ce = 0.0f;
    for (int s = 0; s < 4; ++s) {
        float l[REG_MAX], p[REG_MAX];
        for (int k = 0; k < REG_MAX; ++k) l[k] = f[(long long)(s * REG_MAX + k) * A];
        dist[s] = side(l, p);
        float cs = 0.0f;
        for (int k = 0; k < REG_MAX; ++k) cs = __fadd_rn(cs, __fmul_rn(l[k], dfl_w(k, an.t[s])));
        ce = __fadd_rn(ce, cs);
    }
    const float pb[4] = {__fadd_rn(-dist[0], an.ax), __fadd_rn(-dist[1], an.ay), __fadd_rn(dist[2], an.ax),
                         __fadd_rn(dist[3], an.ay)};
    const float ciou = ciou_grad(pb, an.tb, nullptr);
    const float bx = __fmul_rn(__fadd_rn(__fmul_rn(ciou, -1.0f), 1.0f), an.w);
    const float dfl = __fmul_rn(__fmul_rn(ce, -0.25f), an.w);
    double sp = 0.0, xt = 0.0;
    const int nc = C - 4 * REG_MAX;
    for (int c = 0; c < nc; ++c) {
        const float x = f[(long long)(4 * REG_MAX + c) * A];
        sp += (double)__fadd_rn(fmaxf(x, 0.0f), log1p_exp_neg_abs(x));
        if (an.label == (float)c) xt += (double)__fmul_rn(x, an.w);
    }
    part[i] = (double)bx;
    part[BA + i] = sp - xt;
    part[2 * BA + i] = (double)dfl;
}

// out (3,) f32: the sums of part (3, n), one block per term, fixed order (deterministic).
extern "C" __global__ void tal_terms_sum(const double* __restrict__ part, long long n, float* __restrict__ out) {
    __shared__ double sh[BLOCK];
    const double* p = part + (long long)blockIdx.x * n;
    double acc = 0.0;
    for (long long j = threadIdx.x; j < n; j += BLOCK) acc += p[j];
    sh[threadIdx.x] = acc;
    __syncthreads();
    for (int off = BLOCK / 2; off > 0; off >>= 1) {
        if (threadIdx.x < off) sh[threadIdx.x] += sh[threadIdx.x + off];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = (float)sh[0];
}

// d flat (B, C, A) for the output gradient g (3,) = (box, cls, dfl).
extern "C" __global__ void tal_terms_bwd(const float* __restrict__ flat, const float* __restrict__ planes,
                                         const float* __restrict__ anc, const float* __restrict__ g,
                                         float* __restrict__ dflat, int B, int C, int A) {
    const long long BA = (long long)B * A;
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= BA) return;
    const int b = (int)(i / A), a = (int)(i % A);
    const float* f = flat + (long long)b * C * A + a;
    float* o = dflat + (long long)b * C * A + a;
    const Anchor an = load_anchor(planes, anc, BA, i, a);
    const float g_box = g[0], g_cls = g[1], g_dfl = g[2];
    float P[4][REG_MAX], dist[4];
    for (int s = 0; s < 4; ++s) {
        float l[REG_MAX];
        for (int k = 0; k < REG_MAX; ++k) l[k] = f[(long long)(s * REG_MAX + k) * A];
        dist[s] = side(l, P[s]);
    }
    const float pb[4] = {__fadd_rn(-dist[0], an.ax), __fadd_rn(-dist[1], an.ay), __fadd_rn(dist[2], an.ax),
                         __fadd_rn(dist[3], an.ay)};
    float dc[4];
    ciou_grad(pb, an.tb, dc);
    const float sign[4] = {-1.0f, -1.0f, 1.0f, 1.0f};
    for (int s = 0; s < 4; ++s) {
        float swt = 0.0f;
        for (int k = 0; k < REG_MAX; ++k) swt += dfl_w(k, an.t[s]);
        const float gbox = g_box * -an.w * dc[s] * sign[s];
        for (int k = 0; k < REG_MAX; ++k) {
            const float ddist = P[s][k] * ((float)k - dist[s]);
            const float ddfl = -0.25f * an.w * (dfl_w(k, an.t[s]) - P[s][k] * swt);
            o[(long long)(s * REG_MAX + k) * A] = gbox * ddist + g_dfl * ddfl;
        }
    }
    const int nc = C - 4 * REG_MAX;
    for (int c = 0; c < nc; ++c) {
        const float x = f[(long long)(4 * REG_MAX + c) * A];
        const float t = an.label == (float)c ? an.w : 0.0f;
        const float sig = 1.0f / (1.0f + expf(-x));
        o[(long long)(4 * REG_MAX + c) * A] = g_cls * (sig - t);
    }
}
