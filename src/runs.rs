//! Run folders: `runs/detect/exp`, `runs/train/exp2`, ... as the official `increment_path`.

use std::path::{Path, PathBuf};

/// `project/name`, or `project/name2`, `name3`, ... when it exists (unless `exist_ok`), as the
/// official `utils/general.py increment_path`. Does not create the folder.
pub fn increment_path(project: &Path, name: &str, exist_ok: bool) -> PathBuf {
    if exist_ok {
        return project.join(name);
    }
    first_free(project, name, "")
}

/// `dir/{stem}{ext}` if nothing is there, else the first free of `dir/{stem}2{ext}`,
/// `dir/{stem}3{ext}`, ... (the official `increment_path` with `sep=''`, suffix kept): the name
/// of a new file or folder that does not clobber an existing one. `ext` includes its dot.
pub fn first_free(dir: &Path, stem: &str, ext: &str) -> PathBuf {
    let base = dir.join(format!("{stem}{ext}"));
    if !base.exists() {
        return base;
    }
    (2u64..)
        .map(|n| dir.join(format!("{stem}{n}{ext}")))
        .find(|p| !p.exists())
        .unwrap_or(base)
}

/// Creates the run folder and returns it: `project/name`, else the first of `name2`, `name3`, ...
/// that this call creates itself (`create_dir` is exclusive, so two runs started at once never get
/// the same folder, which a check-then-create of [`increment_path`] allows). With `exist_ok` the
/// folder `project/name` is used whether or not it exists.
///
/// Errors: the project folder or the run folder cannot be created (permissions, read-only disk).
pub fn claim_run_dir(project: &Path, name: &str, exist_ok: bool) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(project)?;
    let base = project.join(name);
    if exist_ok {
        std::fs::create_dir_all(&base)?;
        return Ok(base);
    }
    let mut n = 1u64;
    loop {
        let p = if n == 1 {
            base.clone()
        } else {
            project.join(format!("{name}{n}"))
        };
        match std::fs::create_dir(&p) {
            Ok(()) => return Ok(p),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => n += 1,
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concurrent_claims_get_distinct_run_folders() {
        let project = std::env::temp_dir().join(format!("yolo9-runs-claim-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&project);
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let p = project.clone();
                std::thread::spawn(move || claim_run_dir(&p, "exp", false).unwrap())
            })
            .collect();
        let mut got: Vec<PathBuf> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        got.sort();
        got.dedup();
        assert_eq!(got.len(), 8, "two claims shared a folder: {got:?}");
        assert!(got.contains(&project.join("exp")) && got.contains(&project.join("exp8")));
        assert_eq!(
            claim_run_dir(&project, "exp", true).unwrap(),
            project.join("exp")
        );
        let _ = std::fs::remove_dir_all(&project);
    }
}
