// The TaskAlignedAssigner on the GPU (src/loss/assigner.rs documents the rules and holds the
// CPU version these kernels follow op for op; official utils/tal/assigner.py). Launched by
// src/cuda/tal.rs for src/loss/device_assign.rs. Compiled with -fmad=false (build.rs), so no
// multiply-add is contracted and every f32 operation rounds as the CPU code's does.
//
// Inputs:
//   pbox   (B, 4, A) f32 predicted boxes xyxy in grid units (multiplied by the anchor's stride
//          here, as the CPU path multiplies before copying);
//   scores f32, score of (b, class c, anchor a) at scores[off + b*sb + c*sc + a*sa], a logit
//          when sig != 0 (sigmoid applied on read) or a probability;
//   anc    (A, 3) f32: anchor centre x, y in grid units, stride in pixels;
//   gt     (B*M, 6) f32: x1, y1, x2, y2 in pixels, class, valid (0 or 1).
// Output planes (11, B, A) f32: 0 target score (0 for background), 1 label, 2..6 target box
// xyxy in grid units, 6..10 DFL distances l, t, r, b (clamped to [0, 14.99]), 10 the assigned GT
// row (-1 for background). Background anchors get label 0, a unit box around the anchor and
// distances 0 (the layout of kernels/tal.cu).
//
// 1. tal_topk, one block per GT row (b, j): the top-k anchors of the alignment metric among the
//    anchors strictly inside the GT (descending, NaN first, ties by the lower anchor index); when
//    fewer than k have a metric != 0, the rest of the k slots go, in anchor order, to anchors
//    whose metric is not != 0 (outside the GT or metric 0), and those inside the GT become
//    positives too.
// 2. tal_claim, one thread per (GT row, slot): claims per anchor and the lowest claiming row.
// 3. tal_owner, one thread per anchor: the owner (the single claimer, or the row of highest
//    overlap among all the image's rows), its metric and overlap, and the per-row maxima.
// 4. tal_planes, one thread per anchor: the output planes.

#define TOPK_MAX 32
#define BLOCK 256
#define IN_GT_EPS 1e-9f
#define IOU_EPS 1e-7f
#define DFL_TARGET_MAX 14.99f

struct Box {
    float x1, y1, x2, y2, w, h, at;
};

__device__ __forceinline__ Box prep(float x1, float y1, float x2, float y2) {
    Box b;
    b.x1 = x1;
    b.y1 = y1;
    b.x2 = x2;
    b.y2 = y2;
    b.w = x2 - x1;
    b.h = y2 - y1 + IOU_EPS;
    b.at = (float)atan((double)(b.w / b.h));
    return b;
}

// src/loss/iou.rs ciou_prepared(b1 = GT, b2 = prediction).
__device__ __forceinline__ float ciou(const Box& b1, const Box& b2) {
    const float FOUR_OVER_PI2 = 0.40528473456935109f;
    const float inter = fmaxf(fminf(b1.x2, b2.x2) - fmaxf(b1.x1, b2.x1), 0.0f) *
                        fmaxf(fminf(b1.y2, b2.y2) - fmaxf(b1.y1, b2.y1), 0.0f);
    const float uni = b1.w * b1.h + b2.w * b2.h - inter + IOU_EPS;
    const float iou = inter / uni;
    const float cw = fmaxf(b1.x2, b2.x2) - fminf(b1.x1, b2.x1);
    const float ch = fmaxf(b1.y2, b2.y2) - fminf(b1.y1, b2.y1);
    const float c2 = cw * cw + ch * ch + IOU_EPS;
    const float dx = b2.x1 + b2.x2 - b1.x1 - b1.x2;
    const float dy = b2.y1 + b2.y2 - b1.y1 - b1.y2;
    const float rho2 = (dx * dx + dy * dy) / 4.0f;
    const float d = b2.at - b1.at;
    const float v = FOUR_OVER_PI2 * (d * d);
    const float alpha = v / (v - iou + (1.0f + IOU_EPS));
    return iou - (rho2 / c2 + v * alpha);
}

// clamp(min = 0) that keeps NaN.
__device__ __forceinline__ float clamp0(float x) { return x < 0.0f ? 0.0f : x; }

// src/loss/assigner.rs pow_like_torch.
__device__ __forceinline__ float pow_t(float x, float e) {
    if (e == 0.5f) return sqrtf(x);
    if (e == 1.0f) return x;
    if (e == 2.0f) return x * x;
    if (e == 3.0f) return x * x * x;
    return (float)pow((double)x, (double)e);
}

__device__ __forceinline__ bool inside(float px, float py, const Box& g) {
    return fminf(fminf(fminf(px - g.x1, py - g.y1), g.x2 - px), g.y2 - py) > IN_GT_EPS;
}

