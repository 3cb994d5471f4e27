//! Model tests: the architecture against the official one, blocks, the training graph, the
//! CPU engine and its INT8, model sizes, the `.pt` converter, the ONNX export and weights by name (one test binary; the files
//! are in `tests/model/`).
mod common;

mod model {
    mod arch_parity;
    mod blocks;
    mod convert;
    mod cpu_engine;
    mod export_onnx;
    mod int8;
    mod parity;
    mod seg;
    mod sizes;
    mod train;
    mod weights_download;
}
