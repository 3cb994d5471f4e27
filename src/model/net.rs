//! The network of a model description ([`Arch`]): one block per layer row, run in order, each
//! reading the outputs it names (official `models/yolo.py::BaseModel._forward_once`). Used by
//! the inference graph ([`crate::model::YoloV9`]) and the training graph
//! ([`crate::model::YoloV9Train`]) alike, under a [`Ctx`] (plain or taped).
//!
//! An output is dropped as soon as its last reader has run, so the peak holds only the maps
//! still needed later (the taped forward keeps what its backward saved, independently).

use super::arch::{Arch, Module, Src};
use super::blocks::{AConv, ADown, CBLinear, Elan1, RepNCSPELAN4, SppElan};
use super::conv::{Conv, ConvSpec};
use super::head::{DetectHead, MaskHead, Proto, REG_MAX};
use super::params::Builder;
use super::tape::Ctx;
use anyhow::{ensure, Context, Result};
use candle_core::Tensor;

/// One layer's block.
enum Block {
    Identity,
    Conv(Box<Conv>),
    Elan1(Box<Elan1>),
    Rep(Box<RepNCSPELAN4>),
    AConv(Box<AConv>),
    ADown(Box<ADown>),
    Spp(Box<SppElan>),
    Upsample,
    Concat,
    CBLinear(Box<CBLinear>),
    /// Piece `idx[j]` of input j, upsampled by `factor[j]`, summed with the last input.
    CBFuse {
        idx: Vec<usize>,
        factor: Vec<usize>,
    },
}

/// A layer's output: one map, the pieces of a `CBLinear`, or the inputs of a `Concat` left
/// unjoined for the one block that reads it ([`Net::cat_read_by_elan`]).
enum Out {
    One(Tensor),
    Many(Vec<Tensor>),
    /// With the index of the part that is still to be upsampled 2× (from an [`Out::Half`]).
    Parts(Vec<Tensor>, Option<usize>),
    /// An `nn.Upsample`'s input, not yet upsampled: its one reader is a `Concat` left unjoined
    /// ([`Net::up_read_by_cat`]).
    Half(Tensor),
}

/// Layers `model.0 … model.{head-1}` of an [`Arch`] (the head is built by [`load_heads`]).
pub(crate) struct Net {
    blocks: Vec<Block>,
    from: Vec<Vec<Src>>,
    /// Per layer, the last layer that reads its output (the head index for head inputs).
    last_use: Vec<usize>,
    /// Per layer, whether it is a `Concat` whose only reader is an ELAN block
    /// (RepNCSPELAN4, ELAN1) and not the head: that block's `cv1` (1x1) reads the parts without
    /// the concatenation on channels-last activations ([`crate::model::conv::Conv::run_cat`]).
    cat_read_by_elan: Vec<bool>,
    /// Per layer, whether it is an `nn.Upsample` whose one reader is such a `Concat` (the first
    /// upsampled input of that `Concat`, once in its inputs): its input is handed on without
    /// the upsampling, and the ELAN block's `cv1` takes that part's product at the lower
    /// resolution ([`crate::model::conv::Conv::run_cat_into`]).
    up_read_by_cat: Vec<Option<usize>>,
}

