// Batched NMS of decoded YOLO outputs: the official `non_max_suppression` (candidates, stable
// descending sort, the `max_nms` cut, class-offset greedy NMS, `max_det`) for every image of a
// batch in one launch, one block per image. It equals the host version
// (src/detect/postprocess.rs `nms_image`) row for row and bit for bit: compiled with -fmad=false
// (build.rs NO_FMA), every box and IoU value is rounded as the host rounds it.
//
// Input `pred` (B, 4+nc, A) f32, contiguous: rows cx, cy, w, h (or x1, y1, x2, y2 when `xyxy`),
// then nc class scores. Output `out` (B, 1 + max_det*7) f32: out[b][0] = the number of kept rows
// k, then k rows [x1, y1, x2, y2, conf, cls, anchor] by decreasing confidence.
//
// Order: the key of a candidate (anchor j, class c) is (descending score, j*nc + c): the host's
// stable sort by decreasing score of the candidates made in anchor order, classes ascending.
// Keys are unique, so the order is total and the result does not depend on thread timing.
//
// Scratch (from the caller): `keys` (B, cap) u64 for every candidate, `det` (B, kmax, 12) f32 for
// the candidates that survive the max_nms cut (raw box, offset box, area, score, class, anchor).
// Rust side: src/cuda/nms.rs (launch), src/detect/device_nms.rs (the op and its CPU version).

#define NMS_THREADS 1024
#define MAX_WH 7680.0f
#define KEY_NONE 0xFFFFFFFFFFFFFFFFull

// Ascending order of the u32 image of a float (NaN never reaches here); -0 is folded to +0 so
// that equal scores compare equal, as on the host.
__device__ __forceinline__ unsigned int order_bits(float s) {
    if (s == 0.0f) s = 0.0f;
    unsigned int u = __float_as_uint(s);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ unsigned long long make_key(float s, unsigned int idx) {
    // Descending score first: the complement of the ascending image.
    return ((unsigned long long)(~order_bits(s)) << 32) | (unsigned long long)idx;
}

// Warp-wide minimum of (key, slot) by shuffles: lane 0 ends with the warp's minimum.
__device__ __forceinline__ void warp_min(unsigned long long& key, int& slot) {
    for (int o = 16; o > 0; o >>= 1) {
        const unsigned long long k2 = __shfl_down_sync(0xffffffffu, key, o);
        const int s2 = __shfl_down_sync(0xffffffffu, slot, o);
        if (k2 < key) {
            key = k2;
            slot = s2;
        }
    }
}

// Block-wide minimum of (key, slot); every thread gets the result.
__device__ void block_min(unsigned long long key, int slot, unsigned long long* s_key, int* s_slot,
                          unsigned long long* out_key, int* out_slot) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    warp_min(key, slot);
    if (lane == 0) {
        s_key[warp] = key;
        s_slot[warp] = slot;
    }
    __syncthreads();
    if (warp == 0) {
        const int nw = blockDim.x >> 5;
        key = lane < nw ? s_key[lane] : KEY_NONE;
        slot = lane < nw ? s_slot[lane] : -1;
        warp_min(key, slot);
        if (lane == 0) {
            *out_key = key;
            *out_slot = slot;
        }
    }
    __syncthreads();
}

