//! Model descriptions: the layer table of every YOLOv9 graph, read from the official model-yaml
//! format (`backbone` / `head` rows of `[from, number, module, args]`, with `depth_multiple` and
//! `width_multiple`), resolved the way the official `models/yolo.py::parse_model` resolves it:
//! absolute input indices, input and output channels per layer, and the stride of every output.
//!
//! One [`Arch`] drives everything that depends on the model's layout: the network built for
//! training and inference ([`crate::model::net`]), the state_dict names the converter and
//! [`crate::model::weights::Weights`] check ([`crate::model::keys`]), and the official
//! re-parameterization (a training graph with the auxiliary branch → its inference graph:
//! [`Arch::main_branch`]).
//!
//! The ten official models (yolov9-t/s/m/c/e and gelan-t/s/m/c/e) are embedded from
//! `models/*.yaml` ([`Arch::builtin`]); a user's own yaml in the official format is read with
//! [`Arch::from_yaml`]. Supported modules: `Silence`, `Conv`, `ELAN1`, `RepNCSPELAN4`, `AConv`,
//! `ADown`, `SPPELAN`, `nn.Upsample` (nearest, ×2), `Concat` (channels), `CBLinear`, `CBFuse`,
//! `DDetect` and `DualDDetect` (the last row).
//!
//! Why one file (about 850 lines of code, then its unit tests): the yaml reader and writer, the
//! `parse_model` resolution of indices, channels and strides, and the main-branch derivation all
//! work on the same row table, and the official `parse_model` is one function too.

use anyhow::{bail, ensure, Context, Result};
use serde_yaml_ng::Value;

/// Head strides in pixels (P3, P4, P5), the same for every supported model: [`Arch::from_yaml`]
/// refuses a head at other strides.
pub const STRIDES: [u32; 3] = [8, 16, 32];

/// Where a layer's input comes from: the network input image, or the output of an earlier layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Src {
    /// The (B, 3, H, W) input image.
    Input,
    /// Output of layer `i` (official `model.{i}`).
    Layer(usize),
}

/// One layer's module with its arguments, output channels already scaled by `width_multiple`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Module {
    /// Identity (official `Silence`, the first layer of the graphs with a second backbone).
    Silence,
    /// `Conv(c1, c2, k, s)`: conv + BN + SiLU, padding `k/2`.
    Conv {
        /// Output channels.
        c2: usize,
        /// Kernel size.
        k: usize,
        /// Stride.
        s: usize,
    },
    /// `ELAN1(c1, c2, c3, c4)`.
    Elan1 {
        /// Output channels.
        c2: usize,
        /// Channels of the first 1×1 conv (split in halves).
        c3: usize,
        /// Channels of each following 3×3 conv.
        c4: usize,
    },
    /// `RepNCSPELAN4(c1, c2, c3, c4, n)`.
    RepNCSPELAN4 {
        /// Output channels.
        c2: usize,
        /// Channels of the first 1×1 conv (split in halves).
        c3: usize,
        /// Channels of each RepNCSP branch.
        c4: usize,
        /// RepNBottlenecks per RepNCSP.
        n: usize,
    },
    /// `AConv(c1, c2)`: avg-pool 2 (stride 1) + 3×3 stride-2 Conv.
    AConv {
        /// Output channels.
        c2: usize,
    },
    /// `ADown(c1, c2)`: avg-pool 2 (stride 1), split in halves: 3×3 stride-2 Conv on one, max-pool
    /// 3 (stride 2) + 1×1 Conv on the other, concatenated.
    ADown {
        /// Output channels.
        c2: usize,
    },
    /// `SPPELAN(c1, c2, c3)`.
    SppElan {
        /// Output channels.
        c2: usize,
        /// Channels of the pooled branches.
        c3: usize,
    },
    /// `nn.Upsample(None, 2, 'nearest')`.
    Upsample,
    /// `Concat(1)` of all inputs along channels.
    Concat,
    /// `CBLinear(c1, c2s)`: one biased 1×1 conv to `sum(c2s)` channels, split into `c2s`.
    CBLinear {
        /// Channels of each output piece.
        c2s: Vec<usize>,
    },
    /// `CBFuse(idx)`: piece `idx[j]` of the j-th CBLinear input, resized (nearest) to the last
    /// input's size, summed with the last input.
    CBFuse {
        /// Which piece of each CBLinear input is taken.
        idx: Vec<usize>,
    },
    /// The head over its inputs (always the last row): a detection head (`DDetect`,
    /// `DualDDetect`, `Detect`) or a segmentation head (`Segment`, `DSegment`, `DualDSegment`).
    Detect(Head),
}

/// What a head row builds (official `models/yolo.py`): the detection branches and, for
/// segmentation heads, the mask branch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    /// Two branches, auxiliary levels first, then the main ones (`DualDDetect`,
    /// `DualDSegment`: training graphs); inference keeps the main one.
    pub dual: bool,
    /// Box towers with grouped convolutions (`DDetect`: `Conv(c2, c2, 3, g=4)` and
    /// `Conv2d(c2, 64, 1, groups=4)`, `c2` rounded to a multiple of 4); `false` for the plain
    /// `Detect` towers, which the official `Segment` head inherits.
    pub grouped: bool,
    /// The mask branch of a segmentation head.
    pub seg: Option<Seg>,
}

