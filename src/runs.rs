//! Run folders: `runs/detect/exp`, `runs/train/exp2`, ... as the official `increment_path`, and
//! the two rules every writer (`train`, `val`, `detect`, `convert`) follows so that it never
//! clobbers: a new run folder is claimed atomically ([`claim_run_dir`]), and a destination that
//! is or holds one of the command's inputs is refused before any work starts ([`input_within`],
//! [`refuse_reused_dir`]).

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

/// The name of the lock file in a run folder ([`lock_run_dir`]).
pub const LOCK_FILE: &str = ".yolo9.lock";

/// A run folder owned by this process: held while the value lives; the operating system releases
/// it when the process ends, however it ends (a killed run leaves no stale lock).
#[derive(Debug)]
pub struct RunLock {
    _file: std::fs::File,
    path: PathBuf,
}

impl RunLock {
    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Takes the run folder `dir` for this process: an exclusive advisory lock (`flock`) on
/// `dir/.yolo9.lock`, which then holds this process's id. Two trainings into one folder (two
/// `--resume`s of one run, two `--exist-ok` runs of one name) would interleave `results.csv` and
/// overwrite each other's weights; the second is refused instead, naming the owner.
///
/// Errors: the folder is owned by another running process (its process id, what to do); the lock
/// file cannot be created or is not a regular file (a symlink is refused).
pub fn lock_run_dir(dir: &Path) -> anyhow::Result<RunLock> {
    use std::io::{Read, Seek, Write};
    let path = dir.join(LOCK_FILE);
    let shown = crate::text::path(&dir);
    let mut o = std::fs::OpenOptions::new();
    o.read(true).write(true).create(true).truncate(false);
    let (mut f, ft) = crate::outfile::open_no_follow(&path, o).map_err(|e| {
        anyhow::anyhow!(
            "{}: cannot create the run folder's lock ({e}; a symbolic link is refused)",
            crate::text::path(&path)
        )
    })?;
    if !ft.is_file() {
        anyhow::bail!("{}: is not a regular file", crate::text::path(&path));
    }
    #[cfg(unix)]
    {
        use std::os::unix::io::AsRawFd;
        // SAFETY: flock on a descriptor this function owns.
        let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if r != 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
                let mut owner = String::new();
                let _ = (&mut f).take(64).read_to_string(&mut owner);
                let owner = owner.trim();
                let owner = if owner.is_empty() { "unknown" } else { owner };
                anyhow::bail!(
                    "{shown}: this run folder is in use by another yolo9 process (process id \
                     {owner}); wait for it to end, or pass another --name (or leave out \
                     --exist-ok)",
                    owner = crate::text::escape(owner)
                );
            }
            return Err(err)
                .map_err(|e| anyhow::anyhow!("{}: cannot lock ({e})", crate::text::path(&path)));
        }
    }
    let _ = f.set_len(0);
    let _ = f.rewind();
    let _ = writeln!(f, "{}", std::process::id());
    Ok(RunLock { _file: f, path })
}

/// The first of `inputs` that `dest` is or holds, compared by canonical path (so `./x`, `x`, a
/// symlink to it and `a/../x` all count). `dest` is an output file or a folder the outputs go
/// into; when it does not exist nothing is in it and the answer is `None`, as for inputs that
/// cannot be resolved.
pub fn input_within<'a>(
    dest: &Path,
    inputs: impl IntoIterator<Item = &'a Path>,
) -> Option<&'a Path> {
    let dest = dest.canonicalize().ok()?;
    inputs
        .into_iter()
        .find(|i| i.canonicalize().is_ok_and(|c| c.starts_with(&dest)))
}

/// For `--exist-ok`, which reuses `project/name` instead of claiming a fresh folder: refuses
/// (before any work) a folder that is or holds one of the run's `inputs` (weights, data.yaml, hyp,
/// images, labels, sources), since the run's outputs (fixed names such as `best.safetensors`,
/// `hyp.yaml`, `predictions.json`, or `<stem>.jpg`) could replace it. Without `exist_ok` the folder
/// is new and empty, and nothing is checked.
pub fn refuse_reused_dir<'a>(
    project: &Path,
    name: &str,
    exist_ok: bool,
    inputs: impl IntoIterator<Item = &'a Path>,
) -> anyhow::Result<()> {
    if !exist_ok {
        return Ok(());
    }
    let dir = project.join(name);
    if let Some(input) = input_within(&dir, inputs) {
        anyhow::bail!(
            "--exist-ok would write this run's outputs into {}, which holds {}, an input of the \
             run: an output could replace it. Pass another --project/--name, or leave out \
             --exist-ok",
            crate::text::path(&dir),
            crate::text::path(&input)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_locked_run_folder_is_refused_naming_the_owner_and_freed_on_drop() {
        let d = std::env::temp_dir().join(format!("yolo9-runs-lock-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let held = lock_run_dir(&d).unwrap();
        assert_eq!(
            std::fs::read_to_string(held.path()).unwrap().trim(),
            std::process::id().to_string()
        );
        // flock locks belong to the open file description: a second open in this process
        // conflicts as another process's would.
        let e = format!("{:#}", lock_run_dir(&d).unwrap_err());
        assert!(
            e.contains("in use by another yolo9 process")
                && e.contains(&std::process::id().to_string()),
            "{e}"
        );
        drop(held);
        let again = lock_run_dir(&d).unwrap();
        drop(again);
        let _ = std::fs::remove_dir_all(&d);
    }

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

    #[test]
    fn a_reused_folder_holding_an_input_is_refused() {
        let root = std::env::temp_dir().join(format!("yolo9-runs-input-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let run = root.join("runs/exp");
        std::fs::create_dir_all(run.join("weights")).unwrap();
        let w = run.join("weights/best.safetensors");
        std::fs::write(&w, b"w").unwrap();
        let other = root.join("data.yaml");
        std::fs::write(&other, b"d").unwrap();
        let dotted = root.join("runs/./exp/../exp/weights/best.safetensors");
        let inputs = [other.as_path(), dotted.as_path()];
        assert_eq!(input_within(&run, inputs), Some(dotted.as_path()));
        assert_eq!(
            input_within(&w, [w.as_path()]),
            Some(w.as_path()),
            "a file is itself"
        );
        assert_eq!(
            input_within(&root.join("runs/exp2"), inputs),
            None,
            "absent"
        );
        let e = refuse_reused_dir(&root.join("runs"), "exp", true, inputs).unwrap_err();
        let e = format!("{e:#}");
        assert!(
            e.contains("--exist-ok") && e.contains("best.safetensors"),
            "{e}"
        );
        assert!(refuse_reused_dir(&root.join("runs"), "exp", false, inputs).is_ok());
        assert!(refuse_reused_dir(&root.join("runs"), "exp", true, [other.as_path()]).is_ok());
        assert_eq!(std::fs::read(&w).unwrap(), b"w");
        let _ = std::fs::remove_dir_all(&root);
    }
}
