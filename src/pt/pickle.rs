//! A guarded run of candle's pickle reader over a checkpoint's `data.pkl`, and a walk of the
//! resulting object tree (PyTorch `nn.Module`s) into a flat state_dict of tensor references.
//!
//! Nothing in the pickle is executed: candle's [`Stack`] only builds an [`Object`] tree. On top of
//! it this module adds, before each opcode runs:
//! - an **allow-list** of `GLOBAL`s (torch storages / rebuild functions / `Size`,
//!   `collections.OrderedDict`, `__builtin__.set`, `__builtin__.getattr`, `torch.nn.modules.*`, `models.common.*`,
//!   `models.yolo.*`); anything else (e.g. `os.system`) is refused with an error naming it;
//! - bounds that candle's reader does not check: a string longer than the rest of the stream,
//!   an integer wider than 8 bytes, nesting deeper than [`MAX_DEPTH`] and a tree larger than
//!   [`MAX_NODES`] objects (memo copies can blow a small pickle up exponentially).
//!
//! The walk follows what `torch.nn.Module.state_dict()` does: for each module, its
//! `_parameters` (skipping `None`), its `_buffers` (skipping `None` and the names listed in
//! `_non_persistent_buffers_set`), then its `_modules`, recursively, joined with `.`.
//!
//! Known limit of candle's reader: its memo stores a *copy* of an object when it is put, i.e.
//! before a container is filled or a module is built. A module referenced a second time (such as
//! the shared `nn.SiLU` of every official `Conv`) therefore comes back unbuilt; the walk counts
//! those ([`WalkReport::shared_modules`]) and the caller's key check catches any tensor lost that
//! way.
//!
//! Why one file: the guarded pickle run (allow-list and bounds) and the walk of
//! the object tree it builds share the `Object` helpers, and whoever audits what a hostile
//! checkpoint can do needs both in front of them.

use anyhow::{bail, Context, Result};
use candle_core::pickle::{Object, Stack};
use std::collections::HashMap;

/// Deepest object nesting accepted (official checkpoints nest about 40 levels).
pub const MAX_DEPTH: u32 = 512;
/// Largest single object accepted, counted in nested objects including memo copies (the whole
/// official YOLOv9-s tree is about a quarter of a million).
pub const MAX_NODES: u64 = 4_000_000;
/// Most entries (objects and MARKs) the pickle stack may hold at once: an official checkpoint
/// never holds more than a few hundred; a stream of millions of MARKs or literals is refused
/// before candle's reader grows without bound.
pub const MAX_STACK_ITEMS: usize = 1 << 20;
/// Total objects candle's reader may copy in and out of its memo (it clones on every PUT and
/// GET); bounds memory for hostile pickles built from repeated memo references.
pub const MAX_MEMO_COPIES: u64 = 20_000_000;

/// Whether a pickle `GLOBAL` (`module.name`) may appear in a checkpoint we read.
///
/// The list is the set of globals that official YOLOv9 checkpoints and plain PyTorch state_dicts
/// use (see `../shared/reference/README.md` §1): torch storage classes and `torch.Size`,
/// `torch._utils` tensor/parameter rebuild functions, `collections.OrderedDict`,
/// `__builtin__.set`, `__builtin__.getattr` (segmentation checkpoints), and module classes from `torch.nn.modules.*`, `models.common` and
/// `models.yolo`.
pub fn global_allowed(module: &str, name: &str) -> bool {
    match module {
        "torch" => name == "Size" || (name.ends_with("Storage") && name.len() > 7),
        "torch._utils" => matches!(
            name,
            "_rebuild_tensor_v2" | "_rebuild_parameter" | "_rebuild_parameter_with_state"
        ),
        "collections" => name == "OrderedDict",
        // `getattr`: the segmentation heads keep the detect forward as an attribute
        // (`Segment.detect = Detect.forward`), which pickles as `getattr(Detect, 'forward')`.
        // Harmless here: the reader only records the call as data and never resolves it.
        "__builtin__" | "builtins" => name == "set" || name == "getattr",
        "models.common" | "models.yolo" => is_identifier(name),
        m if m.starts_with("torch.nn.modules.") => is_identifier(name),
        _ => false,
    }
}