/// The mask branch of a segmentation head (official `Segment` / `DSegment` / `DualDSegment`):
/// per level a mask-coefficient tower (`Conv(c, c4, 3)`, `Conv(c4, c4, 3)`,
/// `Conv2d(c4, nm, 1)`, `c4 = max(c_P3 / 4, nm)`), and a prototype branch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seg {
    /// Mask coefficients per anchor = prototype masks (`nm`, 32 in the official models).
    pub nm: usize,
    /// Hidden channels of the `Proto` module (`npr`, 256 × `width_multiple`, rounded up to a
    /// multiple of 8); unused by the 1×1 prototypes.
    pub npr: usize,
    /// `true` (`DSegment`, `DualDSegment`): the prototypes are a 1×1 `Conv(c, nm)` of an extra
    /// head input (the last one; the last two for a dual head, auxiliary first); `false`
    /// (`Segment`): `Proto(c_P3, npr, nm)` on the P3 input (3×3 conv, nearest ×2 upsample, 3×3
    /// conv, 1×1 conv), so the prototypes are at stride 4.
    pub proto_inputs: bool,
}

impl Head {
    /// The official module name of this head row.
    pub fn module_name(&self) -> &'static str {
        match (self.dual, self.grouped, self.seg) {
            (true, _, None) => "DualDDetect",
            (false, true, None) => "DDetect",
            (false, false, None) => "Detect",
            (true, _, Some(_)) => "DualDSegment",
            (false, _, Some(s)) if s.proto_inputs => "DSegment",
            (false, _, Some(_)) => "Segment",
        }
    }

    /// Head inputs that feed the prototype branch, at the end of the row's `from`.
    pub fn proto_input_count(&self) -> usize {
        match self.seg {
            Some(s) if s.proto_inputs => 1 + self.dual as usize,
            _ => 0,
        }
    }
}

/// One resolved layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layer {
    /// Inputs, in the order of the row's `from`.
    pub from: Vec<Src>,
    /// The module.
    pub module: Module,
    /// Input channels, one per `from`.
    pub c_in: Vec<usize>,
    /// Output channels: one entry, or one per piece for `CBLinear`; empty for the head.
    pub c_out: Vec<usize>,
    /// Output stride in pixels (input pixels per output cell); the head's is its first input's.
    pub stride: u32,
}

/// A resolved model description: layers `model.0 … model.{n-1}`, the last being the head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arch {
    /// Model name (`yolov9-s`, `gelan-c`, or the yaml file's stem).
    pub name: String,
    /// The layers in official order.
    pub layers: Vec<Layer>,
}

/// The official models embedded in the binary: `(name, yaml)`.
const BUILTIN: [(&str, &str); 15] = [
    ("yolov9-t", include_str!("../../models/yolov9-t.yaml")),
    ("yolov9-s", include_str!("../../models/yolov9-s.yaml")),
    ("yolov9-m", include_str!("../../models/yolov9-m.yaml")),
    ("yolov9-c", include_str!("../../models/yolov9-c.yaml")),
    ("yolov9-e", include_str!("../../models/yolov9-e.yaml")),
    ("gelan-t", include_str!("../../models/gelan-t.yaml")),
    ("gelan-s", include_str!("../../models/gelan-s.yaml")),
    ("gelan-m", include_str!("../../models/gelan-m.yaml")),
    ("gelan-c", include_str!("../../models/gelan-c.yaml")),
    ("gelan-e", include_str!("../../models/gelan-e.yaml")),
    (
        "yolov9-c-dseg",
        include_str!("../../models/yolov9-c-dseg.yaml"),
    ),
    ("gelan-t-seg", include_str!("../../models/gelan-t-seg.yaml")),
    ("gelan-s-seg", include_str!("../../models/gelan-s-seg.yaml")),
    ("gelan-c-seg", include_str!("../../models/gelan-c-seg.yaml")),
    (
        "gelan-c-dseg",
        include_str!("../../models/gelan-c-dseg.yaml"),
    ),
];

/// Names of the embedded models: detection (training graphs, then GELAN), then segmentation.
pub fn builtin_names() -> impl Iterator<Item = &'static str> {
    BUILTIN.iter().map(|(n, _)| *n)
}

/// Official `make_divisible(x, 8)`: `x` rounded up to a multiple of 8.
fn make_divisible(x: f64) -> usize {
    ((x / 8.0).ceil() * 8.0) as usize
}

/// Largest channel count or kernel accepted from a yaml row (far above any YOLO model).
const MAX_CH: usize = 1 << 16;
/// Most layers accepted from a yaml (yolov9-e has 50).
const MAX_LAYERS: usize = 1000;

fn as_usize(v: &Value, what: &str) -> Result<usize> {
    let n = v
        .as_u64()
        .with_context(|| format!("{what}: expected a non-negative integer, got {v:?}"))?;
    ensure!(
        (1..=MAX_CH as u64).contains(&n),
        "{what}: {n} is out of range (1..={MAX_CH})"
    );
    Ok(n as usize)
}

