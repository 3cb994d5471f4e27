//! The scan's label cache: `<labels folder>.yolo9-cache.json` beside the labels folder, keyed by
//! a SHA-256 of the scan rules version, `nc`, every image's and label candidate's path, size
//! and modification time (and a COCO JSON split's files and class mapping); written atomically, and only a warning when it cannot be written.
//! The scan hands it its records, counts, rules version and label paths: the cache knows
//! nothing of how a split is scanned.

use crate::data::labels::Issue;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

#[derive(Serialize, Deserialize)]
pub(super) struct CacheFile<R, C> {
    pub version: u32,
    pub key: String,
    /// SHA-256 of `key` and the records, issues and counts as serialized ([`content_digest`]):
    /// a cache edited in place (a class changed, a box added) no longer matches and is rebuilt
    /// instead of going into training. Filled by [`write_cache`]; absent in older caches, which
    /// are rebuilt once.
    #[serde(default)]
    pub digest: String,
    pub records: Vec<R>,
    pub issues: Vec<Issue>,
    pub counts: C,
}

/// SHA-256 (hex) of `key` and the JSON of `(records, issues, counts)`. The JSON of values read
/// back from the cache is the JSON that was written (serde_json writes floats in their shortest
/// round-trip form), so an untouched cache matches.
fn content_digest<R: Serialize, C: Serialize>(c: &CacheFile<R, C>) -> Option<String> {
    let body = serde_json::to_vec(&(&c.records, &c.issues, &c.counts)).ok()?;
    let mut h = Sha256::new();
    h.update(c.key.as_bytes());
    h.update([0]);
    h.update(&body);
    Some(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// `<labels folder>.yolo9-cache.json`, beside the folder holding `label`.
pub(super) fn cache_path_for(label: &Path) -> Option<PathBuf> {
    let dir = label.parent()?;
    let name = dir.file_name()?;
    let mut n = name.to_os_string();
    n.push(".yolo9-cache.json");
    Some(dir.with_file_name(n))
}

/// SHA-256 over the rules `version`, nc, and every image's and label candidate's path, size,
/// mtime (the label candidates: `label_path` of the image, and the `.txt` beside it); for a COCO
/// JSON split also each JSON file's path, size, mtime and the class → category ids.
pub(super) fn scan_key(
    version: u32,
    images: &[PathBuf],
    nc: usize,
    jsons: &[&PathBuf],
    ids: &[u64],
    label_path: impl Fn(&Path) -> PathBuf,
) -> String {
    let mut h = Sha256::new();
    h.update(version.to_le_bytes());
    h.update((nc as u64).to_le_bytes());
    for id in ids {
        h.update(id.to_le_bytes());
    }
    let stamp = |h: &mut Sha256, p: &Path| {
        h.update(p.to_string_lossy().as_bytes());
        h.update([0]);
        match std::fs::metadata(p) {
            Ok(m) => {
                h.update(m.len().to_le_bytes());
                let t = m
                    .modified()
                    .ok()
                    .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                    .map(|d| d.as_nanos())
                    .unwrap_or(0);
                h.update(t.to_le_bytes());
            }
            Err(_) => h.update(b"absent"),
        }
    };
    for j in jsons {
        stamp(&mut h, j);
    }
    for img in images {
        stamp(&mut h, img);
        stamp(&mut h, &label_path(img));
        stamp(&mut h, &img.with_extension("txt"));
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// The cache at `path` when it was written by rules `version` under `key` and its content is
/// what was written (its digest matches); `None` otherwise (the split is scanned again).
pub(super) fn read_cache<R: DeserializeOwned + Serialize, C: DeserializeOwned + Serialize>(
    path: &Path,
    version: u32,
    key: &str,
) -> Option<CacheFile<R, C>> {
    let text = crate::bounded::read_text_capped(path, crate::bounded::FileKind::LabelCache).ok()?;
    let c: CacheFile<R, C> = serde_json::from_str(&text).ok()?;
    let intact = content_digest(&c).is_some_and(|d| d == c.digest);
    (c.version == version && c.key == key && intact).then_some(c)
}

/// Atomic write ([`crate::outfile::write`]). `Err` is the reason, for a warning.
pub(super) fn write_cache<R: Serialize, C: Serialize>(
    path: &Path,
    cache: &mut CacheFile<R, C>,
) -> std::result::Result<(), String> {
    cache.digest = content_digest(cache).ok_or("cannot serialize")?;
    let dir = path.parent().ok_or("no parent folder")?;
    let meta = std::fs::metadata(dir).map_err(|e| format!("{}: {e}", crate::text::path(&dir)))?;
    if meta.permissions().readonly() {
        return Err(format!("{} is read-only", crate::text::path(&dir)));
    }
    let text = serde_json::to_string(cache).map_err(|e| format!("cannot serialize: {e}"))?;
    crate::outfile::write(path, text.as_bytes(), &crate::outfile::Inputs::none())
        .map_err(|e| format!("{e:#}"))
}
