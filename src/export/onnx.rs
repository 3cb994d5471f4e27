//! The ONNX model of a detector ([`export`]): the traced network, the decode and, optionally,
//! the NMS, as ONNX nodes of the default operator set.
//!
//! Inputs and outputs (what Ultralytics' and the official exports write):
//! - `images` (B, 3, H, W) f32, RGB in 0..1 (letterboxed as `yolo9 detect` does);
//! - `output0` (B, 4+nc, A) f32: rows 0..4 = cx, cy, w, h in input pixels, rows 4.. = sigmoid
//!   class scores; anchors P3, P4, P5, row-major within a level (A = 8400 at 640×640), exactly
//!   [`crate::model::YoloV9::forward`];
//! - a segmentation model adds its `nm` mask coefficients to `output0` (B, 4+nc+nm, A; raw,
//!   after the scores) and writes `output1` (B, nm, H/4, W/4) f32, the prototypes: exactly
//!   [`crate::model::YoloV9::forward_seg`] (an instance's mask is `sigmoid(coefficients ·
//!   prototypes)` inside its box; official `Segment` export, Ultralytics' layout);
//! - with NMS instead: `num_dets` (B, 1) i32, `boxes` (B, K, 4) f32 x1, y1, x2, y2 in input
//!   pixels, `scores` (B, K) f32, `classes` (B, K) i32, best first, rows from `num_dets` on are
//!   zeros (TensorRT `EfficientNMS` layout; K = min(max_det, A)); a segmentation model adds
//!   `masks` (B, K, H/4, W/4) f32, each kept detection's `sigmoid(coefficients · prototypes)`
//!   cropped to its box on the prototype grid (official `crop_mask`), zeros in padding slots.
//!
//! The metadata carries what Ultralytics-reading runtimes look for: `names` (a Python dict
//! literal, `{0: 'RBC', …}`), `stride`, `imgsz`, `batch`, `task` (`detect` or `segment`), plus `description`,
//! `author`, `version`, `date`.
//!
//! Why one file (about 710 lines): the traced ops' ONNX nodes, the in-graph decode and NMS and the
//! model's metadata write one `ModelProto`; the protobuf messages are `onnx_pb.rs`.

use super::onnx_pb::{
    attribute_type, data_type, dimension, AttributeProto, Dimension, GraphProto, ModelProto,
    NodeProto, OperatorSetIdProto, StringStringEntryProto, TensorProto, TensorShapeProto,
    TypeProto, TypeProtoTensor, ValueInfoProto,
};
use super::{ExportOptions, NmsExport};
use crate::model::head::REG_MAX;
use crate::model::trace::TracedOp;
use crate::model::weights::Weights;
use crate::model::{YoloV9, STRIDES};
use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor, TensorId};
use std::collections::HashMap;

