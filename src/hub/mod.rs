//! Weights by name: the official checkpoints of the WongKinYiu/yolov9 release `v0.1`
//! ([`registry::PUBLISHED`]) resolved to a verified file in a cache, and the built-in default.
//!
//! [`resolve`] takes what a user passes as `--weights`: an existing path is used as given; a
//! published name (`yolov9-s`, `yolov9-s.pt`, `gelan-c`, `yolov9-c-converted`) is looked up in
//! the cache ([`cache`]: `$YOLO9_HOME`, else e.g. `~/.cache/yolo9`) and, when missing, downloaded
//! from the release (`YOLO9_WEIGHTS_URL` replaces its base URL; feature `download`), verified
//! and converted once to safetensors there, so the next run starts at once. `YOLO9_OFFLINE=1`
//! forbids the network: a missing model is an error naming the file to place and where.
//!
//! Verification of a new checkpoint: its keys describe the model the name promises (the
//! architecture is recognised from the tensors), its parameter count equals the official one,
//! and every tensor is finite. Its SHA-256 (and that of the converted file) is printed and
//! recorded in the cache's manifest; every later use checks the converted file against the
//! record, and a changed file is an error naming both hashes. The official release publishes no
//! checksums, so the first download is the reference (trust on first use).
//!
//! With the feature `builtin-weights`, [`builtin_bytes`] are the shipped BCCD weights
//! (`weights/yolov9-s-bccd.safetensors`: yolov9-s trained on blood cells, 3 classes, f16)
//! compiled into the program, the default model of `yolo9 detect`, `val` and `serve`.

pub mod cache;
#[cfg(feature = "download")]
pub mod download;
pub mod error;
pub mod options;
pub mod registry;
pub mod spec;

use crate::model::weights::{Provenance, Weights};
use cache::{Cache, Record};
pub use error::HubError;
pub use options::HubOptions;
use registry::Published;
pub use registry::RELEASE_URL;
use std::path::{Path, PathBuf};

/// The name of the built-in weights.
pub const BUILTIN_NAME: &str = "yolov9-s-bccd";

/// The shipped BCCD weights, compiled in (14,590,218 bytes of f16 safetensors; see
/// `weights/README.md`).
#[cfg(feature = "builtin-weights")]
pub fn builtin_bytes() -> &'static [u8] {
    include_bytes!("../../weights/yolov9-s-bccd.safetensors")
}

/// The one line a command prints when it runs the built-in model.
pub const BUILTIN_NOTE: &str = "using the built-in yolov9-s-bccd weights (BCCD blood cells: \
RBC, WBC, Platelets); for the 80 COCO classes pass --weights yolov9-s";

/// The file `spec` means: an existing path as given; else a published name, fetched into the
/// cache ([`fetch_name`]).
///
/// Errors: [`HubError::UnknownName`] for neither (listing the published names), and those of
/// [`fetch_name`].
pub fn resolve(spec: &Path, opts: &HubOptions) -> Result<PathBuf, HubError> {
    if spec.is_file() {
        return Ok(spec.to_path_buf());
    }
    if let Ok(m) = std::fs::metadata(spec) {
        return Err(HubError::NotAFile {
            path: spec.to_path_buf(),
            kind: crate::outfile::kind_of(&m.file_type()),
        });
    }
    let text = spec.to_string_lossy();
    match registry::lookup(&text) {
        Some(p) => fetch(p, opts),
        None => Err(unknown(&text)),
    }
}

fn unknown(spec: &str) -> HubError {
    let key = registry::strip_pt(spec);
    let converted = format!("{key}-converted");
    let hint = if registry::lookup(&converted).is_some() {
        format!("; {key} is published only as {converted}")
    } else if let Some(p) = registry::near_miss(key) {
        format!("; did you mean {}?", p.name)
    } else {
        String::new()
    };
    HubError::UnknownName {
        spec: spec.to_string(),
        published: registry::published_names(),
        hint,
    }
}

/// The published checkpoint `name` (`yolov9-s`, `yolov9-s.pt`) as a verified safetensors file in
/// the cache: the cached file (its SHA-256 checked against the manifest), else a checkpoint
/// placed there by hand (`NAME.pt`), else a download (unless offline) — verified, converted
/// (f16, exact for the official fp16 checkpoints), recorded, and the SHA-256 printed.
///
/// Errors: [`HubError::UnknownName`], [`HubError::HashMismatch`], [`HubError::Offline`],
/// [`HubError::Verify`], [`HubError::Cache`] and the download's errors.
pub fn fetch_name(name: &str, opts: &HubOptions) -> Result<PathBuf, HubError> {
    match registry::lookup(name) {
        Some(p) => fetch(p, opts),
        None => Err(unknown(name)),
    }
}

