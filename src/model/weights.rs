//! Model weights: a flat state_dict (official key names) plus metadata, read from yolo9
//! safetensors, plain state_dict safetensors, or official PyTorch `.pt` checkpoints, and written
//! as safetensors atomically.
//!
//! # File format
//!
//! A standard safetensors file. Tensors carry the official state_dict names
//! (`model.4.cv2.0.m.0.cv1.conv1.conv.weight`, see [`crate::model::keys`]); floating-point
//! tensors are `F32` (or `F16` when saved with `half`), BatchNorm `*.num_batches_tracked`
//! counters are `I64` scalars. The metadata holds **one key, `yolo9`**, whose value is a JSON
//! object (one key keeps the file bytes deterministic, since safetensors writes metadata from a
//! hash map):
//!
//! ```json
//! {"format":"yolo9-weights","version":1,"nc":3,"names":["RBC","WBC","Platelets"],
//!  "strides":[8,16,32],"graph":"infer","dtype":"f16",
//!  "source":{"file":"bccd-official-best.pt","sha256":"85bf…"}}
//! ```
//!
//! `graph` is `train` (yolov9-s.yaml: layers 0–28 + DualDDetect at 29) or `infer` (gelan-s:
//! 0–21 + DDetect at 22); `source` is optional. A safetensors file without this key (a plain
//! state_dict) is accepted: the graph is inferred from the names, `nc` from the class
//! convolution, and names default to `class0`, `class1`, ….
//!
//! Why one file: the three input formats (yolo9 safetensors, plain state_dict safetensors, official
//! `.pt`) end in the same checks on one `Weights` (model recognition, class names, NaN/Inf,
//! metadata); the `.pt` parsing itself is in `crate::pt`.

use super::arch::Arch;
use super::keys;
use anyhow::{bail, ensure, Context, Result};
use candle_core::{DType, Device, Tensor};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

/// Which graph a set of weights describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Graph {
    /// The training graph of `yolov9-s.yaml`: layers 0–28 and `DualDDetect` (layer 29).
    Train,
    /// The inference graph (gelan-s): layers 0–21 and `DDetect` (layer 22).
    Infer,
}

impl Graph {
    /// `"train"` / `"infer"` (the metadata spelling).
    pub fn as_str(self) -> &'static str {
        match self {
            Graph::Train => "train",
            Graph::Infer => "infer",
        }
    }
}

impl std::fmt::Debug for Weights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Weights")
            .field("model", &self.meta.arch.name)
            .field("graph", &self.meta.graph)
            .field("nc", &self.meta.nc)
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

/// Metadata stored with the weights.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelMeta {
    /// Number of classes.
    pub nc: usize,
    /// Class names, `names[class_id]`.
    pub names: Vec<String>,
    /// Head strides in pixels, `[8, 16, 32]`.
    pub strides: Vec<u32>,
    /// Which graph the tensors describe (`Train` exactly when `arch` has `DualDDetect`).
    pub graph: Graph,
    /// The model description of the tensors (yolov9-s, gelan-c, a user's yaml, …).
    pub arch: Arc<Arch>,
    /// The INT8 calibration of a quantized file (`yolo9 convert --int8`): the CPU engine runs
    /// its convolutions in INT8 ([`crate::model::quant`]); `None` for a floating-point model.
    pub int8: Option<Arc<crate::model::quant::Int8Calibration>>,
}

impl ModelMeta {
    /// Metadata of the yolov9-s training graph or the gelan-s inference graph.
    pub fn yolov9_s(nc: usize, names: Vec<String>, graph: Graph) -> Self {
        Self {
            nc,
            names,
            strides: STRIDES.to_vec(),
            graph,
            arch: default_arch(graph),
            int8: None,
        }
    }
}

/// yolov9-s (`Graph::Train`) or gelan-s (`Graph::Infer`), parsed once.
pub fn default_arch(graph: Graph) -> Arc<Arch> {
    static S: std::sync::OnceLock<(Arc<Arch>, Arc<Arch>)> = std::sync::OnceLock::new();
    let (t, i) = S.get_or_init(|| {
        let t = Arch::builtin("yolov9-s").expect("the embedded yolov9-s.yaml resolves");
        let i = Arch::builtin("gelan-s").expect("the embedded gelan-s.yaml resolves");
        (Arc::new(t), Arc::new(i))
    });
    match graph {
        Graph::Train => t.clone(),
        Graph::Infer => i.clone(),
    }
}

/// Where converted weights came from: the source file name and the sha256 of its bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Provenance {
    /// File name of the source checkpoint (no directory), e.g. `bccd-official-best.pt`.
    pub file: String,
    /// sha256 of the source file, lowercase hex.
    pub sha256: String,
}

