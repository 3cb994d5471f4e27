//! Launches of the TAL kernels of the loss:
//! - [`assign`]: the TaskAlignedAssigner (`kernels/tal_assign.cu`) for
//!   `crate::loss::assign_op`, the default on CUDA: boxes and scores stay on the device;
//! - [`dense_targets`]: the dense per-anchor targets from the foreground rows of a host
//!   assignment (`kernels/tal.cu`), when the assignment was made on the host;
//! - [`terms_forward`] / [`terms_backward`]: the fused box, DFL and class terms
//!   (`kernels/tal_terms.cu`) for `crate::loss::terms`.

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::WrapErr;
use candle_core::{CudaStorage, DType, Error, Layout, Result, Shape, Tensor};

/// The PTX of `kernels/tal.cu`.
const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/tal.ptx"));
/// Module name under which candle caches the loaded PTX.
const MODULE: &str = "yolo9_tal";

fn cfg(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(256).max(1) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// `fg` (nfg, 11) and `anc` (A, 2) f32, contiguous → the (10, B, A) planes described in
/// `kernels/tal.cu`.
pub fn dense_targets(
    fg: (&CudaStorage, &Layout),
    anc: (&CudaStorage, &Layout),
    batch: usize,
) -> Result<(CudaStorage, Shape)> {
    let bad = |what: &str| Error::Msg(format!("dense targets (CUDA): {what}"));
    if fg.0.dtype() != DType::F32 || anc.0.dtype() != DType::F32 {
        return Err(bad("inputs must be f32"));
    }
    let (fa, fb) =
        fg.1.contiguous_offsets()
            .ok_or_else(|| bad("fg not contiguous"))?;
    let (aa, ab) = anc
        .1
        .contiguous_offsets()
        .ok_or_else(|| bad("anchors not contiguous"))?;
    let nfg = (fb - fa) / 11;
    let na = (ab - aa) / 2;
    let ba = batch * na;
    let dev = fg.0.device().clone();
    let mut out = unsafe { dev.alloc::<f32>(10 * ba)? };
    let anc_v = anc.0.as_cuda_slice::<f32>()?.slice(aa..ab);
    let (na_, ba_) = (na as i32, ba as i64);
    let f = dev.get_or_load_custom_func("tal_dense_init", MODULE, PTX)?;
    let mut b = f.builder();
    b.arg(&anc_v).arg(&mut out).arg(&na_).arg(&ba_);
    unsafe { b.launch(cfg(ba)) }.w()?;
    if nfg > 0 {
        let fg_v = fg.0.as_cuda_slice::<f32>()?.slice(fa..fb);
        let nfg_ = nfg as i32;
        let f = dev.get_or_load_custom_func("tal_dense_fg", MODULE, PTX)?;
        let mut b = f.builder();
        b.arg(&fg_v).arg(&mut out).arg(&nfg_).arg(&ba_);
        unsafe { b.launch(cfg(nfg)) }.w()?;
    }
    Ok((
        CudaStorage::wrap_cuda_slice(out, dev),
        Shape::from((10, batch, na)),
    ))
}

/// The PTX of `kernels/tal_terms.cu`.
const TERMS_PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/tal_terms.ptx"));
/// Module name of `kernels/tal_terms.cu`.
const TERMS_MODULE: &str = "yolo9_tal_terms";

type Held<'a> = (
    candle_core::cuda_backend::cudarc::driver::CudaView<'a, f32>,
    candle_core::cuda_backend::cudarc::driver::CudaView<'a, f32>,
);

/// Views of a tensor held by the op (targets or anchors), which must be a contiguous f32 CUDA
/// tensor.
fn held_view<'a>(
    st: &'a candle_core::Storage,
    l: &Layout,
    what: &str,
) -> Result<candle_core::cuda_backend::cudarc::driver::CudaView<'a, f32>> {
    let candle_core::Storage::Cuda(s) = st else {
        return Err(Error::Msg(format!("TAL (CUDA): {what} is not on the GPU")));
    };
    let (a, b) = l
        .contiguous_offsets()
        .ok_or_else(|| Error::Msg(format!("TAL (CUDA): {what} is not contiguous")))?;
    Ok(s.as_cuda_slice::<f32>()?.slice(a..b))
}