fn is_identifier(s: &str) -> bool {
    !s.is_empty()
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !s.starts_with(|c: char| c.is_ascii_digit())
}

/// Depth and size of one object on the shadow stack (`None` = a MARK).
type Shape = Option<(u32, u64)>;

/// Mirrors the stack effect of each opcode to bound depth and size before candle builds it.
#[derive(Default)]
struct Shadow {
    stack: Vec<Shape>,
    memo: HashMap<u32, (u32, u64)>,
}

impl Shadow {
    fn pop(&mut self) -> Result<(u32, u64)> {
        match self.stack.pop() {
            Some(Some(x)) => Ok(x),
            _ => bail!("malformed pickle: stack underflow"),
        }
    }
    fn pop_to_mark(&mut self) -> Result<(u32, u64)> {
        let mut depth = 0;
        let mut size = 0u64;
        loop {
            match self.stack.pop() {
                Some(Some((d, s))) => {
                    depth = depth.max(d);
                    size = size.saturating_add(s);
                }
                Some(None) => return Ok((depth, size)),
                None => bail!("malformed pickle: MARK not found"),
            }
        }
    }
    fn push(&mut self, depth: u32, size: u64) -> Result<()> {
        if depth > MAX_DEPTH {
            bail!(
                "pickle nests objects deeper than {MAX_DEPTH} levels: not a checkpoint we can read"
            )
        }
        if size > MAX_NODES {
            bail!("pickle expands to more than {MAX_NODES} objects: not a checkpoint we can read")
        }
        self.stack.push(Some((depth, size)));
        self.check_len()
    }
    fn check_len(&self) -> Result<()> {
        if self.stack.len() > MAX_STACK_ITEMS {
            bail!(
                "pickle stack holds more than {MAX_STACK_ITEMS} entries (objects and MARKs): not a \
                 checkpoint we can read"
            )
        }
        Ok(())
    }
    /// Adds `child` into the container on top of the stack.
    fn merge_into_top(&mut self, child: (u32, u64)) -> Result<()> {
        let top = self.pop()?;
        self.push(top.0.max(child.0 + 1), top.1.saturating_add(child.1))
    }
}

fn le_u32(b: &[u8], at: usize) -> Option<u32> {
    b.get(at..at + 4)
        .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}