/// The detector of `weights` as an ONNX model (see the module docs). The network is traced on
/// the CPU at a 64×64 input (its ops do not depend on the size); a static model then declares
/// `opts.batch` × 3 × `opts.img`, a dynamic one symbolic `batch`, `height`, `width`.
///
/// Errors: invalid options (naming the option), weights that do not build a model.
pub fn export(weights: &Weights, opts: &ExportOptions) -> Result<ModelProto> {
    opts.validate()?;
    let model = YoloV9::load(weights, &Device::Cpu).context("building the inference graph")?;
    let x = Tensor::zeros((1, 3, 64, 64), DType::F32, &Device::Cpu)?;
    let seg = model.is_seg();
    let (ops, raw, masks) = if seg {
        let (ops, raw, coeffs, proto) = model.trace_seg(&x)?;
        (ops, raw, Some((coeffs, proto)))
    } else {
        let (ops, raw) = model.trace_raw(&x)?;
        (ops, raw, None)
    };
    let meta = model.meta();
    let nc = meta.nc;

    let mut g = Graph::new(opts.half, opts.opset);
    let images = "images".to_string();
    let net_in = if opts.half {
        g.cast(&images, data_type::FLOAT16)
    } else {
        images.clone()
    };
    let mut names: HashMap<TensorId, String> = HashMap::new();
    names.insert(x.id(), net_in);
    for op in &ops {
        g.layer(op, &mut names)?;
    }
    // The value of a traced output, cast back to f32 in a half model.
    let out = |g: &mut Graph, t: &Tensor| -> Result<String> {
        let n = names
            .get(&t.id())
            .context("export: a head output was not produced by a traced op")?
            .clone();
        Ok(if opts.half {
            g.cast(&n, data_type::FLOAT)
        } else {
            n
        })
    };
    let heads = raw
        .iter()
        .map(|r| out(&mut g, r))
        .collect::<Result<Vec<_>>>()?;
    let mut output0 = g.decode(&heads, nc)?;
    // A segmentation model: the mask coefficients after the scores (official `Segment`:
    // `torch.cat([x, mc], 1)`), and the prototypes as `output1` (or the masks with NMS).
    let mut seg_out = None;
    if let Some((coeffs, proto)) = &masks {
        let nm = proto.dim(1)?;
        let mut flat = Vec::with_capacity(coeffs.len());
        for c in coeffs {
            let n = out(&mut g, c)?;
            flat.push(g.reshape(&n, &[0, nm as i64, -1]));
        }
        let flat: Vec<&str> = flat.iter().map(String::as_str).collect();
        let mc = g.node("Concat", &flat, vec![attr_i("axis", 2)]);
        output0 = g.node("Concat", &[&output0, &mc], vec![attr_i("axis", 1)]);
        seg_out = Some(SegOut {
            proto: out(&mut g, proto)?,
            nm,
            stride: x.dim(2)? / proto.dim(2)?,
        });
    }
    let (b, h, w) = if opts.dynamic {
        (Dim::Sym("batch"), Dim::Sym("height"), Dim::Sym("width"))
    } else {
        (Dim::N(opts.batch), Dim::N(opts.img.0), Dim::N(opts.img.1))
    };
    let outputs = g.outputs(&output0, &images, opts, nc, b, seg_out.as_ref())?;
    let graph = GraphProto {
        node: g.nodes,
        name: meta.arch.name.clone(),
        initializer: g.inits,
        input: vec![value_info(
            "images",
            data_type::FLOAT,
            &[b, Dim::N(3), h, w],
        )],
        output: outputs,
        ..Default::default()
    };
    Ok(ModelProto {
        ir_version: ir_version(opts.opset),
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: opts.opset,
        }],
        producer_name: "yolo9".into(),
        producer_version: env!("CARGO_PKG_VERSION").into(),
        graph: Some(graph),
        metadata_props: metadata(weights, opts, seg),
        ..Default::default()
    })
}

/// The IR version that goes with an operator set (the ONNX release that introduced it).
/// The mask outputs' sources of a segmentation model: its prototypes (the graph value), `nm`,
/// and the prototypes' stride in input pixels.
struct SegOut {
    proto: String,
    nm: usize,
    stride: usize,
}

/// What [`Graph::nms`] keeps, for the masks of an end-to-end segmentation model: the anchor of
/// each output slot `(B, K, 1)` i64 and whether the slot holds a detection `(B, K)` f32 (1 or 0).
struct Kept {
    index: String,
    valid: String,
}

fn ir_version(opset: i64) -> i64 {
    match opset {
        ..=14 => 7,
        15..=18 => 8,
        19..=20 => 9,
        _ => 10,
    }
}

/// Ultralytics-style metadata (see the module docs).
fn metadata(weights: &Weights, opts: &ExportOptions, seg: bool) -> Vec<StringStringEntryProto> {
    let names = weights
        .meta
        .names
        .iter()
        .enumerate()
        .map(|(i, n)| format!("{i}: '{}'", n.replace('\\', "\\\\").replace('\'', "\\'")))
        .collect::<Vec<_>>()
        .join(", ");
    let kv = |k: &str, v: String| StringStringEntryProto {
        key: k.into(),
        value: v,
    };
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    vec![
        kv(
            "description",
            format!(
                "yolo9 {} {} ({} classes){}{}",
                weights.meta.arch.name,
                if seg {
                    "segmentation model"
                } else {
                    "detector"
                },
                weights.meta.nc,
                if opts.half { ", f16" } else { "" },
                if opts.nms.is_some() { ", with NMS" } else { "" }
            ),
        ),
        kv("author", "yolo9".into()),
        kv("version", env!("CARGO_PKG_VERSION").into()),
        kv("date", format!("{secs} (seconds since 1970-01-01 UTC)")),
        kv("task", if seg { "segment" } else { "detect" }.into()),
        kv("stride", STRIDES[STRIDES.len() - 1].to_string()),
        kv(
            "batch",
            if opts.dynamic {
                "-1".into()
            } else {
                opts.batch.to_string()
            },
        ),
        kv("imgsz", format!("[{}, {}]", opts.img.0, opts.img.1)),
        kv("names", format!("{{{names}}}")),
    ]
}

/// A declared dimension: a size or a symbolic name.
#[derive(Clone, Copy)]
enum Dim {
    N(usize),
    Sym(&'static str),
}

fn value_info(name: &str, elem: i32, dims: &[Dim]) -> ValueInfoProto {
    let dim = dims
        .iter()
        .map(|d| Dimension {
            value: Some(match d {
                Dim::N(n) => dimension::Value::DimValue(*n as i64),
                Dim::Sym(s) => dimension::Value::DimParam((*s).into()),
            }),
            denotation: String::new(),
        })
        .collect();
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            tensor_type: Some(TypeProtoTensor {
                elem_type: elem,
                shape: Some(TensorShapeProto { dim }),
            }),
            denotation: String::new(),
        }),
        doc_string: String::new(),
    }
}