fn with_held<R>(
    (planes, anchors): (&Tensor, &Tensor),
    f: impl FnOnce(Held<'_>) -> Result<R>,
) -> Result<R> {
    let (sp, lp) = planes.storage_and_layout();
    let (sa, la) = anchors.storage_and_layout();
    f((
        held_view(&sp, lp, "targets")?,
        held_view(&sa, la, "anchors")?,
    ))
}

fn flat_dims(l: &Layout) -> Result<(i32, i32, i32, (usize, usize))> {
    let (b, c, a) = l.shape().dims3()?;
    let r = l
        .contiguous_offsets()
        .ok_or_else(|| Error::Msg("loss terms (CUDA): head output is not contiguous".into()))?;
    let i = |v: usize| {
        i32::try_from(v).map_err(|_| Error::Msg(format!("loss terms (CUDA): {v} exceeds i32")))
    };
    Ok((i(b)?, i(c)?, i(a)?, r))
}

/// `crate::loss::terms::TalTerms` on CUDA with `op = (planes (10, B, A), anchors (A, 2))`: the
/// per-anchor terms, then their three sums.
pub fn terms_forward(
    op: (&Tensor, &Tensor),
    (s, l): (&CudaStorage, &Layout),
) -> Result<(CudaStorage, Shape)> {
    let (b, c, a, (x0, x1)) = flat_dims(l)?;
    let dev = s.device().clone();
    let flat = s.as_cuda_slice::<f32>()?.slice(x0..x1);
    let ba = b as usize * a as usize;
    let mut part = unsafe { dev.alloc::<f64>(3 * ba)? };
    let mut out = unsafe { dev.alloc::<f32>(3)? };
    with_held(op, |(planes, anc)| {
        let f = dev.get_or_load_custom_func("tal_terms_fwd", TERMS_MODULE, TERMS_PTX)?;
        let mut bld = f.builder();
        bld.arg(&flat)
            .arg(&planes)
            .arg(&anc)
            .arg(&mut part)
            .arg(&b)
            .arg(&c)
            .arg(&a);
        unsafe { bld.launch(cfg(ba)) }.w()?;
        Ok(())
    })?;
    let n = ba as i64;
    let f = dev.get_or_load_custom_func("tal_terms_sum", TERMS_MODULE, TERMS_PTX)?;
    let mut bld = f.builder();
    bld.arg(&part).arg(&n).arg(&mut out);
    let sum_cfg = LaunchConfig {
        grid_dim: (3, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    unsafe { bld.launch(sum_cfg) }.w()?;
    Ok((CudaStorage::wrap_cuda_slice(out, dev), Shape::from(3)))
}

/// `crate::loss::terms::TalTermsGrad` on CUDA with `op` as [`terms_forward`]: `d flat` for the
/// output gradient `g` (3,).
pub fn terms_backward(
    op: (&Tensor, &Tensor),
    (s, l): (&CudaStorage, &Layout),
    (sg, lg): (&CudaStorage, &Layout),
) -> Result<(CudaStorage, Shape)> {
    let (b, c, a, (x0, x1)) = flat_dims(l)?;
    let (g0, g1) = lg
        .contiguous_offsets()
        .ok_or_else(|| Error::Msg("loss terms (CUDA): gradient is not contiguous".into()))?;
    if g1 - g0 != 3 {
        return Err(Error::Msg(format!(
            "loss terms (CUDA): gradient of {} values, expected 3",
            g1 - g0
        )));
    }
    let dev = s.device().clone();
    let flat = s.as_cuda_slice::<f32>()?.slice(x0..x1);
    let g = sg.as_cuda_slice::<f32>()?.slice(g0..g1);
    let ba = b as usize * a as usize;
    let mut out = unsafe { dev.alloc::<f32>(x1 - x0)? };
    with_held(op, |(planes, anc)| {
        let f = dev.get_or_load_custom_func("tal_terms_bwd", TERMS_MODULE, TERMS_PTX)?;
        let mut bld = f.builder();
        bld.arg(&flat)
            .arg(&planes)
            .arg(&anc)
            .arg(&g)
            .arg(&mut out)
            .arg(&b)
            .arg(&c)
            .arg(&a);
        unsafe { bld.launch(cfg(ba)) }.w()?;
        Ok(())
    })?;
    Ok((CudaStorage::wrap_cuda_slice(out, dev), l.shape().clone()))
}

/// The PTX of `kernels/tal_assign.cu`.
const ASSIGN_PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/tal_assign.ptx"));
/// Module name of `kernels/tal_assign.cu`.
const ASSIGN_MODULE: &str = "yolo9_tal_assign";

/// Sizes, hyper-parameters and the score layout of one [`assign`] launch (see
/// `kernels/tal_assign.cu` for what each kernel reads).
#[derive(Debug, Clone, Copy)]
pub struct AssignShape {
    /// Batch size B.
    pub batch: usize,
    /// Anchors per image A.
    pub anchors: usize,
    /// GT rows per image M (at least 1; padded rows have valid = 0).
    pub rows: usize,
    /// Positives per GT at most (top-k), 1..=32.
    pub topk: usize,
    /// Exponent of the score in the alignment metric.
    pub alpha: f32,
    /// Exponent of the overlap in the alignment metric.
    pub beta: f32,
    /// Guard of the score normalisation.
    pub eps: f32,
    /// Element offset of the score of (b, c, a) = (0, 0, 0) in the scores tensor, and the strides
    /// of b, c and a.
    pub score_at: [i64; 4],
    /// Whether the scores are logits (sigmoid applied on read) rather than probabilities.
    pub logits: bool,
}

/// The TaskAlignedAssigner on the GPU: `pbox` `(B, 4, A)` f32 grid units, `scores` f32 (read as
/// [`AssignShape::score_at`] says), `held` = the GT rows `(B * M, 6)` and the anchors `(A, 3)`,
/// contiguous f32 CUDA tensors → the `(11, B, A)` planes of `kernels/tal_assign.cu`.
pub fn assign(
    pbox: (&CudaStorage, &Layout),
    scores: (&CudaStorage, &Layout),
    held: (&Tensor, &Tensor),
    sh: &AssignShape,
) -> Result<(CudaStorage, Shape)> {
    let (sg, lg) = held.0.storage_and_layout();
    let (sa, la) = held.1.storage_and_layout();
    let gt = held_view(&sg, lg, "GT rows")?;
    let anc = held_view(&sa, la, "anchors")?;
    let (gt, anc) = (&gt, &anc);
    let bad = |what: String| Error::Msg(format!("TAL assigner (CUDA): {what}"));
    if pbox.0.dtype() != DType::F32 || scores.0.dtype() != DType::F32 {
        return Err(bad("boxes and scores must be f32".into()));
    }
    if sh.topk == 0 || sh.topk > 32 || sh.rows == 0 {
        return Err(bad(format!("topk {} / rows {}", sh.topk, sh.rows)));
    }
    let (p0, p1) = pbox
        .1
        .contiguous_offsets()
        .ok_or_else(|| bad("boxes not contiguous".into()))?;
    let (s0, s1) = scores
        .1
        .contiguous_offsets()
        .ok_or_else(|| bad("scores not contiguous".into()))?;
    let (bs, na, m, k) = (sh.batch, sh.anchors, sh.rows, sh.topk);
    if p1 - p0 != bs * 4 * na || gt.len() != bs * m * 6 || anc.len() != na * 3 {
        return Err(bad(format!(
            "sizes: boxes {} for {bs} x 4 x {na}, GT {} for {bs} x {m} x 6, anchors {}",
            p1 - p0,
            gt.len(),
            anc.len()
        )));
    }
    let i = |v: usize| i32::try_from(v).map_err(|_| bad(format!("{v} exceeds i32")));
    let ba = bs * na;
    let (b_, a_, m_, k_) = (i(bs)?, i(na)?, i(m)?, i(k)?);
    i(ba)?;
    let dev = pbox.0.device().clone();
    let pv = pbox.0.as_cuda_slice::<f32>()?.slice(p0..p1);
    let sv = scores.0.as_cuda_slice::<f32>()?.slice(s0..s1);
    let [off, sb, sc, sa] = sh.score_at;
    let sig = sh.logits as i32;
    let (alpha, beta, eps) = (sh.alpha, sh.beta, sh.eps);
    // The arguments every kernel of the module takes first (`ARGS_DECL`).
    macro_rules! common {
        ($b:expr) => {
            $b.arg(&pv)
                .arg(&sv)
                .arg(&off)
                .arg(&sb)
                .arg(&sc)
                .arg(&sa)
                .arg(&sig)
                .arg(anc)
                .arg(gt)
                .arg(&b_)
                .arg(&a_)
                .arg(&m_)
                .arg(&k_)
                .arg(&alpha)
                .arg(&beta)
                .arg(&eps)
        };
    }
    let mut pos = unsafe { dev.alloc::<i32>(bs * m * k)? };
    let mut npos = unsafe { dev.alloc::<i32>(bs * m)? };
    let f = dev.get_or_load_custom_func("tal_topk", ASSIGN_MODULE, ASSIGN_PTX)?;
    let mut b = f.builder();
    common!(b).arg(&mut pos).arg(&mut npos);
    let per_row = LaunchConfig {
        grid_dim: (i(bs * m)? as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    unsafe { b.launch(per_row) }.w()?;

    let mut claims = dev.alloc_zeros::<i32>(ba)?;
    let mut top = dev.alloc_zeros::<i32>(ba)?;
    let f = dev.get_or_load_custom_func("tal_claim", ASSIGN_MODULE, ASSIGN_PTX)?;
    let mut b = f.builder();
    b.arg(&pos)
        .arg(&npos)
        .arg(&mut claims)
        .arg(&mut top)
        .arg(&b_)
        .arg(&a_)
        .arg(&m_)
        .arg(&k_);
    unsafe { b.launch(cfg(bs * m * k)) }.w()?;

    let mut owner = unsafe { dev.alloc::<i32>(ba)? };
    let mut am = unsafe { dev.alloc::<f32>(ba)? };
    let mut pmax = dev.alloc_zeros::<f32>(2 * bs * m)?;
    let f = dev.get_or_load_custom_func("tal_owner", ASSIGN_MODULE, ASSIGN_PTX)?;
    let mut b = f.builder();
    common!(b)
        .arg(&claims)
        .arg(&top)
        .arg(&mut owner)
        .arg(&mut am)
        .arg(&mut pmax);
    unsafe { b.launch(cfg(ba)) }.w()?;

    let mut out = unsafe { dev.alloc::<f32>(11 * ba)? };
    let f = dev.get_or_load_custom_func("tal_planes", ASSIGN_MODULE, ASSIGN_PTX)?;
    let mut b = f.builder();
    common!(b).arg(&owner).arg(&am).arg(&pmax).arg(&mut out);
    unsafe { b.launch(cfg(ba)) }.w()?;
    Ok((
        CudaStorage::wrap_cuda_slice(out, dev),
        Shape::from((11, bs, na)),
    ))
}