/// A flat state_dict with official names (`model.N....`), on the CPU, plus metadata.
///
/// Every floating-point tensor is f32. The BatchNorm step counters `*.num_batches_tracked`
/// (int64 scalars) are kept when the source has them so that a state_dict round trip is
/// complete; model loaders ignore them ([`keys::is_counter`]). Cloning shares the tensors
/// (candle tensors are reference counted).
#[derive(Clone)]
pub struct Weights {
    /// Tensors by official state_dict name.
    pub tensors: HashMap<String, Tensor>,
    /// Metadata.
    pub meta: ModelMeta,
}

/// The `yolo9` metadata value (JSON).
#[derive(Debug, Serialize, Deserialize)]
struct MetaJson {
    format: String,
    version: u32,
    nc: usize,
    names: Vec<String>,
    strides: Vec<u32>,
    graph: String,
    #[serde(default)]
    dtype: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    source: Option<Provenance>,
    /// The model name (`yolov9-c`, …); absent in files of yolo9 before several sizes (yolov9-s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    model: Option<String>,
    /// The model yaml, for a description that is not built in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cfg: Option<String>,
    /// The INT8 calibration of a quantized file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    int8: Option<crate::model::quant::Int8Calibration>,
}

/// The metadata key of yolo9 safetensors files.
pub const META_KEY: &str = "yolo9";
/// [`crate::model::arch::STRIDES`], also named here for the training set-up (`train/setup.rs`,
/// `train/budget.rs`).
pub use crate::model::arch::STRIDES;
/// Makes class names safe to print: every control character (an ANSI escape sequence, a
/// carriage return, a NUL) is replaced by its escaped text (`\u{1b}`), so a hostile name in a
/// checkpoint or a `data.yaml` cannot drive the terminal. Returns the indices of the names
/// changed, for a notice.
pub fn sanitize_names(names: &mut [String]) -> Vec<usize> {
    let mut changed = Vec::new();
    for (i, n) in names.iter_mut().enumerate() {
        if let std::borrow::Cow::Owned(e) = crate::text::escape(n) {
            *n = e;
            changed.push(i);
        }
    }
    changed
}

/// Most classes a model or dataset may declare. The largest public detection label sets have a
/// few thousand (LVIS 1,203); the bound keeps a hostile `nc` from building billions of names.
pub const MAX_CLASSES: usize = 100_000;

impl Weights {
    /// Loads weights from a safetensors file (written by `yolo9 convert` / [`Weights::save`], or a
    /// plain state_dict), or from an official `.pt` checkpoint / state_dict `.pt` converted in
    /// memory. The format is detected from the content, not the extension.
    ///
    /// The tensor names are checked against the graph ([`keys::state_dict_names`]): a missing
    /// tensor is an error (`missing tensor model.0.conv.weight`), as is an unexpected one, a
    /// class count that disagrees with the class convolution, or damaged bytes (`empty file`,
    /// `truncated: header declares N bytes of tensor data, file has M`, `garbage header`).
    /// Every error names the file and what to do.
    ///
    /// The error is [`crate::error::Error::Weights`] with the file's path (or
    /// [`crate::error::Error::OutOfMemory`]).
    pub fn load(path: impl AsRef<Path>) -> std::result::Result<Self, crate::error::Error> {
        let path = path.as_ref();
        match Self::load_detailed(path) {
            Ok(w) => Ok(w.0),
            Err(e) if crate::memory::is_oom(&e) => Err(crate::error::Error::from(e)),
            Err(e) => Err(crate::error::Error::weights(path, &e)),
        }
    }

    /// Weights from the bytes of a safetensors file held in memory (e.g. compiled into the
    /// program), checked exactly as [`Weights::load`] checks a file; `what` names the bytes in
    /// errors (`built-in yolov9-s-bccd`).
    ///
    /// Errors: [`crate::error::Error::Weights`] (with `what` as the path) for damaged bytes or tensors
    /// that are not a model yolo9 builds.
    pub fn from_bytes(bytes: &[u8], what: &str) -> std::result::Result<Self, crate::error::Error> {
        match from_safetensors(bytes, what) {
            Ok((w, _, _)) => Ok(w),
            Err(e) if crate::memory::is_oom(&e) => Err(crate::error::Error::from(e)),
            Err(e) => Err(crate::error::Error::weights(what, &e)),
        }
    }

    /// [`Weights::load`], also returning the provenance stored in yolo9 safetensors metadata
    /// (`None` for other files).
    pub fn load_with_provenance(path: &Path) -> Result<(Self, Option<Provenance>)> {
        let file = crate::text::path(&path).to_string();
        if sniff(path)?.starts_with(b"PK") {
            return Ok((Self::load_detailed(path)?.0, None));
        }
        let bytes = read_file(path)?;
        let (w, prov, _) = from_safetensors(&bytes, &file)?;
        Ok((w, prov))
    }

