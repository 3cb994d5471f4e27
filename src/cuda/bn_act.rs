//! CUDA launches of the fused train-mode BN + SiLU kernels (`kernels/bn_act.cu`, compiled to PTX
//! by `build.rs`) for the candle ops of `crate::model::bn_act`. Activations are f32 or bf16
//! (mixed-precision training), parameter blocks and statistics f32; every input must be
//! contiguous. Reductions are deterministic (fixed partial-sum order, no atomics).

use crate::op_args::{geometry, params_range, RunningUpdate};
use candle_core::backend::BackendStorage;
use candle_core::cuda::CudaDType;
use candle_core::cuda_backend::cudarc::driver::DeviceRepr;
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaView, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::WrapErr;
use candle_core::{CudaDevice, CudaStorage, DType, Error, Layout, Result, Shape};

/// The PTX of `kernels/bn_act.cu`.
const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/bn_act.ptx"));
/// Module name under which candle caches the loaded PTX.
const MODULE: &str = "yolo9_bn_act";
/// Threads per block (must equal `BLOCK` in the .cu file).
const BLOCK: u32 = 256;
/// Target number of reduction blocks per launch (about 8 per SM on an H200).
const TARGET_BLOCKS: usize = 1024;
/// Fewest elements a reduction block handles.
const MIN_CHUNK: usize = 2048;

fn err(msg: impl std::fmt::Display) -> Error {
    Error::Msg(format!("bn_act (CUDA): {msg}"))
}

fn view<'a, T: CudaDType>(
    s: &'a CudaStorage,
    (a, b): (usize, usize),
    what: &str,
) -> Result<CudaView<'a, T>> {
    s.as_cuda_slice::<T>()?
        .try_slice(a..b)
        .ok_or_else(|| err(format!("{what} storage is shorter than its layout")))
}

fn f32_view<'a>(s: &'a CudaStorage, r: (usize, usize), what: &str) -> Result<CudaView<'a, f32>> {
    if s.dtype() != DType::F32 {
        return Err(err(format!("{what} is {:?}, expected f32", s.dtype())));
    }
    view(s, r, what)
}

/// Kernel-name suffix of an activation dtype.
fn suffix(d: DType, what: &str) -> Result<&'static str> {
    match d {
        DType::F32 => Ok("f32"),
        DType::BF16 => Ok("bf16"),
        d => Err(err(format!("{what} is {d:?}; f32 and bf16 are supported"))),
    }
}

/// The element range of a contiguous (C,) vector.
fn vec_range(l: &Layout, c: usize, what: &str) -> Result<(usize, usize)> {
    if l.shape().elem_count() != c {
        return Err(err(format!(
            "{what} has shape {:?}, expected [{c}]",
            l.shape().dims()
        )));
    }
    l.contiguous_offsets()
        .ok_or_else(|| err(format!("{what} is not contiguous")))
}

fn i32_of(v: usize, what: &str) -> Result<i32> {
    i32::try_from(v).map_err(|_| err(format!("{what} = {v} does not fit in i32")))
}

/// Elements per 16-byte vector of the kernels' vector paths (8 bf16; f32 takes 4): chunks are
/// multiples of it, and an element-wise launch gives each thread about one vector.
const VEC: usize = 8;

/// Splits a channel's `m` elements into `s` chunks of `chunk` (a multiple of [`VEC`], so that the
/// kernels' vector path applies) for a (C, S) reduction grid.
fn split(c: usize, m: usize) -> (usize, usize) {
    let want = TARGET_BLOCKS.div_ceil(c.max(1)).max(1);
    let most = m.div_ceil(MIN_CHUNK).max(1);
    let s = want.min(most);
    let chunk = m.div_ceil(s).next_multiple_of(VEC);
    (m.div_ceil(chunk), chunk)
}