fn attr_i(name: &str, v: i64) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attribute_type::INT,
        i: Some(v),
        ..Default::default()
    }
}

fn attr_ints(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attribute_type::INTS,
        ints: v.to_vec(),
        ..Default::default()
    }
}

fn attr_s(name: &str, v: &str) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attribute_type::STRING,
        s: Some(v.as_bytes().to_vec()),
        ..Default::default()
    }
}

fn attr_t(name: &str, t: TensorProto) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attribute_type::TENSOR,
        t: Some(t),
        ..Default::default()
    }
}

fn tensor(name: &str, elem: i32, dims: &[i64], raw: Vec<u8>) -> TensorProto {
    TensorProto {
        dims: dims.to_vec(),
        data_type: elem,
        name: name.into(),
        raw_data: raw,
        ..Default::default()
    }
}

/// The nodes and constants being written; values are named `v{n}`.
struct Graph {
    nodes: Vec<NodeProto>,
    inits: Vec<TensorProto>,
    next: usize,
    /// Network constants in f16.
    half: bool,
    /// The operator set written (ReduceMax takes its axes as an input from 18 on).
    opset: i64,
}

impl Graph {
    fn new(half: bool, opset: i64) -> Self {
        Self {
            nodes: Vec::new(),
            inits: Vec::new(),
            next: 0,
            half,
            opset,
        }
    }

    fn fresh(&mut self, hint: &str) -> String {
        self.next += 1;
        format!("{hint}_{}", self.next)
    }

    /// One node of `op` with one output.
    fn node(&mut self, op: &str, inputs: &[&str], attrs: Vec<AttributeProto>) -> String {
        let out = self.fresh(op);
        self.node_out(op, inputs, attrs, &[&out]);
        out
    }

    fn node_out(&mut self, op: &str, inputs: &[&str], attrs: Vec<AttributeProto>, outs: &[&str]) {
        let name = format!("{op}_n{}", self.nodes.len());
        self.nodes.push(NodeProto {
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: outs.iter().map(|s| s.to_string()).collect(),
            name,
            op_type: op.into(),
            attribute: attrs,
            ..Default::default()
        });
    }

    /// Renames the value `from` (produced by the last node that outputs it) to `to`.
    fn rename(&mut self, from: &str, to: &str) {
        for n in self.nodes.iter_mut().rev() {
            if let Some(o) = n.output.iter_mut().find(|o| *o == from) {
                *o = to.into();
                return;
            }
        }
    }

    fn init(&mut self, hint: &str, elem: i32, dims: &[i64], raw: Vec<u8>) -> String {
        let name = self.fresh(hint);
        self.inits.push(tensor(&name, elem, dims, raw));
        name
    }

    /// An int64 constant.
    fn i64s(&mut self, v: &[i64]) -> String {
        let raw = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.init("i64", data_type::INT64, &[v.len() as i64], raw)
    }

    /// An f32 constant of shape `dims` (for the decode and the NMS, which run in f32).
    fn f32s(&mut self, dims: &[i64], v: &[f32]) -> String {
        let raw = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.init("f32", data_type::FLOAT, dims, raw)
    }

    /// A network constant (kernel or bias) from `t`, in f16 for a half-precision export.
    fn weight(&mut self, hint: &str, t: &Tensor) -> Result<String> {
        let dims: Vec<i64> = t.dims().iter().map(|d| *d as i64).collect();
        let flat = t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
        let (elem, raw) = if self.half {
            (
                data_type::FLOAT16,
                flat.iter()
                    .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
                    .collect(),
            )
        } else {
            (
                data_type::FLOAT,
                flat.iter().flat_map(|x| x.to_le_bytes()).collect(),
            )
        };
        Ok(self.init(hint, elem, &dims, raw))
    }

    fn cast(&mut self, x: &str, to: i32) -> String {
        self.node("Cast", &[x], vec![attr_i("to", to as i64)])
    }

    /// `x[axis][start..end]` (several axes at once; `steps` 1 unless given).
    fn slice(
        &mut self,
        x: &str,
        axes: &[i64],
        starts: &[i64],
        ends: &[i64],
        steps: Option<&[i64]>,
    ) -> String {
        let s = self.i64s(starts);
        let e = self.i64s(ends);
        let a = self.i64s(axes);
        match steps {
            Some(st) => {
                let st = self.i64s(st);
                self.node("Slice", &[x, &s, &e, &a, &st], vec![])
            }
            None => self.node("Slice", &[x, &s, &e, &a], vec![]),
        }
    }