impl Net {
    /// Builds every layer but the head, asking `b` for the official names `model.{i}.…`.
    pub(crate) fn load(b: &mut Builder, arch: &Arch) -> Result<Self> {
        let n = arch.head_index();
        let mut blocks = Vec::with_capacity(n);
        for (i, l) in arch.layers[..n].iter().enumerate() {
            let p = format!("model.{i}");
            let c1 = l.c_in.first().copied().unwrap_or(0);
            let block =
                match &l.module {
                    Module::Silence => Block::Identity,
                    Module::Conv { c2, k, s } => {
                        Block::Conv(Box::new(Conv::load(b, &p, ConvSpec::new(c1, *c2, *k, *s))?))
                    }
                    Module::Elan1 { c2, c3, c4 } => {
                        Block::Elan1(Box::new(Elan1::load(b, &p, [c1, *c2, *c3, *c4])?))
                    }
                    Module::RepNCSPELAN4 { c2, c3, c4, n } => Block::Rep(Box::new(
                        RepNCSPELAN4::load(b, &p, [c1, *c2, *c3, *c4, *n])?,
                    )),
                    Module::AConv { c2 } => Block::AConv(Box::new(AConv::load(b, &p, c1, *c2)?)),
                    Module::ADown { c2 } => Block::ADown(Box::new(ADown::load(b, &p, c1, *c2)?)),
                    Module::SppElan { c2, c3 } => {
                        Block::Spp(Box::new(SppElan::load(b, &p, [c1, *c2, *c3])?))
                    }
                    Module::Upsample => Block::Upsample,
                    Module::Concat => Block::Concat,
                    Module::CBLinear { c2s } => {
                        Block::CBLinear(Box::new(CBLinear::load(b, &p, c1, c2s)?))
                    }
                    Module::CBFuse { idx } => {
                        let target = l.stride;
                        let factor = l.from[..idx.len()]
                            .iter()
                            .map(|s| (arch.stride_of(*s) / target) as usize)
                            .collect();
                        Block::CBFuse {
                            idx: idx.clone(),
                            factor,
                        }
                    }
                    Module::Detect(_) => unreachable!("the head is the last layer (checked)"),
                };
            blocks.push(block);
        }
        let mut last_use = vec![0; n];
        for (i, l) in arch.layers.iter().enumerate() {
            for s in &l.from {
                if let Src::Layer(j) = s {
                    last_use[*j] = last_use[*j].max(i);
                }
            }
        }
        let from: Vec<Vec<Src>> = arch.layers[..n].iter().map(|l| l.from.clone()).collect();
        let cat_read_by_elan = (0..n)
            .map(|i| {
                let readers: Vec<usize> = (0..arch.layers.len())
                    .filter(|&k| arch.layers[k].from.contains(&Src::Layer(i)))
                    .collect();
                matches!(blocks[i], Block::Concat)
                    && matches!(readers[..], [k] if k < n
                        && from[k].len() == 1
                        && matches!(blocks[k], Block::Rep(_) | Block::Elan1(_)))
            })
            .collect::<Vec<bool>>();
        let mut up_read_by_cat = vec![None; n];
        for (j, srcs) in from.iter().enumerate() {
            if !cat_read_by_elan[j] {
                continue;
            }
            let once = |i: usize| srcs.iter().filter(|s| **s == Src::Layer(i)).count() == 1;
            let first_up = srcs.iter().find_map(|s| match s {
                Src::Layer(i) if matches!(blocks[*i], Block::Upsample) => Some(*i),
                _ => None,
            });
            if let Some(i) = first_up {
                let readers = arch
                    .layers
                    .iter()
                    .filter(|l| l.from.contains(&Src::Layer(i)));
                if readers.count() == 1 && once(i) && matches!(from[i][..], [Src::Layer(_)]) {
                    up_read_by_cat[i] = Some(j);
                }
            }
        }
        Ok(Self {
            blocks,
            from,
            last_use,
            cat_read_by_elan,
            up_read_by_cat,
        })
    }

    /// Runs the layers on `x` (B, 3, H, W) and returns the outputs of `taps` (the head inputs)
    /// in order.
    pub(crate) fn forward(&self, x: &Tensor, c: Ctx, taps: &[Src]) -> Result<Vec<Tensor>> {
        self.forward_from(x, c, taps, None)
    }