/// Parses a pickle stream with candle's [`Stack`], refusing globals outside
/// [`global_allowed`] and malformed or hostile streams (see the module docs).
///
/// `what` names the stream in errors (e.g. `"yolov9-s.pt: yolov9-s/data.pkl"`).
// One piece: the pickle virtual machine, one loop with one match arm per opcode over the same
// stack, shadow and limits; the arms are short and read in the protocol's order.
pub fn parse(bytes: &[u8], what: &str) -> Result<Object> {
    let mut cursor = std::io::Cursor::new(bytes);
    let mut stack = Stack::empty();
    let mut shadow = Shadow::default();
    let mut copies = 0u64;
    loop {
        let pos = cursor.position() as usize;
        let Some(&op) = bytes.get(pos) else {
            bail!("{what}: truncated pickle (ended at byte {pos} without a STOP opcode)")
        };
        // Checks that must happen before candle reads the operands.
        match op {
            b'X' => {
                let len = le_u32(bytes, pos + 1)
                    .with_context(|| format!("{what}: truncated pickle at byte {pos}"))?;
                if (len as usize) > bytes.len().saturating_sub(pos + 5) {
                    bail!(
                        "{what}: truncated or corrupt pickle: a string of {len} bytes at byte {pos} \
                         runs past the end ({} bytes)",
                        bytes.len()
                    )
                }
            }
            // Globals by other opcodes than GLOBAL: candle does not read them, and the allow-list
            // must see the name, so refuse them here, naming the global.
            0x93 => {
                let name = match stack.stack() {
                    [.., Object::Unicode(m), Object::Unicode(n)] => format!("`{m}.{n}`"),
                    _ => "(names not on the stack)".to_string(),
                };
                bail!(
                    "{what}: the pickle references the global {name} with STACK_GLOBAL (byte \
                     {pos}, pickle protocol 4+), which yolo9 does not read; re-save the \
                     checkpoint with torch.save's default protocol 2, or as safetensors"
                )
            }
            b'i' | b'o' | 0x92 | 0x82..=0x84 => {
                let opname = match op {
                    b'i' => "INST",
                    b'o' => "OBJ",
                    0x92 => "NEWOBJ_EX",
                    _ => "EXT",
                };
                let name = if op == b'i' {
                    let rest = &bytes[(pos + 1).min(bytes.len())..];
                    let mut lines = rest.splitn(3, |&b| b == b'\n');
                    match (lines.next(), lines.next()) {
                        (Some(m), Some(n)) => format!(
                            " `{}.{}`",
                            String::from_utf8_lossy(&m[..m.len().min(200)]),
                            String::from_utf8_lossy(&n[..n.len().min(200)])
                        ),
                        _ => String::new(),
                    }
                } else {
                    String::new()
                };
                bail!(
                    "{what}: pickle opcode {opname}{name} at byte {pos} is not one official \
                     checkpoints use, and yolo9 does not read it; re-save the checkpoint with \
                     torch.save, or as safetensors"
                )
            }
            0x8c..=0x91 | 0x94..=0x98 => {
                let opname = match op {
                    0x8c => "SHORT_BINUNICODE",
                    0x8d => "BINUNICODE8",
                    0x8e => "BINBYTES8",
                    0x8f => "EMPTY_SET",
                    0x90 => "ADDITEMS",
                    0x91 => "FROZENSET",
                    0x94 => "MEMOIZE",
                    0x95 => "FRAME",
                    0x96 => "BYTEARRAY8",
                    0x97 => "NEXT_BUFFER",
                    _ => "READONLY_BUFFER",
                };
                bail!(
                    "{what}: pickle protocol 4+ opcode {opname} at byte {pos}: yolo9 reads the \
                     protocol-2 pickles torch.save writes by default; re-save the checkpoint with \
                     `torch.save(obj, f)` (or `pickle_protocol=2`), or as safetensors"
                )
            }
            0x8a => {
                let n = *bytes
                    .get(pos + 1)
                    .with_context(|| format!("{what}: truncated pickle at byte {pos}"))?;
                if n > 8 {
                    bail!("{what}: pickle integer of {n} bytes at byte {pos} is too wide (max 8)")
                }
            }
            _ => {}
        }
        // Operand of memo opcodes, read before candle consumes them.
        let memo_id = match op {
            b'q' | b'h' => bytes.get(pos + 1).map(|&b| b as u32),
            b'r' | b'j' => le_u32(bytes, pos + 1),
            _ => None,
        };
        if matches!(op, b'h' | b'j') {
            let size = memo_id
                .and_then(|id| shadow.memo.get(&id))
                .map_or(1, |x| x.1);
            copies = copies.saturating_add(size);
            if copies > MAX_MEMO_COPIES {
                bail!("{what}: pickle expands to more than {MAX_MEMO_COPIES} objects through memo references: not a checkpoint we can read")
            }
        }
        let done = stack
            .read(&mut cursor)
            .map_err(|e| anyhow::anyhow!("{what}: corrupt pickle at byte {pos}: {e}"))?;
        if done {
            break;
        }
        // Shadow stack effect (after candle accepted the opcode).
        let sh = &mut shadow;
        match op {
            0x80 => {}
            b'(' => {
                sh.stack.push(None);
                sh.check_len()
                    .with_context(|| format!("{what}: at byte {pos}"))?;
            }
            b'q' | b'r' => {
                let top = match sh.stack.last() {
                    Some(Some(x)) => *x,
                    _ => bail!("{what}: malformed pickle: PUT on an empty stack"),
                };
                sh.memo.insert(memo_id.unwrap_or(0), top);
                copies = copies.saturating_add(top.1);
                if copies > MAX_MEMO_COPIES {
                    bail!("{what}: pickle expands to more than {MAX_MEMO_COPIES} objects through memo references: not a checkpoint we can read")
                }
            }
            b'h' | b'j' => {
                let x = sh
                    .memo
                    .get(&memo_id.unwrap_or(0))
                    .copied()
                    .unwrap_or((1, 1));
                sh.push(x.0, x.1)?;
            }
            b'Q' => {
                let x = sh.pop()?;
                sh.push(x.0 + 1, x.1 + 1)?;
            }
            b't' => {
                let x = sh.pop_to_mark()?;
                sh.push(x.0 + 1, x.1 + 1)?;
            }
            0x85..=0x87 => {
                let n = (op - 0x84) as usize;
                let mut d = 0;
                let mut s = 1u64;
                for _ in 0..n {
                    let x = sh.pop()?;
                    d = d.max(x.0);
                    s = s.saturating_add(x.1);
                }
                sh.push(d + 1, s)?;
            }
            b'a' => {
                let v = sh.pop()?;
                sh.merge_into_top(v)?;
            }
            b'e' | b'u' => {
                let v = sh.pop_to_mark()?;
                sh.merge_into_top(v)?;
            }
            b's' => {
                let v = sh.pop()?;
                let k = sh.pop()?;
                sh.merge_into_top((v.0.max(k.0), v.1.saturating_add(k.1)))?;
            }
            b'b' | b'R' | 0x81 => {
                let a = sh.pop()?;
                let c = sh.pop()?;
                sh.push(a.0.max(c.0) + 1, a.1.saturating_add(c.1).saturating_add(1))?;
            }
            // GLOBAL, ints, floats, strings, None, bools, empty containers: one leaf.
            _ => sh.push(1, 1)?,
        }
        if op == b'c' {
            if let Some(Object::Class {
                module_name,
                class_name,
            }) = stack.stack().last()
            {
                if !global_allowed(module_name, class_name) {
                    bail!(
                        "{what}: refusing to load: the pickle references the global \
                         `{module_name}.{class_name}`, which is not on the allow-list (torch \
                         storages and rebuild functions, collections.OrderedDict, set, getattr, \
                         torch.nn.modules.*, models.common.*, models.yolo.*). Only load \
                         checkpoints from sources you trust; re-save a trusted one as a plain \
                         state_dict or safetensors"
                    )
                }
            }
        }
    }
    stack
        .finalize()
        .map_err(|e| anyhow::anyhow!("{what}: corrupt pickle: {e}"))
}