struct Args {
    const float* pbox;
    const float* scores;
    long long off, sb, sc, sa;
    int sig;
    const float* anc;
    const float* gt;
    int B, A, M, K;
    float alpha, beta, eps;
};

// The kernels' common arguments (cudarc passes scalars and device pointers, not structs).
#define ARGS_DECL                                                                              \
    const float *pbox, const float *scores, long long off, long long sb, long long sc,         \
        long long sa, int sig, const float *anc, const float *gt, int B, int A, int M, int K, \
        float alpha, float beta, float eps
#define ARGS_MAKE Args p = {pbox, scores, off, sb, sc, sa, sig, anc, gt, B, A, M, K, alpha, beta, eps}

__device__ __forceinline__ Box pred(const Args& p, int b, int a) {
    const long long base = (long long)b * 4 * p.A + a;
    const float s = p.anc[3 * a + 2];
    return prep(p.pbox[base] * s, p.pbox[base + p.A] * s, p.pbox[base + 2 * p.A] * s,
                p.pbox[base + 3 * p.A] * s);
}

__device__ __forceinline__ float score(const Args& p, int b, int c, int a) {
    const float x = p.scores[p.off + b * p.sb + c * p.sc + a * p.sa];
    if (!p.sig) return x;
    return 1.0f / (1.0f + (float)exp(-(double)x));
}

__device__ __forceinline__ Box gt_box(const Args& p, int bj) {
    const float* g = p.gt + 6 * (long long)bj;
    return prep(g[0], g[1], g[2], g[3]);
}

__device__ __forceinline__ float metric(const Args& p, int b, int a, int label, float ov) {
    return pow_t(score(p, b, label, a), p.alpha) * pow_t(ov, p.beta);
}

// Whether (va, ia) ranks before (vb, ib): descending value with NaN first, ties by index.
__device__ __forceinline__ bool before(float va, int ia, float vb, int ib) {
    const bool na = isnan(va), nb = isnan(vb);
    if (na != nb) return na;
    if (na || va == vb) return ia < ib;
    return va > vb;
}

extern "C" __global__ void tal_topk(ARGS_DECL, int* pos, int* npos) {
    ARGS_MAKE;
    const int bj = blockIdx.x;
    const int b = bj / p.M;
    const int tid = threadIdx.x;
    __shared__ float sv[BLOCK];
    __shared__ int si[BLOCK];
    __shared__ int nnz;
    const float* g = p.gt + 6 * (long long)bj;
    if (g[5] == 0.0f) {
        if (tid == 0) npos[bj] = 0;
        return;
    }
    const Box G = gt_box(p, bj);
    const int label = (int)g[4];
    if (tid == 0) nnz = 0;
    __syncthreads();
    // This thread's best candidates, sorted.
    float val[TOPK_MAX];
    int idx[TOPK_MAX];
    int cnt = 0, mine = 0;
    for (int a = tid; a < p.A; a += BLOCK) {
        const float s = p.anc[3 * a + 2];
        if (!inside(p.anc[3 * a] * s, p.anc[3 * a + 1] * s, G)) continue;
        const float m = metric(p, b, a, label, clamp0(ciou(G, pred(p, b, a))));
        if (!(m != 0.0f)) continue;  // metric 0: only a fallback slot
        ++mine;
        int k = cnt < p.K ? cnt : p.K;
        if (k == p.K && !before(m, a, val[p.K - 1], idx[p.K - 1])) continue;
        if (cnt < p.K) ++cnt;
        while (k > 0 && before(m, a, val[k - 1], idx[k - 1])) {
            if (k < p.K) {
                val[k] = val[k - 1];
                idx[k] = idx[k - 1];
            }
            --k;
        }
        val[k] = m;
        idx[k] = a;
    }
    atomicAdd(&nnz, mine);
    __syncthreads();
    const int total = nnz;
    const int take = total < p.K ? total : p.K;
    int head = 0;
    int* out = pos + (long long)bj * p.K;
    for (int r = 0; r < take; ++r) {
        sv[tid] = head < cnt ? val[head] : -1.0f;
        si[tid] = head < cnt ? idx[head] : 0x7fffffff;
        __syncthreads();
        for (int w = BLOCK / 2; w > 0; w >>= 1) {
            if (tid < w && before(sv[tid + w], si[tid + w], sv[tid], si[tid])) {
                sv[tid] = sv[tid + w];
                si[tid] = si[tid + w];
            }
            __syncthreads();
        }
        const int win = si[0];
        if (head < cnt && idx[head] == win) ++head;
        if (tid == 0) out[r] = win;
        __syncthreads();
    }
    if (tid != 0) return;
    int n = take;
    if (total < p.K) {
        int left = p.K - total;
        for (int a = 0; a < p.A && left > 0; ++a) {
            const float s = p.anc[3 * a + 2];
            const bool in = inside(p.anc[3 * a] * s, p.anc[3 * a + 1] * s, G);
            if (in) {
                const float m = metric(p, b, a, label, clamp0(ciou(G, pred(p, b, a))));
                if (m != 0.0f) continue;
            }
            --left;
            if (in) out[n++] = a;
        }
    }
    npos[bj] = n;
}