    /// The layer whose convolution alone reads the network's input, directly or through
    /// identity layers (yolov9's `Silence`), with that convolution: the layer a caller may run
    /// itself from the input ([`Net::forward_from`]). `None` where several layers read the input
    /// (the auxiliary branch of an unreparameterised yolov9-c) or its reader is not a
    /// convolution of one input.
    pub(crate) fn input_conv(&self) -> Option<(usize, &Conv)> {
        let mut input_like = vec![false; self.blocks.len()];
        let mut reader = None;
        for (i, from) in self.from.iter().enumerate() {
            let reads = from.iter().any(|s| match s {
                Src::Input => true,
                Src::Layer(j) => input_like[*j],
            });
            if !reads {
                continue;
            }
            if matches!(self.blocks[i], Block::Identity) && from.len() == 1 {
                input_like[i] = true;
            } else if reader.replace(i).is_some() {
                return None;
            }
        }
        let i = reader?;
        match &self.blocks[i] {
            Block::Conv(m) if self.from[i].len() == 1 => Some((i, m)),
            _ => None,
        }
    }

    /// [`Net::forward`] with the output of layer `first.0` given (`first.1`, made by the caller
    /// from the input: [`Net::input_conv`]) instead of computed.
    pub(crate) fn forward_from(
        &self,
        x: &Tensor,
        c: Ctx,
        taps: &[Src],
        first: Option<(usize, Tensor)>,
    ) -> Result<Vec<Tensor>> {
        let n = self.blocks.len();
        let mut outs: Vec<Option<Out>> = (0..n).map(|_| None).collect();
        for (i, block) in self.blocks.iter().enumerate() {
            if let Some((_, y)) = first.as_ref().filter(|(k, _)| *k == i) {
                outs[i] = Some(Out::One(y.clone()));
                continue;
            }
            // Input k: a map, or (`true`) an upsampling's input still to be upsampled.
            let input = |k: usize| -> Result<(&Tensor, bool)> {
                match self.from[i][k] {
                    Src::Input => Ok((x, false)),
                    Src::Layer(j) => match outs[j].as_ref() {
                        Some(Out::One(t)) => Ok((t, false)),
                        Some(Out::Half(t)) => Ok((t, true)),
                        Some(Out::Many(_) | Out::Parts(..)) => {
                            anyhow::bail!("layer {i}: input {j} has pieces")
                        }
                        None => anyhow::bail!("layer {i}: output of layer {j} is gone"),
                    },
                }
            };
            let one = |k: usize| -> Result<&Tensor> {
                match input(k)? {
                    (t, false) => Ok(t),
                    (_, true) => anyhow::bail!("layer {i}: input {k} is not upsampled"),
                }
            };
            // The unjoined inputs of a Concat this block alone reads.
            let parts = || -> Option<(Vec<&Tensor>, Option<usize>)> {
                match (self.from[i].first(), self.from[i].len()) {
                    (Some(Src::Layer(j)), 1) => match outs[*j].as_ref() {
                        Some(Out::Parts(p, up)) => Some((p.iter().collect(), *up)),
                        _ => None,
                    },
                    _ => None,
                }
            };
            // Whether Concat `j` is left unjoined for the ELAN block that reads it.
            let unjoined = |j: usize| {
                c.is_plain_nhwc() && self.cat_read_by_elan[j] && !taps.contains(&Src::Layer(j))
            };
            let y = match block {
                Block::Identity => Out::One(one(0)?.clone()),
                Block::Conv(m) => Out::One(m.run(one(0)?, c)?),
                Block::Elan1(m) => Out::One(match parts() {
                    Some((p, up)) => m.run_cat(&p, up, c)?,
                    None => m.run(one(0)?, c)?,
                }),
                Block::Rep(m) => Out::One(match parts() {
                    Some((p, up)) => m.run_cat(&p, up, c)?,
                    None => m.run(one(0)?, c)?,
                }),
                Block::AConv(m) => Out::One(m.run(one(0)?, c)?),
                Block::ADown(m) => Out::One(m.run(one(0)?, c)?),
                Block::Spp(m) => Out::One(m.run(one(0)?, c)?),
                Block::Upsample => match self.up_read_by_cat[i] {
                    Some(j)
                        if unjoined(j)
                            && !taps.contains(&Src::Layer(i))
                            && super::layout::low_res_products() =>
                    {
                        Out::Half(one(0)?.clone())
                    }
                    _ => Out::One(c.upsample_nearest_2x(one(0)?)?),
                },
                Block::Concat => {
                    if unjoined(i) {
                        let mut xs = Vec::with_capacity(self.from[i].len());
                        let mut up = None;
                        for k in 0..self.from[i].len() {
                            let (t, half) = input(k)?;
                            if half {
                                ensure!(up.is_none(), "layer {i}: two inputs not upsampled");
                                up = Some(k);
                            }
                            xs.push(t.clone());
                        }
                        Out::Parts(xs, up)
                    } else {
                        let xs: Vec<&Tensor> =
                            (0..self.from[i].len()).map(one).collect::<Result<_>>()?;
                        Out::One(c.cat(&xs, 1)?)
                    }
                }
                Block::CBLinear(m) => Out::Many(m.run(one(0)?, c)?),
                Block::CBFuse { idx, factor } => {
                    let k = idx.len();
                    let mut acc = one(k)?.clone();
                    for j in 0..k {
                        let Src::Layer(src) = self.from[i][j] else {
                            anyhow::bail!("layer {i}: CBFuse input {j} is the image")
                        };
                        let Some(Out::Many(pieces)) = outs[src].as_ref() else {
                            anyhow::bail!("layer {i}: CBFuse input {src} is not a CBLinear")
                        };
                        let p = pieces
                            .get(idx[j])
                            .with_context(|| format!("layer {i}: no piece {}", idx[j]))?;
                        let up = c.upsample_nearest(p, factor[j])?;
                        ensure!(
                            up.dims() == acc.dims(),
                            "layer {i}: CBFuse piece {:?} does not match {:?}",
                            up.dims(),
                            acc.dims()
                        );
                        acc = c.add(&up, &acc)?;
                    }
                    Out::One(acc)
                }
            };
            outs[i] = Some(y);
            // Drop what no later layer (nor the head) reads.
            for s in &self.from[i] {
                if let Src::Layer(j) = s {
                    if self.last_use[*j] <= i && !taps.contains(s) {
                        outs[*j] = None;
                    }
                }
            }
        }
        taps.iter()
            .map(|s| match s {
                Src::Input => Ok(x.clone()),
                Src::Layer(j) => match &outs[*j] {
                    Some(Out::One(t)) => Ok(t.clone()),
                    _ => anyhow::bail!("head input {j} is not a feature map"),
                },
            })
            .collect()
    }
}