fn usize_list(v: &Value, what: &str) -> Result<Vec<usize>> {
    let seq = v
        .as_sequence()
        .with_context(|| format!("{what}: expected a list of integers, got {v:?}"))?;
    ensure!(!seq.is_empty(), "{what}: the list is empty");
    seq.iter()
        .map(|x| {
            x.as_u64()
                .filter(|&n| n < MAX_CH as u64)
                .map(|n| n as usize)
                .with_context(|| format!("{what}: {x:?} is not a small non-negative integer"))
        })
        .collect()
}

impl Arch {
    /// One of the embedded official models by name (`yolov9-c`, `gelan-s`, …; a trailing
    /// `.yaml` is accepted). Errors list the names there are.
    pub fn builtin(name: &str) -> Result<Self> {
        let key = name.strip_suffix(".yaml").unwrap_or(name);
        let Some((n, text)) = BUILTIN.iter().find(|(n, _)| *n == key) else {
            bail!(
                "unknown model {name:?}: the built-in models are {}; or pass a model yaml file",
                builtin_names().collect::<Vec<_>>().join(", ")
            )
        };
        Self::from_yaml(text, n)
    }

    /// A built-in name, or a path to a yaml file in the official format.
    pub fn from_name_or_path(s: &str) -> Result<Self> {
        let path = std::path::Path::new(s);
        if !path.is_file() {
            return Self::builtin(s);
        }
        let bytes = read_small(path)
            .with_context(|| format!("{}: cannot read the model yaml", crate::text::path(&path)))?;
        ensure!(
            bytes.len() <= 1 << 20,
            "{}: {} bytes is too large for a model yaml (1 MiB at most)",
            crate::text::path(&path),
            bytes.len()
        );
        let text = String::from_utf8(bytes).with_context(|| {
            format!(
                "{}: the model yaml is not UTF-8 text",
                crate::text::path(&path)
            )
        })?;
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "custom".into());
        Self::from_yaml(&text, &name).with_context(|| format!("{}", crate::text::path(&path)))
    }

    /// [`Arch::from_name_or_path`] for the `--cfg` option of train, detect, val, serve and
    /// convert: shared, ready to hand to the model, errors prefixed with `--cfg VALUE`.
    pub fn from_cfg(s: &str) -> Result<std::sync::Arc<Self>> {
        Ok(std::sync::Arc::new(
            Self::from_name_or_path(s).with_context(|| format!("--cfg {s}"))?,
        ))
    }

    /// Parses and resolves a model yaml (official format). `name` names the model.
    ///
    /// Errors name the row (`layer 12 (RepNCSPELAN4)`) and the value: an unknown module, a
    /// `from` that points forward or out of range, a wrong argument, a head that is not the last
    /// row, inconsistent strides in a `Concat`.
    pub fn from_yaml(text: &str, name: &str) -> Result<Self> {
        crate::bounded::check_yaml(text).context("the model yaml")?;
        let doc: Value = serde_yaml_ng::from_str(text).context("the model yaml does not parse")?;
        let num = |k: &str| -> Result<f64> {
            match doc.get(k) {
                None => Ok(1.0),
                Some(v) => v
                    .as_f64()
                    .filter(|x| *x > 0.0 && *x <= 16.0)
                    .with_context(|| format!("`{k}`: expected a number in (0, 16], got {v:?}")),
            }
        };
        let (gd, gw) = (num("depth_multiple")?, num("width_multiple")?);
        let mut rows = Vec::new();
        for part in ["backbone", "head"] {
            let seq = doc
                .get(part)
                .and_then(Value::as_sequence)
                .with_context(|| format!("the model yaml has no `{part}` list of layer rows"))?;
            rows.extend(seq.iter());
        }
        ensure!(
            !rows.is_empty() && rows.len() <= MAX_LAYERS,
            "the model yaml has {} layers (1..={MAX_LAYERS})",
            rows.len()
        );
        let mut layers: Vec<Layer> = Vec::with_capacity(rows.len());
        for (i, row) in rows.iter().enumerate() {
            let layer = resolve_row(i, row, &layers, gd, gw)
                .with_context(|| format!("model yaml, layer {i} ({})", row_module(row)))?;
            layers.push(layer);
        }
        let arch = Arch {
            name: name.to_string(),
            layers,
        };
        arch.check()?;
        Ok(arch)
    }

    fn check(&self) -> Result<()> {
        let n = self.layers.len();
        for (i, l) in self.layers.iter().enumerate() {
            if matches!(l.module, Module::Detect(_)) {
                ensure!(
                    i + 1 == n,
                    "model yaml, layer {i}: the detection head must be the last row"
                );
            }
        }
        let head = self.head_layer();
        let Module::Detect(h) = head.module else {
            bail!(
                "model yaml: the last row must be a head (DDetect, DualDDetect, Detect, Segment, \
                 DSegment or DualDSegment)"
            )
        };
        let dual = h.dual;
        let name = h.module_name();
        ensure!(
            head.from.len() > h.proto_input_count(),
            "model yaml, {name}: {} inputs, {} of them for the prototypes",
            head.from.len(),
            h.proto_input_count()
        );
        let det = self.det_inputs().len();
        let levels = if dual {
            ensure!(
                det.is_multiple_of(2),
                "model yaml, {name}: needs an even number of detection inputs (auxiliary, then \
                 main)"
            );
            det / 2
        } else {
            det
        };
        ensure!(
            (1..=8).contains(&levels),
            "model yaml, detection head: {levels} levels"
        );
        let strides = self.strides();
        for w in strides.windows(2) {
            ensure!(
                w[0] < w[1],
                "model yaml: head strides {strides:?} must increase"
            );
        }
        ensure!(
            strides == STRIDES,
            "model yaml: head strides {strides:?}; yolo9 supports heads at strides [8, 16, 32] \
             (P3, P4, P5) only"
        );
        if dual {
            let aux: Vec<u32> = head.from[..levels]
                .iter()
                .map(|s| self.stride_of(*s))
                .collect();
            ensure!(
                aux == strides,
                "model yaml, {name}: auxiliary strides {aux:?} differ from the main {strides:?}"
            );
        }
        Ok(())
    }

    /// The stride of a source.
    pub fn stride_of(&self, s: Src) -> u32 {
        match s {
            Src::Input => 1,
            Src::Layer(j) => self.layers[j].stride,
        }
    }

    /// Channels of a source (the first piece for `CBLinear`).
    pub fn channels_of(&self, s: Src) -> usize {
        match s {
            Src::Input => 3,
            Src::Layer(j) => self.layers[j].c_out.first().copied().unwrap_or(0),
        }
    }

    /// The head layer (the last one).
    pub fn head_layer(&self) -> &Layer {
        self.layers.last().expect("an Arch has layers (checked)")
    }

    /// Index of the head layer (`model.{i}`), e.g. 29 for yolov9-s, 22 for gelan-s.
    pub fn head_index(&self) -> usize {
        self.layers.len() - 1
    }

    /// The head row's kind (checked to be the last layer).
    pub fn head(&self) -> Head {
        match self.head_layer().module {
            Module::Detect(h) => h,
            _ => unreachable!("the last layer is a head (checked)"),
        }
    }

    /// Whether the head has an auxiliary branch (`DualDDetect`, `DualDSegment`: a training
    /// graph).
    pub fn is_dual(&self) -> bool {
        self.head().dual
    }

    /// The mask branch, for a segmentation model.
    pub fn seg(&self) -> Option<Seg> {
        self.head().seg
    }

    /// The head inputs of the detection branches (all but the prototype inputs).
    pub fn det_inputs(&self) -> &[Src] {
        let f = &self.head_layer().from;
        &f[..f.len() - self.head().proto_input_count()]
    }

    /// The main-branch detection inputs (P3, P4, P5 for every official model).
    pub fn main_inputs(&self) -> &[Src] {
        let f = self.det_inputs();
        if self.is_dual() {
            &f[f.len() / 2..]
        } else {
            f
        }
    }

    /// The auxiliary detection inputs (empty without a dual head).
    pub fn aux_inputs(&self) -> &[Src] {
        let f = self.det_inputs();
        if self.is_dual() {
            &f[..f.len() / 2]
        } else {
            &[]
        }
    }

    /// The extra head inputs of the prototype branches (`DSegment`: one; `DualDSegment`:
    /// auxiliary then main), empty otherwise.
    pub fn proto_inputs(&self) -> &[Src] {
        let f = &self.head_layer().from;
        &f[f.len() - self.head().proto_input_count()..]
    }

    /// The input the main prototype branch reads: the last extra input, or P3 for `Segment`;
    /// `None` for a detection model.
    pub fn main_proto_input(&self) -> Option<Src> {
        self.seg()?;
        self.proto_inputs()
            .last()
            .or(self.main_inputs().first())
            .copied()
    }

    /// Head strides in pixels (of the main inputs), `[8, 16, 32]` for every official model.
    pub fn strides(&self) -> Vec<u32> {
        self.main_inputs()
            .iter()
            .map(|s| self.stride_of(*s))
            .collect()
    }

    /// The largest stride: input sides must be multiples of it.
    pub fn max_stride(&self) -> u32 {
        self.layers
            .iter()
            .map(|l| l.stride)
            .max()
            .unwrap_or(1)
            .max(32)
    }

    /// The inference graph of a training graph, as the official re-parameterization
    /// (`tools/reparameterization.ipynb`) builds it: only the layers the main head needs, in
    /// order, renumbered, with a leading `Silence` dropped when nothing but layer 1 reads it, and
    /// a `DDetect` over the main inputs. Returns the graph and, per layer of it, the index of the
    /// layer it comes from. A graph without `DualDDetect` is its own inference graph.
    ///
    /// For yolov9-t/s this keeps layers 0–21 (head 29 → 22), for m/c layers 1–22 (head 38 →
    /// 22), for e layers 0–28 and 36–48 (head 49 → 42): the official gelan-* graphs.
    pub fn main_branch(&self) -> (Arch, Vec<usize>) {
        let n = self.layers.len();
        if !self.is_dual() {
            return (self.clone(), (0..n).collect());
        }
        let mut keep = vec![false; n];
        let mut stack: Vec<usize> = self
            .main_inputs()
            .iter()
            .chain(self.proto_inputs().last())
            .filter_map(|s| match s {
                Src::Layer(j) => Some(*j),
                Src::Input => None,
            })
            .collect();
        while let Some(j) = stack.pop() {
            if keep[j] {
                continue;
            }
            keep[j] = true;
            for s in &self.layers[j].from {
                if let Src::Layer(k) = s {
                    stack.push(*k);
                }
            }
        }
        // A leading Silence read only by layer 1 (through `-1`) disappears (gelan-m/c).
        if keep[0] && self.layers[0].module == Module::Silence {
            let readers = (1..n - 1)
                .filter(|&i| keep[i] && self.layers[i].from.contains(&Src::Layer(0)))
                .count();
            if readers <= 1 && (n > 1 && self.layers[1].from == [Src::Layer(0)]) {
                keep[0] = false;
            }
        }
        let old: Vec<usize> = (0..n - 1).filter(|&i| keep[i]).collect();
        let mut new_of = vec![None; n];
        for (k, &i) in old.iter().enumerate() {
            new_of[i] = Some(k);
        }
        let map_src = |s: &Src| -> Src {
            match s {
                Src::Input => Src::Input,
                // A dropped Silence is the input itself.
                Src::Layer(j) => new_of[*j].map(Src::Layer).unwrap_or(Src::Input),
            }
        };
        let mut layers: Vec<Layer> = old
            .iter()
            .map(|&i| {
                let l = &self.layers[i];
                Layer {
                    from: l.from.iter().map(map_src).collect(),
                    ..l.clone()
                }
            })
            .collect();
        let head = self.head_layer();
        let h = self.head();
        let main: Vec<Src> = self
            .main_inputs()
            .iter()
            .chain(self.proto_inputs().last())
            .copied()
            .collect();
        let c_in = main.iter().map(|s| self.channels_of(*s)).collect();
        layers.push(Layer {
            from: main.iter().map(map_src).collect(),
            module: Module::Detect(Head { dual: false, ..h }),
            c_in,
            c_out: Vec::new(),
            stride: head.stride,
        });
        let mut from_index = old;
        from_index.push(n - 1);
        // The GELAN name when that built-in model is this graph (yolov9-c → gelan-c); yolov9-c-dseg's
        // main branch is not gelan-c-dseg (its prototype branch repeats RepNCSP twice).
        let name = self
            .name
            .strip_prefix("yolov9-")
            .map(|s| format!("gelan-{s}"))
            .filter(|g| Arch::builtin(g).is_ok_and(|a| a.layers == layers))
            .unwrap_or_else(|| format!("{}-infer", self.name));
        (Arch { name, layers }, from_index)
    }

    /// The training graph (with the auxiliary branch) whose [`Arch::main_branch`] is this
    /// inference graph, among the built-in models: `gelan-c` → `yolov9-c`. `None` for a graph
    /// that is already a training graph or has no built-in counterpart.
    pub fn dual_counterpart(&self) -> Option<Arch> {
        if self.is_dual() {
            return None;
        }
        builtin_names()
            .filter_map(|n| Arch::builtin(n).ok())
            .filter(|a| a.is_dual())
            .find(|a| a.main_branch().0.layers == self.layers)
    }

    /// The official yaml rows of this graph (absolute `from` indices except `-1` for the
    /// previous layer), readable by [`Arch::from_yaml`] and by the official code.
    pub fn to_yaml(&self) -> String {
        let mut s = String::from("# written by yolo9\nnc: 80\ndepth_multiple: 1.0\nwidth_multiple: 1.0\nanchors: 3\nbackbone: []\nhead:\n");
        for (i, l) in self.layers.iter().enumerate() {
            let src = |x: &Src| match x {
                Src::Input => "-1".to_string(),
                Src::Layer(j) if *j + 1 == i => "-1".to_string(),
                Src::Layer(j) => j.to_string(),
            };
            let from = if l.from.len() == 1
                && !matches!(
                    l.module,
                    Module::Detect(_) | Module::Concat | Module::CBFuse { .. }
                ) {
                src(&l.from[0])
            } else {
                format!(
                    "[{}]",
                    l.from.iter().map(src).collect::<Vec<_>>().join(", ")
                )
            };
            let list = |v: &[usize]| {
                v.iter()
                    .map(|x| x.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let (m, args) = match &l.module {
                Module::Silence => ("Silence", String::new()),
                Module::Conv { c2, k, s } => ("Conv", format!("{c2}, {k}, {s}")),
                Module::Elan1 { c2, c3, c4 } => ("ELAN1", format!("{c2}, {c3}, {c4}")),
                Module::RepNCSPELAN4 { c2, c3, c4, n } => {
                    ("RepNCSPELAN4", format!("{c2}, {c3}, {c4}, {n}"))
                }
                Module::AConv { c2 } => ("AConv", c2.to_string()),
                Module::ADown { c2 } => ("ADown", c2.to_string()),
                Module::SppElan { c2, c3 } => ("SPPELAN", format!("{c2}, {c3}")),
                Module::Upsample => ("nn.Upsample", "None, 2, 'nearest'".into()),
                Module::Concat => ("Concat", "1".into()),
                Module::CBLinear { c2s } => ("CBLinear", format!("[{}]", list(c2s))),
                Module::CBFuse { idx } => ("CBFuse", format!("[{}]", list(idx))),
                Module::Detect(h) => (
                    h.module_name(),
                    match h.seg {
                        Some(sg) => format!("nc, {}, {}", sg.nm, sg.npr),
                        None => "nc".into(),
                    },
                ),
            };
            s.push_str(&format!("  - [{from}, 1, {m}, [{args}]]  # {i}\n"));
        }
        s
    }
}

/// The bytes of a regular file of at most 1 MiB + 1 (larger files are cut there and refused by
/// the caller); a FIFO or device is refused without blocking ([`crate::bounded::open_regular`]).
fn read_small(path: &std::path::Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let f = crate::bounded::open_regular(path)?;
    let mut b = Vec::new();
    f.take((1 << 20) + 1).read_to_end(&mut b)?;
    Ok(b)
}

/// The module name of a row, for error messages.
fn row_module(row: &Value) -> String {
    row.as_sequence()
        .and_then(|r| r.get(2))
        .and_then(Value::as_str)
        .unwrap_or("?")
        .to_string()
}

/// Resolves row `i` against the layers before it (official `parse_model`).
// One piece: the row's fields and helpers, then one match arm per module kind, as the official
// `parse_model` is one if-chain over module names; the arms share the helpers' closures.
fn resolve_row(i: usize, row: &Value, prev: &[Layer], gd: f64, gw: f64) -> Result<Layer> {
    let r = row
        .as_sequence()
        .filter(|r| r.len() == 4)
        .with_context(|| format!("expected a row [from, number, module, args], got {row:?}"))?;
    let from_v: Vec<&Value> = match &r[0] {
        Value::Sequence(s) => s.iter().collect(),
        v => vec![v],
    };
    ensure!(!from_v.is_empty(), "`from` is empty");
    let mut from = Vec::with_capacity(from_v.len());
    for v in from_v {
        let f = v
            .as_i64()
            .with_context(|| format!("`from` entry {v:?} is not an integer"))?;
        let src = if f < 0 {
            let back = f.unsigned_abs() as usize;
            ensure!(back <= i.max(1), "`from` {f} points before the input");
            if i == 0 {
                Src::Input
            } else {
                Src::Layer(i - back)
            }
        } else {
            let j = f as usize;
            ensure!(j < i, "`from` {f} is not an earlier layer");
            Src::Layer(j)
        };
        from.push(src);
    }
    let number = r[1]
        .as_u64()
        .with_context(|| format!("`number` {:?} is not an integer", r[1]))?;
    let number = if number > 1 {
        ((number as f64 * gd).round() as u64).max(1)
    } else {
        number
    };
    ensure!(
        number == 1,
        "`number` = {number}: repeated modules (nn.Sequential of copies) are not supported; the \
         official YOLOv9 models use 1"
    );
    let module = r[2]
        .as_str()
        .with_context(|| format!("`module` {:?} is not a name", r[2]))?;
    let args: Vec<Value> = r[3]
        .as_sequence()
        .with_context(|| format!("`args` {:?} is not a list", r[3]))?
        .clone();
    let arg = |k: usize| -> Result<&Value> {
        args.get(k)
            .with_context(|| format!("{module}: missing argument {k} (args {args:?})"))
    };
    let arg_or = |k: usize, d: usize| -> Result<usize> {
        match args.get(k) {
            None => Ok(d),
            Some(v) => as_usize(v, &format!("{module} argument {k}")),
        }
    };
    let stride_of = |s: &Src| match s {
        Src::Input => 1,
        Src::Layer(j) => prev[*j].stride,
    };
    let ch_of = |s: &Src| -> Result<usize> {
        match s {
            Src::Input => Ok(3),
            Src::Layer(j) => {
                let l = &prev[*j];
                ensure!(
                    l.c_out.len() == 1,
                    "input layer {j} has {} outputs (a CBLinear feeds only CBFuse)",
                    l.c_out.len()
                );
                Ok(l.c_out[0])
            }
        }
    };
    let single = || -> Result<Src> {
        ensure!(
            from.len() == 1,
            "{module} takes one input, got {}",
            from.len()
        );
        Ok(from[0])
    };
    let c2_scaled = |v: &Value| -> Result<usize> {
        let c = as_usize(v, &format!("{module} output channels"))?;
        Ok(make_divisible(c as f64 * gw))
    };
    let (module, c_in, c_out, stride) = match module {
        "Silence" => {
            let s = single()?;
            let c = ch_of(&s)?;
            (Module::Silence, vec![c], vec![c], stride_of(&s))
        }
        "Conv" => {
            let s = single()?;
            let c2 = c2_scaled(arg(0)?)?;
            let k = arg_or(1, 1)?;
            let st = arg_or(2, 1)?;
            ensure!(
                k % 2 == 1 && k <= 15,
                "Conv kernel {k} must be odd and at most 15"
            );
            ensure!(st <= 4, "Conv stride {st} is out of range");
            ensure!(
                args.len() <= 3,
                "Conv: padding/groups arguments are not supported"
            );
            (
                Module::Conv { c2, k, s: st },
                vec![ch_of(&s)?],
                vec![c2],
                stride_of(&s) * st as u32,
            )
        }
        "ELAN1" => {
            let s = single()?;
            let c2 = c2_scaled(arg(0)?)?;
            let c3 = as_usize(arg(1)?, "ELAN1 c3")?;
            let c4 = as_usize(arg(2)?, "ELAN1 c4")?;
            ensure!(c3 % 2 == 0, "ELAN1 c3 = {c3} must be even");
            (
                Module::Elan1 { c2, c3, c4 },
                vec![ch_of(&s)?],
                vec![c2],
                stride_of(&s),
            )
        }
        "RepNCSPELAN4" => {
            let s = single()?;
            let c2 = c2_scaled(arg(0)?)?;
            let c3 = as_usize(arg(1)?, "RepNCSPELAN4 c3")?;
            let c4 = as_usize(arg(2)?, "RepNCSPELAN4 c4")?;
            let n = arg_or(3, 1)?;
            ensure!(c3 % 2 == 0, "RepNCSPELAN4 c3 = {c3} must be even");
            ensure!(c4 % 2 == 0, "RepNCSPELAN4 c4 = {c4} must be even");
            ensure!(n <= 16, "RepNCSPELAN4 depth {n} is out of range");
            (
                Module::RepNCSPELAN4 { c2, c3, c4, n },
                vec![ch_of(&s)?],
                vec![c2],
                stride_of(&s),
            )
        }
        "AConv" | "ADown" => {
            let s = single()?;
            let c2 = c2_scaled(arg(0)?)?;
            let c1 = ch_of(&s)?;
            let m = if module == "AConv" {
                Module::AConv { c2 }
            } else {
                ensure!(
                    c1 % 2 == 0 && c2 % 2 == 0,
                    "ADown channels {c1} → {c2} must be even"
                );
                Module::ADown { c2 }
            };
            (m, vec![c1], vec![c2], stride_of(&s) * 2)
        }
        "SPPELAN" => {
            let s = single()?;
            let c2 = c2_scaled(arg(0)?)?;
            let c3 = as_usize(arg(1)?, "SPPELAN c3")?;
            (
                Module::SppElan { c2, c3 },
                vec![ch_of(&s)?],
                vec![c2],
                stride_of(&s),
            )
        }
        "nn.Upsample" => {
            let s = single()?;
            let scale = args.get(1).and_then(Value::as_f64);
            let mode = args.get(2).and_then(Value::as_str);
            ensure!(
                scale == Some(2.0) && mode == Some("nearest"),
                "nn.Upsample: only [None, 2, 'nearest'] is supported, got {args:?}"
            );
            let st = stride_of(&s);
            ensure!(st >= 2, "nn.Upsample above the input resolution");
            let c = ch_of(&s)?;
            (Module::Upsample, vec![c], vec![c], st / 2)
        }
        "Concat" => {
            ensure!(
                args.first().and_then(Value::as_i64) == Some(1),
                "Concat: only the channel dimension (1) is supported, got {args:?}"
            );
            let c: Vec<usize> = from.iter().map(ch_of).collect::<Result<_>>()?;
            let st = stride_of(&from[0]);
            for s in &from {
                ensure!(
                    stride_of(s) == st,
                    "Concat of inputs at strides {:?}",
                    from.iter().map(stride_of).collect::<Vec<_>>()
                );
            }
            let total = c.iter().sum();
            (Module::Concat, c, vec![total], st)
        }
        "CBLinear" => {
            let s = single()?;
            let c2s = usize_list(arg(0)?, "CBLinear channels")?;
            ensure!(
                c2s.iter().all(|&c| c >= 1),
                "CBLinear channels {c2s:?} must be positive"
            );
            ensure!(
                args.len() == 1,
                "CBLinear: kernel/stride arguments are not supported"
            );
            (
                Module::CBLinear { c2s: c2s.clone() },
                vec![ch_of(&s)?],
                c2s,
                stride_of(&s),
            )
        }
        "CBFuse" => {
            let idx = usize_list(arg(0)?, "CBFuse indices")?;
            ensure!(
                idx.len() + 1 == from.len(),
                "CBFuse: {} indices for {} inputs (one per input but the last)",
                idx.len(),
                from.len()
            );
            let last = *from.last().expect("from is not empty");
            let target = stride_of(&last);
            let c2 = ch_of(&last)?;
            let mut c_in = Vec::new();
            for (s, &k) in from.iter().zip(&idx) {
                let Src::Layer(j) = s else {
                    bail!("CBFuse: input {s:?} is not a CBLinear")
                };
                let l = &prev[*j];
                ensure!(
                    matches!(l.module, Module::CBLinear { .. }),
                    "CBFuse: input layer {j} is not a CBLinear"
                );
                let c = *l.c_out.get(k).with_context(|| {
                    format!("CBFuse: layer {j} has {} pieces, index {k}", l.c_out.len())
                })?;
                ensure!(
                    c == c2,
                    "CBFuse: piece {k} of layer {j} has {c} channels, the fused map {c2}"
                );
                ensure!(
                    l.stride >= target && l.stride.is_multiple_of(target),
                    "CBFuse: layer {j} at stride {} cannot be resized to stride {target}",
                    l.stride
                );
                c_in.push(c);
            }
            c_in.push(c2);
            (Module::CBFuse { idx }, c_in, vec![c2], target)
        }
        "Detect" | "DDetect" | "DualDDetect" | "Segment" | "DSegment" | "DualDSegment" => {
            let c: Vec<usize> = from.iter().map(ch_of).collect::<Result<_>>()?;
            let st = stride_of(&from[0]);
            let seg = if module.ends_with("Segment") {
                let nm = arg_or(1, 32)?;
                let npr = arg_or(2, 256)?;
                ensure!(
                    (1..=256).contains(&nm) && (1..=4096).contains(&npr),
                    "{module}: nm = {nm} (1..=256) and npr = {npr} (1..=4096)"
                );
                Some(Seg {
                    nm,
                    npr: make_divisible(npr as f64 * gw),
                    proto_inputs: module != "Segment",
                })
            } else {
                None
            };
            let head = Head {
                dual: module.starts_with("Dual"),
                grouped: module != "Detect" && module != "Segment",
                seg,
            };
            (Module::Detect(head), c, Vec::new(), st)
        }
        m => bail!(
            "module {m:?} is not supported (supported: Silence, Conv, ELAN1, RepNCSPELAN4, AConv, \
             ADown, SPPELAN, nn.Upsample, Concat, CBLinear, CBFuse, Detect, DDetect, DualDDetect, \
             Segment, DSegment, DualDSegment)"
        ),
    };
    Ok(Layer {
        from,
        module,
        c_in,
        c_out,
        stride,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_resolves_with_strides_8_16_32() {
        for n in builtin_names() {
            let a = Arch::builtin(n).unwrap();
            assert_eq!(a.strides(), vec![8, 16, 32], "{n}");
            assert_eq!(a.is_dual(), n.starts_with("yolov9-"), "{n}");
        }
    }

    #[test]
    fn main_branch_of_each_training_graph_is_the_official_gelan_graph() {
        for (t, g, map) in [
            (
                "yolov9-t",
                "gelan-t",
                (0..22).chain([29]).collect::<Vec<_>>(),
            ),
            ("yolov9-s", "gelan-s", (0..22).chain([29]).collect()),
            ("yolov9-m", "gelan-m", (1..23).chain([38]).collect()),
            ("yolov9-c", "gelan-c", (1..23).chain([38]).collect()),
            ("yolov9-e", "gelan-e", (0..29).chain(36..50).collect()),
        ] {
            let (main, from) = Arch::builtin(t).unwrap().main_branch();
            let gelan = Arch::builtin(g).unwrap();
            assert_eq!(main.name, g);
            assert_eq!(main.layers, gelan.layers, "{t} → {g}");
            assert_eq!(from, map, "{t}");
            assert_eq!(
                gelan.dual_counterpart().map(|a| a.name),
                Some(t.to_string())
            );
        }
    }

    #[test]
    fn yaml_round_trip_and_channel_arithmetic() {
        for n in builtin_names() {
            let a = Arch::builtin(n).unwrap();
            let b = Arch::from_yaml(&a.to_yaml(), n).unwrap();
            assert_eq!(a, b, "{n}");
        }
        let c = Arch::builtin("yolov9-c").unwrap();
        // layer 12: Concat of the upsampled SPPELAN (512) and layer 7 (512)
        assert_eq!(c.layers[12].c_out, vec![1024]);
        // layer 25: CBLinear on layer 9 → pieces 256, 512, 512
        assert_eq!(c.layers[25].c_out, vec![256, 512, 512]);
        assert_eq!(c.layers[30].from.len(), 4);
        assert_eq!(c.layers[26].from, vec![Src::Layer(0)]);
        assert_eq!(c.layers[26].c_in, vec![3]);
        // width_multiple scales output channels to multiples of 8
        let half = Arch::from_yaml(
            &Arch::builtin("gelan-s")
                .unwrap()
                .to_yaml()
                .replace("width_multiple: 1.0", "width_multiple: 0.3"),
            "x",
        )
        .unwrap();
        assert_eq!(half.layers[0].c_out, vec![16]); // ceil(32·0.3 / 8)·8
    }

    #[test]
    fn bad_rows_are_refused_with_the_layer() {
        let base = Arch::builtin("gelan-t").unwrap().to_yaml();
        for (from, to, want) in [
            ("ELAN1", "Focus", "module \"Focus\" is not supported"),
            (
                "[[-1, 6], 1, Concat",
                "[[-1, 30], 1, Concat",
                "not an earlier layer",
            ),
            (
                "[[15, 18, -1], 1, DDetect",
                "[[-1, 18, 15], 1, DDetect",
                "must increase",
            ),
        ] {
            let y = base.replacen(from, to, 1);
            assert_ne!(y, base, "{from}");
            let e = format!("{:#}", Arch::from_yaml(&y, "x").unwrap_err());
            assert!(e.contains(want), "{e}");
        }
    }
}