    fn silu(&mut self, x: &str) -> String {
        let s = self.node("Sigmoid", &[x], vec![]);
        self.node("Mul", &[x, &s], vec![])
    }

    fn unsqueeze(&mut self, x: &str, axes: &[i64]) -> String {
        let a = self.i64s(axes);
        self.node("Unsqueeze", &[x, &a], vec![])
    }

    fn reshape(&mut self, x: &str, shape: &[i64]) -> String {
        let s = self.i64s(shape);
        self.node("Reshape", &[x, &s], vec![])
    }

    /// Element `i` of the 1-D int64 `shape` as a 1-element tensor.
    fn shape_at(&mut self, shape: &str, i: i64) -> String {
        let idx = self.i64s(&[i]);
        self.node("Gather", &[shape, &idx], vec![attr_i("axis", 0)])
    }

    /// One recorded layer op as ONNX nodes; `names` maps tensor ids to value names.
    fn layer(&mut self, op: &TracedOp, names: &mut HashMap<TensorId, String>) -> Result<()> {
        let get = |names: &HashMap<TensorId, String>, id: &TensorId| -> Result<String> {
            names
                .get(id)
                .cloned()
                .context("export: an op reads a value no traced op produced")
        };
        let (y, out) = match op {
            TracedOp::Conv {
                x,
                y,
                weight,
                bias,
                stride,
                padding,
                groups,
                act,
            } => {
                let xn = get(names, x)?;
                let k = weight.dim(2)? as i64;
                let w = self.weight("w", weight)?;
                let mut inputs = vec![xn, w];
                if let Some(b) = bias {
                    inputs.push(self.weight("b", &b.flatten_all()?)?);
                }
                let refs: Vec<&str> = inputs.iter().map(String::as_str).collect();
                let (s, p) = (*stride as i64, *padding as i64);
                let c = self.node(
                    "Conv",
                    &refs,
                    vec![
                        attr_ints("kernel_shape", &[k, k]),
                        attr_ints("strides", &[s, s]),
                        attr_ints("pads", &[p, p, p, p]),
                        attr_ints("dilations", &[1, 1]),
                        attr_i("group", *groups as i64),
                    ],
                );
                (y, if *act { self.silu(&c) } else { c })
            }
            TracedOp::Add { a, b, y } => {
                let (a, b) = (get(names, a)?, get(names, b)?);
                (y, self.node("Add", &[&a, &b], vec![]))
            }
            TracedOp::Cat { xs, y, dim } => {
                let xs: Vec<String> = xs.iter().map(|i| get(names, i)).collect::<Result<_>>()?;
                let refs: Vec<&str> = xs.iter().map(String::as_str).collect();
                (
                    y,
                    self.node("Concat", &refs, vec![attr_i("axis", *dim as i64)]),
                )
            }
            TracedOp::Narrow {
                x,
                y,
                dim,
                start,
                len,
            } => {
                let x = get(names, x)?;
                let (d, s) = (*dim as i64, *start as i64);
                (y, self.slice(&x, &[d], &[s], &[s + *len as i64], None))
            }
            TracedOp::Silu { x, y } => {
                let x = get(names, x)?;
                (y, self.silu(&x))
            }
            TracedOp::Upsample { x, y, factor } => {
                let x = get(names, x)?;
                let f = *factor as f32;
                let scales = self.f32s(&[4], &[1.0, 1.0, f, f]);
                (
                    y,
                    self.node(
                        "Resize",
                        &[&x, "", &scales],
                        vec![
                            attr_s("mode", "nearest"),
                            attr_s("coordinate_transformation_mode", "asymmetric"),
                            attr_s("nearest_mode", "floor"),
                        ],
                    ),
                )
            }
            TracedOp::TakeEven { x, y } => {
                let x = get(names, x)?;
                (
                    y,
                    self.slice(&x, &[2, 3], &[0, 0], &[i64::MAX, i64::MAX], Some(&[2, 2])),
                )
            }
            TracedOp::AvgPool2x2S1 { x, y } => {
                let x = get(names, x)?;
                (
                    y,
                    self.node(
                        "AveragePool",
                        &[&x],
                        vec![
                            attr_ints("kernel_shape", &[2, 2]),
                            attr_ints("strides", &[1, 1]),
                            attr_ints("pads", &[0, 0, 0, 0]),
                        ],
                    ),
                )
            }
            TracedOp::MaxPoolSame { x, y, k } => {
                let x = get(names, x)?;
                let (k, p) = (*k as i64, (*k / 2) as i64);
                (
                    y,
                    self.node(
                        "MaxPool",
                        &[&x],
                        vec![
                            attr_ints("kernel_shape", &[k, k]),
                            attr_ints("strides", &[1, 1]),
                            attr_ints("pads", &[p, p, p, p]),
                        ],
                    ),
                )
            }
            TracedOp::Alias { x, y } => (y, get(names, x)?),
        };
        names.insert(*y, out);
        Ok(())
    }

