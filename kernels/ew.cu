// Element-wise add and copy over row-strided operands, for the training graph's additions,
// gradient sums and copies of channel slices (Rust side: src/cuda/ew.rs, src/model/ew.rs).
// An operand is R rows of L contiguous elements, row r starting at element r * S of its buffer:
// a contiguous tensor is one row, a narrow along dimension 1 of a contiguous (N, C, H, W) tensor
// is N rows of n*H*W elements with S = C*H*W. The output is contiguous (row r at r * L).
// f32, f16 and bf16 (suffix _f32 / _f16 / _bf16); additions in f32, rounded once to the type.
// Grid: x strides over a row's vectors, y over rows. 16-byte vectors (elem.cuh) when every
// pointer is 16-byte aligned and L and the strides are multiples of the vector width.

#include "elem.cuh"

template <typename T>
__device__ void add_rows(const T* __restrict__ a, long long sa, const T* __restrict__ b,
                         long long sb, T* __restrict__ y, long long rows, long long len) {
    constexpr int V = VecOf<T>::N;
    const long long step = (long long)gridDim.x * blockDim.x;
    const long long t0 = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    const bool vec = aligned16(a) && aligned16(b) && aligned16(y) && len % V == 0 && sa % V == 0 &&
                     sb % V == 0;
    for (long long r = blockIdx.y; r < rows; r += gridDim.y) {
        const T* ar = a + r * sa;
        const T* br = b + r * sb;
        T* yr = y + r * len;
        if (vec) {
            for (long long v = t0; v < len / V; v += step) {
                const Vec<T> ua = ldv(ar + v * V), ub = ldv(br + v * V);
                Vec<T> o;
#pragma unroll
                for (int e = 0; e < V; ++e) st(o.e, e, ld(ua.e, e) + ld(ub.e, e));
                stv(yr + v * V, o);
            }
        } else {
            for (long long i = t0; i < len; i += step) st(yr, i, ld(ar, i) + ld(br, i));
        }
    }
}

template <typename T>
__device__ void copy_rows(const T* __restrict__ a, long long sa, T* __restrict__ y, long long rows,
                          long long len) {
    constexpr int V = VecOf<T>::N;
    const long long step = (long long)gridDim.x * blockDim.x;
    const long long t0 = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    const bool vec = aligned16(a) && aligned16(y) && len % V == 0 && sa % V == 0;
    for (long long r = blockIdx.y; r < rows; r += gridDim.y) {
        const T* ar = a + r * sa;
        T* yr = y + r * len;
        if (vec) {
            for (long long v = t0; v < len / V; v += step) stv(yr + v * V, ldv(ar + v * V));
        } else {
            for (long long i = t0; i < len; i += step) yr[i] = ar[i];
        }
    }
}

#define EW_KERNELS(T, SUF)                                                                         \
    extern "C" __global__ void ew_add_rows_##SUF(const T* a, long long sa, const T* b,            \
                                                 long long sb, T* y, long long rows,              \
                                                 long long len) {                                 \
        add_rows<T>(a, sa, b, sb, y, rows, len);                                                   \
    }                                                                                              \
    extern "C" __global__ void ew_copy_rows_##SUF(const T* a, long long sa, T* y, long long rows, \
                                                  long long len) {                                \
        copy_rows<T>(a, sa, y, rows, len);                                                         \
    }

EW_KERNELS(float, f32)
EW_KERNELS(__half, f16)
EW_KERNELS(__nv_bfloat16, bf16)
