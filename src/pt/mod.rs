//! Official YOLOv9 PyTorch checkpoints (`.pt`) read without Python, knowing nothing of the model:
//! state_dict names and tensors, and the few metadata fields a checkpoint carries.
//!
//! - [`checkpoint`]: the `torch.save` zip layout (record prefix, `data.pkl`, `data/<key>` storages)
//!   and strided tensor reads with bounds checks.
//! - [`pickle`]: candle's pickle reader run under an allow-list of globals and size/depth bounds,
//!   and the walk of `nn.Module` trees (`_parameters` / `_buffers` / `_modules`) into state_dict
//!   names.
//!
//! [`import_pt`] reads any supported `.pt` (an official checkpoint dict with `model`/`ema`, a
//! pickled module, or a plain state_dict) into state_dict tensors; `crate::model::weights` turns
//! them into the model's weights.

pub mod checkpoint;
pub mod pickle;

use anyhow::{bail, Context, Result};
use candle_core::pickle::Object;
use candle_core::{DType, Tensor};
use std::path::Path;

/// Most bytes one `.pt` load may inflate and build, summed over its tensors before any is read
/// (each tensor's storage record plus 8 bytes per element of its copy): 2 GiB, several times
/// what the largest YOLOv9 (e, about 58 M parameters) needs. A few small records viewed many
/// times, or a tiny storage viewed with stride 0 under a huge shape, are refused at once.
pub const MAX_LOAD_BYTES: u64 = 2 << 30;

/// Tensors and metadata read from a `.pt` file.
pub struct Imported {
    /// `(state_dict name, tensor)`: floating-point tensors upcast to f32, int64 kept, on the CPU,
    /// in the order of the walk.
    pub tensors: Vec<(String, Tensor)>,
    /// `model.nc` when the checkpoint holds a model object.
    pub nc: Option<usize>,
    /// `model.names` (dict or list) when present.
    pub names: Option<Vec<String>>,
    /// Class of the last layer, e.g. `models.yolo.DualDDetect`, with its index.
    pub head: Option<(usize, String)>,
    /// `model.stride` when present (pixels per head level).
    pub strides: Option<Vec<u32>>,
    /// Which object the tensors came from: `ema`, `model`, `state_dict` or `(top level)`.
    pub source_key: String,
    /// What was seen but not imported (for the summary).
    pub ignored: Vec<String>,
    /// Floating-point tensors stored as f16/bf16/f64 in the file and converted to f32.
    pub converted_from: Vec<(String, usize)>,
    /// Shared module references (parameterless in YOLOv9; see [`pickle::WalkReport`]).
    pub shared_modules: usize,
}

fn describe(o: &Object) -> String {
    match o {
        Object::None => "None".into(),
        Object::Dict(d) => format!("dict of {}", d.len()),
        Object::List(l) => format!("list of {}", l.len()),
        Object::Unicode(_) => "str".into(),
        Object::Int(_) | Object::Long(_) => "int".into(),
        Object::Float(_) => "float".into(),
        Object::Bool(_) => "bool".into(),
        Object::Build { callable, .. } | Object::Reduce { callable, .. } => match &**callable {
            Object::Class {
                module_name,
                class_name,
            } => format!("{module_name}.{class_name}"),
            Object::Reduce { callable, .. } => match &**callable {
                Object::Class {
                    module_name,
                    class_name,
                } => format!("{module_name}.{class_name}"),
                _ => "object".into(),
            },
            _ => "object".into(),
        },
        _ => "object".into(),
    }
}

