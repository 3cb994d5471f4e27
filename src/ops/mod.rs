//! Custom Candle ops: backward passes Candle lacks, CUDA kernels under the `cuda` feature.