    /// [`Weights::load`] plus notes for a conversion summary: `(weights, notes, how it was read,
    /// number of tensors imported)`.
    pub fn load_detailed(path: &Path) -> Result<(Self, Vec<String>, String, usize)> {
        Self::load_detailed_as(path, None)
    }

    /// [`Weights::load_detailed`] where a PyTorch checkpoint may be the model `cfg` (`yolo9
    /// convert --cfg`): its tensors are read as that model's when they are exactly its
    /// state_dict (a model that is not built in, such as a user's yaml), else recognised from
    /// their keys as without `cfg` (the caller then applies `cfg` with [`Weights::with_arch`]).
    pub fn load_detailed_as(
        path: &Path,
        cfg: Option<&Arc<Arch>>,
    ) -> Result<(Self, Vec<String>, String, usize)> {
        let file = crate::text::path(&path).to_string();
        if sniff(path)?.starts_with(b"PK") {
            return from_pt(path, cfg);
        }
        let bytes = read_file(path)?;
        let n = bytes.len();
        let (w, _, notes) = from_safetensors(&bytes, &file)?;
        let imported = w.tensors.len();
        Ok((w, notes, format!("safetensors ({n} bytes)"), imported))
    }

    /// Saves as safetensors (format in the module docs), atomically (temporary file in the same
    /// directory, fsync, rename, fsync of the directory). `half` stores floating-point tensors as
    /// f16 (round to nearest even; exact for weights that came from an fp16 checkpoint).
    pub fn save(&self, path: &Path, half: bool) -> Result<()> {
        self.save_with_provenance(path, half, None)
    }

    /// [`Weights::save`] recording where the weights came from.
    pub fn save_with_provenance(
        &self,
        path: &Path,
        half: bool,
        source: Option<&Provenance>,
    ) -> Result<()> {
        let file = crate::text::path(&path).to_string();
        let meta = MetaJson {
            format: "yolo9-weights".into(),
            version: 1,
            nc: self.meta.nc,
            names: self.meta.names.clone(),
            strides: self.meta.strides.clone(),
            graph: self.meta.graph.as_str().into(),
            dtype: Some(if half { "f16" } else { "f32" }.into()),
            source: source.cloned(),
            model: Some(self.meta.arch.name.clone()),
            cfg: match Arch::builtin(&self.meta.arch.name) {
                Ok(a) if a == *self.meta.arch => None,
                _ => Some(self.meta.arch.to_yaml()),
            },
            int8: self.meta.int8.as_deref().cloned(),
        };
        let mut raws = Vec::with_capacity(self.tensors.len());
        for (name, t) in &self.tensors {
            raws.push((
                name.clone(),
                RawTensor::from_tensor(t, half)
                    .with_context(|| format!("{file}: cannot serialize tensor {name}"))?,
            ));
        }
        let info: HashMap<String, String> =
            [(META_KEY.to_string(), serde_json::to_string(&meta)?)].into();
        let bytes = safetensors::serialize(raws.iter().map(|(n, r)| (n.as_str(), r)), Some(info))
            .with_context(|| format!("{file}: cannot serialize safetensors"))?;
        write_atomic(path, &bytes)
    }

    /// Parameters counted like the official model summary (`sum(p.numel() for p in
    /// model.parameters())`): every tensor except BN running statistics and counters.
    /// 9,804,512 for the training graph and 7,226,208 for the inference graph at nc=80.
    pub fn parameter_count(&self) -> usize {
        self.tensors
            .iter()
            .filter(|(n, _)| keys::is_parameter(n))
            .map(|(_, t)| t.elem_count())
            .sum()
    }

    /// The inference graph of these weights: for [`Graph::Train`], layers 0–21 as they are and
    /// `model.29.cv4/cv5/dfl2` renamed to `model.22.cv2/cv3/dfl` (the official
    /// re-parameterization, `tools/reparameterization.ipynb`); Infer weights are returned as a
    /// copy. Tensors are shared (candle tensors are reference counted), not copied.
    pub fn to_infer(&self) -> Result<Weights> {
        let (tensors, arch) = if self.meta.arch.is_dual() {
            let map = crate::model::rename::NameMap::train_to_infer(&self.meta.arch);
            let tensors = self
                .tensors
                .iter()
                .filter_map(|(n, t)| map.map(n).map(|m| (m, t.clone())))
                .collect();
            (tensors, Arc::new(self.meta.arch.main_branch().0))
        } else {
            (self.tensors.clone(), self.meta.arch.clone())
        };
        let w = Weights {
            tensors,
            meta: ModelMeta {
                graph: Graph::Infer,
                arch,
                ..self.meta.clone()
            },
        };
        w.validate("inference graph")?;
        Ok(w)
    }