/// Reads a PyTorch zip checkpoint (`torch.save`, PyTorch ≥ 1.6) without Python.
///
/// Accepted top-level objects: the official training checkpoint dict (`ema` is used when it is
/// not `None`, else `model`; a `models.yolo.DetectionModel` tree or a state_dict), a dict with a
/// `state_dict` key, a plain state_dict, or a pickled module. Errors name the file and the
/// damage: not a zip / truncated, no `data.pkl`, a forbidden pickle global, a missing or short
/// storage record, an absurd shape.
pub fn import_pt(path: &Path) -> Result<Imported> {
    let file = crate::text::path(&path).to_string();
    let mut ck = checkpoint::Checkpoint::open(path)?;
    let pkl = ck.pickle_bytes()?;
    let what = format!("{file}: {}/data.pkl", ck.prefix);
    let top = pickle::parse(&pkl, &what)?;
    drop(pkl);

    let mut ignored = Vec::new();
    let (source_key, model) = choose_model(&top, &mut ignored);
    let found = if let Some(((m, c), state)) = pickle::as_module(model) {
        read_module(&file, &source_key, (model, (m, c)), state, &mut ignored)?
    } else if let Object::Dict(entries) = model {
        read_state_dict(&file, &source_key, entries, &mut ignored)?
    } else {
        bail!(
            "{file}: no model found: the checkpoint holds a {} (expected a dict with 'model' or \
             'ema', a state_dict, or a module)",
            describe(model)
        )
    };
    check_load_budget(&file, &found.refs)?;
    let mut seen = std::collections::HashSet::new();
    let mut tensors = Vec::with_capacity(found.refs.len());
    let mut converted = std::collections::BTreeMap::new();
    for (name, r) in &found.refs {
        if !seen.insert(name.as_str()) {
            bail!("{file}: tensor {name} appears twice")
        }
        let t = ck.read_tensor(name, r)?;
        if r.dtype.is_float() && r.dtype != pickle::StorageDType::F32 {
            *converted
                .entry(format!("{:?}", r.dtype).to_lowercase())
                .or_insert(0) += 1;
        }
        tensors.push((name.clone(), t));
    }
    let strides = match &found.stride_ref {
        Some(r) => {
            let t = ck.read_tensor("model.stride", r)?;
            let v: Vec<f32> = t.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
            let s: Vec<u32> = v.iter().map(|x| *x as u32).collect();
            if v.iter().zip(&s).any(|(f, u)| *f != *u as f32) {
                bail!("{file}: model.stride {v:?} is not a list of whole pixel counts")
            }
            Some(s)
        }
        None => None,
    };
    Ok(Imported {
        tensors,
        nc: found.nc,
        names: found.names,
        head: found.head,
        strides,
        source_key,
        ignored,
        converted_from: converted.into_iter().collect(),
        shared_modules: found.walk.shared_modules,
    })
}

/// The object holding the model in the checkpoint's top-level object `top`, and its key: `ema`
/// when not `None`, else `model`, else `state_dict`, else `top` itself (`"(top level)"`). The
/// other non-`None` keys of a top-level dict are listed in `ignored`.
fn choose_model<'a>(top: &'a Object, ignored: &mut Vec<String>) -> (String, &'a Object) {
    let Object::Dict(entries) = top else {
        return ("(top level)".to_string(), top);
    };
    let get = |k: &str| pickle::dict_get(entries, k).filter(|o| **o != Object::None);
    let chosen = if let Some(ema) = get("ema") {
        Some(("ema", ema))
    } else if let Some(m) = get("model") {
        Some(("model", m))
    } else {
        get("state_dict").map(|m| ("state_dict", m))
    };
    match chosen {
        Some((k, m)) => {
            for (key, v) in entries {
                if let Object::Unicode(key) = key {
                    if key != k && *v != Object::None {
                        ignored.push(format!("checkpoint['{key}'] ({})", describe(v)));
                    }
                }
            }
            (k.to_string(), m)
        }
        None => ("(top level)".to_string(), top),
    }
}

/// What the model object of a checkpoint holds: its tensors (not yet read) and metadata.
struct Found {
    refs: Vec<(String, pickle::TensorRef)>,
    nc: Option<usize>,
    names: Option<Vec<String>>,
    head: Option<(usize, String)>,
    stride_ref: Option<pickle::TensorRef>,
    walk: pickle::WalkReport,
}