fn fetch(p: &Published, opts: &HubOptions) -> Result<PathBuf, HubError> {
    let cache = opts.cache()?;
    let converted = cache.converted(p.name);
    if converted.is_file() {
        let actual = cache::sha256_file(&converted).map_err(|e| HubError::Cache {
            path: converted.clone(),
            message: format!("cannot read ({e})"),
        })?;
        match cache.record(p.name)? {
            Some(r) if r.sha256 == actual => return Ok(converted),
            Some(r) => {
                return Err(HubError::HashMismatch {
                    path: converted,
                    recorded: r.sha256,
                    actual,
                })
            }
            None => {
                // Placed by hand: verified and recorded now.
                cache.ensure()?;
                let w = load_verified(&converted, p, &crate::text::path(&converted).to_string())?;
                drop(w);
                let bytes = std::fs::metadata(&converted).map(|m| m.len()).unwrap_or(0);
                let r = Record {
                    name: p.name.to_string(),
                    source: crate::text::path(&converted).to_string(),
                    source_sha256: actual.clone(),
                    source_bytes: bytes,
                    sha256: actual,
                    arch: p.arch.to_string(),
                    parameters: p.parameters,
                };
                cache.write_record(&r)?;
                say(opts, &format!("{}: verified, sha256 {}", p.name, r.sha256));
                return Ok(converted);
            }
        }
    }
    let placed = cache.placed(p.name);
    if placed.is_file() {
        cache.ensure()?;
        let source = crate::text::path(&placed).to_string();
        let out = install(&cache, p, &placed, &source, opts)?;
        let _ = std::fs::remove_file(&placed);
        return Ok(out);
    }
    let url = opts.url(p.name);
    let offline = |why: &str| HubError::Offline {
        name: p.name.to_string(),
        why: why.to_string(),
        url: url.clone(),
        place: placed.clone(),
    };
    if opts.offline {
        return Err(offline("YOLO9_OFFLINE=1 forbids the network"));
    }
    #[cfg(not(feature = "download"))]
    {
        Err(offline(
            "this build has no downloader (cargo feature `download`)",
        ))
    }
    #[cfg(feature = "download")]
    {
        cache.ensure()?;
        let part = cache.temp_path(&format!("{}.pt", p.name));
        say(opts, &format!("downloading {url}"));
        let got = download::download(&url, &part, opts).map_err(|e| HubError::DownloadFailed {
            reason: Box::new(e),
            url: url.clone(),
            place: placed.clone(),
        })?;
        let r = install(&cache, p, &part, &url, opts);
        let _ = std::fs::remove_file(&part);
        let out = r?;
        if got.attempts > 1 {
            say(
                opts,
                &format!("{}: downloaded in {} attempts", p.name, got.attempts),
            );
        }
        Ok(out)
    }
}

fn say(opts: &HubOptions, line: &str) {
    if opts.verbose {
        crate::text::errln!("{line}");
    }
}

/// Loads `path` and checks it is the model `p` promises. Returns the weights.
fn load_verified(path: &Path, p: &Published, source: &str) -> Result<Weights, HubError> {
    let bad = |message: String| HubError::Verify {
        source_name: source.to_string(),
        message,
    };
    let w = Weights::load(path).map_err(|e| {
        bad(format!(
            "not a checkpoint yolo9 reads ({}); the download may be damaged",
            e.to_string()
                .replace(&crate::text::path(&path).to_string(), "the file")
        ))
    })?;
    if w.meta.arch.name != p.arch {
        return Err(bad(format!(
            "holds a {} model, but {} is {}",
            w.meta.arch.name, p.name, p.arch
        )));
    }
    let n = w.parameter_count();
    if n != p.parameters {
        return Err(bad(format!(
            "{n} parameters, but the official {} has {} (80 classes)",
            p.name, p.parameters
        )));
    }
    let mut names: Vec<&String> = w.tensors.keys().collect();
    names.sort();
    for name in names {
        let t = &w.tensors[name];
        if !t.dtype().is_float() {
            continue;
        }
        let finite = t
            .flatten_all()
            .and_then(|t| t.to_dtype(candle_core::DType::F32))
            .and_then(|t| t.to_vec1::<f32>())
            .map(|v| v.iter().all(|x| x.is_finite()))
            .map_err(|e| bad(format!("tensor {name}: {e}")))?;
        if !finite {
            return Err(bad(format!(
                "tensor {name} holds NaN or infinite values; the checkpoint is damaged"
            )));
        }
    }
    Ok(w)
}

