//! CUDA launch of the detection head's DFL expectation (`kernels/dfl.cu`) for
//! [`crate::model::head::dfl`]: logits (B, 64, A) of f32, f16 or bf16, any strides (a narrow of
//! the concatenated head output is read in place) → distances (B, 4, A), contiguous, same dtype.
//! One launch where the composite (softmax, multiply by the bins, sum) took about a dozen,
//! among them a 16-wide max reduction over every anchor.

use candle_core::backend::BackendStorage;
use candle_core::cuda::CudaDType;
use candle_core::cuda_backend::cudarc::driver::{
    DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg,
};
use candle_core::cuda_backend::WrapErr;
use candle_core::{CudaStorage, DType, Error, Layout, Result, Shape};

/// The PTX of `kernels/dfl.cu`.
const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/dfl.ptx"));
/// Module name under which candle caches the loaded PTX.
const MODULE: &str = "yolo9_dfl";
/// Bins per box side (the kernel's `BINS`).
pub const BINS: usize = 16;

fn err(msg: impl std::fmt::Display) -> Error {
    Error::Msg(format!("dfl (CUDA): {msg}"))
}

/// Distances (B, 4, A) of the logits `x` (B, 4·[`BINS`], A).
pub fn dfl(s: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
    match s.dtype() {
        DType::F32 => run::<f32>(s, l, "f32"),
        DType::F16 => run::<half::f16>(s, l, "f16"),
        DType::BF16 => run::<half::bf16>(s, l, "bf16"),
        d => Err(err(format!("dtype {d:?}; f32, f16 and bf16 are supported"))),
    }
}

fn run<T: CudaDType + DeviceRepr>(
    s: &CudaStorage,
    l: &Layout,
    suf: &str,
) -> Result<(CudaStorage, Shape)> {
    let (b, c, a) = l.shape().dims3()?;
    if c != 4 * BINS {
        return Err(err(format!("expected {} channels, got {c}", 4 * BINS)));
    }
    let st = l.stride();
    let x = s.as_cuda_slice::<T>()?.slice(l.start_offset()..);
    let dev = s.device().clone();
    let total = b * 4 * a;
    // SAFETY: every element is written by the kernel before it is read.
    let mut y = unsafe { dev.alloc::<T>(total)? };
    let shape = Shape::from((b, 4, a));
    if total == 0 {
        return Ok((CudaStorage::wrap_cuda_slice(y, dev), shape));
    }
    let a_ = i32::try_from(a).map_err(|_| err("A does not fit in i32"))?;
    let (total_, sb, sc, sa) = (total as i64, st[0] as i64, st[1] as i64, st[2] as i64);
    let f = dev.get_or_load_custom_func(&format!("dfl_{suf}"), MODULE, PTX)?;
    let mut bld = f.builder();
    bld.arg(&x)
        .arg(&mut y)
        .arg(&total_)
        .arg(&a_)
        .arg(&sb)
        .arg(&sc)
        .arg(&sa);
    let cfg = LaunchConfig {
        grid_dim: (total.div_ceil(256).min(65_535 * 8) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the view starts at the layout's offset and every element the strides reach lies
    // in the storage (candle's layout invariant); y holds `total` elements.
    unsafe { bld.launch(cfg) }.w()?;
    Ok((CudaStorage::wrap_cuda_slice(y, dev), shape))
}

/// One level of channels-last head outputs for [`decode_levels`]: box logits `(B, H, W, 64)` and
/// class logits `(B, H, W, nc)`, each with evenly spaced pixels, and the level's stride (pixels).
pub struct Level<'a> {
    /// Box logits, side-major `side·16 + bin` in the last dimension.
    pub boxes: &'a candle_core::Tensor,
    /// Class logits.
    pub classes: &'a candle_core::Tensor,
    /// The level's stride in input pixels.
    pub stride: f32,
}

/// The whole decode of channels-last head outputs (`kernels/dfl.cu`, `decode_levels`, one launch
/// for all levels): `(B, 4+nc, A)` f32 with rows cx, cy, w, h in input pixels and the class sigmoids,
/// anchors level after level, row-major within a level (what [`crate::model::head::decode`]
/// computes from the NCHW outputs).
///
/// Errors: no levels or more than 4, levels of different batch, dtype or class count, pixels not
/// evenly spaced, a box tensor without 64 channels, sizes beyond i32.
pub fn decode_levels(levels: &[Level]) -> Result<candle_core::Tensor> {
    let first = levels.first().ok_or_else(|| err("decode: no levels"))?;
    let op = DecodeOp {
        levels: levels
            .iter()
            .map(|l| (l.boxes.clone(), l.classes.clone(), l.stride))
            .collect(),
    };
    first.boxes.apply_op1_no_bwd(&op)
}

/// The most levels one decode launch takes (the kernel's `DecodeLevels`).
const MAX_LEVELS: usize = 4;

/// One level of the kernel's by-value `DecodeLevels` (`kernels/dfl.cu`, same layout): device
/// pointers of the box and class logits, their pixel strides, the level's B·H·W threads, its first
/// anchor row and first thread, H·W, W and its stride in pixels.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct DecodeLevel {
    bx: u64,
    cx: u64,
    bld: i64,
    cld: i64,
    total: i64,
    a_off: i64,
    start: i64,
    hw: i32,
    w: i32,
    stride: f32,
    pad: i32,
}

/// The kernel's `DecodeLevels`.
#[repr(C)]
#[derive(Clone, Copy)]
struct DecodeLevels {
    l: [DecodeLevel; MAX_LEVELS],
}