    /// These weights read as the model `arch` names (`--cfg` of detect, val, convert and serve),
    /// instead of the model recognised from their keys or metadata. A training graph asked for as
    /// its inference counterpart (yolov9-c weights with `--cfg gelan-c`) is reduced to its main
    /// branch first ([`Weights::to_infer`]).
    ///
    /// Errors: the tensors are not that model's state_dict — the message names `what` (e.g.
    /// `--cfg yolov9-c`) and the first missing, unexpected or mis-shaped tensor, as
    /// [`Weights::validate`] does.
    pub fn with_arch(self, arch: Arc<Arch>, what: &str) -> Result<Weights> {
        if *self.meta.arch == *arch {
            return Ok(self);
        }
        let w = if self.meta.arch.is_dual() && !arch.is_dual() {
            self.to_infer()?
        } else {
            self
        };
        let w = Weights {
            meta: ModelMeta {
                graph: graph_of(&arch),
                arch,
                ..w.meta
            },
            tensors: w.tensors,
        };
        w.validate(what)?;
        Ok(w)
    }

    /// Checks the tensors against the graph of `self.meta`: every float tensor present with dtype
    /// f32 and the shape of [`keys::state_dict_entries`], nothing unexpected, counters int64 when
    /// present, `nc` equal to the class-convolution width and to `names.len()`, strides
    /// `[8, 16, 32]`. `what` names the source in errors.
    pub fn validate(&self, what: &str) -> Result<()> {
        let arch = &self.meta.arch;
        let graph = self.meta.graph;
        ensure!(
            arch.is_dual() == (graph == Graph::Train),
            "{what}: the metadata says graph {:?} but {} is a {} graph",
            graph.as_str(),
            arch.name,
            if arch.is_dual() {
                "training"
            } else {
                "inference"
            }
        );
        let entries = keys::state_dict_entries(arch, self.meta.nc.max(1))?;
        let set: std::collections::HashSet<&str> = entries.iter().map(|e| e.0.as_str()).collect();
        let kind = format!(
            "{} {}",
            arch.name,
            if arch.is_dual() {
                "training"
            } else {
                "inference"
            }
        );
        let missing: Vec<&str> = entries
            .iter()
            .map(|e| e.0.as_str())
            .filter(|n| !keys::is_counter(n) && !self.tensors.contains_key(*n))
            .collect();
        if let Some(first) = missing.first() {
            bail!(
                "{what}: missing tensor {first}{}: not a complete {kind} state_dict; use \
                 weights made by `yolo9 convert` from an official checkpoint of that model",
                if missing.len() > 1 {
                    format!(" (and {} more)", missing.len() - 1)
                } else {
                    String::new()
                }
            )
        }
        let mut unexpected: Vec<&str> = self
            .tensors
            .keys()
            .filter(|n| !set.contains(n.as_str()))
            .map(String::as_str)
            .collect();
        unexpected.sort_unstable();
        if let Some(first) = unexpected.first() {
            bail!(
                "{what}: unexpected tensor {first}{} for the {kind} graph: the file holds \
                 another model (or a different graph than its metadata says)",
                if unexpected.len() > 1 {
                    format!(" (and {} more)", unexpected.len() - 1)
                } else {
                    String::new()
                }
            )
        }
        for (n, t) in &self.tensors {
            let want = if keys::is_counter(n) {
                DType::I64
            } else {
                DType::F32
            };
            if t.dtype() != want {
                bail!(
                    "{what}: tensor {n} has dtype {:?}, expected {want:?}",
                    t.dtype()
                )
            }
        }
        let cls = keys::class_conv_name(arch);
        let width = self
            .tensors
            .get(&cls)
            .map(|t| t.dims().first().copied().unwrap_or(0));
        if width != Some(self.meta.nc) {
            bail!(
                "{what}: nc={} but {cls} has {} output channels: class count and weights disagree",
                self.meta.nc,
                width.unwrap_or(0)
            )
        }
        for (n, shape) in &entries {
            if let Some(t) = self.tensors.get(n) {
                if t.dims() != shape.as_slice() {
                    bail!(
                        "{what}: tensor {n} has shape {:?}, the {kind} graph needs \
                         {shape:?}: the file holds another model size",
                        t.dims()
                    )
                }
            }
        }
        // Non-finite values load and then detect nothing: refuse them, naming the first tensor.
        let mut bad: Vec<(&str, usize)> = Vec::new();
        let mut names: Vec<&String> = self.tensors.keys().collect();
        names.sort_unstable();
        for n in names {
            let t = &self.tensors[n];
            if t.dtype() != DType::F32 {
                continue;
            }
            let v = t.flatten_all()?.to_vec1::<f32>()?;
            let k = v.iter().filter(|x| !x.is_finite()).count();
            if k > 0 {
                bad.push((n.as_str(), k));
            }
        }
        if let Some((first, k)) = bad.first() {
            let total: usize = bad.iter().map(|b| b.1).sum();
            bail!(
                "{what}: {total} NaN/Inf values in {} tensors (first: {first}, {k} values): the \
                 weights are damaged or come from a diverged run; use another checkpoint",
                bad.len()
            )
        }
        if self.meta.names.len() != self.meta.nc {
            bail!(
                "{what}: {} class names for nc={}",
                self.meta.names.len(),
                self.meta.nc
            )
        }
        if self.meta.strides != STRIDES {
            bail!(
                "{what}: strides {:?} are not supported (yolo9's heads use {STRIDES:?})",
                self.meta.strides
            )
        }
        Ok(())
    }
}

