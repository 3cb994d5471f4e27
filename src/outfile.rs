//! Output files, written so that no input and no file of the user's is ever destroyed. Every
//! file a command writes (`export -o`, `convert -o`, checkpoints, `val --save-json`, detect's
//! labels, crops and annotated images, the label cache) goes through [`write`] or
//! [`write_with`]:
//!
//! - **Never onto an input**: the destination is compared with the command's [`Inputs`] by file
//!   identity (device and inode on Unix, so a hard link, a symlink, `./x` and `a/../x` all count;
//!   the canonical path elsewhere) before anything is written, and again just before the rename.
//! - **Only regular files are replaced**: a destination that is a FIFO, socket, device or
//!   directory is refused with an error that names the path, what it is and what to do; the check
//!   never opens it, so a FIFO cannot block.
//! - **Temporary files never collide with a user's file**: the temporary is created beside the
//!   destination with a name unique to this process and call (`.NAME.yolo9-PID-N.tmp`), opened
//!   exclusively (`O_EXCL`), so an existing file of any name is never opened, let alone replaced.
//! - **Atomic**: temporary, `fsync`, rename over the destination, `fsync` of the folder (Unix). A
//!   crash leaves the old file or the new one, never a torn one; the temporary is removed on error.
//!   A replaced file keeps its permissions. A destination that is a symlink (to a regular file
//!   that is not an input) is replaced by the new file; what it pointed to is left as it was.
//!
//! [`check`] alone is for outputs that are streamed as they grow (`predictions.jsonl` of a live
//! stream, `results.csv` appended each epoch): they get the same refusals, then are opened by
//! [`create_stream`].

use anyhow::{bail, Context, Result};
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// What makes two paths the same file.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum FileId {
    #[cfg(unix)]
    Inode(u64, u64),
    #[cfg(not(unix))]
    Path(PathBuf),
}

fn file_id(p: &Path, m: &std::fs::Metadata) -> Option<FileId> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let _ = p;
        Some(FileId::Inode(m.dev(), m.ino()))
    }
    #[cfg(not(unix))]
    {
        let _ = m;
        p.canonicalize().ok().map(FileId::Path)
    }
}

/// The files a command reads (weights, data yaml, images, a model yaml, …): no output may be one
/// of them. Paths that do not exist are left out (nothing there can be destroyed).
#[derive(Debug, Clone, Default)]
pub struct Inputs {
    by_id: HashMap<FileId, PathBuf>,
}

impl Inputs {
    /// No inputs (the destination is still checked to be a regular file).
    pub fn none() -> Self {
        Self::default()
    }

    /// The inputs `paths`.
    pub fn of<P: AsRef<Path>>(paths: impl IntoIterator<Item = P>) -> Self {
        let mut s = Self::default();
        for p in paths {
            s.add(p.as_ref());
        }
        s
    }

    /// Adds the input `p` (a file; ignored when it cannot be read).
    pub fn add(&mut self, p: &Path) {
        if let Some(id) = std::fs::metadata(p).ok().and_then(|m| file_id(p, &m)) {
            self.by_id.entry(id).or_insert_with(|| p.to_path_buf());
        }
    }

    /// The input that `p` is, if any.
    pub fn find(&self, p: &Path) -> Option<&Path> {
        let m = std::fs::metadata(p).ok()?;
        self.by_id.get(&file_id(p, &m)?).map(PathBuf::as_path)
    }

    /// How many inputs are known.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Whether no input is known.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }
}

/// What a file that is not a regular file is, for messages.
pub fn kind_of(ft: &std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if ft.is_fifo() {
            return "a FIFO (named pipe)";
        }
        if ft.is_socket() {
            return "a socket";
        }
        if ft.is_block_device() || ft.is_char_device() {
            return "a device";
        }
    }
    if ft.is_dir() {
        return "a directory";
    }
    if ft.is_symlink() {
        return "a symbolic link";
    }
    "not a regular file"
}

