//! Launch of the network's first convolution straight from the f32 NCHW input
//! (`kernels/first_conv.cu`): `x` (N, 3, H, W) f32 → `act(conv(x) + b)` (N, H/2, W/2, C)
//! channels-last in f16 or bf16, for a 3×3 stride-2 padding-1 kernel of 3 input channels (the
//! first layer of every YOLOv9 model), C a multiple of 8 up to [`MAX_CHANNELS`]. Used by
//! [`crate::model::conv::Conv::first_nhwc`]; the composite it replaces is
//! [`crate::model::layout::nhwc_from_nchw`] then the fused cuDNN convolution.

use candle_core::backend::BackendStorage;
use candle_core::cuda::CudaDType;
use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::WrapErr;
use candle_core::{
    CpuStorage, CudaStorage, CustomOp1, DType, Error, Layout, Result, Shape, Storage, Tensor,
};

/// The PTX of `kernels/first_conv.cu`.
const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/first_conv.ptx"));
/// Module name under which candle caches the loaded PTX.
const MODULE: &str = "yolo9_first_conv";
/// Threads per block.
const BLOCK: u32 = 128;
/// The most output channels [`first_conv`] takes (its weights in shared memory: 28·C f32).
pub const MAX_CHANNELS: usize = 256;
fn err(msg: impl std::fmt::Display) -> Error {
    Error::Msg(format!("first convolution (CUDA): {msg}"))
}

/// `act(conv(x) + b)` (module docs): `x` (N, 3, H, W) f32 CUDA, `w_t` the kernel as (27, C) f32
/// contiguous (input channel, row, column major: the (C, 3, 3, 3) kernel reshaped and
/// transposed), `b` (C,) f32, output (N, ⌈H/2⌉, ⌈W/2⌉, C) in `dtype` (f16 or bf16).
///
/// Errors: other shapes or dtypes, C not a multiple of 8 or above [`MAX_CHANNELS`].
pub fn first_conv(
    x: &Tensor,
    w_t: &Tensor,
    b: &Tensor,
    silu: bool,
    dtype: DType,
) -> Result<Tensor> {
    let (taps, c) = w_t.dims2()?;
    if taps != 27
        || !c.is_multiple_of(8)
        || c > MAX_CHANNELS
        || b.dims() != [c]
        || w_t.dtype() != DType::F32
        || b.dtype() != DType::F32
        || x.dtype() != DType::F32
        || x.dims4()?.1 != 3
        || !matches!(dtype, DType::F16 | DType::BF16)
    {
        return Err(err(format!(
            "input {:?} {:?}, kernel {:?}, bias {:?}, output {dtype:?}",
            x.dims(),
            x.dtype(),
            w_t.dims(),
            b.dims()
        )));
    }
    x.contiguous()?.apply_op1_no_bwd(&FirstConv {
        w: w_t.contiguous()?,
        b: b.contiguous()?,
        silu,
        dtype,
    })
}

struct FirstConv {
    w: Tensor,
    b: Tensor,
    silu: bool,
    dtype: DType,
}

impl CustomOp1 for FirstConv {
    fn name(&self) -> &'static str {
        "first-conv"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        Err(err("CUDA only"))
    }

    fn cuda_fwd(&self, s: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
        match self.dtype {
            DType::F16 => self.run::<half::f16>(s, l, "f16"),
            _ => self.run::<half::bf16>(s, l, "bf16"),
        }
    }
}

fn i32_of(v: usize, what: &str) -> Result<i32> {
    i32::try_from(v).map_err(|_| err(format!("{what} = {v} does not fit in i32")))
}

impl FirstConv {
    fn run<T: CudaDType + DeviceRepr>(
        &self,
        s: &CudaStorage,
        l: &Layout,
        suf: &str,
    ) -> Result<(CudaStorage, Shape)> {
        let (n, _, h, w) = l.shape().dims4()?;
        let c = self.b.dims1()?;
        let (ho, wo) = (h.div_ceil(2), w.div_ceil(2));
        let (a, z) = l
            .contiguous_offsets()
            .ok_or_else(|| err("the input is not contiguous"))?;
        let x = s.as_cuda_slice::<f32>()?.slice(a..z);
        let (ws, wl) = self.w.storage_and_layout();
        let (bs, bl) = self.b.storage_and_layout();
        let (Storage::Cuda(ws), Storage::Cuda(bs)) = (&*ws, &*bs) else {
            return Err(err("the kernel or bias is not on the GPU"));
        };
        let w0 = wl.start_offset();
        let wv = ws.as_cuda_slice::<f32>()?.slice(w0..w0 + 27 * c);
        let bv = bs
            .as_cuda_slice::<f32>()?
            .slice(bl.start_offset()..bl.start_offset() + c);
        let dev = s.device().clone();
        // Threads: one per two neighbouring pixels of an output row.
        let pairs = n * ho * wo.div_ceil(2);
        // SAFETY: every element is written by the kernel (each pixel's C channels).
        let mut y = unsafe { dev.alloc::<T>(n * ho * wo * c)? };
        if pairs > 0 {
            let f = dev.get_or_load_custom_func(&format!("first_conv_{suf}"), MODULE, PTX)?;
            let (pairs_, h_, w_) = (pairs as i64, i32_of(h, "H")?, i32_of(w, "W")?);
            let (ho_, wo_, c_) = (i32_of(ho, "H'")?, i32_of(wo, "W'")?, i32_of(c, "C")?);
            let silu_ = i32::from(self.silu);
            let mut k = f.builder();
            k.arg(&x)
                .arg(&wv)
                .arg(&bv)
                .arg(&mut y)
                .arg(&pairs_)
                .arg(&h_)
                .arg(&w_)
                .arg(&ho_)
                .arg(&wo_)
                .arg(&c_)
                .arg(&silu_);
            let cfg = LaunchConfig {
                grid_dim: (pairs.div_ceil(BLOCK as usize).min(1 << 20) as u32, 1, 1),
                block_dim: (BLOCK, 1, 1),
                shared_mem_bytes: (28 * c * 4) as u32,
            };
            // SAFETY: x holds N·3·H·W f32, w 27·C and b C f32, y N·H'·W'·C of T (16-byte
            // aligned: a fresh allocation, C a multiple of 8); 28·C f32 of shared memory; the
            // arguments match the kernel's (x, w, b, y, pairs, H, W, H', W', C, silu).
            unsafe { k.launch(cfg) }.w()?;
        }
        Ok((
            CudaStorage::wrap_cuda_slice(y, dev),
            Shape::from((n, ho, wo, c)),
        ))
    }
}