    /// [`crate::model::head::decode`] on the raw head outputs `heads` (B, 64+nc, H_i, W_i) f32,
    /// the anchors computed from the heads' shapes (so a dynamic model decodes any size):
    /// returns the (B, 4+nc, A) f32 value.
    fn decode(&mut self, heads: &[String], nc: usize) -> Result<String> {
        if heads.len() != STRIDES.len() {
            bail!(
                "export: {} head outputs, expected {}",
                heads.len(),
                STRIDES.len()
            );
        }
        let no = (4 * REG_MAX + nc) as i64;
        let mut flat = Vec::new();
        let mut pts = Vec::new();
        let mut sts = Vec::new();
        for (h, &s) in heads.iter().zip(&STRIDES) {
            flat.push(self.reshape(h, &[0, no, -1]));
            // Anchor centres (x + 0.5, y + 0.5), row-major, and the stride, per cell.
            let shape = self.node("Shape", &[h], vec![]);
            let hh = self.shape_at(&shape, 2);
            let ww = self.shape_at(&shape, 3);
            let axis0 = self.i64s(&[0]);
            let (h0, w0) = (
                self.node("Squeeze", &[&hh, &axis0], vec![]),
                self.node("Squeeze", &[&ww, &axis0], vec![]),
            );
            let z = self.init("i64", data_type::INT64, &[], 0i64.to_le_bytes().to_vec());
            let o = self.init("i64", data_type::INT64, &[], 1i64.to_le_bytes().to_vec());
            let xs = self.node("Range", &[&z, &w0, &o], vec![]);
            let ys = self.node("Range", &[&z, &h0, &o], vec![]);
            let half_cell = self.f32s(&[], &[0.5]);
            let xs = self.cast(&xs, data_type::FLOAT);
            let xs = self.node("Add", &[&xs, &half_cell], vec![]);
            let ys = self.cast(&ys, data_type::FLOAT);
            let ys = self.node("Add", &[&ys, &half_cell], vec![]);
            let hw = self.node("Concat", &[&hh, &ww], vec![attr_i("axis", 0)]);
            let xs = self.unsqueeze(&xs, &[0]);
            let gx = self.node("Expand", &[&xs, &hw], vec![]);
            let ys = self.unsqueeze(&ys, &[1]);
            let gy = self.node("Expand", &[&ys, &hw], vec![]);
            let gx = self.reshape(&gx, &[1, 1, -1]);
            let gy = self.reshape(&gy, &[1, 1, -1]);
            pts.push(self.node("Concat", &[&gx, &gy], vec![attr_i("axis", 1)]));
            let n = self.node("Mul", &[&hh, &ww], vec![]);
            let ones = self.i64s(&[1, 1]);
            let st_shape = self.node("Concat", &[&ones, &n], vec![attr_i("axis", 0)]);
            let value = tensor(
                "value",
                data_type::FLOAT,
                &[1],
                (s as f32).to_le_bytes().to_vec(),
            );
            sts.push(self.node(
                "ConstantOfShape",
                &[&st_shape],
                vec![attr_t("value", value)],
            ));
        }
        let cat2 = |g: &mut Self, v: &[String]| {
            let r: Vec<&str> = v.iter().map(String::as_str).collect();
            g.node("Concat", &r, vec![attr_i("axis", 2)])
        };
        let flat = cat2(self, &flat);
        let pts = cat2(self, &pts);
        let st = cat2(self, &sts);
        let reg = (4 * REG_MAX) as i64;
        let boxl = self.slice(&flat, &[1], &[0], &[reg], None);
        let cls = self.slice(&flat, &[1], &[reg], &[no], None);
        // DFL: softmax over each side's 16 bins, expectation of the bin index.
        let bl = self.reshape(&boxl, &[0, 4, REG_MAX as i64, -1]);
        let p = self.node("Softmax", &[&bl], vec![attr_i("axis", 2)]);
        let bins: Vec<f32> = (0..REG_MAX).map(|i| i as f32).collect();
        let bins = self.f32s(&[1, 1, REG_MAX as i64, 1], &bins);
        let pb = self.node("Mul", &[&p, &bins], vec![]);
        let axis2 = self.i64s(&[2]);
        let d = self.node("ReduceSum", &[&pb, &axis2], vec![attr_i("keepdims", 0)]);
        let lt = self.slice(&d, &[1], &[0], &[2], None);
        let rb = self.slice(&d, &[1], &[2], &[4], None);
        let x1y1 = self.node("Sub", &[&pts, &lt], vec![]);
        let x2y2 = self.node("Add", &[&pts, &rb], vec![]);
        let sum = self.node("Add", &[&x1y1, &x2y2], vec![]);
        let two = self.f32s(&[], &[2.0]);
        let cxy = self.node("Div", &[&sum, &two], vec![]);
        let wh = self.node("Sub", &[&x2y2, &x1y1], vec![]);
        let dbox = self.node("Concat", &[&cxy, &wh], vec![attr_i("axis", 1)]);
        let dbox = self.node("Mul", &[&dbox, &st], vec![]);
        let scores = self.node("Sigmoid", &[&cls], vec![]);
        Ok(self.node("Concat", &[&dbox, &scores], vec![attr_i("axis", 1)]))
    }