/// Refuses `path` as a destination when it is one of `inputs` or exists as anything but a
/// regular file (a symlink is judged by what it points to). Opens nothing.
///
/// Errors: the path, what it is, and what to do.
pub fn check(path: &Path, inputs: &Inputs) -> Result<()> {
    let shown = crate::text::path(&path);
    if path.file_name().is_none() {
        bail!("{shown}: not a file path; pass a file name as the output");
    }
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("{shown}: cannot inspect the output")),
    };
    let ft = meta.file_type();
    if !ft.is_file() {
        bail!(
            "{shown}: is {}, not a regular file; yolo9 writes its outputs only as regular files \
             (it replaces them whole). Pass the path of a new or regular file",
            kind_of(&ft)
        );
    }
    if let Some(input) = file_id(path, &meta).and_then(|id| inputs.by_id.get(&id)) {
        bail!(
            "{shown}: is the same file as {}, an input of this command; writing it would destroy \
             the input. Pass another output path",
            crate::text::path(&input)
        );
    }
    Ok(())
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// Creates a new temporary file beside `path` (exclusive create, a name no other file has).
fn create_temp(path: &Path, suffix: &str) -> Result<(PathBuf, File)> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "out".into());
    let dir = folder_of(path);
    let mut last = None;
    for _ in 0..64 {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let tmp = dir.join(format!(
            ".{name}.yolo9-{}-{n}-{nanos:x}.tmp{suffix}",
            std::process::id()
        ));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
        {
            Ok(f) => return Ok((tmp, f)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => {
                return Err(e).with_context(|| {
                    format!(
                        "{}: cannot create a temporary file in {} (does the folder exist, is it \
                         writable?)",
                        crate::text::path(&path),
                        crate::text::path(&dir)
                    )
                })
            }
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no free name")))
        .with_context(|| format!("{}: no free temporary file name", crate::text::path(&path)))
}

fn folder_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Writes `bytes` to `path` (see the module docs: never onto an input, only over a regular file,
/// a unique temporary, fsync and rename).
pub fn write(path: &Path, bytes: &[u8], inputs: &Inputs) -> Result<()> {
    write_with(path, inputs, |w| {
        w.write_all(bytes)?;
        Ok(())
    })
}

/// Writes `path` with what `fill` writes into a buffered temporary file (see [`write`]). An error
/// of `fill` leaves nothing behind and the old file untouched.
pub fn write_with(
    path: &Path,
    inputs: &Inputs,
    fill: impl FnOnce(&mut BufWriter<File>) -> Result<()>,
) -> Result<()> {
    check(path, inputs)?;
    let shown = crate::text::path(&path).to_string();
    let (tmp, file) = create_temp(path, "")?;
    // A replaced file keeps its permissions (a user's 0600 file stays private).
    if let Ok(m) = std::fs::metadata(path) {
        let _ = file.set_permissions(m.permissions());
    }
    let result = (|| -> Result<()> {
        let mut w = BufWriter::new(file);
        fill(&mut w).with_context(|| format!("{shown}: cannot write (disk full?)"))?;
        let file = w
            .into_inner()
            .map_err(|e| e.into_error())
            .with_context(|| format!("{shown}: write failed (disk full?)"))?;
        file.sync_all()
            .with_context(|| format!("{shown}: fsync failed"))?;
        drop(file);
        // The destination may have changed since the first check.
        check(path, inputs)?;
        std::fs::rename(&tmp, path).with_context(|| {
            format!(
                "{shown}: cannot move {} into place",
                crate::text::path(&tmp)
            )
        })?;
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result?;
    sync_folder(path);
    Ok(())
}

/// For a writer that needs a path of its own (an encoder run as another program): checks `path`
/// ([`check`]) and creates an empty temporary file beside it whose name ends in `suffix` (the
/// extension the program needs), for [`commit`] once it is written.
pub fn temp_beside(path: &Path, suffix: &str, inputs: &Inputs) -> Result<PathBuf> {
    check(path, inputs)?;
    create_temp(path, suffix).map(|(p, _)| p)
}

/// Moves the temporary `tmp` of [`temp_beside`], once written, over `path`: fsync, the checks
/// again, rename, fsync of the folder. The temporary is removed on error.
pub fn commit(tmp: &Path, path: &Path, inputs: &Inputs) -> Result<()> {
    let shown = crate::text::path(&path).to_string();
    let result = (|| -> Result<()> {
        File::open(tmp)
            .and_then(|f| f.sync_all())
            .with_context(|| format!("{shown}: fsync of {} failed", crate::text::path(&tmp)))?;
        check(path, inputs)?;
        std::fs::rename(tmp, path).with_context(|| {
            format!(
                "{shown}: cannot move {} into place",
                crate::text::path(&tmp)
            )
        })?;
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(tmp);
    }
    result?;
    sync_folder(path);
    Ok(())
}

fn sync_folder(path: &Path) {
    #[cfg(unix)]
    if let Ok(d) = File::open(folder_of(path)) {
        let _ = d.sync_all();
    }
    #[cfg(not(unix))]
    let _ = path;
}

/// Saves `img` as `path` in the format of its extension, through [`write_with`].
pub fn save_image(img: &image::RgbImage, path: &Path, inputs: &Inputs) -> Result<()> {
    let format = image::ImageFormat::from_path(path).with_context(|| {
        format!(
            "{}: no image format for this extension",
            crate::text::path(&path)
        )
    })?;
    write_with(path, inputs, |w| {
        img.write_to(w, format)?;
        Ok(())
    })
}

/// Opens `path` for an output that grows as it is written (`predictions.jsonl`, track's MOT
/// files), after the refusals of [`check`]. The file is a **new** one: it is created exclusively
/// beside `path` and renamed over it before the first byte is written, so an old file, a symlink
/// or a hard link at `path` is replaced as a name and whatever it pointed to is left intact (a
/// `predictions.jsonl` that links to the weights never truncates the weights).
///
/// Errors: those of [`check`], or the folder cannot hold a new file.
pub fn create_stream(path: &Path, inputs: &Inputs) -> Result<File> {
    check(path, inputs)?;
    let (tmp, file) = create_temp(path, "")?;
    // The empty new file moved over `path` as any finished temporary is (checks again, rename,
    // the temporary removed on error).
    commit(&tmp, path, inputs)?;
    Ok(file)
}

/// Opens `path` to append to it (a log that several calls extend, such as the cuDNN algorithm
/// cache): created when missing; a symlink at `path`, or a FIFO, device or folder, is refused
/// (`O_NOFOLLOW`, and the kind checked on the open descriptor), so an append never writes
/// through a link into another file.
///
/// Errors: the path and what it is.
pub fn open_append(path: &Path) -> Result<File> {
    let shown = crate::text::path(&path);
    let mut o = std::fs::OpenOptions::new();
    o.create(true).append(true);
    let (f, ft) = open_no_follow(path, o).with_context(|| {
        format!(
            "{shown}: cannot open to append (a symbolic link is refused; is it a regular file?)"
        )
    })?;
    if !ft.is_file() {
        bail!(
            "{shown}: is {}, not a regular file; refusing to append to it",
            kind_of(&ft)
        );
    }
    Ok(f)
}

/// Opens `path` with `o`, adding `O_NOFOLLOW | O_NONBLOCK` on Unix (a symbolic link at `path` is
/// refused, a FIFO does not block the open), and returns the file with the kind of what was
/// opened (read from the open descriptor, so it cannot change in between): the one way a
/// writer opens a file it keeps in place ([`open_append`], the run folder's lock in
/// [`crate::runs`]).
///
/// Errors: the open's (a link: `ELOOP`), or the descriptor cannot be inspected.
pub fn open_no_follow(
    path: &Path,
    mut o: std::fs::OpenOptions,
) -> std::io::Result<(File, std::fs::FileType)> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
    }
    let f = o.open(path)?;
    let ft = f.metadata()?.file_type();
    Ok((f, ft))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("yolo9-outfile-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn writes_replace_regular_files_and_leave_no_temporary() {
        let d = dir("plain");
        let p = d.join("a.bin");
        write(&p, b"one", &Inputs::none()).unwrap();
        write(&p, b"two", &Inputs::none()).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        let names: Vec<_> = std::fs::read_dir(&d).unwrap().collect();
        assert_eq!(names.len(), 1);
        // A failing fill leaves the old file and no temporary.
        let e = write_with(&p, &Inputs::none(), |_| bail!("boom")).unwrap_err();
        assert!(format!("{e:#}").contains("boom"));
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 1);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[cfg(unix)]
    #[test]
    fn streams_and_appends_never_write_through_a_link() {
        let d = dir("links");
        let weights = d.join("w.safetensors");
        std::fs::write(&weights, b"precious").unwrap();
        let link = d.join("predictions.jsonl");
        std::os::unix::fs::symlink(&weights, &link).unwrap();
        let mut f = create_stream(&link, &Inputs::none()).unwrap();
        f.write_all(b"{}\n").unwrap();
        drop(f);
        assert_eq!(std::fs::read(&weights).unwrap(), b"precious");
        assert!(!std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read(&link).unwrap(), b"{}\n");
        // A hard link is replaced as a name too.
        let hard = d.join("mot.txt");
        std::fs::hard_link(&weights, &hard).unwrap();
        create_stream(&hard, &Inputs::none()).unwrap();
        assert_eq!(std::fs::read(&weights).unwrap(), b"precious");
        // Appending through a symlink is refused; to a regular file it appends.
        let alink = d.join("cache.tsv");
        std::os::unix::fs::symlink(&weights, &alink).unwrap();
        let e = format!("{:#}", open_append(&alink).unwrap_err());
        assert!(e.contains("cache.tsv"), "{e}");
        assert_eq!(std::fs::read(&weights).unwrap(), b"precious");
        let plain = d.join("log.tsv");
        open_append(&plain).unwrap().write_all(b"a").unwrap();
        open_append(&plain).unwrap().write_all(b"b").unwrap();
        assert_eq!(std::fs::read(&plain).unwrap(), b"ab");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn inputs_directories_and_hard_links_are_refused() {
        let d = dir("refuse");
        let input = d.join("in.bin");
        std::fs::write(&input, b"keep").unwrap();
        let inputs = Inputs::of([&input]);
        let e = format!("{:#}", write(&input, b"x", &inputs).unwrap_err());
        assert!(e.contains("an input of this command"), "{e}");
        let dotted = d.join(".").join("in.bin");
        assert!(write(&dotted, b"x", &inputs).is_err());
        #[cfg(unix)]
        {
            let link = d.join("hard.bin");
            std::fs::hard_link(&input, &link).unwrap();
            assert!(write(&link, b"x", &inputs).is_err());
        }
        assert_eq!(std::fs::read(&input).unwrap(), b"keep");
        let e = format!("{:#}", write(&d, b"x", &inputs).unwrap_err());
        assert!(e.contains("a directory"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }
}