/// `(exact, matching)`: whether `tensors` are exactly the state_dict of `arch` (step counters
/// aside; the class count read from its class convolution), and how many of its tensors they
/// hold with the right shape.
fn match_arch(tensors: &HashMap<String, Tensor>, arch: &Arch) -> Result<(bool, usize)> {
    let nc = tensors
        .get(&keys::class_conv_name(arch))
        .and_then(|t| t.dims().first().copied())
        .filter(|&n| (1..=MAX_CLASSES).contains(&n))
        .unwrap_or(80);
    let entries = keys::state_dict_entries(arch, nc)?;
    let mut matching = 0;
    let mut exact = true;
    for (n, shape) in &entries {
        if keys::is_counter(n) {
            continue;
        }
        match tensors.get(n) {
            Some(t) if t.dims() == shape.as_slice() => matching += 1,
            _ => exact = false,
        }
    }
    let names: std::collections::HashSet<&str> = entries.iter().map(|e| e.0.as_str()).collect();
    Ok((
        exact && tensors.keys().all(|k| names.contains(k.as_str())),
        matching,
    ))
}

/// The built-in model whose state_dict the tensors are: every name present with its shape (the
/// class count taken from each candidate's class convolution). Without an exact match, the
/// candidate with the most matching tensors (yolov9-s / gelan-s first on ties), for
/// [`Weights::validate`] to name the first tensor that differs.
pub fn arch_from_tensors(tensors: &HashMap<String, Tensor>) -> Result<Arc<Arch>> {
    let order = ["yolov9-s", "gelan-s"]
        .into_iter()
        .chain(super::arch::builtin_names().filter(|n| !n.ends_with("-s")));
    let mut best: Option<(usize, Arc<Arch>)> = None;
    for name in order {
        let arch = match name {
            "yolov9-s" => default_arch(Graph::Train),
            "gelan-s" => default_arch(Graph::Infer),
            n => Arc::new(Arch::builtin(n)?),
        };
        let (exact, matching) = match_arch(tensors, &arch)?;
        if exact {
            return Ok(arch);
        }
        if best.as_ref().is_none_or(|(m, _)| matching > *m) {
            best = Some((matching, arch));
        }
    }
    Ok(best
        .map(|b| b.1)
        .unwrap_or_else(|| default_arch(Graph::Train)))
}

/// The graph of a model description.
pub fn graph_of(arch: &Arch) -> Graph {
    if arch.is_dual() {
        Graph::Train
    } else {
        Graph::Infer
    }
}

/// The first bytes of a file (up to 8), for format detection; errors on an empty file.
fn sniff(path: &Path) -> Result<Vec<u8>> {
    use std::io::Read;
    let file = crate::text::path(&path).to_string();
    let mut f = crate::bounded::open_regular(path)
        .with_context(|| format!("{file}: cannot open the weights file (check the path)"))?;
    let mut head = Vec::with_capacity(8);
    Read::by_ref(&mut f)
        .take(8)
        .read_to_end(&mut head)
        .with_context(|| format!("{file}: cannot read the weights file"))?;
    if head.is_empty() {
        bail!(
            "{file}: empty file (0 bytes): the weights were not written completely; use another \
             copy or re-run `yolo9 convert`"
        )
    }
    Ok(head)
}