/// Storage element types a tensor can reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StorageDType {
    /// `torch.HalfStorage`
    F16,
    /// `torch.BFloat16Storage`
    BF16,
    /// `torch.FloatStorage`
    F32,
    /// `torch.DoubleStorage`
    F64,
    /// `torch.LongStorage`
    I64,
    /// `torch.IntStorage`
    I32,
    /// `torch.ByteStorage` / `torch.BoolStorage`
    U8,
}

impl StorageDType {
    fn from_class(name: &str) -> Option<Self> {
        Some(match name {
            "HalfStorage" => Self::F16,
            "BFloat16Storage" => Self::BF16,
            "FloatStorage" => Self::F32,
            "DoubleStorage" => Self::F64,
            "LongStorage" => Self::I64,
            "IntStorage" => Self::I32,
            "ByteStorage" | "BoolStorage" => Self::U8,
            _ => return None,
        })
    }
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Self::F16 | Self::BF16 => 2,
            Self::F32 | Self::I32 => 4,
            Self::F64 | Self::I64 => 8,
            Self::U8 => 1,
        }
    }
    /// Whether this is a floating-point type.
    pub fn is_float(self) -> bool {
        matches!(self, Self::F16 | Self::BF16 | Self::F32 | Self::F64)
    }
}

/// Where a tensor's values live: `torch._utils._rebuild_tensor_v2(storage, offset, size, stride)`.
/// Offsets, sizes and strides are in elements.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorRef {
    /// The storage key: the record `<prefix>/data/<key>` of the zip.
    pub storage_key: String,
    /// Element type of the storage.
    pub dtype: StorageDType,
    /// Number of elements the pickle declares for the storage.
    pub storage_numel: u64,
    /// Offset of element `[0, .., 0]` in the storage.
    pub offset: u64,
    /// Tensor shape.
    pub shape: Vec<usize>,
    /// Stride of each dimension.
    pub stride: Vec<usize>,
}

