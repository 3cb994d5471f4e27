//! The dataset description (`data.yaml`) as users write it for the official YOLOv9
//! (`utils/general.py check_dataset`), with one deliberate fix: every relative path resolves against
//! the folder that holds the yaml, never against the current directory or the code's folder.
//!
//! Keys read:
//! - `path` (optional): dataset root. Relative → joined to the yaml's folder. Absent → the yaml's folder.
//! - `train`, `val` (required), `test` (optional): each a directory of images (searched recursively),
//!   a `.txt` file listing image paths (relative entries resolve against the `.txt`'s folder), a
//!   COCO JSON annotations file (`.json`, read by [`super::coco_json`]), or a YAML list of those.
//!   Relative values join to the root.
//! - `names`: a list (`[a, b]`) or an index map (`{0: a, 1: b}`, keys exactly `0..n`).
//! - `nc` (optional): checked against `names`; with no `names`, names become `class0`, `class1`, ...
//!
//! When a split names a COCO JSON file, the classes are its categories sorted by id
//! ([`super::coco_json::read_classes`], kept in [`DataConfig::coco`]) and printed as a notice;
//! with no `names` key their names are the category names. A `names` list of another length is
//! an error; one of the same length with other names is used, with a notice saying that they
//! disagree and how the category ids map to it.
//!
//! A split path that does not exist but starts with `../` is tried once more without that
//! `../`, under the root (Roboflow exports write `train: ../train/images` beside a `data.yaml`
//! that sits in the dataset folder; both upstream trainers do this retry in `check_dataset` /
//! `check_det_dataset`). When the retry is used, one line saying so is logged (warn level) and
//! kept in [`DataConfig::notices`].
//!
//! Other keys (`download`, ...) are ignored.

use super::fsio::normalize;
use crate::model::weights::MAX_CLASSES;
use anyhow::{bail, Context, Result};
use serde_yaml_ng::Value;
use std::path::{Path, PathBuf};

/// File extensions (lower case) accepted as images when a split is a directory. Compared
/// case-insensitively; the decoder is still chosen by content, not by extension.
pub const IMAGE_EXTENSIONS: &[&str] = &["jpg", "jpeg", "png", "bmp", "tif", "tiff", "webp", "mpo"];

/// One of the three dataset splits named in `data.yaml`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Split {
    /// `train:`
    Train,
    /// `val:`
    Val,
    /// `test:`
    Test,
}

impl Split {
    /// The yaml key (`"train"`, `"val"`, `"test"`).
    pub fn key(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Val => "val",
            Split::Test => "test",
        }
    }
}

impl std::fmt::Display for Split {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.key())
    }
}

/// A parsed and resolved `data.yaml`. Every path in it is absolute and lexically normalized
/// (no `.`/`..`), and every split source was checked to exist when it was loaded.
#[derive(Debug, Clone, PartialEq)]
pub struct DataConfig {
    /// The yaml file itself (absolute).
    pub yaml_path: PathBuf,
    /// The dataset root: `path:` resolved, or the yaml's folder.
    pub root: PathBuf,
    /// `train:` sources (directories or `.txt` lists), absolute.
    pub train: Vec<PathBuf>,
    /// `val:` sources, absolute.
    pub val: Vec<PathBuf>,
    /// `test:` sources, absolute; empty when the key is absent.
    pub test: Vec<PathBuf>,
    /// Number of classes (`nc`, or the length of `names`).
    pub nc: usize,
    /// Class names, index = class id.
    pub names: Vec<String>,
    /// Lines about how a path was resolved that the user should see (e.g. a Roboflow
    /// `../train/images` found as `train/images` under the root, or the classes of a COCO JSON
    /// split); each was also logged.
    pub notices: Vec<String>,
    /// The class ↔ category id mapping when a split is a COCO JSON file.
    pub coco: Option<super::coco_json::CocoClasses>,
}

impl DataConfig {
    /// Reads and resolves `path` (a data.yaml).
    ///
    /// Errors (each names the yaml, the key, the resolved absolute path and what was expected): the
    /// file is missing or not YAML; `train`/`val` absent; a source that does not exist or is neither a
    /// directory nor a `.txt` list; `path` not a directory; `names` malformed; `nc` disagreeing
    /// with `names`.
    pub fn load(path: &Path) -> Result<DataConfig> {
        let yaml_path = absolute(path)?;
        if let Err(e) = std::fs::metadata(&yaml_path) {
            return Err(e).with_context(|| {
                format!(
                    "cannot read dataset description {} (pass --data with the path of an existing data.yaml)",
                    crate::text::path(&yaml_path)
                )
            });
        }
        let text = crate::bounded::read_yaml(&yaml_path, "--data")?;
        Self::from_yaml_str(&text, &yaml_path)
    }

