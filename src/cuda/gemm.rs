//! 1×1 convolutions of channels-last activations as cuBLAS products that read their inputs where
//! they lie: a channel slice of a larger tensor (RepNCSPELAN4's half of `cv1`'s output) through
//! its row stride, and a concatenation (`cv4(cat[y, a, c])`) as the sum of one product per part
//! into the same output (`β = 1` after the first), so that neither the slice nor the
//! concatenation is copied.
//!
//! Each part `x_i` is `(B, H, W, C_i)` whose rows (pixels) are evenly spaced (`strides
//! [H·W·ld, W·ld, ld, 1]`, `ld ≥ C_i`: contiguous, or a slice of the channels of a contiguous
//! tensor); the weight `w` is `(K, ΣC_i)` contiguous (the `(K, 1, 1, C)` kernel of a 1×1
//! convolution); the output is a new contiguous `(B, H, W, K)`:
//! `out = Σ_i x_i · w[:, o_i .. o_i + C_i]ᵀ`, `o_i = Σ_{j<i} C_j`.
//!
//! Row-major `out (M, K) = x (M, C) · wᵀ` is column-major `outᵀ (K, M) = w · xᵀ`: cuBLAS
//! `gemm(op(A) = T on w viewed (C, K) with lda = ΣC, op(B) = N on x viewed (C, M) with
//! ldb = ld, ldc = K)`. Accumulation in f32 (`CUBLAS_COMPUTE_32F`, no TF32) for f32, f16 and
//! bf16, as candle's own products; with several parts the f16/bf16 output is rounded after each
//! part's product.

use candle_core::backend::BackendStorage;
use candle_core::cuda::CudaDType;
use candle_core::cuda_backend::cudarc::cublas::{result::gemm_ex, sys};
use candle_core::cuda_backend::cudarc::driver::{DevicePtr, DevicePtrMut, DeviceRepr};
use candle_core::{
    CpuStorage, CudaStorage, CustomOp1, DType, Error, Layout, Result, Shape, Storage, Tensor,
};

fn err(msg: impl std::fmt::Display) -> Error {
    Error::Msg(format!("pointwise GEMM (CUDA): {msg}"))
}

/// The row stride of a `(B, H, W, C)` layout whose rows are evenly spaced, `None` otherwise.
pub fn row_stride(l: &Layout) -> Option<usize> {
    let d = l.shape().dims();
    let s = l.stride();
    if d.len() != 4 || s[3] != 1 {
        return None;
    }
    let ld = s[2];
    (ld >= d[3] && s[1] == d[2] * ld && s[0] == d[1] * s[1]).then_some(ld)
}

/// `Σ_i parts[i] · w[:, o_i .. o_i + C_i]ᵀ` (module docs): `parts` `(B, H, W, C_i)` CUDA
/// tensors of `w`'s dtype (f32, f16 or bf16) with evenly spaced rows ([`row_stride`]), `w`
/// `(K, ΣC_i)` → `(B, H, W, K)`.
///
/// Errors: no parts, parts of different pixels or dtypes, rows not evenly spaced, channel
/// counts that do not add up to `w`'s, sizes beyond i32, cuBLAS errors.
pub fn pointwise_parts(parts: &[&Tensor], w: &Tensor) -> Result<Tensor> {
    let (first, rest) = parts.split_first().ok_or_else(|| err("no input"))?;
    let w = w.contiguous()?;
    first.apply_op1_no_bwd(&PartsGemm {
        rest: rest.iter().map(|t| (*t).clone()).collect(),
        cols: None,
        w,
    })
}

/// `x · w[:, col .. col + C]ᵀ` for one `(B, H, W, C)` part `x` (rows evenly spaced, as
/// [`pointwise_parts`]), `w` `(K, C_w)` with `col + C ≤ C_w` → `(B, H, W, K)`: the product of
/// one part of a concatenation computed on its own (the head's upsampled parts, at their lower
/// resolution, [`crate::model::conv::Conv::run_cat_into`]). Errors: as [`pointwise_parts`];
/// columns beyond `w`'s.
pub fn pointwise_part_at(x: &Tensor, col: usize, w: &Tensor) -> Result<Tensor> {
    let w = w.contiguous()?;
    x.apply_op1_no_bwd(&PartsGemm {
        rest: vec![],
        cols: Some(vec![col]),
        w,
    })
}

