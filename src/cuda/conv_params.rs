//! The geometry of a cuDNN convolution ([`Conv2dParams`]): what [`super::conv`] launches and
//! what [`super::algo_cache`] keys its algorithm choices by.

use candle_core::{Error, Result, Shape};

/// Geometry of a 2-D convolution: input `(batch, c_in, h, w)`, kernel
/// `(c_out, c_in / groups, kh, kw)`, the same zero `padding` on all four sides, the same `stride`
/// in both directions, dilation 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Conv2dParams {
    /// Batch size N.
    pub batch: usize,
    /// Input channels.
    pub c_in: usize,
    /// Input height.
    pub h: usize,
    /// Input width.
    pub w: usize,
    /// Output channels.
    pub c_out: usize,
    /// Kernel height.
    pub kh: usize,
    /// Kernel width.
    pub kw: usize,
    /// Zero padding per side.
    pub padding: usize,
    /// Stride.
    pub stride: usize,
    /// Groups (`c_in` and `c_out` are multiples of it).
    pub groups: usize,
    /// Channels-last memory: input `(N, H, W, C_in)`, kernel `(C_out, kh, kw, C_in/groups)`,
    /// output `(N, H', W', C_out)` (cuDNN's `CUDNN_TENSOR_NHWC`, the layout of its tensor-core
    /// kernels for half types). Forward only.
    pub nhwc: bool,
}

impl Conv2dParams {
    /// Checks and builds the geometry from the input dims `(N, C_in, H, W)` and the kernel dims
    /// `(C_out, C_in / groups, kh, kw)`. Errors name the mismatch; sizes that cuDNN's 32-bit
    /// descriptors cannot hold are refused too.
    pub fn new(
        x: (usize, usize, usize, usize),
        k: (usize, usize, usize, usize),
        padding: usize,
        stride: usize,
        groups: usize,
    ) -> Result<Self> {
        let (batch, c_in, h, w) = x;
        let (c_out, c_in_g, kh, kw) = k;
        let p = Self {
            batch,
            c_in,
            h,
            w,
            c_out,
            kh,
            kw,
            padding,
            stride,
            groups,
            nhwc: false,
        };
        let bad = |why: String| Err(Error::Cuda(format!("conv2d {x:?} * {k:?}: {why}").into()));
        if stride == 0 || groups == 0 {
            return bad(format!("stride {stride} and groups {groups} must be >= 1"));
        }
        if c_in_g * groups != c_in || c_out % groups != 0 {
            return bad(format!(
                "{c_in} input channels and {c_out} output channels do not fit {groups} groups of \
                 {c_in_g} kernel channels"
            ));
        }
        if [batch, c_in, h, w, c_out, kh, kw].contains(&0) {
            return bad("empty dimension".into());
        }
        if h + 2 * padding < kh || w + 2 * padding < kw {
            return bad(format!(
                "kernel larger than the padded input (padding {padding})"
            ));
        }
        for n in [p.x_elems(), p.y_elems(), p.w_elems()] {
            if i32::try_from(n).is_err() {
                return bad(format!("{n} elements exceed cuDNN's 32-bit tensor sizes"));
            }
        }
        if i32::try_from(padding.max(stride).max(groups)).is_err() {
            return bad("padding/stride/groups exceed 32 bits".into());
        }
        Ok(p)
    }

    /// Output height `(h + 2·padding − kh) / stride + 1`.
    pub fn out_h(&self) -> usize {
        (self.h + 2 * self.padding - self.kh) / self.stride + 1
    }

    /// Output width `(w + 2·padding − kw) / stride + 1`.
    pub fn out_w(&self) -> usize {
        (self.w + 2 * self.padding - self.kw) / self.stride + 1
    }

    /// The same geometry on channels-last tensors (see [`Conv2dParams::nhwc`]).
    pub fn channels_last(mut self) -> Self {
        self.nhwc = true;
        self
    }

    /// Input shape `(N, C_in, H, W)`, or `(N, H, W, C_in)` channels-last.
    pub fn x_shape(&self) -> Shape {
        if self.nhwc {
            return Shape::from((self.batch, self.h, self.w, self.c_in));
        }
        Shape::from((self.batch, self.c_in, self.h, self.w))
    }

    /// Kernel shape `(C_out, C_in / groups, kh, kw)`, or `(C_out, kh, kw, C_in / groups)`
    /// channels-last.
    pub fn w_shape(&self) -> Shape {
        if self.nhwc {
            return Shape::from((self.c_out, self.kh, self.kw, self.c_in / self.groups));
        }
        Shape::from((self.c_out, self.c_in / self.groups, self.kh, self.kw))
    }

    /// Output shape `(N, C_out, H', W')`, or `(N, H', W', C_out)` channels-last.
    pub fn y_shape(&self) -> Shape {
        if self.nhwc {
            return Shape::from((self.batch, self.out_h(), self.out_w(), self.c_out));
        }
        Shape::from((self.batch, self.c_out, self.out_h(), self.out_w()))
    }

    fn x_elems(&self) -> usize {
        self.batch * self.c_in * self.h * self.w
    }

    fn w_elems(&self) -> usize {
        self.c_out * (self.c_in / self.groups) * self.kh * self.kw
    }

    fn y_elems(&self) -> usize {
        self.batch * self.c_out * self.out_h() * self.out_w()
    }
}
