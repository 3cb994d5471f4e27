//! Expands `yolo9 detect SOURCE...` arguments into the list of files to try.
//!
//! Policy (documented for users):
//! * a **file** is taken as given, whatever its extension (the decoder sniffs the content);
//! * a **directory** contributes its regular files, sorted by name, **not recursively** (like
//!   the official `LoadImages`); hidden files (name starting with `.`) are left out; each
//!   sub-directory is reported as skipped (pass it, or a glob such as `dir/**/*`, explicitly);
//! * a **glob** (`*`, `?`, `[`) is expanded (`**` recurses, following symlinks but entering each
//!   real folder once, so a symlink loop ends); matched directories are ignored, hidden files are
//!   kept only when the pattern names them;
//! * a path that exists is never treated as a glob (file names may contain `[`);
//! * every file is listed once, in argument order; extensions are not filtered here: files that
//!   are not images are skipped later, one line each, with the decoder's reason.
use anyhow::{bail, Result};
use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// Result of expanding the sources.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Sources {
    /// Files to decode, in order.
    pub files: Vec<PathBuf>,
    /// Things not used, with the reason (missing path, empty glob, sub-directory, ...).
    pub skipped: Vec<(PathBuf, String)>,
}

fn is_hidden(p: &Path) -> bool {
    p.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with('.'))
}

/// Paths left out, each with the reason.
type Skipped = Vec<(PathBuf, String)>;

/// The regular files matching the glob `pattern`, and what was skipped. A pattern with `**`
/// is walked by [`crate::data::fsio::walk_files`] from its literal leading folders (symlinks
/// followed, each real folder once, so a symlink loop ends), then matched whole; other patterns
/// go through `glob::glob`. Errors: an invalid pattern (the message says why).
fn expand_glob(pattern: &str) -> Result<(Vec<PathBuf>, Skipped), String> {
    if !pattern.contains("**") {
        let paths = glob::glob(pattern).map_err(|e| e.to_string())?;
        return Ok((
            paths
                .filter_map(|r| r.ok())
                .filter(|p| p.is_file())
                .collect(),
            Vec::new(),
        ));
    }
    let pat = glob::Pattern::new(pattern).map_err(|e| e.to_string())?;
    let opts = glob::MatchOptions {
        require_literal_separator: true,
        require_literal_leading_dot: true,
        ..Default::default()
    };
    let mut root = PathBuf::new();
    for c in Path::new(pattern).components() {
        let t = c.as_os_str().to_string_lossy();
        if t.contains(['*', '?', '[']) {
            break;
        }
        root.push(c);
    }
    if root.as_os_str().is_empty() {
        root.push(".");
    }
    if !root.is_dir() {
        return Ok((Vec::new(), Vec::new()));
    }
    // Paths under "." come back as "./x"; the pattern "**/x" names them without it.
    let strip_dot = !pattern.starts_with("./") && root == Path::new(".");
    let keep = |p: &Path| {
        let q = if strip_dot {
            p.strip_prefix(".").unwrap_or(p)
        } else {
            p
        };
        pat.matches_path_with(q, opts)
    };
    let w = crate::data::fsio::walk_files(&root, &keep)
        .map_err(|e| format!("{}: {e}", crate::text::path(&root)))?;
    Ok((w.files, w.skipped))
}

/// Expands `sources` (files, directories, globs) by the module policy.
///
/// Errors: when nothing at all is found (every source missing or empty), naming the sources.
pub fn expand_sources(sources: &[PathBuf]) -> Result<Sources> {
    let mut out = Sources::default();
    let mut seen = HashSet::new();
    let mut push = |out: &mut Sources, p: PathBuf| {
        if seen.insert(p.clone()) {
            out.files.push(p);
        }
    };
    for src in sources {
        if src.is_dir() {
            let mut entries: Vec<PathBuf> = match std::fs::read_dir(src) {
                Ok(rd) => rd.filter_map(|e| e.ok().map(|e| e.path())).collect(),
                Err(e) => {
                    out.skipped
                        .push((src.clone(), format!("cannot list directory: {e}")));
                    continue;
                }
            };
            entries.sort();
            for p in entries {
                if is_hidden(&p) {
                    continue;
                }
                if p.is_dir() {
                    out.skipped.push((
                        p,
                        "sub-directory not searched (no recursion); pass it explicitly".into(),
                    ));
                } else if p.is_file() {
                    push(&mut out, p);
                } else {
                    out.skipped.push((p, "not a regular file".into()));
                }
            }
        } else if src.is_file() {
            push(&mut out, src.clone());
        } else if src.exists() {
            out.skipped
                .push((src.clone(), "not a regular file or directory".into()));
        } else {
            let s = src.to_string_lossy();
            if s.contains(['*', '?', '[']) {
                match expand_glob(&s) {
                    Ok((mut matched, skipped)) => {
                        out.skipped.extend(skipped);
                        matched.sort();
                        if matched.is_empty() {
                            out.skipped
                                .push((src.clone(), "glob matches no files".into()));
                        }
                        for p in matched {
                            push(&mut out, p);
                        }
                    }
                    Err(e) => out
                        .skipped
                        .push((src.clone(), format!("invalid glob pattern: {e}"))),
                }
            } else {
                out.skipped
                    .push((src.clone(), "no such file or directory".into()));
            }
        }
    }
    if out.files.is_empty() {
        let list: Vec<String> = out
            .skipped
            .iter()
            .map(|(p, r)| format!("{}: {r}", crate::text::path(&p)))
            .collect();
        bail!(
            "no input files found in {:?}{}",
            sources,
            if list.is_empty() {
                String::new()
            } else {
                format!(" ({})", list.join("; "))
            }
        );
    }
    Ok(out)
}