struct PartsGemm {
    rest: Vec<Tensor>,
    /// Each part's first column of `w`; `None`: the parts cover `w`'s columns in order.
    cols: Option<Vec<usize>>,
    w: Tensor,
}

/// The cuBLAS element type of a dtype.
fn data_type(d: DType) -> Result<sys::cudaDataType> {
    Ok(match d {
        DType::F32 => sys::cudaDataType::CUDA_R_32F,
        DType::F16 => sys::cudaDataType::CUDA_R_16F,
        DType::BF16 => sys::cudaDataType::CUDA_R_16BF,
        d => return Err(err(format!("dtype {d:?}; f32, f16 and bf16 are supported"))),
    })
}

fn i32_of(v: usize, what: &str) -> Result<i32> {
    i32::try_from(v).map_err(|_| err(format!("{what} = {v} does not fit in i32")))
}

impl CustomOp1 for PartsGemm {
    fn name(&self) -> &'static str {
        "pointwise-parts-gemm"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        Err(err("CUDA only"))
    }

    fn cuda_fwd(&self, s: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
        match s.dtype() {
            DType::F32 => self.run::<f32>(s, l),
            DType::F16 => self.run::<half::f16>(s, l),
            DType::BF16 => self.run::<half::bf16>(s, l),
            d => Err(err(format!("dtype {d:?}; f32, f16 and bf16 are supported"))),
        }
    }
}

impl PartsGemm {
    fn run<T: CudaDType + DeviceRepr>(
        &self,
        s: &CudaStorage,
        l: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let (b, h, wd, _) = l.shape().dims4()?;
        let k = self.w.dims2()?.0;
        let dev = s.device().clone();
        let stream = dev.cuda_stream();
        // The other parts' storages, read-locked for the call.
        let held: Vec<_> = self.rest.iter().map(|t| t.storage_and_layout()).collect();
        let mut parts: Vec<(&CudaStorage, &Layout)> = vec![(s, l)];
        parts.extend(cuda_storages(&held)?);
        let lds = checked_strides(&parts, &self.w)?;
        let cols = match &self.cols {
            Some(c) => checked_cols(&parts, c, &self.w)?,
            None => covering_cols(&parts, &self.w)?,
        };
        let m = b * h * wd;
        // SAFETY: every element is written by the first product (β = 0) before it is read.
        let mut out = unsafe { dev.alloc::<T>(m * k)? };
        {
            let (o_ptr, _og) = out.device_ptr_mut(&stream);
            products::<T>(&parts, &lds, &cols, &self.w, (o_ptr, k), m)?;
        }
        Ok((
            CudaStorage::wrap_cuda_slice(out, dev),
            Shape::from((b, h, wd, k)),
        ))
    }
}

/// The CUDA storages of read-locked parts (`Tensor::storage_and_layout` of each) with their
/// layouts. Errors: a part not on the GPU.
fn cuda_storages<'a, G: std::ops::Deref<Target = Storage>>(
    held: &'a [(G, &'a Layout)],
) -> Result<Vec<(&'a CudaStorage, &'a Layout)>> {
    held.iter()
        .map(|(st, pl)| match &**st {
            Storage::Cuda(cs) => Ok((cs, *pl)),
            _ => Err(err("an input is not on the GPU")),
        })
        .collect()
}

/// Each part's first column of `w` where the parts cover its columns in order. Errors: channel
/// counts that do not add up to `w`'s.
fn covering_cols(parts: &[(&CudaStorage, &Layout)], w: &Tensor) -> Result<Vec<usize>> {
    let ctot = w.dims2()?.1;
    let mut cols = Vec::with_capacity(parts.len());
    let mut channels = 0;
    for (_, pl) in parts {
        cols.push(channels);
        channels += pl.shape().dims4()?.3;
    }
    if channels != ctot {
        return Err(err(format!(
            "inputs of {channels} channels for a kernel of {ctot}"
        )));
    }
    Ok(cols)
}