    /// Parses yaml `text` as if it were the file at `yaml_path` (absolute; relative paths resolve
    /// against its folder). Same errors as [`DataConfig::load`].
    pub fn from_yaml_str(text: &str, yaml_path: &Path) -> Result<DataConfig> {
        let yaml_path = absolute(yaml_path)?;
        let shown = crate::text::path(&yaml_path);
        crate::bounded::check_yaml(text).with_context(|| format!("{shown}"))?;
        let doc: Value = serde_yaml_ng::from_str(text).with_context(|| {
            format!("{shown} is not valid YAML (fix the syntax at the position above)")
        })?;
        let map = doc.as_mapping().with_context(|| {
            format!("{shown}: expected a mapping with keys path/train/val/names")
        })?;
        let yaml_dir = yaml_path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("/"));
        let mut yaml = Doc {
            map,
            yaml_path: &yaml_path,
            notices: Vec::new(),
        };
        let root = yaml.root(&yaml_dir)?;
        let train = yaml.sources(&root, Split::Train, true)?;
        let val = yaml.sources(&root, Split::Val, true)?;
        let test = yaml.sources(&root, Split::Test, false)?;
        let nc_key = yaml.nc()?;
        let jsons: Vec<PathBuf> = train
            .iter()
            .chain(&val)
            .chain(&test)
            .filter(|p| super::coco_json::is_coco_json(p))
            .cloned()
            .collect();
        let coco = yaml.coco_classes(&jsons)?;
        let names = yaml.names(nc_key, coco.as_ref())?;
        Ok(DataConfig {
            nc: names.len(),
            names,
            train,
            val,
            test,
            notices: yaml.notices,
            coco,
            yaml_path,
            root,
        })
    }

    /// The sources of `split` (empty for an absent `test`).
    pub fn sources(&self, split: Split) -> &[PathBuf] {
        match split {
            Split::Train => &self.train,
            Split::Val => &self.val,
            Split::Test => &self.test,
        }
    }

    /// The COCO JSON files among the sources of `split`.
    pub fn coco_sources(&self, split: Split) -> Vec<&PathBuf> {
        self.sources(split)
            .iter()
            .filter(|p| super::coco_json::is_coco_json(p))
            .collect()
    }

    /// Lists the image files of `split` that are not in a COCO JSON file (those are read by
    /// [`super::coco_json::read_split`]): directories are walked recursively (entries whose extension
    /// is one of [`IMAGE_EXTENSIONS`], case-insensitively; each real folder and file once, FIFOs
    /// and other non-regular files skipped, with one warning line), `.txt` lists are read line by line
    /// (blank lines skipped; relative entries resolve against the list's folder). Sorted, duplicates
    /// removed. Errors name the list file and line when an entry cannot be read.
    pub fn list_images(&self, split: Split) -> Result<Vec<PathBuf>> {
        let mut out = Vec::new();
        for src in self.sources(split) {
            if super::coco_json::is_coco_json(src) {
                continue;
            }
            if src.is_dir() {
                let skipped = walk_images(src, &mut out).with_context(|| {
                    format!(
                        "{}: cannot list images in {} (key `{split}`)",
                        crate::text::path(&self.yaml_path),
                        crate::text::path(&src)
                    )
                })?;
                if !skipped.is_empty() {
                    tracing::warn!(
                        "{} (key `{split}`): {}",
                        crate::text::path(&src),
                        super::fsio::summarize_skipped(&skipped, 3)
                    );
                }
            } else {
                let text =
                    crate::bounded::read_text_capped(src, crate::bounded::FileKind::ImageList)
                        .with_context(|| {
                            format!(
                                "cannot read image list {} (key `{split}` of {})",
                                crate::text::path(&src),
                                crate::text::path(&self.yaml_path)
                            )
                        })?;
                let base = src.parent().unwrap_or(Path::new("/"));
                for line in text.lines() {
                    let entry = line.trim();
                    if entry.is_empty() {
                        continue;
                    }
                    out.push(normalize(&base.join(entry)));
                }
            }
        }
        out.sort();
        out.dedup();
        Ok(out)
    }
}

/// True when `p`'s extension is one of [`IMAGE_EXTENSIONS`] (case-insensitive).
pub fn has_image_extension(p: &Path) -> bool {
    p.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| IMAGE_EXTENSIONS.iter().any(|x| x.eq_ignore_ascii_case(e)))
}

/// The images under `dir` (see [`super::fsio::walk_files`]: symlinks followed, each real folder
/// and file once, FIFOs and other non-regular files skipped) and what was skipped.
fn walk_images(dir: &Path, out: &mut Vec<PathBuf>) -> Result<Vec<(PathBuf, String)>> {
    let w = super::fsio::walk_files(dir, &has_image_extension)
        .with_context(|| format!("cannot read directory {}", crate::text::path(&dir)))?;
    out.extend(w.files);
    Ok(w.skipped)
}