/// The bytes of the safetensors file `path`, read only after its header and the sizes it
/// declares were checked against the file's size ([`check_safetensors_frame`] on the first
/// `8 + header` bytes), so a large file of garbage is refused after reading a few bytes, not
/// after reading it all.
fn read_file(path: &Path) -> Result<Vec<u8>> {
    use std::io::{Read, Seek};
    let file = crate::text::path(&path).to_string();
    let mut f = crate::bounded::open_regular(path)
        .with_context(|| format!("{file}: cannot read the weights file (check the path)"))?;
    let len = f
        .metadata()
        .with_context(|| format!("{file}: cannot read the weights file"))?
        .len();
    if len == 0 {
        bail!(
            "{file}: empty file (0 bytes): the weights were not written completely; use another \
             copy or re-run `yolo9 convert`"
        )
    }
    let mut head = Vec::with_capacity(16);
    Read::by_ref(&mut f)
        .take(16)
        .read_to_end(&mut head)
        .with_context(|| format!("{file}: cannot read the weights file"))?;
    // The legacy format starts with the pickled magic number 0x1950a86a20f9469cfc6c
    // (PROTO 2, LONG1 of 10 bytes).
    if head.starts_with(&[0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc]) {
        bail!(
            "{file}: this is a legacy (pre-1.6, non-zip) torch.save file, which yolo9 does not \
             read; re-save it with a current PyTorch (`torch.save(torch.load(f), f2)`)"
        )
    }
    if head.len() > 8 && head[8] == b'{' {
        let n = u64::from_le_bytes(head[..8].try_into().unwrap_or([0; 8]));
        if (2..=MAX_HEADER).contains(&n) && n <= len - 8 && head.len() as u64 <= 8 + n {
            let more = 8 + n - head.len() as u64;
            Read::by_ref(&mut f)
                .take(more)
                .read_to_end(&mut head)
                .with_context(|| format!("{file}: cannot read the weights file"))?;
        }
    }
    check_safetensors_frame(&head, len, &file)?;
    f.rewind()
        .with_context(|| format!("{file}: cannot read the weights file"))?;
    let mut bytes = Vec::new();
    bytes
        .try_reserve_exact(len as usize)
        .map_err(|_| anyhow::anyhow!("{file}: {len} bytes do not fit in memory"))?;
    f.take(len)
        .read_to_end(&mut bytes)
        .with_context(|| format!("{file}: cannot read the weights file (check the path)"))?;
    Ok(bytes)
}

/// The largest safetensors JSON header read.
const MAX_HEADER: u64 = 100_000_000;

/// Builds and validates [`Weights`] from imported `.pt` tensors.
fn from_pt(path: &Path, cfg: Option<&Arc<Arch>>) -> Result<(Weights, Vec<String>, String, usize)> {
    let file = crate::text::path(&path).to_string();
    let imp = crate::pt::import_pt(path)?;
    let imported = imp.tensors.len();
    let tensors: HashMap<String, Tensor> = imp.tensors.into_iter().collect();
    let arch = match cfg {
        Some(a) if match_arch(&tensors, a).is_ok_and(|m| m.0) => a.clone(),
        _ => arch_from_tensors(&tensors)?,
    };
    let graph = graph_of(&arch);
    let mut notes = Vec::new();
    let (nc, names) = resolve_classes(&tensors, &arch, imp.nc, imp.names, &mut notes, &file)?;
    let strides = imp.strides.unwrap_or_else(|| STRIDES.to_vec());
    notes.push(format!("model: {}", arch.name));
    let w = Weights {
        tensors,
        meta: ModelMeta {
            nc,
            names,
            strides,
            graph,
            arch,
            int8: None,
        },
    };
    w.validate(&file)?;
    for (dt, n) in &imp.converted_from {
        notes.push(format!("upcast {n} {dt} tensors to f32 (exact)"));
    }
    if imp.shared_modules > 0 {
        notes.push(format!(
            "{} shared module references (the parameterless SiLU of every Conv)",
            imp.shared_modules
        ));
    }
    for i in &imp.ignored {
        notes.push(format!("ignored {i}"));
    }
    let how = format!(
        "PyTorch checkpoint, '{}'{}",
        imp.source_key,
        imp.head
            .as_ref()
            .map(|(i, c)| format!(" ({c} head at layer {i})"))
            .unwrap_or_default()
    );
    Ok((w, notes, how, imported))
}