/// `cols` (each part's first column of `w`), after checking that there is one per part and that
/// each part's columns lie within `w`'s.
fn checked_cols(
    parts: &[(&CudaStorage, &Layout)],
    cols: &[usize],
    w: &Tensor,
) -> Result<Vec<usize>> {
    let ctot = w.dims2()?.1;
    if cols.len() != parts.len() {
        return Err(err(format!(
            "{} columns for {} inputs",
            cols.len(),
            parts.len()
        )));
    }
    for ((_, pl), &col) in parts.iter().zip(cols) {
        let c = pl.shape().dims4()?.3;
        if col + c > ctot {
            return Err(err(format!(
                "an input of {c} channels at column {col} of a kernel of {ctot}"
            )));
        }
    }
    Ok(cols.to_vec())
}

/// Each part's row stride, after checking that the parts share pixels and the kernel's dtype.
fn checked_strides(parts: &[(&CudaStorage, &Layout)], w: &Tensor) -> Result<Vec<usize>> {
    let (first_s, first_l) = parts.first().ok_or_else(|| err("no input"))?;
    let dtype = first_s.dtype();
    if w.dtype() != dtype {
        return Err(err(format!("weight {:?}, input {dtype:?}", w.dtype())));
    }
    let (b, h, wd, _) = first_l.shape().dims4()?;
    let mut lds = Vec::with_capacity(parts.len());
    for (ps, pl) in parts {
        let (pb, ph, pw, _) = pl.shape().dims4()?;
        if (pb, ph, pw) != (b, h, wd) || ps.dtype() != dtype {
            return Err(err(format!(
                "input {:?} {:?} beside {:?} {dtype:?}",
                pl.shape().dims(),
                ps.dtype(),
                first_l.shape().dims()
            )));
        }
        lds.push(row_stride(pl).ok_or_else(|| err("an input's pixels are not evenly spaced"))?);
    }
    Ok(lds)
}

/// [`pointwise_parts`] written into channels `c_off .. c_off + K` of `out`, a contiguous
/// `(B, H, W, C_total)` tensor of the parts' pixels and dtype (a concatenation built in place,
/// [`crate::model::layout::concat_buffer`]): the products' output rows are `out`'s pixels,
/// `C_total` elements apart. The other channels of `out` are not touched.
///
/// `cols`: each part's first column of `w`, where the parts do not cover `w`'s columns in order
/// (some of them computed apart: [`pointwise_part_at`]); `None`: they do.
///
/// Errors: as [`pointwise_parts`]; `out` not contiguous, of another dtype, device or pixel
/// count, or too narrow for the slot; `cols` not one per part or beyond `w`'s columns.
pub fn pointwise_parts_into(
    parts: &[&Tensor],
    cols: Option<&[usize]>,
    w: &Tensor,
    (out, c_off): (&Tensor, usize),
) -> Result<()> {
    let w = w.contiguous()?;
    let k = w.dims2()?.0;
    let (ob, oh, ow, oc) = out.dims4()?;
    let first = parts.first().ok_or_else(|| err("no input"))?;
    let (b, h, wd, _) = first.dims4()?;
    if (ob, oh, ow) != (b, h, wd)
        || c_off + k > oc
        || !out.is_contiguous()
        || out.dtype() != w.dtype()
        || !out.device().same_device(first.device())
    {
        return Err(err(format!(
            "output {:?} {:?} at channel {c_off} for {k} channels of {:?}",
            out.dims(),
            out.dtype(),
            first.dims()
        )));
    }
    let held: Vec<_> = parts.iter().map(|t| t.storage_and_layout()).collect();
    let ps = cuda_storages(&held)?;
    let lds = checked_strides(&ps, &w)?;
    let cols = match cols {
        Some(c) => checked_cols(&ps, c, &w)?,
        None => covering_cols(&ps, &w)?,
    };
    let (ost, ol) = out.storage_and_layout();
    let Storage::Cuda(os) = &*ost else {
        return Err(err("the output is not on the GPU"));
    };
    let m = b * h * wd;
    let slot = (os, ol.start_offset() + c_off, oc);
    match out.dtype() {
        DType::F32 => into_t::<f32>(&ps, (&lds, &cols), &w, slot, m),
        DType::F16 => into_t::<half::f16>(&ps, (&lds, &cols), &w, slot, m),
        DType::BF16 => into_t::<half::bf16>(&ps, (&lds, &cols), &w, slot, m),
        d => Err(err(format!("dtype {d:?}; f32, f16 and bf16 are supported"))),
    }
}