/// A pickled `nn.Module` `model` of class `m.c` (its attributes `state`): the walk of its tree, `nc`, `names`,
/// `stride` and the head; other public attributes are listed in `ignored`.
fn read_module(
    file: &str,
    source_key: &str,
    (model, (m, c)): (&Object, (&str, &str)),
    state: &pickle::Entries,
    ignored: &mut Vec<String>,
) -> Result<Found> {
    let mut found = Found {
        refs: Vec::new(),
        nc: None,
        names: None,
        head: None,
        stride_ref: None,
        walk: pickle::WalkReport::default(),
    };
    pickle::walk_module(model, "", &mut found.refs, &mut found.walk)
        .with_context(|| format!("{file}: reading the {m}.{c} in '{source_key}'"))?;
    if let Some(o) = pickle::dict_get(state, "nc") {
        found.nc = pickle::uint(o).map(|n| n as usize);
    }
    if let Some(o) = pickle::dict_get(state, "names") {
        found.names =
            Some(pickle::class_names(o).with_context(|| format!("{file}: reading model.names"))?);
    }
    if let Some(o) = pickle::dict_get(state, "stride") {
        found.stride_ref = pickle::tensor_ref(o, "model.stride")
            .with_context(|| format!("{file}: reading model.stride"))?;
    }
    found.head = pickle::yolo_head(state);
    let mut attrs: Vec<&str> = state
        .iter()
        .filter_map(|(k, _)| match k {
            Object::Unicode(k) if !k.starts_with('_') && k != "training" => Some(k.as_str()),
            _ => None,
        })
        .filter(|k| !matches!(*k, "nc" | "names" | "stride"))
        .collect();
    attrs.sort_unstable();
    if !attrs.is_empty() {
        ignored.push(format!("model attributes {}", attrs.join(", ")));
    }
    Ok(found)
}

/// A state_dict `entries` (name → tensor): its tensors; entries that are not tensors are listed
/// in `ignored`. Errors: a non-string key, or no tensor at all.
fn read_state_dict(
    file: &str,
    source_key: &str,
    entries: &pickle::Entries,
    ignored: &mut Vec<String>,
) -> Result<Found> {
    let mut refs = Vec::new();
    for (k, v) in entries.iter().rev() {
        let Object::Unicode(k) = k else {
            bail!("{file}: '{source_key}' is a dict with a non-string key {k:?}")
        };
        match pickle::tensor_ref(v, k).with_context(|| format!("{file}: '{source_key}'"))? {
            Some(t) => refs.push((k.clone(), t)),
            None => ignored.push(format!("'{k}' ({})", describe(v))),
        }
    }
    if refs.is_empty() {
        let keys: Vec<String> = entries
            .iter()
            .take(12)
            .map(|(k, v)| format!("{k:?}: {}", describe(v)))
            .collect();
        bail!(
            "{file}: no model found: expected an official checkpoint (keys 'model'/'ema'), a \
             state_dict or a module; the top-level object holds {keys:?}"
        )
    }
    Ok(Found {
        refs,
        nc: None,
        names: None,
        head: None,
        stride_ref: None,
        walk: pickle::WalkReport::default(),
    })
}

/// One budget for the whole load, checked before anything is inflated: every tensor read
/// inflates its storage record and builds an f32 (or i64) copy of its elements; refused over
/// [`MAX_LOAD_BYTES`].
fn check_load_budget(file: &str, refs: &[(String, pickle::TensorRef)]) -> Result<()> {
    let mut budget: u64 = 0;
    for (name, r) in refs {
        // An overflowing shape or an over-sized record is refused by the read itself, with its
        // own message; the budget sums the rest.
        let Some(elems) = r
            .shape
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d as u64))
        else {
            continue;
        };
        let Some(record) = r
            .storage_numel
            .checked_mul(r.dtype.size() as u64)
            .filter(|&b| b <= checkpoint::MAX_RECORD_BYTES)
        else {
            continue;
        };
        let need = elems.saturating_mul(8).saturating_add(record);
        budget = budget.saturating_add(need);
        if budget > MAX_LOAD_BYTES {
            bail!(
                "{file}: reading its tensors would take more than {} MB (at tensor {name}: shape \
                 {:?} over a storage of {} elements); a YOLOv9 checkpoint needs far less, so the \
                 file is damaged or hostile",
                MAX_LOAD_BYTES >> 20,
                r.shape,
                r.storage_numel
            )
        }
    }
    Ok(())
}