/// A `data.yaml` being resolved: its mapping, its path (named in every error) and the notices
/// gathered so far (each also logged at warn level).
struct Doc<'a> {
    map: &'a serde_yaml_ng::Mapping,
    yaml_path: &'a Path,
    notices: Vec<String>,
}

impl<'a> Doc<'a> {
    /// The value of `key`, `None` when absent or null.
    fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    /// Records a notice and logs it.
    fn notice(&mut self, note: String) {
        tracing::warn!("{note}");
        self.notices.push(note);
    }

    /// The dataset root: `path:` joined to `yaml_dir` (the yaml's folder), or that folder.
    fn root(&self, yaml_dir: &Path) -> Result<PathBuf> {
        let shown = crate::text::path(&self.yaml_path);
        let Some(v) = self.get("path") else {
            return Ok(yaml_dir.to_path_buf());
        };
        let s = scalar_string(v).with_context(|| {
            format!("{shown}: key `path` must be a string (the dataset root folder)")
        })?;
        let p = normalize(&yaml_dir.join(&s));
        if !p.is_dir() {
            bail!(
                "{shown}: key `path` ({s:?}) resolves to {}, which is not an existing directory \
                 (relative paths resolve against the yaml's own folder {}; fix `path`)",
                crate::text::path(&p),
                crate::text::path(&yaml_dir)
            );
        }
        Ok(p)
    }

    /// The sources of `split` under `root` (with the Roboflow `../` retry of the module doc);
    /// empty when the key is absent and not `required`.
    fn sources(&mut self, root: &Path, split: Split, required: bool) -> Result<Vec<PathBuf>> {
        let yaml_path = self.yaml_path;
        let shown = crate::text::path(&yaml_path);
        let key = split.key();
        let Some(v) = self.get(key) else {
            if required {
                bail!("{shown}: key `{key}` is missing (expected a directory of images, a .txt list of image paths, or a list of those)");
            }
            return Ok(Vec::new());
        };
        let items: Vec<String> = match v {
            Value::Sequence(seq) => seq
                .iter()
                .map(|x| {
                    scalar_string(x).with_context(|| {
                        format!("{shown}: key `{key}`: every list entry must be a path string")
                    })
                })
                .collect::<Result<_>>()?,
            other => vec![scalar_string(other).with_context(|| {
                format!("{shown}: key `{key}` must be a path string or a list of path strings")
            })?],
        };
        if items.is_empty() {
            bail!("{shown}: key `{key}` is an empty list (expected at least one image directory or .txt list)");
        }
        let mut out = Vec::new();
        for s in items {
            let mut p = normalize(&root.join(&s));
            if !p.exists() {
                if let Some(rest) = s.strip_prefix("../").filter(|r| !r.is_empty()) {
                    let alt = normalize(&root.join(rest));
                    if alt.exists() {
                        self.notice(format!(
                            "{shown}: `{key}: {s}` does not exist at {}; using {} (the path without \
                             the leading `../`, as Roboflow exports expect)",
                            crate::text::path(&p),
                            crate::text::path(&alt)
                        ));
                        p = alt;
                    }
                }
            }
            let is_txt = p.extension().is_some_and(|e| e.eq_ignore_ascii_case("txt"));
            let is_json = super::coco_json::is_coco_json(&p);
            if p.is_dir() || ((is_txt || is_json) && p.is_file()) {
                out.push(p);
            } else if p.exists() {
                bail!(
                    "{shown}: key `{key}` ({s:?}) resolves to {}, which is neither a directory, a .txt list of images nor a COCO .json file",
                    crate::text::path(&p)
                );
            } else {
                bail!(
                    "{shown}: key `{key}` ({s:?}) resolves to {}, which does not exist (expected a directory of \
                     images or a .txt list; relative paths resolve against `path` = {})",
                    crate::text::path(&p),
                    crate::text::path(&root)
                );
            }
        }
        Ok(out)
    }

    /// `nc:`, when given: a positive integer up to [`MAX_CLASSES`].
    fn nc(&self) -> Result<Option<usize>> {
        let shown = crate::text::path(&self.yaml_path);
        let nc_key = match self.get("nc") {
            None => None,
            Some(v) => Some(v.as_u64().filter(|&n| n > 0).with_context(|| {
                format!(
                    "{shown}: key `nc` must be a positive integer, got {}",
                    show_value(v)
                )
            })? as usize),
        };
        if let Some(n) = nc_key.filter(|&n| n > MAX_CLASSES) {
            bail!("{shown}: `nc: {n}` is over the limit of {MAX_CLASSES} classes");
        }
        Ok(nc_key)
    }