fn as_class(o: &Object) -> Option<(&str, &str)> {
    match o {
        Object::Class {
            module_name,
            class_name,
        } => Some((module_name, class_name)),
        _ => None,
    }
}

fn as_uint(o: &Object) -> Option<u64> {
    match o {
        Object::Int(i) if *i >= 0 => Some(*i as u64),
        Object::Long(i) if *i >= 0 => Some(*i as u64),
        _ => None,
    }
}

fn as_uint_tuple(o: &Object) -> Option<Vec<usize>> {
    match o {
        Object::Tuple(v) | Object::List(v) => v
            .iter()
            .map(|x| as_uint(x).and_then(|u| usize::try_from(u).ok()))
            .collect(),
        // torch.Size((..)) pickled as REDUCE(torch.Size, (tuple,))
        Object::Reduce { callable, args } if as_class(callable) == Some(("torch", "Size")) => {
            match &**args {
                Object::Tuple(a) if a.len() == 1 => as_uint_tuple(&a[0]),
                _ => None,
            }
        }
        _ => None,
    }
}

/// Reads a tensor or parameter object (`_rebuild_parameter(_rebuild_tensor_v2(...), ..)`).
///
/// Returns `Ok(None)` when `obj` is not a tensor at all, and an error naming `name` when it is
/// one but its arguments are malformed.
pub fn tensor_ref(obj: &Object, name: &str) -> Result<Option<TensorRef>> {
    let Object::Reduce { callable, args } = obj else {
        return Ok(None);
    };
    let Some((module, func)) = as_class(callable) else {
        return Ok(None);
    };
    let Object::Tuple(args) = &**args else {
        if module == "torch._utils" {
            bail!("tensor {name}: malformed {func} arguments")
        }
        return Ok(None);
    };
    match (module, func) {
        ("torch._utils", "_rebuild_parameter" | "_rebuild_parameter_with_state") => {
            let inner = args
                .first()
                .with_context(|| format!("tensor {name}: {func} without a tensor"))?;
            tensor_ref(inner, name)?
                .map(Some)
                .with_context(|| format!("tensor {name}: {func} does not wrap a tensor"))
        }
        ("torch._utils", "_rebuild_tensor_v2") => {
            if args.len() < 4 {
                bail!(
                    "tensor {name}: _rebuild_tensor_v2 has {} arguments, expected at least 4",
                    args.len()
                )
            }
            let Object::PersistentLoad(pid) = &args[0] else {
                bail!("tensor {name}: storage is not a persistent reference")
            };
            let Object::Tuple(pid) = &**pid else {
                bail!("tensor {name}: storage reference is not a tuple")
            };
            if pid.len() < 5 || pid[0] != Object::Unicode("storage".into()) {
                bail!("tensor {name}: storage reference is not ('storage', type, key, location, numel)")
            }
            let dtype = as_class(&pid[1])
                .and_then(|(_, c)| StorageDType::from_class(c))
                .with_context(|| format!("tensor {name}: unsupported storage type {:?}", pid[1]))?;
            let storage_key = match &pid[2] {
                Object::Unicode(k) => k.clone(),
                other => bail!("tensor {name}: storage key is not a string: {other:?}"),
            };
            if storage_key.is_empty()
                || !storage_key
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
                || storage_key.contains("..")
            {
                bail!("tensor {name}: invalid storage key {storage_key:?}")
            }
            let storage_numel = as_uint(&pid[4])
                .with_context(|| format!("tensor {name}: storage size is not a count"))?;
            let offset = as_uint(&args[1])
                .with_context(|| format!("tensor {name}: storage offset is not a count"))?;
            let shown = |o: &Object| {
                let s = format!("{o:?}");
                if s.len() > 120 {
                    format!(
                        "{}...",
                        &s[..s.char_indices().nth(120).map_or(s.len(), |c| c.0)]
                    )
                } else {
                    s
                }
            };
            let shape = as_uint_tuple(&args[2]).with_context(|| {
                format!(
                    "tensor {name}: size {} is not a tuple of counts (>= 0)",
                    shown(&args[2])
                )
            })?;
            let stride = as_uint_tuple(&args[3]).with_context(|| {
                format!(
                    "tensor {name}: stride {} is not a tuple of counts (>= 0)",
                    shown(&args[3])
                )
            })?;
            if shape.len() != stride.len() {
                bail!("tensor {name}: size {shape:?} and stride {stride:?} have different ranks")
            }
            Ok(Some(TensorRef {
                storage_key,
                dtype,
                storage_numel,
                offset,
                shape,
                stride,
            }))
        }
        _ => Ok(None),
    }
}

