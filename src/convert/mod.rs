//! The converter behind `yolo9 convert` (`crate::cli::convert`): a checkpoint (official `.pt`,
//! state_dict `.pt` or `.safetensors`) → validated [`Weights`], optionally reduced to the inference
//! graph, with a printable [`Report`] and the source's provenance.
//!
//! Reading `.pt` files is [`crate::pt`]'s job (zip records, guarded pickle walk); the state_dict
//! names of both graphs are the model's ([`crate::model::keys`]). The `.pt` import itself is
//! re-exported here ([`import_pt`]).

pub use crate::pt::{import_pt, Imported};
pub mod int8;

use crate::model::weights::{Graph, Provenance, Weights};
use anyhow::{Context, Result};
use sha2::Digest;
use std::fmt;
use std::path::Path;

/// Options of [`convert`].
#[derive(Debug, Clone, Default)]
pub struct ConvertOptions {
    /// Store floating-point tensors as f16 (the loader upcasts to f32).
    pub half: bool,
    /// Keep only the inference graph (the main branch: gelan-* layout, see
    /// [`crate::model::rename::NameMap::train_to_infer`]).
    pub infer: bool,
    /// The model the checkpoint must be (`--cfg`; [`Weights::with_arch`]) instead of the one
    /// recognised from its keys; a checkpoint that is not that model is refused, naming the first
    /// tensor that differs.
    pub cfg: Option<std::sync::Arc<crate::model::arch::Arch>>,
}

/// What a conversion did, printed by `yolo9 convert`.
#[derive(Debug, Clone)]
pub struct Report {
    /// Input file name.
    pub source: String,
    /// sha256 of the input file.
    pub sha256: String,
    /// How the input was read (e.g. "official checkpoint, 'model' (models.yolo.DualDDetect head)").
    pub how: String,
    /// Tensors imported from the input (float + int64 counters).
    pub imported: usize,
    /// Tensors written (after `--infer`).
    pub written: usize,
    /// Parameters of the written graph, counted like the official summary.
    pub parameters: usize,
    /// Graph written.
    pub graph: Graph,
    /// Model written (`yolov9-c`, `gelan-s`, …) and its head layer index.
    pub model: (String, usize),
    /// The head's official module name (`DualDDetect`, `DDetect`, `Segment`, …).
    pub head: &'static str,
    /// Number of classes and their names.
    pub nc: usize,
    /// Class names.
    pub names: Vec<String>,
    /// Things seen and not imported, conversions, dropped tensors.
    pub notes: Vec<String>,
    /// Whether the output stores f16.
    pub half: bool,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "source:     {} (sha256 {})", self.source, self.sha256)?;
        writeln!(f, "read:       {}", self.how)?;
        writeln!(f, "imported:   {} tensors", self.imported)?;
        writeln!(
            f,
            "written:    {} tensors, {} graph, {} parameters, {}",
            self.written,
            match self.graph {
                Graph::Train => format!(
                    "training ({}, {} at {})",
                    self.model.0, self.head, self.model.1
                ),
                Graph::Infer => format!(
                    "inference ({}, {} at {})",
                    self.model.0, self.head, self.model.1
                ),
            },
            self.parameters,
            if self.half { "f16" } else { "f32" }
        )?;
        let shown: Vec<&str> = self.names.iter().take(10).map(String::as_str).collect();
        writeln!(
            f,
            "classes:    nc={} {:?}{}",
            self.nc,
            shown,
            if self.names.len() > 10 { " ..." } else { "" }
        )?;
        writeln!(f, "missing:    none (all tensors of the graph present)")?;
        for n in &self.notes {
            writeln!(f, "note:       {n}")?;
        }
        Ok(())
    }
}

/// sha256 of a file, lowercase hex.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut f = std::fs::File::open(path)
        .with_context(|| format!("{}: cannot open to hash", crate::text::path(&path)))?;
    let mut h = sha2::Sha256::new();
    std::io::copy(&mut f, &mut h)
        .with_context(|| format!("{}: read error", crate::text::path(&path)))?;
    Ok(format!("{:x}", h.finalize()))
}

