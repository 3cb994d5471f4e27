//! The weights cache on disk: where it is, the files of one model, and its manifest.
//!
//! Layout of the cache folder (`$YOLO9_HOME`, else the platform cache folder + `yolo9`):
//! - `NAME.safetensors`: the converted checkpoint (f16, the graph the release file holds);
//! - `NAME.pt`: an official checkpoint placed there by hand (offline use), converted and
//!   removed on first use; downloads never stay there (they are written to a unique `.part` file);
//! - `manifest/NAME.json`: the manifest record of `NAME` ([`Record`]): the SHA-256 of the
//!   release file and of the converted file, checked on every later use. One file per model, each
//!   replaced atomically, so two processes caching two models never lose each other's record.

use super::error::HubError;
use serde::{Deserialize, Serialize};
use sha2::Digest;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// The default cache folder: `$YOLO9_HOME` when set; else `$XDG_CACHE_HOME/yolo9`,
/// `$HOME/.cache/yolo9` (Linux and other Unix), `$HOME/Library/Caches/yolo9` (macOS),
/// `%LOCALAPPDATA%\yolo9` (Windows); `None` when none of those variables is set.
pub fn default_home() -> Option<PathBuf> {
    let var = |k: &str| {
        crate::switches::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(h) = var("YOLO9_HOME") {
        return Some(h);
    }
    if cfg!(windows) {
        return var("LOCALAPPDATA").map(|d| d.join("yolo9"));
    }
    if cfg!(target_os = "macos") {
        return var("HOME").map(|h| h.join("Library/Caches/yolo9"));
    }
    if let Some(x) = var("XDG_CACHE_HOME") {
        return Some(x.join("yolo9"));
    }
    var("HOME").map(|h| h.join(".cache/yolo9"))
}

/// The manifest record of one cached model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The model name (`yolov9-s`).
    pub name: String,
    /// Where the checkpoint came from: its URL, or the path of a file placed in the cache.
    pub source: String,
    /// SHA-256 of the release file (`NAME.pt`), lowercase hex.
    pub source_sha256: String,
    /// Size of the release file in bytes.
    pub source_bytes: u64,
    /// SHA-256 of `NAME.safetensors`, lowercase hex: checked on every use.
    pub sha256: String,
    /// The model its tensors describe (`yolov9-s`, `gelan-c`).
    pub arch: String,
    /// Its parameter count (official summary count).
    pub parameters: usize,
}

/// The cache folder and the files of its models.
#[derive(Debug, Clone)]
pub struct Cache {
    /// The folder.
    pub dir: PathBuf,
}

impl Cache {
    /// `NAME.safetensors`.
    pub fn converted(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.safetensors"))
    }

    /// `NAME.pt` (a checkpoint placed by hand).
    pub fn placed(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.pt"))
    }

    /// `manifest/NAME.json`.
    pub fn record_path(&self, name: &str) -> PathBuf {
        self.dir.join("manifest").join(format!("{name}.json"))
    }

    /// Creates the folder (and `manifest/`) when missing.
    ///
    /// Errors: [`HubError::Cache`] naming the folder when it cannot be created or is not a
    /// folder (e.g. a regular file at that path, or a read-only parent).
    pub fn ensure(&self) -> Result<(), HubError> {
        for d in [self.dir.clone(), self.dir.join("manifest")] {
            if d.exists() && !d.is_dir() {
                return Err(HubError::Cache {
                    path: d.clone(),
                    message: "is not a folder; set YOLO9_HOME to a writable folder".into(),
                });
            }
            std::fs::create_dir_all(&d).map_err(|e| HubError::Cache {
                path: d.clone(),
                message: format!(
                    "cannot create the cache folder ({e}); set YOLO9_HOME to a writable folder"
                ),
            })?;
        }
        Ok(())
    }

    /// The record of `name`; `None` when there is none.
    ///
    /// Errors: [`HubError::Cache`] for a record that cannot be read or parsed (delete it to let
    /// the next run verify and record the file again).
    pub fn record(&self, name: &str) -> Result<Option<Record>, HubError> {
        let p = self.record_path(name);
        if !p.exists() {
            return Ok(None);
        }
        let bad = |m: String| HubError::Cache {
            path: p.clone(),
            message: format!("{m}; delete it and the cached {name}.safetensors to fetch again"),
        };
        let text = crate::bounded::read_text_capped(&p, crate::bounded::FileKind::Record)
            .map_err(|e| bad(format!("unreadable ({e})")))?;
        let r: Record =
            serde_json::from_str(&text).map_err(|e| bad(format!("not a manifest record ({e})")))?;
        Ok(Some(r))
    }

    /// Writes the record of `r.name` atomically.
    pub fn write_record(&self, r: &Record) -> Result<(), HubError> {
        let text = serde_json::to_string_pretty(r).expect("a record serializes");
        let p = self.record_path(&r.name);
        let tmp = self.temp_path(&format!("{}.json", r.name));
        write_synced(&tmp, text.as_bytes())
            .and_then(|()| std::fs::rename(&tmp, &p))
            .map_err(|e| {
                let _ = std::fs::remove_file(&tmp);
                HubError::Cache {
                    path: p.clone(),
                    message: format!("cannot write the manifest record ({e})"),
                }
            })
    }

    /// A path in the cache folder no other writer uses (process id, a per-process counter and
    /// the clock): `.NAME.PID-N-NANOS.part`.
    pub fn temp_path(&self, name: &str) -> PathBuf {
        static N: AtomicU64 = AtomicU64::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        self.dir
            .join(format!(".{name}.{}-{n}-{nanos}.part", std::process::id()))
    }
}

/// Writes `bytes` to a new file at `path` (created exclusively: an existing file or link of
/// that name is never opened) and fsyncs it.
fn write_synced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

/// SHA-256 of a file, lowercase hex.
pub fn sha256_file(path: &Path) -> std::io::Result<String> {
    let mut f = std::fs::File::open(path)?;
    let mut h = sha2::Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(format!("{:x}", h.finalize()))
}