/// `nc` and names: from the checkpoint when present, else the class-convolution width and
/// `class{i}`; checked against each other.
fn resolve_classes(
    tensors: &HashMap<String, Tensor>,
    arch: &Arch,
    nc: Option<usize>,
    names: Option<Vec<String>>,
    notes: &mut Vec<String>,
    file: &str,
) -> Result<(usize, Vec<String>)> {
    // (`validate` runs next and names the first missing tensor when there is no class conv.)
    let cls = keys::class_conv_name(arch);
    let width = tensors.get(&cls).and_then(|t| t.dims().first().copied());
    let nc = match (nc, &names, width) {
        (Some(n), _, _) => n,
        (None, Some(v), _) => v.len(),
        (None, None, Some(w)) => w,
        // The class convolution is missing: `validate` reports the missing tensors.
        (None, None, None) => 0,
    };
    if nc > MAX_CLASSES {
        bail!("{file}: nc = {nc} classes is over the limit of {MAX_CLASSES}")
    }
    let names = match names {
        Some(v) => v,
        None if nc == 0 => Vec::new(),
        None => {
            notes.push(format!(
                "no class names in the source: using class0..class{}",
                nc.saturating_sub(1)
            ));
            (0..nc).map(|i| format!("class{i}")).collect()
        }
    };
    if names.len() != nc {
        bail!("{file}: nc={nc} but {} class names", names.len())
    }
    let mut names = names;
    let changed = sanitize_names(&mut names);
    if !changed.is_empty() {
        notes.push(format!(
            "class names {changed:?} contain control characters; shown escaped (e.g. {:?})",
            names[changed[0]]
        ));
    }
    Ok((nc, names))
}

/// Checks the safetensors framing before parsing, for precise errors on damaged files: `bytes`
/// holds at least the first `8 + header length` bytes of a file of `len` bytes (the whole file,
/// or only its start when the bulk is not read yet).
fn check_safetensors_frame(bytes: &[u8], len: u64, file: &str) -> Result<()> {
    if len < 8 || bytes.len() < 8 {
        bail!("{file}: truncated: {len} bytes, shorter than the 8-byte safetensors header length; the file is damaged: use another copy")
    }
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap_or([0; 8]));
    let looks_json = bytes.get(8) == Some(&b'{');
    if !looks_json || !(2..=MAX_HEADER).contains(&n) {
        bail!(
            "{file}: garbage header: not a safetensors file (header length {n}, first bytes {:02x?}) \
             nor a PyTorch zip checkpoint; check that this is a weights file",
            &bytes[..bytes.len().min(12)]
        )
    }
    if n > len - 8 {
        bail!(
            "{file}: truncated: header declares a {n}-byte JSON header, file has {} bytes after the \
             length; the file is damaged: use another copy or re-run `yolo9 convert`",
            len - 8
        )
    }
    let Some(text) = bytes.get(8..8 + n as usize) else {
        bail!("{file}: truncated: the {n}-byte JSON header could not be read")
    };
    let header: serde_json::Value = serde_json::from_slice(text).map_err(|e| {
        anyhow::anyhow!(
            "{file}: garbage header: the JSON header does not parse ({e}); the file is damaged"
        )
    })?;
    let Some(obj) = header.as_object() else {
        bail!("{file}: garbage header: the JSON header is not an object")
    };
    let mut declared = 0u64;
    for (k, v) in obj {
        if k == "__metadata__" {
            continue;
        }
        let end = v
            .get("data_offsets")
            .and_then(|o| o.get(1))
            .and_then(|e| e.as_u64())
            .with_context(|| format!("{file}: garbage header: tensor {k} has no data_offsets"))?;
        declared = declared.max(end);
    }
    let have = len - 8 - n;
    if have < declared {
        bail!(
            "{file}: truncated: header declares {declared} bytes of tensor data, file has {have}; the \
             file was not written completely: use another copy or re-run `yolo9 convert`"
        )
    }
    if have > declared {
        bail!(
            "{file}: {} trailing bytes after the {declared} bytes of tensor data the header declares: \
             the file is damaged",
            have - declared
        )
    }
    Ok(())
}