    /// The official NMS (`multi_label=False`) on the decoded `out` (B, 4+nc, A), written as the
    /// graph outputs `num_dets`, `boxes`, `scores`, `classes` (see the module docs).
    ///
    /// Each anchor keeps only its best class (its other scores are zeroed), so ONNX's per-class
    /// `NonMaxSuppression` is the official class-aware NMS over best-class candidates; the kept
    /// (image, anchor) pairs are scattered into a dense (B, A) score map whose `TopK` gives the
    /// padded, best-first output.
    fn nms(&mut self, out: &str, nc: usize, n: &NmsExport) -> Result<Kept> {
        let xywh = self.slice(out, &[1], &[0], &[4], None);
        let scores = self.slice(out, &[1], &[4], &[4 + nc as i64], None);
        let cxy = self.slice(&xywh, &[1], &[0], &[2], None);
        let wh = self.slice(&xywh, &[1], &[2], &[4], None);
        let two = self.f32s(&[], &[2.0]);
        let half_wh = self.node("Div", &[&wh, &two], vec![]);
        let x1y1 = self.node("Sub", &[&cxy, &half_wh], vec![]);
        let x2y2 = self.node("Add", &[&cxy, &half_wh], vec![]);
        let xyxy = self.node("Concat", &[&x1y1, &x2y2], vec![attr_i("axis", 1)]);
        let boxes = self.node("Transpose", &[&xyxy], vec![attr_ints("perm", &[0, 2, 1])]); // (B, A, 4)
                                                                                           // Best class per anchor, and the scores with every other class zeroed.
        let best = if self.opset >= 18 {
            let axis = self.i64s(&[1]);
            self.node("ReduceMax", &[&scores, &axis], vec![attr_i("keepdims", 1)])
        } else {
            self.node(
                "ReduceMax",
                &[&scores],
                vec![attr_ints("axes", &[1]), attr_i("keepdims", 1)],
            )
        };
        let cls = self.node(
            "ArgMax",
            &[&scores],
            vec![attr_i("axis", 1), attr_i("keepdims", 1)],
        ); // (B,1,A) i64
        let ids: Vec<i64> = (0..nc as i64).collect();
        let ids = self.i64s(&ids);
        let ids = self.reshape(&ids, &[1, -1, 1]);
        let onehot = self.node("Equal", &[&ids, &cls], vec![]);
        let zero = self.f32s(&[], &[0.0]);
        let masked = self.node("Where", &[&onehot, &best, &zero], vec![]); // (B, nc, A)
        let max_out = self.i64s(&[n.max_det as i64]);
        let iou = self.f32s(&[1], &[n.iou]);
        let conf = self.f32s(&[1], &[n.conf]);
        let sel = self.node(
            "NonMaxSuppression",
            &[&boxes, &masked, &max_out, &iou, &conf],
            vec![attr_i("center_point_box", 0)],
        ); // (N, 3): image, class, anchor
        let ba = self.i64s(&[0, 2]);
        let ba = self.node("Gather", &[&sel, &ba], vec![attr_i("axis", 1)]); // (N, 2)
        let axis1 = self.i64s(&[1]);
        let best2 = self.node("Squeeze", &[&best, &axis1], vec![]); // (B, A)
        let cls2 = self.node("Squeeze", &[&cls, &axis1], vec![]); // (B, A)
        let kept = self.node("GatherND", &[&best2, &ba], vec![]); // (N,)
        let zeros = self.node("Mul", &[&best2, &zero], vec![]);
        let dense = self.node("ScatterND", &[&zeros, &ba, &kept], vec![]); // (B, A)
                                                                           // K = min(max_det, A).
        let shape = self.node("Shape", &[&dense], vec![]);
        let a = self.shape_at(&shape, 1);
        let md = self.i64s(&[n.max_det as i64]);
        let k = self.node("Min", &[&a, &md], vec![]);
        let vals = self.fresh("topk_values");
        let idx = self.fresh("topk_indices");
        self.node_out(
            "TopK",
            &[&dense, &k],
            vec![attr_i("axis", 1), attr_i("largest", 1), attr_i("sorted", 1)],
            &[&vals, &idx],
        );
        let valid = self.node("Greater", &[&vals, &zero], vec![]); // (B, K)
        let validf = self.cast(&valid, data_type::FLOAT);
        let idx3 = self.unsqueeze(&idx, &[2]); // (B, K, 1)
        let kb = self.node("GatherND", &[&boxes, &idx3], vec![attr_i("batch_dims", 1)]); // (B, K, 4)
        let v3 = self.unsqueeze(&validf, &[2]);
        self.node_out("Mul", &[&kb, &v3], vec![], &["boxes"]);
        self.node_out("Mul", &[&vals, &validf], vec![], &["scores"]);
        let kc = self.node("GatherND", &[&cls2, &idx3], vec![attr_i("batch_dims", 1)]); // (B, K) i64
        let kc = self.cast(&kc, data_type::INT32);
        let validi = self.cast(&valid, data_type::INT32);
        self.node_out("Mul", &[&kc, &validi], vec![], &["classes"]);
        let cnt = self.node("ReduceSum", &[&validi, &axis1], vec![attr_i("keepdims", 1)]);
        self.node_out("Identity", &[&cnt], vec![], &["num_dets"]);
        Ok(Kept {
            index: idx3,
            valid: validf,
        })
    }

