//! Run folders: `runs/detect/exp`, `runs/train/exp2`, ... as the official `increment_path`.

use std::path::{Path, PathBuf};

/// `project/name`, or `project/name2`, `name3`, ... when it exists (unless `exist_ok`), as the
/// official `utils/general.py increment_path`. Does not create the folder.
pub fn increment_path(project: &Path, name: &str, exist_ok: bool) -> PathBuf {
    let base = project.join(name);
    if exist_ok || !base.exists() {
        return base;
    }
    (2u64..)
        .map(|n| project.join(format!("{name}{n}")))
        .find(|p| !p.exists())
        .unwrap_or(base)
}