fn into_t<T: CudaDType + DeviceRepr>(
    parts: &[(&CudaStorage, &Layout)],
    (lds, cols): (&[usize], &[usize]),
    w: &Tensor,
    (os, start, ldc): (&CudaStorage, usize, usize),
    m: usize,
) -> Result<()> {
    let stream = os.device().cuda_stream();
    // The slot is written through a pointer taken from a shared borrow: the tensor is candle's,
    // its elements are plain device memory that no other op of this stream reads concurrently
    // (stream order), as in `fused_conv::conv_bias_act_nhwc_into`.
    let (o_ptr, _og) = os.as_cuda_slice::<T>()?.device_ptr(&stream);
    let o_ptr = o_ptr + (start * std::mem::size_of::<T>()) as u64;
    products::<T>(parts, lds, cols, w, (o_ptr, ldc), m)
}

/// The products of [`pointwise_parts`]: `Σ_i parts[i] · w[:, o_i ..]ᵀ` into the `m` rows of
/// `out.0` (a device pointer of `T`), rows `out.1` elements apart, on the stream of candle's
/// cuBLAS handle; `lds` are the parts' row strides and `cols` their first columns `o_i`, already
/// checked.
fn products<T: CudaDType + DeviceRepr>(
    parts: &[(&CudaStorage, &Layout)],
    lds: &[usize],
    cols: &[usize],
    w: &Tensor,
    (o_ptr, ldc): (u64, usize),
    m: usize,
) -> Result<()> {
    let dtype = w.dtype();
    let ty = data_type(dtype)?;
    let (k, ctot) = w.dims2()?;
    let (wst, wl) = w.storage_and_layout();
    let Storage::Cuda(ws) = &*wst else {
        return Err(err("the kernel is not on the GPU"));
    };
    let dev = ws.device().clone();
    let stream = dev.cuda_stream();
    let (w0, _) = wl
        .contiguous_offsets()
        .ok_or_else(|| err("the kernel is not contiguous"))?;
    let (w_ptr, _wg) = ws.as_cuda_slice::<T>()?.device_ptr(&stream);
    let w_ptr = w_ptr + (w0 * dtype.size_in_bytes()) as u64;
    let (m_, k_, ctot_) = (i32_of(m, "B*H*W")?, i32_of(k, "K")?, i32_of(ctot, "C")?);
    let ldc_ = i32_of(ldc, "output row stride")?;
    let blas = dev.cublas_handle();
    let handle = *blas.handle();
    let (alpha, zero, one) = (1f32, 0f32, 1f32);
    let size = dtype.size_in_bytes();
    for (i, (((ps, pl), &ld), &off)) in parts.iter().zip(lds).zip(cols).enumerate() {
        let c = pl.shape().dims()[3];
        let (x_ptr, _xg) = ps.as_cuda_slice::<T>()?.device_ptr(&stream);
        let x_ptr = x_ptr + (pl.start_offset() * size) as u64;
        let beta = if i == 0 { &zero } else { &one };
        // SAFETY: w holds K rows of C_w elements (column offset `off` + C ≤ C_w, checked), x holds M
        // rows of `ld` elements from its start (its layout says so: `row_stride`), out holds
        // M rows of `ldc` ≥ K elements (the callers' allocation or slot); the pointers are of
        // `dtype`, matching `ty`; alpha and beta are f32 as CUBLAS_COMPUTE_32F takes them; all
        // on the stream of candle's cuBLAS handle.
        unsafe {
            gemm_ex(
                handle,
                sys::cublasOperation_t::CUBLAS_OP_T,
                sys::cublasOperation_t::CUBLAS_OP_N,
                k_,
                m_,
                i32_of(c, "C_i")?,
                (&alpha as *const f32).cast(),
                (w_ptr + (off * size) as u64) as *const std::ffi::c_void,
                ty,
                ctot_,
                x_ptr as *const std::ffi::c_void,
                ty,
                i32_of(ld, "row stride")?,
                (beta as *const f32).cast(),
                o_ptr as *mut std::ffi::c_void,
                ty,
                ldc_,
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT_TENSOR_OP,
            )
        }
        .map_err(|e| err(format!("cublasGemmEx: {e:?}")))?;
    }
    Ok(())
}