fn elementwise_cfg(total: usize) -> LaunchConfig {
    let blocks = total
        .div_ceil(BLOCK as usize * VEC / 2)
        .clamp(1, 65_535 * 8) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn final_cfg(c: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (c.div_ceil(BLOCK as usize) as u32, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn wrap<T: CudaDType + DeviceRepr>(
    dev: &CudaDevice,
    s: CudaSlice<T>,
    shape: Shape,
) -> (CudaStorage, Shape) {
    (CudaStorage::wrap_cuda_slice(s, dev.clone()), shape)
}

fn reduce_cfg(c: usize, parts: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (c as u32, parts as u32, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// `crate::model::bn_act::ChannelStats`: x (N, C, H, W) f32/bf16 → (2, C) f32 [mean; biased var].
pub fn stats(s: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
    match s.dtype() {
        DType::BF16 => stats_t::<half::bf16>(s, l, None),
        _ => stats_t::<f32>(s, l, None),
    }
}

/// `crate::model::bn_act::ParamBlock`: x (N, C, H, W) f32/bf16, γ, β (C,) f32 → (4, C) f32
/// [γ; β; mean; biased var].
/// With `running`, the kernel also updates the running statistics in place (see
/// [`RunningUpdate`]).
pub fn block(
    s: &CudaStorage,
    l: &Layout,
    g: Arg,
    b: Arg,
    running: Option<RunningUpdate>,
) -> Result<(CudaStorage, Shape)> {
    match s.dtype() {
        DType::BF16 => stats_t::<half::bf16>(s, l, Some((g, b, running))),
        _ => stats_t::<f32>(s, l, Some((g, b, running))),
    }
}

fn stats_t<T: CudaDType + DeviceRepr>(
    s: &CudaStorage,
    l: &Layout,
    params: Option<(Arg, Arg, Option<RunningUpdate>)>,
) -> Result<(CudaStorage, Shape)> {
    let suf = suffix(s.dtype(), "x")?;
    let ((n, c, hw), r) = geometry(l, "x")?;
    let x = view::<T>(s, r, "x")?;
    let dev = s.device().clone();
    let m = n * hw;
    let (parts, chunk) = split(c, m);
    let mut part = unsafe { dev.alloc::<f64>(2 * parts * c)? };
    let rows = if params.is_some() { 4 } else { 2 };
    let mut out = unsafe { dev.alloc::<f32>(rows * c)? };
    let (n_, c_, hw_, s_) = (
        i32_of(n, "N")?,
        i32_of(c, "C")?,
        i32_of(hw, "H*W")?,
        i32_of(parts, "S")?,
    );
    let chunk_ = chunk as i64;
    let f = dev.get_or_load_custom_func(&format!("bn_stats_partial_{suf}"), MODULE, PTX)?;
    let mut b = f.builder();
    b.arg(&x)
        .arg(&mut part)
        .arg(&n_)
        .arg(&c_)
        .arg(&hw_)
        .arg(&chunk_);
    unsafe { b.launch(reduce_cfg(c, parts)) }.w()?;
    let mf = m as f64;
    if let Some(((sg, lg), (sb, lb), running)) = params {
        let g = f32_view(sg, vec_range(lg, c, "gamma")?, "gamma")?;
        let be = f32_view(sb, vec_range(lb, c, "beta")?, "beta")?;
        let f = dev.get_or_load_custom_func("bn_block_final", MODULE, PTX)?;
        let mut b = f.builder();
        b.arg(&part).arg(&s_).arg(&c_).arg(&mf).arg(&g).arg(&be);
        b.arg(&mut out);
        let r = running.unwrap_or_default();
        let update = i32::from(running.is_some());
        let (omm, mm, ub) = (
            (1.0 - r.momentum) as f32,
            r.momentum as f32,
            r.unbiased as f32,
        );
        b.arg(&update)
            .arg(&r.mean)
            .arg(&r.var)
            .arg(&omm)
            .arg(&mm)
            .arg(&ub);
        unsafe { b.launch(final_cfg(c)) }.w()?;
        return Ok(wrap(&dev, out, Shape::from((4, c))));
    }
    let f = dev.get_or_load_custom_func("bn_stats_final", MODULE, PTX)?;
    let mut b = f.builder();
    b.arg(&part).arg(&s_).arg(&c_).arg(&mf).arg(&mut out);
    unsafe { b.launch(final_cfg(c)) }.w()?;
    Ok(wrap(&dev, out, Shape::from((2, c))))
}

/// `crate::model::bn_act::BnAct` forward with `op = (ε, SiLU or not)`: x (N, C, H, W)
/// f32/bf16, p (4, C) f32 → y like x.
pub fn forward(
    op: (f64, bool),
    s1: &CudaStorage,
    l1: &Layout,
    s2: &CudaStorage,
    l2: &Layout,
) -> Result<(CudaStorage, Shape)> {
    match s1.dtype() {
        DType::BF16 => forward_t::<half::bf16>(op, s1, l1, s2, l2),
        _ => forward_t::<f32>(op, s1, l1, s2, l2),
    }
}

fn forward_t<T: CudaDType + DeviceRepr>(
    (eps, silu): (f64, bool),
    s1: &CudaStorage,
    l1: &Layout,
    s2: &CudaStorage,
    l2: &Layout,
) -> Result<(CudaStorage, Shape)> {
    let suf = suffix(s1.dtype(), "x")?;
    let ((n, c, hw), r) = geometry(l1, "x")?;
    let x = view::<T>(s1, r, "x")?;
    let p = f32_view(s2, params_range(l2, 4, c, "p")?, "p")?;
    let dev = s1.device().clone();
    let total = n * c * hw;
    let mut y = unsafe { dev.alloc::<T>(total)? };
    let (total_, c_, hw_) = (total as i64, i32_of(c, "C")?, i32_of(hw, "H*W")?);
    let (eps, silu) = (eps as f32, silu as i32);
    let f = dev.get_or_load_custom_func(&format!("bn_act_fwd_{suf}"), MODULE, PTX)?;
    let mut b = f.builder();
    b.arg(&x)
        .arg(&p)
        .arg(&mut y)
        .arg(&total_)
        .arg(&c_)
        .arg(&hw_);
    b.arg(&eps).arg(&silu);
    unsafe { b.launch(elementwise_cfg(total)) }.w()?;
    Ok(wrap(&dev, y, l1.shape().clone()))
}

type Arg<'a> = (&'a CudaStorage, &'a Layout);

/// The (x, dy) pair of a backward op, checked (same shape and dtype): geometry, views and the
/// kernel suffix.
type XDy<'a, T> = (
    (usize, usize, usize),
    CudaView<'a, T>,
    CudaView<'a, T>,
    &'static str,
);

fn x_dy<'a, T: CudaDType + DeviceRepr>((s1, l1): Arg<'a>, (s2, l2): Arg<'a>) -> Result<XDy<'a, T>> {
    let (g, r1) = geometry(l1, "x")?;
    let (g2, r2) = geometry(l2, "dy")?;
    if g != g2 {
        return Err(err("x and dy shapes differ"));
    }
    if s1.dtype() != s2.dtype() {
        return Err(err(format!(
            "x is {:?} but dy is {:?}",
            s1.dtype(),
            s2.dtype()
        )));
    }
    let suf = suffix(s1.dtype(), "x")?;
    Ok((g, view(s1, r1, "x")?, view(s2, r2, "dy")?, suf))
}

/// `crate::model::bn_act::BnActGradSums` with `op = (ε, SiLU or not)`: (x, dy, p (4, C)) → (6, C) f32 [p; Σg; Σg·x̂].
pub fn grad_sums(op: (f64, bool), a1: Arg, a2: Arg, a3: Arg) -> Result<(CudaStorage, Shape)> {
    match a1.0.dtype() {
        DType::BF16 => grad_sums_t::<half::bf16>(op, a1, a2, a3),
        _ => grad_sums_t::<f32>(op, a1, a2, a3),
    }
}

fn grad_sums_t<T: CudaDType + DeviceRepr>(
    (eps, silu): (f64, bool),
    a1: Arg,
    a2: Arg,
    a3: Arg,
) -> Result<(CudaStorage, Shape)> {
    let ((n, c, hw), x, dy, suf) = x_dy::<T>(a1, a2)?;
    let p = f32_view(a3.0, params_range(a3.1, 4, c, "p")?, "p")?;
    let dev = a1.0.device().clone();
    let (parts, chunk) = split(c, n * hw);
    let mut part = unsafe { dev.alloc::<f64>(2 * parts * c)? };
    let mut out = unsafe { dev.alloc::<f32>(6 * c)? };
    let (n_, c_, hw_, s_) = (
        i32_of(n, "N")?,
        i32_of(c, "C")?,
        i32_of(hw, "H*W")?,
        i32_of(parts, "S")?,
    );
    let (chunk_, eps, silu) = (chunk as i64, eps as f32, silu as i32);
    let f = dev.get_or_load_custom_func(&format!("bn_grad_partial_{suf}"), MODULE, PTX)?;
    let mut b = f.builder();
    b.arg(&x).arg(&dy).arg(&p).arg(&mut part);
    b.arg(&n_)
        .arg(&c_)
        .arg(&hw_)
        .arg(&chunk_)
        .arg(&eps)
        .arg(&silu);
    unsafe { b.launch(reduce_cfg(c, parts)) }.w()?;
    let f = dev.get_or_load_custom_func("bn_sums_final", MODULE, PTX)?;
    let mut b = f.builder();
    b.arg(&part).arg(&s_).arg(&c_).arg(&p).arg(&mut out);
    unsafe { b.launch(final_cfg(c)) }.w()?;
    Ok(wrap(&dev, out, Shape::from((6, c))))
}

/// `crate::model::bn_act::BnActGradInput` with `op = (ε, SiLU or not)`: (x, dy, q (6, C)) → dx like x.
pub fn grad_input(op: (f64, bool), a1: Arg, a2: Arg, a3: Arg) -> Result<(CudaStorage, Shape)> {
    match a1.0.dtype() {
        DType::BF16 => grad_input_t::<half::bf16>(op, a1, a2, a3),
        _ => grad_input_t::<f32>(op, a1, a2, a3),
    }
}

fn grad_input_t<T: CudaDType + DeviceRepr>(
    (eps, silu): (f64, bool),
    a1: Arg,
    a2: Arg,
    a3: Arg,
) -> Result<(CudaStorage, Shape)> {
    let ((n, c, hw), x, dy, suf) = x_dy::<T>(a1, a2)?;
    let q = f32_view(a3.0, params_range(a3.1, 6, c, "q")?, "q")?;
    let dev = a1.0.device().clone();
    let total = n * c * hw;
    let mut dx = unsafe { dev.alloc::<T>(total)? };
    let (total_, c_, hw_) = (total as i64, i32_of(c, "C")?, i32_of(hw, "H*W")?);
    let (m, eps, silu) = ((n * hw) as f32, eps as f32, silu as i32);
    let f = dev.get_or_load_custom_func(&format!("bn_act_dx_{suf}"), MODULE, PTX)?;
    let mut b = f.builder();
    b.arg(&x)
        .arg(&dy)
        .arg(&q)
        .arg(&mut dx)
        .arg(&total_)
        .arg(&c_)
        .arg(&hw_);
    b.arg(&m).arg(&eps).arg(&silu);
    unsafe { b.launch(elementwise_cfg(total)) }.w()?;
    Ok(wrap(&dev, dx, a1.1.shape().clone()))
}

/// [`crate::model::bn_act::SiluGrad`]: (x, dy) f32/bf16 → `dx = dy·silu'(x)` like x.
pub fn silu_grad(a1: Arg, a2: Arg) -> Result<(CudaStorage, Shape)> {
    match a1.0.dtype() {
        DType::BF16 => silu_grad_t::<half::bf16>(a1, a2),
        _ => silu_grad_t::<f32>(a1, a2),
    }
}

fn silu_grad_t<T: CudaDType + DeviceRepr>(a1: Arg, a2: Arg) -> Result<(CudaStorage, Shape)> {
    let ((n, c, hw), x, dy, suf) = x_dy::<T>(a1, a2)?;
    let dev = a1.0.device().clone();
    let total = n * c * hw;
    let mut dx = unsafe { dev.alloc::<T>(total)? };
    let total_ = total as i64;
    let f = dev.get_or_load_custom_func(&format!("silu_bwd_{suf}"), MODULE, PTX)?;
    let mut b = f.builder();
    b.arg(&x).arg(&dy).arg(&mut dx).arg(&total_);
    unsafe { b.launch(elementwise_cfg(total)) }.w()?;
    Ok(wrap(&dev, dx, a1.1.shape().clone()))
}