/// Weights from safetensors bytes, their provenance, and notes (class names generated or
/// escaped).
fn from_safetensors(
    bytes: &[u8],
    file: &str,
) -> Result<(Weights, Option<Provenance>, Vec<String>)> {
    check_safetensors_frame(bytes, bytes.len() as u64, file)?;
    let st = safetensors::SafeTensors::deserialize(bytes)
        .map_err(|e| anyhow::anyhow!("{file}: invalid safetensors file: {e}"))?;
    let (_, metadata) = safetensors::SafeTensors::read_metadata(bytes)
        .map_err(|e| anyhow::anyhow!("{file}: invalid safetensors header: {e}"))?;
    let meta_json = match metadata.metadata().as_ref().and_then(|m| m.get(META_KEY)) {
        Some(s) => Some(serde_json::from_str::<MetaJson>(s).map_err(|e| {
            anyhow::anyhow!(
                "{file}: the '{META_KEY}' metadata is not valid ({e}); re-run `yolo9 convert`"
            )
        })?),
        None => None,
    };
    let mut tensors = HashMap::new();
    for (name, view) in st.iter() {
        let t = view_to_tensor(&view).with_context(|| format!("{file}: tensor {name}"))?;
        tensors.insert(name.to_string(), t);
    }
    let mut notes = Vec::new();
    let (meta, prov) = match meta_json {
        Some(m) => {
            if m.format != "yolo9-weights" || m.version != 1 {
                bail!(
                    "{file}: metadata format {:?} version {} is not supported by this yolo9",
                    m.format,
                    m.version
                )
            }
            let graph = match m.graph.as_str() {
                "train" => Graph::Train,
                "infer" => Graph::Infer,
                g => bail!("{file}: unknown graph {g:?} in metadata (expected train or infer)"),
            };
            let arch = match (&m.cfg, &m.model) {
                (Some(yaml), name) => Arc::new(
                    Arch::from_yaml(yaml, name.as_deref().unwrap_or("custom")).with_context(
                        || format!("{file}: the model description in the metadata"),
                    )?,
                ),
                (None, Some(name)) => match name.as_str() {
                    "yolov9-s" => default_arch(Graph::Train),
                    "gelan-s" => default_arch(Graph::Infer),
                    n => Arc::new(
                        Arch::builtin(n)
                            .with_context(|| format!("{file}: the metadata names model {n:?}"))?,
                    ),
                },
                (None, None) => default_arch(graph),
            };
            if m.nc > MAX_CLASSES {
                bail!(
                    "{file}: metadata nc = {} classes is over the limit of {MAX_CLASSES}",
                    m.nc
                )
            }
            let mut names = m.names;
            let changed = sanitize_names(&mut names);
            if !changed.is_empty() {
                notes.push(format!(
                    "class names {changed:?} contain control characters; shown escaped (e.g. {:?})",
                    names[changed[0]]
                ));
            }
            (
                ModelMeta {
                    nc: m.nc,
                    names,
                    strides: m.strides,
                    graph,
                    arch,
                    int8: m.int8.map(Arc::new),
                },
                m.source,
            )
        }
        None => {
            let arch = arch_from_tensors(&tensors)?;
            let graph = graph_of(&arch);
            let (nc, names) = resolve_classes(&tensors, &arch, None, None, &mut notes, file)?;
            (
                ModelMeta {
                    nc,
                    names,
                    strides: STRIDES.to_vec(),
                    graph,
                    arch,
                    int8: None,
                },
                None,
            )
        }
    };
    let w = Weights { tensors, meta };
    w.validate(file)?;
    Ok((w, prov, notes))
}

fn view_to_tensor(view: &safetensors::tensor::TensorView<'_>) -> Result<Tensor> {
    use safetensors::Dtype as D;
    let data = view.data();
    let shape = view.shape().to_vec();
    let dev = &Device::Cpu;
    let floats: Vec<f32> = match view.dtype() {
        D::F32 => data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        D::F16 => data
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        D::BF16 => data
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        D::F64 => data
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8])) as f32)
            .collect(),
        D::I64 => {
            let v: Vec<i64> = data
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                .collect();
            return Ok(Tensor::from_vec(v, shape, dev)?);
        }
        other => bail!("unsupported dtype {other:?} (expected F32, F16, BF16, F64 or I64)"),
    };
    Ok(Tensor::from_vec(floats, shape, dev)?)
}

/// A tensor's bytes ready for `safetensors::serialize`.
struct RawTensor {
    dtype: safetensors::Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl RawTensor {
    fn from_tensor(t: &Tensor, half: bool) -> Result<Self> {
        let shape = t.dims().to_vec();
        let flat = t.flatten_all()?;
        let (dtype, data) = match t.dtype() {
            DType::I64 => (
                safetensors::Dtype::I64,
                flat.to_vec1::<i64>()?
                    .iter()
                    .flat_map(|x| x.to_le_bytes())
                    .collect(),
            ),
            _ => {
                let v = flat.to_dtype(DType::F32)?.to_vec1::<f32>()?;
                if half {
                    (
                        safetensors::Dtype::F16,
                        v.iter()
                            .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
                            .collect(),
                    )
                } else {
                    (
                        safetensors::Dtype::F32,
                        v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                    )
                }
            }
        };
        Ok(Self { dtype, shape, data })
    }
}

impl safetensors::View for &RawTensor {
    fn dtype(&self) -> safetensors::Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        std::borrow::Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

/// Writes `bytes` to `path` atomically ([`crate::outfile::write`]: a unique temporary file in
/// the same directory, `fsync`, rename, `fsync` of the directory; only a regular file is
/// replaced). A crash leaves either the old file or the new one, never a torn file.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    crate::outfile::write(path, bytes, &crate::outfile::Inputs::none())
}