    /// Names the model's outputs and declares them: `output0` (and `output1`, the prototypes of
    /// a segmentation model), or with `--nms` the NMS outputs (and `masks`). `b` is the batch
    /// dimension.
    fn outputs(
        &mut self,
        output0: &str,
        images: &str,
        opts: &ExportOptions,
        nc: usize,
        b: Dim,
        seg: Option<&SegOut>,
    ) -> Result<Vec<ValueInfoProto>> {
        let anchors = if opts.dynamic {
            Dim::Sym("anchors")
        } else {
            Dim::N(
                STRIDES
                    .iter()
                    .map(|s| (opts.img.0 / *s as usize) * (opts.img.1 / *s as usize))
                    .sum(),
            )
        };
        let proto_hw = |s: &SegOut| {
            if opts.dynamic {
                (Dim::Sym("proto_height"), Dim::Sym("proto_width"))
            } else {
                (Dim::N(opts.img.0 / s.stride), Dim::N(opts.img.1 / s.stride))
            }
        };
        let nm = seg.map_or(0, |s| s.nm);
        let Some(n) = &opts.nms else {
            self.rename(output0, "output0");
            let mut outs = vec![value_info(
                "output0",
                data_type::FLOAT,
                &[b, Dim::N(4 + nc + nm), anchors],
            )];
            if let Some(s) = seg {
                let p = self.node("Identity", &[&s.proto], vec![]);
                self.rename(&p, "output1");
                let (ph, pw) = proto_hw(s);
                outs.push(value_info(
                    "output1",
                    data_type::FLOAT,
                    &[b, Dim::N(nm), ph, pw],
                ));
            }
            return Ok(outs);
        };
        let k = match anchors {
            Dim::N(a) => Dim::N(a.min(n.max_det)),
            _ => Dim::Sym("max_det"),
        };
        let kept = self.nms(output0, nc, n)?;
        let mut outs = vec![
            value_info("num_dets", data_type::INT32, &[b, Dim::N(1)]),
            value_info("boxes", data_type::FLOAT, &[b, k, Dim::N(4)]),
            value_info("scores", data_type::FLOAT, &[b, k]),
            value_info("classes", data_type::INT32, &[b, k]),
        ];
        if let Some(s) = seg {
            self.instance_masks(output0, &s.proto, images, nc, nm, &kept)?;
            let (ph, pw) = proto_hw(s);
            outs.push(value_info("masks", data_type::FLOAT, &[b, k, ph, pw]));
        }
        Ok(outs)
    }

