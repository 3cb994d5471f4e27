// Element-wise arctangent for the CIoU aspect term (src/loss/iou.rs `atan_with_grad`), launched by
// src/cuda/atan.rs. Evaluated in f64 and rounded to f32, as the CPU path (Rust f64::atan).

extern "C" __global__ void atan_f32(const float* x, float* y, long long n) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = (float)atan((double)x[i]);
}

extern "C" __global__ void atan_f64(const double* x, double* y, long long n) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = atan(x[i]);
}