extern "C" __global__ void nms_batched(const float* __restrict__ pred, unsigned long long* __restrict__ keys,
                                       float* __restrict__ det, float* __restrict__ out,
                                       const unsigned char* __restrict__ class_ok, int nc, int A,
                                       long long cap, int kmax, float conf, double iou, int multi,
                                       int agnostic, int xyxy, int max_det) {
    __shared__ unsigned int s_n, s_m, s_k;
    __shared__ unsigned long long s_prefix, s_mask, s_best;
    __shared__ int s_slot;
    __shared__ unsigned int hist[256];
    __shared__ unsigned long long r_key[32];
    __shared__ int r_slot[32];

    const int b = blockIdx.x;
    const int tid = threadIdx.x, nt = blockDim.x;
    const float* p = pred + (long long)b * (4 + nc) * A;
    unsigned long long* k = keys + (long long)b * cap;
    float* d = det + (long long)b * kmax * 12;
    float* o = out + (long long)b * (1 + (long long)max_det * 7);
    if (tid == 0) {
        s_n = 0;
        s_m = 0;
    }
    __syncthreads();

    // 1. Candidates: the best class (first maximum) must beat `conf`; then one candidate for it,
    //    or, multi-label, one per class above `conf`; classes outside `class_ok` are dropped.
    for (int j = tid; j < A; j += nt) {
        float best = -INFINITY;
        int bc = 0;
        for (int c = 0; c < nc; ++c) {
            const float s = p[(long long)(4 + c) * A + j];
            if (s > best) {
                best = s;
                bc = c;
            }
        }
        if (!(best > conf)) continue;
        if (multi) {
            for (int c = 0; c < nc; ++c) {
                const float s = p[(long long)(4 + c) * A + j];
                if (s > conf && class_ok[c]) {
                    const unsigned int slot = atomicAdd(&s_n, 1u);
                    k[slot] = make_key(s, (unsigned int)j * (unsigned int)nc + (unsigned int)c);
                }
            }
        } else if (class_ok[bc]) {
            const unsigned int slot = atomicAdd(&s_n, 1u);
            k[slot] = make_key(best, (unsigned int)j * (unsigned int)nc + (unsigned int)bc);
        }
    }
    __syncthreads();
    const unsigned int n = s_n;

    // 2. The max_nms cut: the kmax-th smallest key by radix selection (8 bits a pass).
    unsigned long long limit = KEY_NONE;
    if (n > (unsigned int)kmax) {
        if (tid == 0) {
            s_prefix = 0;
            s_mask = 0;
            s_k = (unsigned int)kmax;
        }
        for (int shift = 56; shift >= 0; shift -= 8) {
            for (int i = tid; i < 256; i += nt) hist[i] = 0;
            __syncthreads();
            const unsigned long long prefix = s_prefix, mask = s_mask;
            for (unsigned int i = tid; i < n; i += nt) {
                const unsigned long long key = k[i];
                if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255ull], 1u);
            }
            __syncthreads();
            if (tid == 0) {
                unsigned int want = s_k, cum = 0;
                int digit = 0;
                for (; digit < 255; ++digit) {
                    if (cum + hist[digit] >= want) break;
                    cum += hist[digit];
                }
                s_k = want - cum;
                s_prefix = prefix | ((unsigned long long)digit << shift);
                s_mask = mask | (255ull << shift);
            }
            __syncthreads();
        }
        limit = s_prefix;
    }

    // 3. The survivors with their boxes, as the host builds them: xyxy from xywh, then the
    //    class offset (agnostic: none) and the area of the offset box.
    for (unsigned int i = tid; i < n; i += nt) {
        const unsigned long long key = k[i];
        if (key > limit) continue;
        const unsigned int slot = atomicAdd(&s_m, 1u);
        const unsigned int idx = (unsigned int)(key & 0xFFFFFFFFull);
        const int j = (int)(idx / (unsigned int)nc), c = (int)(idx % (unsigned int)nc);
        float x1, y1, x2, y2;
        const float a0 = p[j], a1 = p[(long long)A + j], a2 = p[2LL * A + j], a3 = p[3LL * A + j];
        if (xyxy) {
            x1 = a0;
            y1 = a1;
            x2 = a2;
            y2 = a3;
        } else {
            x1 = a0 - a2 / 2.0f;
            y1 = a1 - a3 / 2.0f;
            x2 = a0 + a2 / 2.0f;
            y2 = a1 + a3 / 2.0f;
        }
        const float cls = (float)c;
        const float off = cls * (agnostic ? 0.0f : MAX_WH);
        const float ox1 = x1 + off, oy1 = y1 + off, ox2 = x2 + off, oy2 = y2 + off;
        float* r = d + (long long)slot * 12;
        r[0] = x1;
        r[1] = y1;
        r[2] = x2;
        r[3] = y2;
        r[4] = ox1;
        r[5] = oy1;
        r[6] = ox2;
        r[7] = oy2;
        r[8] = (ox2 - ox1) * (oy2 - oy1);
        r[9] = p[(long long)(4 + c) * A + j];
        r[10] = cls;
        r[11] = (float)j;
        // The slot's key now lives in `k` at the slot (the cut left at most kmax of them).
    }
    __syncthreads();
    const unsigned int m = s_m;
    // Rewrite the keys by slot: each slot's key from its row (score, class, anchor) is the same
    // key as before, so rebuild it rather than move it (no second key array needed).
    for (unsigned int i = tid; i < m; i += nt) {
        const float* r = d + (long long)i * 12;
        const unsigned int idx = (unsigned int)r[11] * (unsigned int)nc + (unsigned int)r[10];
        k[i] = make_key(r[9], idx);
    }
    __syncthreads();

    // 4. Greedy NMS: take the smallest live key, keep it, kill every live box whose IoU with it
    //    is > iou (f32 IoU compared in f64, as torchvision); until max_det rows or none live.
    int kept = 0;
    while (kept < max_det) {
        unsigned long long mine = KEY_NONE;
        int mslot = -1;
        for (unsigned int i = tid; i < m; i += nt) {
            const unsigned long long key = k[i];
            if (key < mine) {
                mine = key;
                mslot = (int)i;
            }
        }
        block_min(mine, mslot, r_key, r_slot, &s_best, &s_slot);
        const unsigned long long best = s_best;
        const int bi = s_slot;
        if (best == KEY_NONE) break;
        const float* rb = d + (long long)bi * 12;
        if (tid == 0) {
            float* row = o + 1 + (long long)kept * 7;
            row[0] = rb[0];
            row[1] = rb[1];
            row[2] = rb[2];
            row[3] = rb[3];
            row[4] = rb[9];
            row[5] = rb[10];
            row[6] = rb[11];
            k[bi] = KEY_NONE;
        }
        ++kept;
        const float bx1 = rb[4], by1 = rb[5], bx2 = rb[6], by2 = rb[7], ba = rb[8];
        for (unsigned int i = tid; i < m; i += nt) {
            if ((int)i == bi || k[i] == KEY_NONE) continue;
            const float* r = d + (long long)i * 12;
            const float w = fmaxf(fminf(bx2, r[6]) - fmaxf(bx1, r[4]), 0.0f);
            const float h = fmaxf(fminf(by2, r[7]) - fmaxf(by1, r[5]), 0.0f);
            const float inter = w * h;
            const float ovr = inter / (ba + r[8] - inter);
            if ((double)ovr > iou) k[i] = KEY_NONE;
        }
        __syncthreads();
    }
    if (tid == 0) o[0] = (float)kept;
}