    /// The `masks` output of an end-to-end segmentation model: for each kept detection (`kept`,
    /// from [`Graph::nms`]) `sigmoid(coefficients · prototypes)` on the prototype grid, zero
    /// outside its box (official `crop_mask`: prototype pixel (c, r) is kept when
    /// x1 ≤ c < x2 and y1 ≤ r < y2 of the box scaled to prototype pixels), and zero for the
    /// padding slots: (B, K, H/4, W/4) f32 in [0, 1]. `out` is `output0` (B, 4+nc+nm, A) with
    /// the coefficients in its last `nm` rows; `proto` (B, nm, Hp, Wp); `images` the input.
    fn instance_masks(
        &mut self,
        out: &str,
        proto: &str,
        images: &str,
        nc: usize,
        nm: usize,
        kept: &Kept,
    ) -> Result<()> {
        let (c0, c1) = ((4 + nc) as i64, (4 + nc + nm) as i64);
        let coeffs = self.slice(out, &[1], &[c0], &[c1], None); // (B, nm, A)
        let coeffs = self.node("Transpose", &[&coeffs], vec![attr_ints("perm", &[0, 2, 1])]);
        let kc = self.node(
            "GatherND",
            &[&coeffs, &kept.index],
            vec![attr_i("batch_dims", 1)],
        ); // (B, K, nm)
        let pshape = self.node("Shape", &[proto], vec![]);
        let hw = self.slice(&pshape, &[0], &[2], &[4], None); // [Hp, Wp]
        let flat_shape = self.i64s(&[0, nm as i64, -1]);
        let pflat = self.node("Reshape", &[proto, &flat_shape], vec![]); // (B, nm, Hp·Wp)
        let m = self.node("MatMul", &[&kc, &pflat], vec![]); // (B, K, Hp·Wp)
        let m = self.node("Sigmoid", &[&m], vec![]);
        let zz = self.i64s(&[0, 0]);
        let mshape = self.node("Concat", &[&zz, &hw], vec![attr_i("axis", 0)]);
        let m = self.node("Reshape", &[&m, &mshape], vec![]); // (B, K, Hp, Wp)
                                                              // Boxes in prototype pixels: x · Wp / W, y · Hp / H.
        let ishape = self.node("Shape", &[images], vec![]);
        let in_hw = self.slice(&ishape, &[0], &[2], &[4], None);
        let in_hw = self.cast(&in_hw, data_type::FLOAT);
        let p_hw = self.cast(&hw, data_type::FLOAT);
        let scale = self.node("Div", &[&p_hw, &in_hw], vec![]); // [sy, sx]
        let idx = |g: &mut Self, i: i64| {
            let at = g.i64s(&[i]);
            g.node("Gather", &[&scale, &at], vec![attr_i("axis", 0)]) // (1,)
        };
        let (sy, sx) = (idx(self, 0), idx(self, 1));
        let coord = |g: &mut Self, j: i64, s: &str| {
            let b = g.slice("boxes", &[2], &[j], &[j + 1], None); // (B, K, 1)
            let b = g.node("Mul", &[&b, s], vec![]);
            g.unsqueeze(&b, &[3]) // (B, K, 1, 1)
        };
        let (x1, y1) = (coord(self, 0, &sx), coord(self, 1, &sy));
        let (x2, y2) = (coord(self, 2, &sx), coord(self, 3, &sy));
        // Column and row indices as f32: (1, 1, 1, Wp) and (1, 1, Hp, 1).
        let scalar = |g: &mut Self, hint: &str, v: i64| {
            g.init(hint, data_type::INT64, &[], v.to_le_bytes().to_vec())
        };
        let (z, o) = (scalar(self, "zero", 0), scalar(self, "one", 1));
        let range = |g: &mut Self, at: i64, shape: &[i64]| {
            // Gather with a scalar index: the scalar Hp or Wp.
            let pos = scalar(g, "dim", at);
            let n = g.node("Gather", &[&hw, &pos], vec![attr_i("axis", 0)]);
            let r = g.node("Range", &[&z, &n, &o], vec![]);
            let r = g.cast(&r, data_type::FLOAT);
            g.reshape(&r, shape)
        };
        let cols = range(self, 1, &[1, 1, 1, -1]);
        let rows = range(self, 0, &[1, 1, -1, 1]);
        let inside = |g: &mut Self, v: &str, lo: &str, hi: &str| {
            let a = g.node("GreaterOrEqual", &[v, lo], vec![]);
            let b = g.node("Less", &[v, hi], vec![]);
            g.node("And", &[&a, &b], vec![])
        };
        let ic = inside(self, &cols, &x1, &x2); // (B, K, 1, Wp)
        let ir = inside(self, &rows, &y1, &y2); // (B, K, Hp, 1)
        let keep = self.node("And", &[&ic, &ir], vec![]); // (B, K, Hp, Wp)
        let keep = self.cast(&keep, data_type::FLOAT);
        let valid = self.unsqueeze(&kept.valid, &[2, 3]); // (B, K, 1, 1)
        let keep = self.node("Mul", &[&keep, &valid], vec![]);
        self.node_out("Mul", &[&m, &keep], vec![], &["masks"]);
        Ok(())
    }
}