// SAFETY: plain C structs of integers and floats, the layout of the kernel's parameter.
unsafe impl DeviceRepr for DecodeLevels {}

struct DecodeOp {
    levels: Vec<(candle_core::Tensor, candle_core::Tensor, f32)>,
}

impl candle_core::CustomOp1 for DecodeOp {
    fn name(&self) -> &'static str {
        "decode-levels"
    }

    fn cpu_fwd(
        &self,
        _: &candle_core::CpuStorage,
        _: &Layout,
    ) -> Result<(candle_core::CpuStorage, Shape)> {
        Err(err("decode: CUDA only"))
    }

    fn cuda_fwd(&self, s: &CudaStorage, _: &Layout) -> Result<(CudaStorage, Shape)> {
        match s.dtype() {
            DType::F32 => self.run::<f32>(s, "f32"),
            DType::F16 => self.run::<half::f16>(s, "f16"),
            DType::BF16 => self.run::<half::bf16>(s, "bf16"),
            d => Err(err(format!("dtype {d:?}; f32, f16 and bf16 are supported"))),
        }
    }
}

impl DecodeOp {
    fn run<T: CudaDType + DeviceRepr>(
        &self,
        s: &CudaStorage,
        suf: &str,
    ) -> Result<(CudaStorage, Shape)> {
        use candle_core::Storage;
        let dev = s.device().clone();
        let (b, _, _, _) = self.levels[0].0.dims4()?;
        let nc = self.levels[0].1.dims4()?.3;
        let mut a_total = 0usize;
        for (bx, cx, _) in &self.levels {
            let (bb, h, w, c) = bx.dims4()?;
            let (cb, ch, cw, cc) = cx.dims4()?;
            if c != 4 * BINS || (bb, cb) != (b, b) || (ch, cw) != (h, w) || cc != nc {
                return Err(err(format!(
                    "decode: level shapes {:?} and {:?}",
                    bx.dims(),
                    cx.dims()
                )));
            }
            if bx.dtype() != s.dtype() || cx.dtype() != s.dtype() {
                return Err(err("decode: levels of different dtypes"));
            }
            a_total += h * w;
        }
        let rows = 4 + nc;
        if self.levels.len() > MAX_LEVELS {
            return Err(err(format!(
                "decode: {} levels, at most {MAX_LEVELS}",
                self.levels.len()
            )));
        }
        // SAFETY: the levels write every anchor's 4 + nc rows (their anchors add up to A).
        let mut out = unsafe { dev.alloc::<f32>(b * rows * a_total)? };
        let f = dev.get_or_load_custom_func(&format!("decode_levels_{suf}"), MODULE, PTX)?;
        let i32_of = |v: usize| i32::try_from(v).map_err(|_| err("decode: size beyond i32"));
        let stream = dev.cuda_stream();
        // The levels' storages stay read-locked until the launch.
        let held: Vec<_> = self
            .levels
            .iter()
            .map(|(bx, cx, _)| (bx.storage_and_layout(), cx.storage_and_layout()))
            .collect();
        let mut p = DecodeLevels {
            l: [DecodeLevel::default(); MAX_LEVELS],
        };
        let (mut a_off, mut start) = (0usize, 0usize);
        for (i, (((bs, bl), (cs, cl)), (bx, _, stride))) in
            held.iter().zip(&self.levels).enumerate()
        {
            let (_, h, w, _) = bx.dims4()?;
            let (Storage::Cuda(bs), Storage::Cuda(cs)) = (&**bs, &**cs) else {
                return Err(err("decode: a level is not on the GPU"));
            };
            let bld = super::gemm::row_stride(bl).ok_or_else(|| err("decode: box pixels"))?;
            let cld = super::gemm::row_stride(cl).ok_or_else(|| err("decode: class pixels"))?;
            let size = std::mem::size_of::<T>() as u64;
            let bp =
                bs.as_cuda_slice::<T>()?.device_ptr(&stream).0 + bl.start_offset() as u64 * size;
            let cp =
                cs.as_cuda_slice::<T>()?.device_ptr(&stream).0 + cl.start_offset() as u64 * size;
            let total = b * h * w;
            p.l[i] = DecodeLevel {
                bx: bp,
                cx: cp,
                bld: bld as i64,
                cld: cld as i64,
                total: total as i64,
                a_off: a_off as i64,
                start: start as i64,
                hw: i32_of(h * w)?,
                w: i32_of(w)?,
                stride: *stride,
                pad: 0,
            };
            a_off += h * w;
            start += total;
        }
        if start > 0 {
            let (nc_, a_, nlev, all) = (
                i32_of(nc)?,
                a_total as i64,
                self.levels.len() as i32,
                start as i64,
            );
            let mut k = f.builder();
            k.arg(&mut out)
                .arg(&nc_)
                .arg(&a_)
                .arg(&nlev)
                .arg(&all)
                .arg(&p);
            let cfg = LaunchConfig {
                grid_dim: (start.div_ceil(128).min(65_535 * 8) as u32, 1, 1),
                block_dim: (128, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: each level's pointers start at its layout's offset and hold B·H·W pixels
            // `ld` apart (row_stride checked it), their storages read-locked in `held`; out holds
            // B·(4+nc)·A f32 and level i writes rows a_off .. a_off + H·W of each image; the
            // arguments match the kernel's (out, nc, A, nlev, all, DecodeLevels by value).
            unsafe { k.launch(cfg) }.w()?;
        }
        Ok((
            CudaStorage::wrap_cuda_slice(out, dev),
            Shape::from((b, rows, a_total)),
        ))
    }
}