/// Verifies the checkpoint `src` (from `source`), converts it to `NAME.safetensors` in the cache
/// (unique temporary, fsync, atomic rename) and records it.
fn install(
    cache: &Cache,
    p: &Published,
    src: &Path,
    source: &str,
    opts: &HubOptions,
) -> Result<PathBuf, HubError> {
    let io = |path: &Path, what: &str, e: &dyn std::fmt::Display| HubError::Cache {
        path: path.to_path_buf(),
        message: format!("{what} ({e})"),
    };
    let source_sha256 = cache::sha256_file(src).map_err(|e| io(src, "cannot read", &e))?;
    let source_bytes = std::fs::metadata(src).map(|m| m.len()).unwrap_or(0);
    let w = load_verified(src, p, source)?;
    let out = cache.converted(p.name);
    let tmp = cache.temp_path(&format!("{}.safetensors", p.name));
    let prov = Provenance {
        file: format!("{}.pt", p.name),
        sha256: source_sha256.clone(),
    };
    let written = w
        .save_with_provenance(&tmp, true, Some(&prov))
        .map_err(|e| {
            io(
                &tmp,
                "cannot write the converted weights",
                &format!("{e:#}"),
            )
        })
        .and_then(|()| cache::sha256_file(&tmp).map_err(|e| io(&tmp, "cannot read", &e)));
    let sha256 = match written {
        Ok(h) => h,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    };
    if let Err(e) = std::fs::rename(&tmp, &out) {
        let _ = std::fs::remove_file(&tmp);
        return Err(io(&out, "cannot move the converted weights into place", &e));
    }
    #[cfg(unix)]
    if let Ok(d) = std::fs::File::open(&cache.dir) {
        let _ = d.sync_all();
    }
    let record = Record {
        name: p.name.to_string(),
        source: source.to_string(),
        source_sha256,
        source_bytes,
        sha256,
        arch: p.arch.to_string(),
        parameters: p.parameters,
    };
    cache.write_record(&record)?;
    say(
        opts,
        &format!(
            "{}.pt: {} bytes, sha256 {}; verified ({}, {} parameters, all finite); cached as {} \
             (sha256 {})",
            p.name,
            record.source_bytes,
            record.source_sha256,
            p.arch,
            record.parameters,
            crate::text::path(&out),
            record.sha256
        ),
    );
    Ok(out)
}

impl Weights {
    /// The published official checkpoint `name` (`yolov9-s`, `gelan-c`, `yolov9-c-converted`;
    /// `.pt` accepted), from the cache or downloaded, verified and cached first (see the module
    /// docs; options from the environment, [`HubOptions::from_env`]).
    ///
    /// Errors: [`crate::error::Error::Weights`] with the one-line [`HubError`] text (an unknown name
    /// lists the published ones; offline names the file to place and where).
    pub fn named(name: &str) -> Result<Weights, crate::error::Error> {
        let opts = HubOptions::from_env()?;
        Self::named_with(name, &opts)
    }

    /// [`Weights::named`] with explicit options.
    ///
    /// Errors: as [`Weights::named`].
    pub fn named_with(name: &str, opts: &HubOptions) -> Result<Weights, crate::error::Error> {
        let path = fetch_name(name, opts)?;
        Weights::load(&path)
    }

    /// The built-in weights (feature `builtin-weights`): yolov9-s trained on BCCD (3 classes:
    /// RBC, WBC, Platelets), f16, as shipped in `weights/yolov9-s-bccd.safetensors`.
    ///
    /// Errors: none in practice (the bytes are checked when the crate is tested); kept as a
    /// `Result` because loading checks them.
    #[cfg(feature = "builtin-weights")]
    pub fn builtin() -> Result<Weights, crate::error::Error> {
        Weights::from_bytes(builtin_bytes(), "built-in yolov9-s-bccd")
    }
}

impl crate::detect::detector::Detector {
    /// A detector of the published official checkpoint `name` ([`Weights::named`]) on `device`
    /// with the options `config`.
    ///
    /// Errors: those of [`Weights::named`] and [`crate::Detector::with_weights`].
    pub fn pretrained(
        name: &str,
        device: candle_core::Device,
        config: crate::detect::config::DetectorConfig,
    ) -> Result<Self, crate::error::Error> {
        let w = Weights::named(name)?;
        Self::with_weights(&w, device, config)
    }
}