/// The head prefixes of `arch`: `[(box, class)]` for the auxiliary branch (dual heads only)
/// and the main branch.
fn head_prefixes(arch: &Arch) -> (Option<(String, String)>, (String, String)) {
    let h = arch.head_index();
    let p = |a: &str, b: &str| (format!("model.{h}.{a}"), format!("model.{h}.{b}"));
    if arch.is_dual() {
        (Some(p("cv2", "cv3")), p("cv4", "cv5"))
    } else {
        (None, p("cv2", "cv3"))
    }
}

/// The heads of a graph: the detection branches and, for a segmentation graph, their mask
/// branches.
pub(crate) struct Heads {
    /// The auxiliary detection branch (dual heads only).
    pub aux: Option<DetectHead>,
    /// The main detection branch.
    pub main: DetectHead,
    /// The auxiliary mask branch (`DualDSegment` only: `cv6`, `proto`).
    pub aux_mask: Option<MaskHead>,
    /// The main mask branch (`Segment`/`DSegment`: `cv4`, `proto`; `DualDSegment`: `cv7`,
    /// `proto2`).
    pub mask: Option<MaskHead>,
}

/// The heads of `arch` with `nc` classes, asking `b` for the official names in the official
/// state_dict order: the detection branches (`DualDDetect`: `cv2`/`cv3` auxiliary and
/// `cv4`/`cv5` main; `DDetect`/`Detect`: `cv2`/`cv3`), the constant DFL kernels (`dfl`, and
/// `dfl2` for dual heads), then for segmentation heads the prototypes (`proto`, and `proto2`
/// for dual heads) and the coefficient towers (`cv4`; dual: `cv6` auxiliary, `cv7` main).
pub(crate) fn load_heads(b: &mut Builder, arch: &Arch, nc: usize) -> Result<Heads> {
    let strides = arch.strides();
    let ch = |srcs: &[Src]| -> Vec<usize> { srcs.iter().map(|s| arch.channels_of(*s)).collect() };
    let grouped = arch.head().grouped;
    let (aux_p, main_p) = head_prefixes(arch);
    let aux = match aux_p {
        Some((bp, cp)) => Some(
            DetectHead::load(b, &bp, &cp, &ch(arch.aux_inputs()), nc, &strides, grouped)
                .context("loading the auxiliary head")?,
        ),
        None => None,
    };
    let main = DetectHead::load(
        b,
        &main_p.0,
        &main_p.1,
        &ch(arch.main_inputs()),
        nc,
        &strides,
        grouped,
    )
    .context("loading the detection head")?;
    for n in dfl_names(arch) {
        b.constant(&n, &[1, REG_MAX, 1, 1]);
    }
    let Some(seg) = arch.seg() else {
        return Ok(Heads {
            aux,
            main,
            aux_mask: None,
            mask: None,
        });
    };
    let h = arch.head_index();
    let nm = seg.nm;
    let (aux_mask, mask) = if arch.is_dual() {
        let pin = ch(arch.proto_inputs());
        let aux_proto = Proto::load_conv(b, &format!("model.{h}.proto"), pin[0], nm)?;
        let proto = Proto::load_conv(b, &format!("model.{h}.proto2"), pin[1], nm)?;
        let aux_coeffs =
            MaskHead::load_coeffs(b, &format!("model.{h}.cv6"), &ch(arch.aux_inputs()), nm)?;
        let coeffs =
            MaskHead::load_coeffs(b, &format!("model.{h}.cv7"), &ch(arch.main_inputs()), nm)?;
        (
            Some(MaskHead {
                coeffs: aux_coeffs,
                proto: aux_proto,
                nm,
            }),
            MaskHead { coeffs, proto, nm },
        )
    } else {
        let proto = if seg.proto_inputs {
            Proto::load_conv(
                b,
                &format!("model.{h}.proto"),
                ch(arch.proto_inputs())[0],
                nm,
            )?
        } else {
            Proto::load_full(
                b,
                &format!("model.{h}.proto"),
                ch(arch.main_inputs())[0],
                seg.npr,
                nm,
            )?
        };
        let coeffs =
            MaskHead::load_coeffs(b, &format!("model.{h}.cv4"), &ch(arch.main_inputs()), nm)?;
        (None, MaskHead { coeffs, proto, nm })
    };
    Ok(Heads {
        aux,
        main,
        aux_mask,
        mask: Some(mask),
    })
}

/// Names of the constant DFL kernels of `arch`'s head (`dfl`, and `dfl2` for dual heads).
pub(crate) fn dfl_names(arch: &Arch) -> Vec<String> {
    let h = arch.head_index();
    let mut v = vec![format!("model.{h}.dfl.conv.weight")];
    if arch.is_dual() {
        v.push(format!("model.{h}.dfl2.conv.weight"));
    }
    v
}

/// Every state_dict entry of `arch` with `nc` classes, in official order (a describing build).
pub(crate) fn describe(arch: &Arch, nc: usize) -> Result<Vec<(String, Vec<usize>)>> {
    let mut b = Builder::describing();
    Net::load(&mut b, arch)?;
    load_heads(&mut b, arch, nc)?;
    Ok(b.described.take().unwrap_or_default())
}