// claims and top (= M - lowest claiming row) are (B, A), zero on entry.
extern "C" __global__ void tal_claim(const int* pos, const int* npos, int* claims, int* top, int B,
                                     int A, int M, int K) {
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (long long)B * M * K) return;
    const int bj = (int)(t / K), r = (int)(t % K);
    if (r >= npos[bj]) return;
    const int b = bj / M, j = bj % M;
    const long long i = (long long)b * A + pos[t];
    atomicAdd(&claims[i], 1);
    atomicMax(&top[i], M - j);
}

// Largest of non-negative floats (or NaN, kept as the largest) through their bit patterns.
__device__ __forceinline__ void atomic_max_nonneg(float* at, float x) {
    const int bits = isnan(x) ? 0x7fc00000 : (x <= 0.0f ? 0 : __float_as_int(x));
    atomicMax((int*)at, bits);
}

// owner (B, A) out; am (B, A) out; pmax (2, B, M) zero on entry: per-row maxima of the metric
// (plane 0) and the overlap (plane 1) over the row's positives.
extern "C" __global__ void tal_owner(ARGS_DECL, const int* claims, const int* top, int* owner,
                                     float* am, float* pmax) {
    ARGS_MAKE;
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)p.B * p.A) return;
    const int b = (int)(i / p.A), a = (int)(i % p.A);
    const int c = claims[i];
    if (c == 0) {
        owner[i] = -1;
        return;
    }
    const Box P = pred(p, b, a);
    const int row0 = b * p.M;
    int j;
    float ov;
    if (c == 1) {
        j = p.M - top[i];
        ov = clamp0(ciou(gt_box(p, row0 + j), P));
    } else {
        // The highest overlap among all the image's rows (padded ones too), the first on ties.
        j = 0;
        ov = clamp0(ciou(gt_box(p, row0), P));
        for (int jj = 1; jj < p.M; ++jj) {
            const float o = clamp0(ciou(gt_box(p, row0 + jj), P));
            if (!isnan(ov) && (o > ov || isnan(o))) {
                j = jj;
                ov = o;
            }
        }
    }
    const int label = (int)p.gt[6 * (long long)(row0 + j) + 4];
    const float m = metric(p, b, a, label, ov);
    owner[i] = j;
    am[i] = m;
    const long long BM = (long long)p.B * p.M;
    atomic_max_nonneg(&pmax[row0 + j], m);
    atomic_max_nonneg(&pmax[BM + row0 + j], ov);
}

__device__ __forceinline__ float clamp_dfl(float v) {
    if (v < 0.0f) return 0.0f;
    if (v > DFL_TARGET_MAX) return DFL_TARGET_MAX;
    return v;
}

extern "C" __global__ void tal_planes(ARGS_DECL, const int* owner, const float* am,
                                      const float* pmax, float* out) {
    ARGS_MAKE;
    const long long BA = (long long)p.B * p.A;
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= BA) return;
    const int b = (int)(i / p.A), a = (int)(i % p.A);
    const float ax = p.anc[3 * a], ay = p.anc[3 * a + 1], st = p.anc[3 * a + 2];
    const int j = owner[i];
    if (j < 0) {
        out[i] = 0.0f;
        out[BA + i] = 0.0f;
        out[2 * BA + i] = ax - 1.0f;
        out[3 * BA + i] = ay - 1.0f;
        out[4 * BA + i] = ax + 1.0f;
        out[5 * BA + i] = ay + 1.0f;
        for (int k = 6; k < 10; ++k) out[k * BA + i] = 0.0f;
        out[10 * BA + i] = -1.0f;
        return;
    }
    const long long bj = (long long)b * p.M + j;
    const long long BM = (long long)p.B * p.M;
    const float* g = p.gt + 6 * bj;
    const float tb[4] = {g[0] / st, g[1] / st, g[2] / st, g[3] / st};
    out[i] = am[i] * pmax[BM + bj] / (pmax[bj] + p.eps);
    out[BA + i] = g[4];
    for (int k = 0; k < 4; ++k) out[(2 + k) * BA + i] = tb[k];
    out[6 * BA + i] = clamp_dfl(ax - tb[0]);
    out[7 * BA + i] = clamp_dfl(ay - tb[1]);
    out[8 * BA + i] = clamp_dfl(tb[2] - ax);
    out[9 * BA + i] = clamp_dfl(tb[3] - ay);
    out[10 * BA + i] = (float)j;
}