/// Looks a string key up in pickled dict entries.
pub fn dict_get<'a>(entries: &'a [(Object, Object)], key: &str) -> Option<&'a Object> {
    entries.iter().find_map(|(k, v)| match k {
        Object::Unicode(s) if s == key => Some(v),
        _ => None,
    })
}

/// Pickled dict entries, in candle's representation.
pub type Entries = [(Object, Object)];

/// A built module: `(module, class)` and its `__dict__` entries.
pub fn as_module(obj: &Object) -> Option<((&str, &str), &Entries)> {
    let Object::Build { callable, args } = obj else {
        return None;
    };
    let Object::Reduce { callable: cls, .. } = &**callable else {
        return None;
    };
    let class = as_class(cls)?;
    let state = match &**args {
        Object::Dict(d) => d.as_slice(),
        // (state, slotstate)
        Object::Tuple(t) => match t.first() {
            Some(Object::Dict(d)) => d.as_slice(),
            _ => return None,
        },
        _ => return None,
    };
    Some((class, state))
}

/// Whether `obj` is an unbuilt object of a module class (a memo copy, see the module docs).
fn is_unbuilt_module(obj: &Object) -> bool {
    match obj {
        Object::Reduce { callable, .. } => as_class(callable)
            .is_some_and(|(m, _)| m.starts_with("torch.nn.modules.") || m.starts_with("models.")),
        _ => false,
    }
}

/// What the walk saw besides tensors.
#[derive(Debug, Default, Clone)]
pub struct WalkReport {
    /// Module references that came back unbuilt (shared modules; parameterless in YOLOv9).
    pub shared_modules: usize,
    /// Module classes met, `module.Class`, sorted and deduplicated.
    pub classes: Vec<String>,
}

