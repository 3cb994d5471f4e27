// Element access shared by the kernels that store f32, f16 or bf16 and compute in f32:
// ld(p, i) reads element i as float, st(p, i, v) rounds v to the element type (round to nearest
// even, as __float2half / __float2bfloat16) and writes it. Included by bias_act.cu, bn_act.cu,
// dfl.cu and pool.cu; not compiled on its own (build.rs compiles only *.cu).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

__device__ __forceinline__ float ld(const float* p, long long i) { return p[i]; }
__device__ __forceinline__ float ld(const __half* p, long long i) { return __half2float(p[i]); }
__device__ __forceinline__ float ld(const __nv_bfloat16* p, long long i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void st(float* p, long long i, float v) { p[i] = v; }
__device__ __forceinline__ void st(__half* p, long long i, float v) { p[i] = __float2half(v); }
__device__ __forceinline__ void st(__nv_bfloat16* p, long long i, float v) { p[i] = __float2bfloat16(v); }

// 16-byte vectors of the element type (8 bf16/f16 or 4 f32), for the kernels' vector paths:
// ldv/stv move one whole vector (the pointer must be 16-byte aligned: check with aligned16).
template <typename T>
struct VecOf {
    static constexpr int N = 16 / sizeof(T);
};
template <typename T>
struct alignas(16) Vec {
    T e[VecOf<T>::N];
};
__device__ __forceinline__ bool aligned16(const void* p) { return (reinterpret_cast<unsigned long long>(p) & 15ull) == 0; }
template <typename T>
__device__ __forceinline__ Vec<T> ldv(const T* p) { return *reinterpret_cast<const Vec<T>*>(p); }
template <typename T>
__device__ __forceinline__ void stv(T* p, const Vec<T>& v) { *reinterpret_cast<Vec<T>*>(p) = v; }

// SiLU z·σ(z) of an f32 sum whose result is stored as T. For f32 outputs the accurate expf and
// division; for f16/bf16 outputs (rounded to 2^-11 / 2^-8 relative) the hardware's approximate
// exponential and division (__expf, __fdividef: a few f32 ulp for the |z| a network produces),
// about a fifth of the instructions, which matters where the SiLU and not the memory bounds a
// kernel (the first convolution, the in-place bias + SiLU of products). For z below about -88,
// e^-z is infinite and both give -0 (the limit).
template <typename T>
__device__ __forceinline__ float silu_for(float z) { return __fdividef(z, 1.0f + __expf(-z)); }
template <>
__device__ __forceinline__ float silu_for<float>(float z) { return z / (1.0f + expf(-z)); }