/// Reads `input` (official `.pt`, state_dict `.pt`, or `.safetensors`) into validated
/// [`Weights`] (see [`Weights::load`]), optionally reduced to the inference graph, with the
/// source's provenance and a [`Report`]. Nothing is written.
pub fn convert(input: &Path, opts: &ConvertOptions) -> Result<(Weights, Provenance, Report)> {
    let (weights, mut notes, how, imported) = Weights::load_detailed_as(input, opts.cfg.as_ref())?;
    let weights = match &opts.cfg {
        Some(arch) => weights.with_arch(
            arch.clone(),
            &format!("{}: --cfg {}", crate::text::path(&input), arch.name),
        )?,
        None => weights,
    };
    let file_name = input
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| crate::text::path(&input).to_string());
    let sha256 = sha256_file(input)?;
    let weights = if opts.infer && weights.meta.graph == Graph::Train {
        let w = weights.to_infer()?;
        let (th, ih) = (weights.meta.arch.head_index(), w.meta.arch.head_index());
        notes.push(format!(
            "--infer: kept the main branch ({} of {} layers, renumbered as {}), renamed \
             model.{th}.cv4/cv5/dfl2 -> model.{ih}.cv2/cv3/dfl, dropped {} tensors of the \
             auxiliary branch (model.{th}.cv2/cv3/dfl and the layers only it reads)",
            ih,
            th,
            w.meta.arch.name,
            weights.tensors.len() - w.tensors.len()
        ));
        w
    } else {
        weights
    };
    let report = Report {
        source: file_name.clone(),
        sha256: sha256.clone(),
        how,
        imported,
        written: weights.tensors.len(),
        parameters: weights.parameter_count(),
        graph: weights.meta.graph,
        model: (
            weights.meta.arch.name.clone(),
            weights.meta.arch.head_index(),
        ),
        head: weights.meta.arch.head().module_name(),
        nc: weights.meta.nc,
        names: weights.meta.names.clone(),
        notes,
        half: opts.half,
    };
    let prov = Provenance {
        file: file_name,
        sha256,
    };
    Ok((weights, prov, report))
}

/// [`convert`] then [`Weights::save_with_provenance`] to `output` (atomic write). `output` is
/// refused before any work, and again before it is written, when it is `input` (by file
/// identity: a hard link or symlink to it counts) or not a regular file
/// ([`crate::outfile::check`]).
pub fn convert_file(input: &Path, output: &Path, opts: ConvertOptions) -> Result<Report> {
    let inputs = crate::outfile::Inputs::of([input]);
    crate::outfile::check(output, &inputs)?;
    let (weights, prov, report) = convert(input, &opts)?;
    crate::outfile::check(output, &inputs)?;
    weights.save_with_provenance(output, opts.half, Some(&prov))?;
    Ok(report)
}

/// The default output of converting `input`: `NAME.safetensors` beside it, or, when the input is
/// already that file, `NAME-infer-half.safetensors` with the suffixes of the options given
/// (`-converted` without options), so the input is never overwritten.
pub fn default_output(input: &std::path::Path, infer: bool, half: bool) -> std::path::PathBuf {
    let o = input.with_extension("safetensors");
    if o != input {
        return o;
    }
    let stem = input
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "weights".into());
    let mut name = stem;
    if infer {
        name.push_str("-infer");
    }
    if half {
        name.push_str("-half");
    }
    if !infer && !half {
        name.push_str("-converted");
    }
    input.with_file_name(format!("{name}.safetensors"))
}

#[cfg(test)]
mod tests {
    use super::default_output;
    use std::path::{Path, PathBuf};

    #[test]
    fn the_default_output_never_overwrites_the_input() {
        let p = |s: &str| PathBuf::from(s);
        assert_eq!(
            default_output(Path::new("runs/best.pt"), true, true),
            p("runs/best.safetensors")
        );
        assert_eq!(
            default_output(Path::new("runs/best.safetensors"), true, true),
            p("runs/best-infer-half.safetensors")
        );
        assert_eq!(
            default_output(Path::new("best.safetensors"), false, true),
            p("best-half.safetensors")
        );
        assert_eq!(
            default_output(Path::new("best.safetensors"), false, false),
            p("best-converted.safetensors")
        );
    }
}