/// Walks a built `nn.Module` into state_dict entries `(name, tensor)`, in state_dict order
/// (parameters, buffers, then sub-modules). `prefix` is prepended (`""` at the top).
pub fn walk_module(
    obj: &Object,
    prefix: &str,
    out: &mut Vec<(String, TensorRef)>,
    report: &mut WalkReport,
) -> Result<()> {
    let Some(((module, class), state)) = as_module(obj) else {
        if is_unbuilt_module(obj) {
            report.shared_modules += 1;
            return Ok(());
        }
        bail!("module {prefix:?}: not a pickled nn.Module")
    };
    let full = format!("{module}.{class}");
    if let Err(i) = report.classes.binary_search(&full) {
        report.classes.insert(i, full);
    }
    let non_persistent = non_persistent_buffers(state);
    for (field, skip) in [("_parameters", &Vec::new()), ("_buffers", &non_persistent)] {
        let Some(dict) = dict_get(state, field) else {
            continue;
        };
        let Object::Dict(entries) = dict else {
            bail!("module {prefix:?} ({class}): {field} is not a dict")
        };
        for (k, v) in entries.iter().rev() {
            let Object::Unicode(k) = k else {
                bail!("module {prefix:?} ({class}): {field} has a non-string key")
            };
            if *v == Object::None || skip.contains(k) {
                continue;
            }
            let name = format!("{prefix}{k}");
            let t = tensor_ref(v, &name)?
                .with_context(|| format!("{name}: {field} entry is not a tensor"))?;
            out.push((name, t));
        }
    }
    if let Some(mods) = dict_get(state, "_modules") {
        let Object::Dict(entries) = mods else {
            bail!("module {prefix:?} ({class}): _modules is not a dict")
        };
        for (k, v) in entries.iter().rev() {
            let Object::Unicode(k) = k else {
                bail!("module {prefix:?} ({class}): _modules has a non-string key")
            };
            if *v == Object::None {
                continue;
            }
            walk_module(v, &format!("{prefix}{k}."), out, report)?;
        }
    }
    Ok(())
}

fn non_persistent_buffers(state: &[(Object, Object)]) -> Vec<String> {
    // set pickled as REDUCE(set, ([names],))
    let Some(Object::Reduce { args, .. }) = dict_get(state, "_non_persistent_buffers_set") else {
        return Vec::new();
    };
    let Object::Tuple(a) = &**args else {
        return Vec::new();
    };
    match a.first() {
        Some(Object::List(items)) => items
            .iter()
            .filter_map(|o| match o {
                Object::Unicode(s) => Some(s.clone()),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// The class of the last layer of a YOLO `DetectionModel` (`model.model[-1]`), e.g.
/// `("models.yolo", "DualDDetect")`, with its index.
pub fn yolo_head(model_state: &[(Object, Object)]) -> Option<(usize, String)> {
    let Object::Dict(mods) = dict_get(model_state, "_modules")? else {
        return None;
    };
    let (_, seq) = as_module(dict_get(mods, "model")?)?;
    let Object::Dict(layers) = dict_get(seq, "_modules")? else {
        return None;
    };
    layers
        .iter()
        .filter_map(|(k, v)| {
            let Object::Unicode(k) = k else { return None };
            let i: usize = k.parse().ok()?;
            let ((m, c), _) = as_module(v)?;
            Some((i, format!("{m}.{c}")))
        })
        .max_by_key(|(i, _)| *i)
}

/// Class names from a pickled `names` attribute: a dict `{int: str}` (dense ids from 0) or a list.
pub fn class_names(obj: &Object) -> Result<Vec<String>> {
    match obj {
        Object::List(items) | Object::Tuple(items) => items
            .iter()
            .enumerate()
            .map(|(i, o)| match o {
                Object::Unicode(s) => Ok(s.clone()),
                other => bail!("names[{i}] is not a string: {other:?}"),
            })
            .collect(),
        Object::Dict(entries) => {
            let mut pairs = Vec::with_capacity(entries.len());
            for (k, v) in entries {
                let k = as_uint(k).with_context(|| format!("names key {k:?} is not a class id"))?;
                let Object::Unicode(v) = v else {
                    bail!("names[{k}] is not a string: {v:?}")
                };
                pairs.push((k, v.clone()));
            }
            pairs.sort_by_key(|p| p.0);
            for (i, (k, _)) in pairs.iter().enumerate() {
                if *k != i as u64 {
                    bail!("names dict is not dense: expected class id {i}, found {k}")
                }
            }
            Ok(pairs.into_iter().map(|p| p.1).collect())
        }
        other => bail!("names is neither a list nor a dict: {other:?}"),
    }
}

/// A non-negative integer attribute.
pub fn uint(obj: &Object) -> Option<u64> {
    as_uint(obj)
}