    /// The classes of the COCO JSON sources `jsons` (`None` when there are none), with a notice
    /// listing them.
    fn coco_classes(&mut self, jsons: &[PathBuf]) -> Result<Option<super::coco_json::CocoClasses>> {
        if jsons.is_empty() {
            return Ok(None);
        }
        let yaml_path = self.yaml_path;
        let shown = crate::text::path(&yaml_path);
        let c = super::coco_json::read_classes(jsons)
            .with_context(|| format!("{shown}: reading the classes of its COCO JSON split"))?;
        for note in &c.notices {
            tracing::warn!("{note}");
            self.notices.push(note.clone());
        }
        self.notices.push(format!(
            "{shown}: {} classes from the COCO categories (sorted by id): {}",
            c.ids.len(),
            c.describe()
        ));
        Ok(Some(c))
    }

    /// The class names: `names:`, else the COCO categories' names, else `class0..` for `nc`;
    /// checked against the COCO categories and `nc`, control characters escaped.
    fn names(
        &mut self,
        nc_key: Option<usize>,
        coco: Option<&super::coco_json::CocoClasses>,
    ) -> Result<Vec<String>> {
        let yaml_path = self.yaml_path;
        let shown = crate::text::path(&yaml_path);
        let mut names = match (self.get("names"), coco) {
            (None, Some(c)) => c.names.clone(),
            (None, None) => match nc_key {
                Some(n) => (0..n).map(|i| format!("class{i}")).collect(),
                None => {
                    bail!("{shown}: neither `names` nor `nc` is given (add `names: [a, b, ...]`)")
                }
            },
            (Some(v), _) => parse_names(v).with_context(|| format!("{shown}: key `names`"))?,
        };
        if let Some(c) = coco {
            if names.len() != c.names.len() {
                bail!(
                    "{shown}: `names` has {} entries but the COCO JSON split has {} categories \
                     ({}); remove `names` to use the categories' names, or fix it",
                    names.len(),
                    c.names.len(),
                    c.describe()
                );
            }
            if names != c.names {
                self.notice(format!(
                    "{shown}: `names` {names:?} disagrees with the COCO category names {:?}; \
                     using `names` (class i = the i-th category by id: {})",
                    c.names,
                    c.describe()
                ));
            }
        }
        if names.is_empty() {
            bail!("{shown}: key `names` is empty (expected at least one class name)");
        }
        let changed = crate::model::weights::sanitize_names(&mut names);
        if !changed.is_empty() {
            tracing::warn!(
                "{shown}: class names {changed:?} contain control characters; shown escaped"
            );
        }
        if names.len() > MAX_CLASSES {
            bail!(
                "{shown}: `names` has {} entries, over the limit of {MAX_CLASSES} classes",
                names.len()
            );
        }
        if let Some(n) = nc_key {
            if n != names.len() {
                bail!(
                    "{shown}: `nc: {n}` disagrees with `names`, which has {} entries (fix one of them)",
                    names.len()
                );
            }
        }
        Ok(names)
    }
}

fn parse_names(v: &Value) -> Result<Vec<String>> {
    match v {
        Value::Sequence(seq) => seq
            .iter()
            .enumerate()
            .map(|(i, x)| {
                scalar_string(x)
                    .with_context(|| format!("entry {i} must be a string, got {}", show_value(x)))
            })
            .collect(),
        Value::Mapping(m) => {
            let mut pairs = Vec::new();
            for (k, x) in m {
                let idx = k
                    .as_u64()
                    .or_else(|| k.as_str().and_then(|s| s.trim().parse().ok()))
                    .with_context(|| {
                        format!("map key {} must be a class index 0, 1, ...", show_value(k))
                    })?;
                let name = scalar_string(x)
                    .with_context(|| format!("name of class {idx} must be a string"))?;
                pairs.push((idx as usize, name));
            }
            pairs.sort_by_key(|p| p.0);
            for (i, (idx, _)) in pairs.iter().enumerate() {
                if *idx != i {
                    bail!(
                        "index map must have keys exactly 0..{} with no gaps; key {i} is missing",
                        pairs.len() - 1
                    );
                }
            }
            Ok(pairs.into_iter().map(|p| p.1).collect())
        }
        other => bail!(
            "expected a list of names or an index map, got {}",
            show_value(other)
        ),
    }
}

/// A yaml scalar as text (strings, numbers, booleans); `None` for lists, maps and null.
fn scalar_string(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

fn show_value(v: &Value) -> String {
    serde_yaml_ng::to_string(v)
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| format!("{v:?}"))
}

/// `p` made absolute against the current directory (only when relative) and lexically normalized.
pub fn absolute(p: &Path) -> Result<PathBuf> {
    let abs = std::path::absolute(p)
        .with_context(|| format!("cannot make {} absolute", crate::text::path(&p)))?;
    Ok(normalize(&abs))
}
