//! Files and folders as yolo9 reads them from a dataset or a detect source, so that no tree can
//! make it loop or block:
//!
//! - [`open_regular`] / [`read_regular`] open only regular files (symlinks to them included). A
//!   FIFO, socket or device named like an image is refused with an error that says what it is,
//!   and the open itself cannot block: on Unix it is made with `O_NONBLOCK` and the kind is
//!   checked on the open descriptor (`fstat`), so there is no window between a check and the open.
//! - [`walk_files`] lists a folder recursively, following symlinks, but enters each real folder
//!   (by device and inode on Unix, canonical path elsewhere) once: a link back to an ancestor (`a -> .`) or a second link to a folder
//!   already walked is skipped and reported, so a loop neither runs forever nor lists the same
//!   images many times; each real file is listed once, under the first path that reached it.

use std::collections::HashSet;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

/// What a non-regular file is, for messages ([`crate::outfile::kind_of`]).
fn kind_of(ft: &std::fs::FileType) -> &'static str {
    crate::outfile::kind_of(ft)
}

/// Opens `path` for reading if it is a regular file (after following symlinks). Errors: the
/// open's own error, or `InvalidInput` naming the kind (FIFO, socket, device, directory).
/// ([`crate::bounded::open_regular`], shared with the YAML and weights readers.)
pub fn open_regular(path: &Path) -> io::Result<File> {
    crate::bounded::open_regular(path)
}

/// The bytes of the regular file `path`, at most `kind`'s cap of them
/// ([`crate::bounded::read_capped`]).
pub fn read_regular(path: &Path, kind: crate::bounded::FileKind) -> io::Result<Vec<u8>> {
    crate::bounded::read_capped(path, kind)
}

/// Result of [`walk_files`].
#[derive(Debug, Default)]
pub struct Walk {
    /// Regular files that `keep` accepted, sorted, each real file once.
    pub files: Vec<PathBuf>,
    /// Entries not listed, with the reason (a folder already walked, a FIFO, an unreadable
    /// folder below the root).
    pub skipped: Vec<(PathBuf, String)>,
}

/// Lists the regular files under `root` whose path `keep` accepts (see the module docs).
/// Errors: `root` itself cannot be listed.
pub fn walk_files(root: &Path, keep: &dyn Fn(&Path) -> bool) -> io::Result<Walk> {
    let mut w = Walk::default();
    let mut seen = Seen::default();
    let id = identity(root, &std::fs::metadata(root)?)?;
    seen.dirs.insert(id, root.to_path_buf());
    walk(root, keep, &mut w, &mut seen, true)?;
    w.files.sort();
    Ok(w)
}

/// What makes two paths the same real folder or file: (device, inode) on Unix, from the metadata
/// already read; the canonical path elsewhere.
#[derive(PartialEq, Eq, Hash)]
enum Identity {
    #[cfg(unix)]
    Inode(u64, u64),
    #[cfg(not(unix))]
    Path(PathBuf),
}

fn identity(p: &Path, m: &std::fs::Metadata) -> io::Result<Identity> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let _ = p;
        Ok(Identity::Inode(m.dev(), m.ino()))
    }
    #[cfg(not(unix))]
    {
        let _ = m;
        Ok(Identity::Path(std::fs::canonicalize(p)?))
    }
}

/// The folders entered (with the first path that reached each) and the files listed.
#[derive(Default)]
struct Seen {
    dirs: std::collections::HashMap<Identity, PathBuf>,
    files: HashSet<Identity>,
}

fn walk(
    dir: &Path,
    keep: &dyn Fn(&Path) -> bool,
    w: &mut Walk,
    seen: &mut Seen,
    is_root: bool,
) -> io::Result<()> {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if !is_root => {
            w.skipped
                .push((dir.to_path_buf(), format!("cannot list folder: {e}")));
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    let mut entries: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
    entries.sort();
    for p in entries {
        // `metadata` follows symlinks: a symlinked folder or image counts like the real thing;
        // a dangling link is an error here, reported.
        let m = match std::fs::metadata(&p) {
            Ok(m) => m,
            Err(e) => {
                if keep(&p) {
                    w.skipped.push((p, format!("cannot read: {e}")));
                }
                continue;
            }
        };
        let ft = m.file_type();
        if ft.is_dir() {
            match identity(&p, &m) {
                Ok(id) => match seen.dirs.get(&id) {
                    Some(first) => {
                        let why = format!(
                            "folder {} already listed (a symlink loop or a second link to it): \
                             not entered again",
                            crate::text::path(&first)
                        );
                        w.skipped.push((p, why));
                    }
                    None => {
                        seen.dirs.insert(id, p.clone());
                        walk(&p, keep, w, seen, false)?
                    }
                },
                Err(e) => w.skipped.push((p, format!("cannot resolve folder: {e}"))),
            }
        } else if keep(&p) {
            if !ft.is_file() {
                w.skipped
                    .push((p, format!("{}, not a regular file", kind_of(&ft))));
                continue;
            }
            // A file whose identity cannot be read is listed (it is read, and judged, later).
            if identity(&p, &m).is_ok_and(|id| !seen.files.insert(id)) {
                w.skipped.push((
                    p,
                    "the same file as one listed already (a second link)".into(),
                ));
            } else {
                w.files.push(p);
            }
        }
    }
    Ok(())
}

/// One line summarising `skipped` for a report: the count and the first `shown` entries.
pub fn summarize_skipped(skipped: &[(PathBuf, String)], shown: usize) -> String {
    let mut s = format!("{} entries skipped", skipped.len());
    for (p, why) in skipped.iter().take(shown) {
        s.push_str(&format!("; {}: {why}", crate::text::path(&p)));
    }
    if skipped.len() > shown {
        s.push_str(&format!("; ... and {} more", skipped.len() - shown));
    }
    s
}

/// Lexical normalization: drops `.` and resolves `..` against the preceding component, without
/// touching the file system (so a missing path can still be shown in absolute form).
pub fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir => {
                if out.file_name().is_some() {
                    out.pop();
                } else if !out.has_root() {
                    out.push("..");
                }
            }
            other => out.push(other),
        }
    }
    out
}
